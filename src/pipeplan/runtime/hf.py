"""Hugging Face ``transformers`` models from a config, with random weights and no download:
``hf:gpt2?n_layer=4&n_embd=256`` or ``hf:bert?num_hidden_layers=2&hidden_size=128``.

The model is ``transformers``' own modules laid out as an ``nn.Sequential``: the embeddings,
each transformer block (``GPT2Block``, ``BertLayer``), the final norm and the language-model
head, so its layers are the blocks and every cut between them runs. Query keys set the
config (integers, numbers, true/false); ``seq`` is the sequence length (default 64) and
``microbatch`` the example microbatch (default 8). Defaults that training on separate
processes needs: no dropout (``--check`` compares exactly), untied input and output
embeddings (the runtime does not share a parameter between stages), ``use_cache=False``.
The input is token ids; the loss is the runtime's, squared error on the logits."""

from __future__ import annotations

from urllib.parse import parse_qsl

import torch
from torch import nn

from ..errors import PipeplanError

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


def _value(text: str) -> int | float | bool | str:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


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


def _config(arch: str, opts: dict, spec: str):
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
    return transformers, cls(**{**base, **opts})


def hf_model(spec: str) -> tuple[nn.Module, torch.Tensor]:
    arch, opts, seq, micro = parse_spec(spec)
    tf, cfg = _config(arch, opts, spec)
    if arch == "gpt2":
        lm = tf.GPT2LMHeadModel(cfg)
        t = lm.transformer
        layers = [GPT2Embed(t.wte, t.wpe, t.drop), *t.h, t.ln_f, lm.lm_head]
    else:
        lm = tf.BertForMaskedLM(cfg)
        layers = [lm.bert.embeddings, *lm.bert.encoder.layer, lm.cls]
    ids = torch.randint(0, cfg.vocab_size, (micro, seq))
    return nn.Sequential(*layers), ids
