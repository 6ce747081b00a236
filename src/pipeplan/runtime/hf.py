"""Hugging Face ``transformers`` models from a config, with random weights and no download:
``hf:gpt2?n_layer=4&n_embd=256``, ``hf:bert?num_hidden_layers=2&hidden_size=128`` or
``hf:llama?hidden_size=64&num_hidden_layers=4&...``.

The model is ``transformers``' own modules laid out as an ``nn.Sequential``: the embeddings,
each transformer block (``GPT2Block``, ``BertLayer``, ``LlamaDecoderLayer``), the final norm
and the language-model head, so its layers are the blocks and every cut between them runs.
Query keys set the config (integers, numbers, true/false); ``seq`` is the sequence length
(default 64) and ``microbatch`` the example microbatch (default 8).

A Llama is the model the analytic graph of the same spec describes (``graph/hf_config.py``):
transformers' defaults for what the spec does not set, ``seq`` by default the graph's
(4,096 or the model's positions if fewer), ``microbatch`` 1, and layers named as the graph's
nodes, ``embed``, ``layer0`` ... ``layer{L-1}``, ``head`` (final norm and output), so a plan
made on the graph runs on it. Each decoder layer computes its rotary embedding itself and
attends causally (torch's scaled-dot-product attention, no mask tensor). Defaults that training on separate
processes needs: no dropout (``--check`` compares exactly), untied input and output
embeddings (free to go to different stages; ``tie_word_embeddings=true`` ties them, and
every plan then keeps the embeddings and the head in one stage), ``use_cache=False``.
Settings are checked before anything is built (``_check_types``, ``_check_shape``). The
input is token ids; the loss is the runtime's, squared error on the logits."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ..errors import PipeplanError
from ..readers import parse_query
from ..graph.hf_config import DEFAULT_SEQ, default_seq
from ..graph.hf_config import config_value as _value
from ..limits import check_built_parameters, check_input_bytes, check_layers

_ARCHS = ("gpt2", "bert", "llama")
_DROPOUT = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
            "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"), "llama": ("attention_dropout",)}
_SMALL = {"gpt2": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000, "n_positions": 256,
                  "bos_token_id": 0, "eos_token_id": 0},
          "bert": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                   "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 256},
          "llama": {}}  # the analytic graph's: transformers' defaults


class LlamaBlock(nn.Module):
    """A ``LlamaDecoderLayer`` with its own rotary embedding: ``LlamaModel.forward``'s loop
    body for one layer, positions 0 ... seq-1 and no mask (causal attention)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        return self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=self.rotary(x, pos))


class LlamaHead(nn.Module):
    """The final RMSNorm and the output projection."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


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
    opts = {k: _value(v) for k, v in parse_query(query, f"model spec {spec!r}", strict=False).items()}
    seq, micro = opts.pop("seq", None if arch == "llama" else 64), opts.pop("microbatch", 1 if arch == "llama" else 8)
    if seq is None:  # the analytic graph's default (graph/hf_config.py)
        from transformers import LlamaConfig

        positions = opts.get("max_position_embeddings", LlamaConfig().max_position_embeddings)
        seq = default_seq(positions) if isinstance(positions, int) else DEFAULT_SEQ
    if not isinstance(seq, int) or not isinstance(micro, int) or seq < 1 or micro < 1:
        raise PipeplanError(f"model spec {spec!r}: seq and microbatch must be positive integers")
    return arch, opts, seq, micro


#: Per architecture, the config keys of its shape: what is checked before anything is built.
_SHAPE = {"gpt2": {"layers": "n_layer", "width": "n_embd", "heads": "n_head", "ffn": "n_inner",
                   "vocab": "vocab_size", "positions": "n_positions", "activation": "activation_function"},
          "bert": {"layers": "num_hidden_layers", "width": "hidden_size", "heads": "num_attention_heads",
                   "ffn": "intermediate_size", "vocab": "vocab_size", "positions": "max_position_embeddings",
                   "activation": "hidden_act"},
          "llama": {"layers": "num_hidden_layers", "width": "hidden_size", "heads": "num_attention_heads",
                    "ffn": "intermediate_size", "vocab": "vocab_size", "positions": "max_position_embeddings",
                    "activation": "hidden_act", "kv_heads": "num_key_value_heads"}}
#: weight matrices of the width x ffn size in a block's MLP
_MLP_MATRICES = {"gpt2": 2, "bert": 2, "llama": 3}


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
    kv = cfg.get(keys.get("kv_heads", ""))
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or size["heads"] % kv):
        raise PipeplanError(f"model spec {spec!r}: {keys['kv_heads']} must be a positive integer dividing "
                            f"{keys['heads']}={size['heads']}, got {kv!r}")
    from transformers.activations import ACT2FN

    if cfg[keys["activation"]] not in ACT2FN:
        raise PipeplanError(f"model spec {spec!r}: unknown {keys['activation']} {cfg[keys['activation']]!r} "
                            f"(known: {', '.join(sorted(ACT2FN))})")
    if seq > size["positions"]:
        raise PipeplanError(f"model spec {spec!r}: seq={seq} is beyond the model's {size['positions']} positions "
                            f"({keys['positions']})")
    width, ffn = size["width"], size["ffn"] or 4 * size["width"]
    check_layers(size["layers"] + 3, f"model spec {spec!r}")  # + embeddings, final norm, head
    check_built_parameters(size["layers"] * (4 * width * width + _MLP_MATRICES[arch] * width * ffn)
                           + (2 * size["vocab"] + size["positions"]) * width, f"model spec {spec!r}")
    check_input_bytes(8 * micro * seq, f"model spec {spec!r}")


def _config(arch: str, opts: dict, spec: str, seq: int, micro: int):
    try:
        import transformers
    except ImportError:
        raise PipeplanError(f"model spec {spec!r} needs Hugging Face transformers "
                            "(pip install 'pipeplan[hf]')") from None
    cls = {"gpt2": transformers.GPT2Config, "bert": transformers.BertConfig, "llama": transformers.LlamaConfig}[arch]
    base = {**_SMALL[arch], **{k: 0.0 for k in _DROPOUT[arch]}, "tie_word_embeddings": False, "use_cache": False}
    defaults = cls()
    unknown = [k for k in opts if not hasattr(defaults, k)]
    if unknown:
        raise PipeplanError(f"model spec {spec!r}: {cls.__name__} has no setting {unknown[0]!r}")
    _check_types(opts, defaults, spec)
    settings = {**base, **opts}
    _check_shape(arch, {**{k: getattr(defaults, k) for k in _SHAPE[arch].values()}, **settings}, seq, micro, spec)
    try:
        cfg = cls(**settings)
        if arch == "llama":  # torch's scaled-dot-product attention: causal without a mask tensor
            cfg._attn_implementation = "sdpa"
        return transformers, cfg
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
    elif arch == "bert":
        lm = tf.BertForMaskedLM(cfg)
        layers = [lm.bert.embeddings, *lm.bert.encoder.layer, lm.cls]
    else:
        return _llama(tf, cfg), torch.randint(0, cfg.vocab_size, (micro, seq))
    ids = torch.randint(0, cfg.vocab_size, (micro, seq))
    return nn.Sequential(*layers), ids


def _llama(tf, cfg) -> nn.Sequential:
    """``embed``, ``layer0`` ... ``layer{L-1}``, ``head``: the analytic graph's node names."""
    lm = tf.LlamaForCausalLM(cfg)
    m = lm.model
    layers = {f"layer{i}": LlamaBlock(layer, tf.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg))
              for i, layer in enumerate(m.layers)}
    return nn.Sequential(OrderedDict(embed=m.embed_tokens, **layers, head=LlamaHead(m.norm, lm.lm_head)))


#: the analytic graph's decoder dimensions (``meta["decoder"]``) by a Llama config's keys
_DECODER_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                 "kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
                 "tied": "tie_word_embeddings"}


def decoder_mismatch(spec: str, decoder: dict) -> str | None:
    """How the model of ``spec`` differs from the decoder a plan was made for (its graph's
    ``meta["decoder"]``), in words, or None: a plan made on another model's graph runs no
    layer it was priced for."""
    arch, opts, seq, micro = parse_spec(spec)
    if arch != "llama":
        return (f"the plan is for a decoder's analytic graph, whose nodes are named as hf:llama's layers, not "
                f"hf:{arch}'s")
    _, cfg = _config(arch, opts, spec, seq, micro)
    ours = {**{k: getattr(cfg, key) for k, key in _DECODER_KEYS.items()}, "seq": seq}
    for key, value in ours.items():
        if key in decoder and decoder[key] != value:
            name = _DECODER_KEYS.get(key, "seq")
            return f"the plan's model has {key} {decoder[key]!r}, this one {value!r} (set {name}= in the spec)"
    return None
