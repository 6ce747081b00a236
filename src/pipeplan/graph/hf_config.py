"""Decoder LLM graphs from Hugging Face configs, read with ``transformers.AutoConfig`` (no
weights, no download): ``hf:ARCH?key=value&...`` (``AutoConfig.for_model(ARCH, key=value,
...)``, e.g. ``hf:llama?hidden_size=8192&num_hidden_layers=80&...``) or ``hf:PATH`` (a
``config.json`` or the folder holding one). Keys ``seq`` (sequence length, default 4096 or the
model's maximum if smaller) and ``microbatch`` (default 1) are pipeplan's; the others set the
config. Llama, Mistral and Qwen2 (biases on the query, key and value projections) map onto a
Llama-style ``DecoderSpec``, GPT-2 onto a GPT-style one; Qwen3 (its own head size, query and
key norms), and the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V3 (latent
attention, shared experts, dense first layers) onto a ``DecoderSpec`` with those fields (their
parameter counts are known; planning them waits for expert parallelism)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import PipeplanError
from ..readers import parse_query, regular_file
from ..llm.spec import DecoderSpec, gpt
from .llm import build_graph
from .model import Graph

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
DEFAULT_SEQ = 4096


def default_seq(positions: int) -> int:
    """The sequence length a spec without ``seq`` gets: ``DEFAULT_SEQ``, or the model's
    positions if fewer (also the runtime's Llama, ``runtime/hf.py``)."""
    return min(DEFAULT_SEQ, positions) if positions > 0 else DEFAULT_SEQ


def config_value(text: str) -> int | float | bool | str:
    """A query value as a transformers config wants it: an integer, a number, true/false,
    else text (also ``runtime/hf.py``'s)."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


#: The dimensions pipeplan reads, by config family: a config must give them (a file) or the
#: query must set them (``hf:ARCH?...``), never transformers' defaults in silence
_BASE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
NEEDED = {"gpt2": ("n_embd", "n_layer", "n_head", "vocab_size"), **{k: _BASE for k in LLAMA_LIKE},
          "qwen3": (*_BASE, "head_dim"),
          "mixtral": (*_BASE, "num_local_experts", "num_experts_per_tok"),
          "qwen2_moe": (*_BASE, "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size"),
          "qwen3_moe": (*_BASE, "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size"),
          "deepseek_v3": (*_BASE, "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                          "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                          "qk_nope_head_dim", "v_head_dim", "n_group", "topk_group")}


#: keys transformers 5 still reads, under their older names, into a field of another name
#: (``rope_theta`` and ``rope_scaling`` into ``rope_parameters``), as released configs have them
LEGACY_KEYS = {"rope_theta", "rope_scaling"}


def _check_keys(spec: str, cfg, given: set[str], query: bool) -> None:
    """One line for a query key the config does not have (a typo; a released config file may
    carry keys this transformers does not read, e.g. DeepSeek-V3's ``ep_size``), or a dimension
    pipeplan needs that neither the file nor the query gives."""
    import inspect

    known = (set(type(cfg)().to_dict()) | set(getattr(cfg, "attribute_map", {}))  # transformers keeps any key given
             | set(inspect.signature(type(cfg).__init__).parameters) | LEGACY_KEYS)
    unknown = sorted(k for k in given if k not in known)
    if unknown and query:
        raise PipeplanError(f"model {spec!r}: {getattr(cfg, 'model_type', '?')!r} configs have no key {unknown[0]!r}")
    missing = [k for k in NEEDED.get(getattr(cfg, "model_type", ""), ()) if k not in given]
    if missing:
        raise PipeplanError(f"model {spec!r}: the config does not give {', '.join(missing)} (pipeplan plans no "
                            "default dimensions)")


def _given_in_file(folder: Path) -> set[str]:
    """The keys a config.json sets itself (transformers fills in the rest from its defaults)."""
    import json

    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return set()  # AutoConfig has already read it; its own error stands where it could not
    return set(data) if isinstance(data, dict) else set()


def _config(spec: str, body: str, options: dict[str, str]):
    """The config, with transformers' own log lines held back (pipeplan's answer is one line)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return _read_config(spec, body, options)
    finally:
        hf_logging.set_verbosity(level)


def _read_config(spec: str, body: str, options: dict[str, str]):
    from transformers import AutoConfig

    kwargs = {k: config_value(v) for k, v in options.items()}
    path = Path(body)
    try:
        if path.is_dir() or path.suffix == ".json":
            if kwargs:
                raise PipeplanError(f"model {spec!r}: a config file takes only seq= and microbatch=")
            folder = path if path.is_dir() else path.parent
            if path.suffix == ".json" and path.name != "config.json":
                raise PipeplanError(f"model {spec!r}: expected a config.json or the folder holding one")
            regular_file(folder / "config.json", f"model {spec!r}: config")  # not a FIFO, not huge
            cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
            _check_keys(spec, cfg, _given_in_file(folder), query=False)
            return cfg
        cfg = AutoConfig.for_model(body, **kwargs)
        _check_keys(spec, cfg, set(kwargs), query=True)
        return cfg
    except PipeplanError:
        raise
    except Exception as e:  # transformers' many error types: one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipeplanError(f"model {spec!r}: transformers cannot build this config ({reason[:200]})") from None


def rope_base(cfg) -> float:
    """A config's rotary base: ``rope_theta``, or its ``rope_parameters`` (transformers 5)."""
    theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    return float(theta or 10000.0)


def _decoder(spec: str, cfg, seq: int | None) -> DecoderSpec:
    kind = getattr(cfg, "model_type", "?")
    name = spec[len("hf:"):].split("?")[0].rstrip("/").split("/")[-1] or kind
    try:
        if kind == "gpt2":
            return replace(gpt(name, int(cfg.n_embd), int(cfg.n_layer), int(cfg.n_head),
                               seq or default_seq(int(cfg.n_positions)), int(cfg.vocab_size),
                               int(cfg.n_inner or 4 * cfg.n_embd)), norm_eps=float(cfg.layer_norm_epsilon))
        if kind in LLAMA_LIKE:
            heads = int(cfg.num_attention_heads)
            return DecoderSpec(name, int(cfg.hidden_size), int(cfg.num_hidden_layers), heads,
                               seq or default_seq(int(cfg.max_position_embeddings)), int(cfg.vocab_size),
                               int(cfg.intermediate_size), int(getattr(cfg, "num_key_value_heads", None) or heads),
                               gated=True, tied=bool(cfg.tie_word_embeddings), norm="rmsnorm", bias=False,
                               positions="rope", dropout=False, flash=True, qkv_bias=kind in ("qwen2", "qwen2_moe"),
                               rope_base=rope_base(cfg), norm_eps=float(cfg.rms_norm_eps), **_layout(kind, cfg))
    except PipeplanError:
        raise
    except (TypeError, ValueError, AttributeError) as e:
        raise PipeplanError(f"model {spec!r}: the config's dimensions are not usable ({e})") from None
    raise PipeplanError(f"model {spec!r}: {kind!r} configs are not planned (known: gpt2, {', '.join(LLAMA_LIKE)})")


def _layout(kind: str, cfg) -> dict:
    """What a Llama-like config adds to the Llama layout: Qwen3's head size and query/key
    norms; the experts of Mixtral (``num_local_experts`` of ``intermediate_size``), Qwen2/3-MoE
    (``num_experts`` of ``moe_intermediate_size``, Qwen2-MoE's shared expert) and DeepSeek-V3
    (``n_routed_experts``, ``n_shared_experts`` of ``moe_intermediate_size``, the first
    ``first_k_dense_replace`` layers dense, ``n_group``/``topk_group`` routing) and its latent
    attention."""
    out: dict = {}
    if kind in ("qwen3", "qwen3_moe"):
        out.update(head_size=int(cfg.head_dim), qk_norm=True)
    if kind == "mixtral":
        out.update(experts=int(cfg.num_local_experts), top_k=int(cfg.num_experts_per_tok),
                   expert_ffn=int(cfg.intermediate_size))
    if kind in ("qwen2_moe", "qwen3_moe"):
        if getattr(cfg, "mlp_only_layers", None) or int(getattr(cfg, "decoder_sparse_step", 1)) != 1:
            raise PipeplanError(f"{kind}: dense layers between the sparse ones (mlp_only_layers, decoder_sparse_step) "
                                "are not modelled")
        out.update(experts=int(cfg.num_experts), top_k=int(cfg.num_experts_per_tok),
                   expert_ffn=int(cfg.moe_intermediate_size),
                   shared_ffn=int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0))
    if kind == "deepseek_v3":
        out.update(experts=int(cfg.n_routed_experts), top_k=int(cfg.num_experts_per_tok),
                   expert_ffn=int(cfg.moe_intermediate_size),
                   shared_ffn=int(cfg.n_shared_experts) * int(cfg.moe_intermediate_size),
                   dense_layers=int(cfg.first_k_dense_replace), route_groups=int(cfg.n_group),
                   route_group_topk=int(cfg.topk_group), head_size=int(cfg.qk_nope_head_dim),
                   q_lora=int(cfg.q_lora_rank or 0), kv_lora=int(cfg.kv_lora_rank), rope_dim=int(cfg.qk_rope_head_dim),
                   v_head=int(cfg.v_head_dim))
    return out


def from_hf(spec: str) -> Graph:
    """The graph of ``hf:ARCH?...`` or ``hf:PATH`` (module docstring)."""
    body, _, query = spec[len("hf:"):].partition("?")
    options = parse_query(query, f"model {spec!r}")
    ours = {k: options.pop(k) for k in ("seq", "microbatch") if k in options}
    for key, raw in ours.items():
        if not str(raw).isdigit() or int(raw) < 1:
            raise PipeplanError(f"model {spec!r}: {key} must be an integer >= 1, got {raw!r}")
    decoder = _decoder(spec, _config(spec, body.strip(), options), int(ours["seq"]) if "seq" in ours else None)
    return build_graph(decoder, int(ours.get("microbatch", 1)))
