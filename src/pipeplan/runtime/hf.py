"""Hugging Face ``transformers`` models from a config, with random weights and no download:
``hf:gpt2?n_layer=4&n_embd=256`` or ``hf:bert?num_hidden_layers=2&hidden_size=128``.

The model is ``transformers``' own modules laid out as an ``nn.Sequential``: the embeddings,
each transformer block (``GPT2Block``, ``BertLayer``), the final norm and the language-model
head, so its layers are the blocks and every cut between them runs. Query keys set the
config (integers, numbers, true/false); ``seq`` is the sequence length (default 64) and
``microbatch`` the example microbatch (default 8). Defaults that training on separate
processes needs: no dropout (``--check`` compares exactly), untied input and output
embeddings (free to go to different stages; ``tie_word_embeddings=true`` ties them, and
every plan then keeps the embeddings and the head in one stage), ``use_cache=False``.
Settings are checked before anything is built (``_check_types``, ``_check_shape``). The
input is token ids; the loss is the runtime's, squared error on the logits."""

from __future__ import annotations

from urllib.parse import parse_qsl

import torch
from torch import nn

from ..errors import PipeplanError
from ..graph.hf_config import config_value as _value
from ..limits import check_built_parameters, check_input_bytes, check_layers

_ARCHS = ("gpt2", "bert")
_DROPOUT = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
            "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob")}
_SMALL = {"gpt2": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000, "n_positions": 256,
                  "bos_token_id": 0, "eos_token_id": 0},
          "bert": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                   "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 256}}


class GPT2Embed(nn.Module):
    """Token + position embeddings (``GPT2Model``'s first step)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.wte(ids) + self.wpe(pos))


def parse_spec(spec: str) -> tuple[str, dict, int, int]:
    """(architecture, config overrides, sequence length, microbatch) of ``hf:ARCH?k=v&...``."""
    arch, _, query = spec[len("hf:"):].partition("?")
    if arch not in _ARCHS:
        raise PipeplanError(f"model spec {spec!r}: unknown Hugging Face architecture {arch!r} "
                            f"(known: {', '.join(_ARCHS)})")
    opts = {k: _value(v) for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=False)}
    seq, micro = opts.pop("seq", 64), opts.pop("microbatch", 8)
    if not isinstance(seq, int) or not isinstance(micro, int) or seq < 1 or micro < 1:
        raise PipeplanError(f"model spec {spec!r}: seq and microbatch must be positive integers")
    return arch, opts, seq, micro


#: Per architecture, the config keys of its shape: what is checked before anything is built.
_SHAPE = {"gpt2": {"layers": "n_layer", "width": "n_embd", "heads": "n_head", "ffn": "n_inner",
                   "vocab": "vocab_size", "positions": "n_positions", "activation": "activation_function"},
          "bert": {"layers": "num_hidden_layers", "width": "hidden_size", "heads": "num_attention_heads",
                   "ffn": "intermediate_size", "vocab": "vocab_size", "positions": "max_position_embeddings",
                   "activation": "hidden_act"}}


def _check_types(opts: dict, defaults: object, spec: str) -> None:
    """Each setting has the type of the config's default (an integer where it is one)."""
    for key, value in opts.items():
        default = getattr(defaults, key)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif isinstance(default, str):
            ok = isinstance(value, str)
        else:
            ok = True  # None by default (n_inner): checked with the shape
        if not ok:
            raise PipeplanError(f"model spec {spec!r}: {key}={value} must be {type(default).__name__}, like its "
                                f"default {default!r}")


def _check_shape(arch: str, cfg: dict, seq: int, micro: int, spec: str) -> None:
    """Sizes positive, heads dividing the width, a known activation, the sequence within the
    positions, and the model and its input within what pipeplan builds (limits.py)."""
    keys = _SHAPE[arch]
    size = {role: cfg[keys[role]] for role in ("layers", "width", "heads", "vocab", "positions", "ffn")}
    for role, value in size.items():
        if value is None and role == "ffn":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PipeplanError(f"model spec {spec!r}: {keys[role]} must be a positive integer, got {value!r}")
    if size["width"] % size["heads"]:
        raise PipeplanError(f"model spec {spec!r}: {keys['width']}={size['width']} is not a multiple of "
                            f"{keys['heads']}={size['heads']}")
    from transformers.activations import ACT2FN

    if cfg[keys["activation"]] not in ACT2FN:
        raise PipeplanError(f"model spec {spec!r}: unknown {keys['activation']} {cfg[keys['activation']]!r} "
                            f"(known: {', '.join(sorted(ACT2FN))})")
    if seq > size["positions"]:
        raise PipeplanError(f"model spec {spec!r}: seq={seq} is beyond the model's {size['positions']} positions "
                            f"({keys['positions']})")
    width, ffn = size["width"], size["ffn"] or 4 * size["width"]
    check_layers(size["layers"] + 3, f"model spec {spec!r}")  # + embeddings, final norm, head
    check_built_parameters(size["layers"] * (4 * width * width + 2 * width * ffn)
                           + (2 * size["vocab"] + size["positions"]) * width, f"model spec {spec!r}")
    check_input_bytes(8 * micro * seq, f"model spec {spec!r}")


def _config(arch: str, opts: dict, spec: str, seq: int, micro: int):
    try:
        import transformers
    except ImportError:
        raise PipeplanError(f"model spec {spec!r} needs Hugging Face transformers "
                            "(pip install 'pipeplan[hf]')") from None
    cls = transformers.GPT2Config if arch == "gpt2" else transformers.BertConfig
    base = {**_SMALL[arch], **{k: 0.0 for k in _DROPOUT[arch]}, "tie_word_embeddings": False, "use_cache": False}
    defaults = cls()
    unknown = [k for k in opts if not hasattr(defaults, k)]
    if unknown:
        raise PipeplanError(f"model spec {spec!r}: {cls.__name__} has no setting {unknown[0]!r}")
    _check_types(opts, defaults, spec)
    settings = {**base, **opts}
    _check_shape(arch, {**{k: getattr(defaults, k) for k in _SHAPE[arch].values()}, **settings}, seq, micro, spec)
    try:
        return transformers, cls(**settings)
    except Exception as e:  # noqa: BLE001 (transformers' validation: one line)
        raise PipeplanError(f"model spec {spec!r}: {cls.__name__} refuses these settings "
                            f"({(str(e).strip().splitlines() or [type(e).__name__])[-1].strip()})") from None


def hf_model(spec: str) -> tuple[nn.Module, torch.Tensor]:
    arch, opts, seq, micro = parse_spec(spec)
    tf, cfg = _config(arch, opts, spec, seq, micro)
    if arch == "gpt2":
        lm = tf.GPT2LMHeadModel(cfg)
        t = lm.transformer
        layers = [GPT2Embed(t.wte, t.wpe, t.drop), *t.h, t.ln_f, lm.lm_head]
    else:
        lm = tf.BertForMaskedLM(cfg)
        layers = [lm.bert.embeddings, *lm.bert.encoder.layer, lm.cls]
    ids = torch.randint(0, cfg.vocab_size, (micro, seq))
    return nn.Sequential(*layers), ids
