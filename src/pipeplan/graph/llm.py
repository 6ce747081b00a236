"""Decoder-only transformer LLMs as graphs (docs/llm.md): ``build_graph`` turns a
``DecoderSpec`` (``llm/spec.py``) into a chain of embedding, layers and head costed on an H100
(``llm/costs.py``); ``zoo:`` presets and ``zoo:gpt?...``."""

from __future__ import annotations

from ..errors import PipeplanError
from ..limits import check_decoder, check_layers
from ..llm.costs import H100_SPEED, REFERENCE, REFERENCE_DEVICE, Rates, embedding_compute_s, head_compute_s, layer_compute_s
from ..llm.experts import ExpertCut, copies, experts_activation_bytes, experts_compute_s
from ..llm.spec import BF16, PRESETS, DecoderSpec, gpt
from .model import Graph, NodeSpec


# -- the model graph ------------------------------------------------------------------------------
def build_graph(spec: DecoderSpec, microbatch: int, rates: Rates = REFERENCE) -> Graph:
    """A chain: ``embed``, ``layer0`` ... ``layer{L-1}``, ``head``, for one microbatch of
    ``microbatch`` sequences on an H100 (``rates``; in V100-reference seconds, ``H100_SPEED``)
    without tensor or expert parallelism (a mixture's layers with all their experts):
    times, FLOPs, parameters (16-bit bytes: the optimizer's state is the memory model's), the
    hidden state handed on (s x b x h, 16-bit) and what each layer keeps for its backward
    (Korthikanti's count, no recomputation). ``meta["decoder"]`` keeps the dimensions, from
    which costs at other parallel degrees and microbatch sizes are computed
    (``sim.tensor_groups``)."""
    check_decoder("microbatch", microbatch, f"model {spec.name!r}")
    b, hidden_bytes = microbatch, BF16 * microbatch * spec.seq * spec.hidden
    e_f, e_b = (t * H100_SPEED for t in embedding_compute_s(spec, rates, b))
    h_f, h_b = (t * H100_SPEED for t in head_compute_s(spec, rates, b))
    nodes = [NodeSpec("embed", e_f, e_b, BF16 * spec.embedding_params(), hidden_bytes,
                      f"Embedding({spec.vocab}x{spec.hidden})", 0.0)]
    nodes += [_layer_node(spec, i, rates, b) for i in range(spec.layers)]
    nodes.append(NodeSpec("head", h_f, h_b, BF16 * spec.head_params(), 4.0 * b * spec.seq,
                          f"Norm + LMHead({spec.hidden}x{spec.vocab}) + loss", spec.head_flops(b)))
    edges = [(a.id, c.id) for a, c in zip(nodes, nodes[1:])]
    meta = {"source": "llm", "decoder": spec.as_dict(), "microbatch": b, "seq": spec.seq, "precision": "bf16",
            "reference_device": REFERENCE_DEVICE, "published_params": spec.total_params(),
            "backward_input_fraction": 0.5}
    graph = Graph.from_nodes(spec.name, nodes, edges, meta)
    if spec.tied:
        graph.tied["embedding"] = ["embed", "head"]
    return graph


def _layer_node(spec: DecoderSpec, i: int, rates: Rates, b: int) -> NodeSpec:
    """Layer ``i`` on one GPU: a dense layer, or a mixture's with every expert on it."""
    hidden_bytes = BF16 * b * spec.seq * spec.hidden
    if not spec.is_moe_layer(i):
        l_f, l_b, _ = (t * H100_SPEED for t in layer_compute_s(spec, rates, b))
        return NodeSpec(f"layer{i}", l_f, l_b, BF16 * spec.layer_params(), hidden_bytes,
                        f"DecoderLayer(h={spec.hidden}, heads={spec.heads}/{spec.kv_heads}, ffn={spec.ffn})",
                        spec.layer_flops(b), saved=spec.layer_activation_bytes(b))
    whole = ExpertCut()
    n = copies(spec, b, 1, 1, whole)
    f, bw, _ = layer_compute_s(spec, rates, b, moe=True)
    e_f, e_b = experts_compute_s(spec, rates, n, whole)
    saved = spec.layer_activation_bytes(b, moe=True) + experts_activation_bytes(spec, b, 1, 1, whole, "none")
    return NodeSpec(f"layer{i}", (f + e_f) * H100_SPEED, (bw + e_b) * H100_SPEED, BF16 * spec.moe_layer_params(),
                    hidden_bytes, f"MoELayer(h={spec.hidden}, experts={spec.experts} x {spec.expert_ffn}, "
                    f"top {spec.top_k}, shared {spec.shared_ffn})", spec.layer_flops(b, True), saved=saved)


# -- zoo:NAME?key=value ---------------------------------------------------------------------------
#: ``zoo:gpt?...``: a GPT-3-style decoder of any size; hidden, layers and heads are required
GPT_OPTIONS = ("hidden", "layers", "heads", "seq", "vocab", "ffn", "kv_heads", "microbatch")
PRESET_OPTIONS = ("seq", "layers", "microbatch")
DESCRIPTIONS = {
    "gpt": "GPT-3-style decoder (Brown et al. 2020) of any size: zoo:gpt?hidden=H&layers=L&heads=A"
           "[&seq=2048&vocab=51200&ffn=4H&kv_heads=A&microbatch=1]",
    "gpt3-175b": "GPT-3 175B (Brown et al. 2020): 96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200",
    "llama3-8b": "Llama 3 8B (Dubey et al. 2024): 32 layers, hidden 4096, 32 heads (8 KV), ffn 14336, SwiGLU",
    "llama3-70b": "Llama 3 70B (Dubey et al. 2024): 80 layers, hidden 8192, 64 heads (8 KV), ffn 28672, SwiGLU",
    "llama3-405b": "Llama 3 405B (Dubey et al. 2024): 126 layers, hidden 16384, 128 heads (8 KV), ffn 53248, SwiGLU",
    "mixtral-8x7b": "Mixtral 8x7B (Jiang et al. 2024): 32 layers, hidden 4096, 8 experts of 14336, 2 a token",
    "mixtral-8x22b": "Mixtral 8x22B: 56 layers, hidden 6144, 8 experts of 16384, 2 a token",
    "qwen3-30b-a3b": "Qwen3-30B-A3B: 48 layers, hidden 2048, 128 experts of 768, 8 a token",
    "qwen3-235b-a22b": "Qwen3-235B-A22B: 94 layers, hidden 4096, 128 experts of 1536, 8 a token",
    "deepseek-v3": "DeepSeek-V3 (DeepSeek-AI 2024): 61 layers (3 dense), hidden 7168, latent attention, 256 "
                   "experts of 2048 + 1 shared, 8 a token",
}


def describe() -> list[dict]:
    """``pipeplan models`` entries (as ``zoo.describe``), ``family`` ``llm``."""
    out = []
    for name, text in DESCRIPTIONS.items():
        defaults = {"microbatch": 1} if name == "gpt" else {"seq": PRESETS[name].seq, "microbatch": 1}
        params = None if name == "gpt" else PRESETS[name].total_params()
        entry = {"name": name, "description": text, "defaults": defaults, "granularities": ["layer"],
                 "published_params": params, "family": "llm"}
        if name != "gpt" and PRESETS[name].moe:
            entry["active_params"] = PRESETS[name].active_params()
        out.append(entry)
    return out


def _positive(name: str, key: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise PipeplanError(f"zoo model {name!r}: option {key!r} must be an integer >= 1, got {raw!r}")
    return value


def from_zoo(name: str, options: dict[str, str]) -> Graph:
    """``zoo:gpt?...`` or a preset (``zoo:llama3-70b?seq=4096&microbatch=2``) as a graph."""
    allowed = GPT_OPTIONS if name == "gpt" else PRESET_OPTIONS
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise PipeplanError(f"zoo model {name!r}: unknown option {unknown[0]!r} (known: {', '.join(allowed)})")
    opts = {k: _positive(name, k, v) for k, v in options.items()}
    microbatch = opts.pop("microbatch", 1)
    if "layers" in opts:
        check_layers(opts["layers"], f"zoo model {name!r}")
    if name == "gpt":
        missing = [k for k in ("hidden", "layers", "heads") if k not in opts]
        if missing:
            raise PipeplanError(f"zoo model 'gpt': give {', '.join(missing)} (zoo:gpt?hidden=H&layers=L&heads=A)")
        spec = gpt("gpt", **opts)
    else:
        from dataclasses import replace

        spec = replace(PRESETS[name], **opts)
    return build_graph(spec, microbatch)
