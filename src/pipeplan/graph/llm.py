"""Decoder-only transformer LLMs (GPT-3-style, Llama 2/3, Mistral, Qwen): dimensions ->
parameters, FLOPs and activation bytes per layer, in closed form (docs/llm.md).

- Parameters: attention (queries h x h, keys and values h x kv each with grouped-query
  attention, output h x h), MLP (2 matrices h x ffn, or 3 with a gated SwiGLU MLP), two norms
  per layer (LayerNorm: weight + bias; RMSNorm: weight), biases where the model has them, the
  token embedding (+ learned positions), a final norm and the LM head (none when tied).
  With GPT-3's layout this is Narayanan et al. 2021's Eq. 2, 12lh^2(1 + 13/12h + (V+s)/12lh).
- FLOPs of one microbatch's forward (a multiply-add is 2): the four projections, the
  attention scores QK^T and their product with V (2 x 2bs^2h, the causal mask not exploited,
  as Megatron counts) and the MLP; the LM head 2bshV. Backward is 2 x forward; full
  recomputation adds a layer's forward, selective recomputation (Korthikanti et al. 2022 §5)
  the attention core's. With GPT-3's layout a layer's forward is 24bsh^2 + 4bs^2h
  (Narayanan et al. 2021, Appendix).
- Activation bytes one layer keeps for its backward (16-bit tensors, 1-byte dropout masks):
  Korthikanti et al. 2022 §4, generalized to grouped-query attention, gated MLPs, models
  without dropout and fused (flash) attention, which keeps no s x s matrix. With GPT-3's
  layout it is their Eq. 1, sbh(34 + 5as/h); tensor parallelism t divides all but the
  norms, the dropout masks after attention and MLP and the inputs of the QKV and first MLP
  matrices (Eq. 2, 10sbh replicated); sequence parallelism divides those too (Eq. 4);
  selective recomputation drops the attention core; full recomputation keeps the layer's
  input, 2sbh.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import PipeplanError
from ..limits import check_layers
from .model import Graph, NodeSpec

BF16 = 2  # bytes of a 16-bit activation, weight or gradient
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class DecoderSpec:
    """A decoder-only transformer's dimensions. ``ffn``: the MLP's intermediate size;
    ``kv_heads``: key/value heads (grouped-query attention; = ``heads`` without it);
    ``gated``: a SwiGLU MLP (3 matrices); ``tied``: the LM head shares the embedding table;
    ``norm``: ``layernorm`` or ``rmsnorm``; ``positions``: ``learned`` (a seq x hidden table)
    or ``rope``; ``dropout``: the layer keeps dropout masks; ``flash``: fused attention;
    ``qkv_bias``: without ``bias``, biases on the query, key and value projections alone."""

    name: str
    hidden: int
    layers: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    kv_heads: int
    gated: bool = False
    tied: bool = False
    norm: str = "layernorm"
    bias: bool = True
    positions: str = "learned"
    dropout: bool = True
    flash: bool = False
    qkv_bias: bool = False  # biases on the query, key and value projections only (Qwen2)

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for key in ("hidden", "layers", "heads", "seq", "vocab", "ffn", "kv_heads"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PipeplanError(f"{where}: {key} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise PipeplanError(f"{where}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise PipeplanError(f"{where}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise PipeplanError(f"{where}: norm must be layernorm or rmsnorm, got {self.norm!r}")
        if self.positions not in ("learned", "rope"):
            raise PipeplanError(f"{where}: positions must be learned or rope, got {self.positions!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def kv_rank(self, tp: int) -> int:
        """Width of the keys (and of the values) one of ``tp`` tensor-parallel ranks holds: its
        1 / tp of the key/value heads, or with more ranks than key/value heads one head,
        replicated tp / kv_heads times (Megatron-core takes num_query_groups a divisor or a
        multiple of TP, docs/megatron-rules.md)."""
        if self.kv_heads % tp == 0:
            return self.kv_dim // tp
        if tp % self.kv_heads == 0:
            return self.head_dim
        raise PipeplanError(f"model {self.name!r}: {self.kv_heads} key/value heads neither split over nor replicate "
                            f"onto {tp} tensor-parallel ranks")

    def kv_replicated_params(self, tp: int) -> int:
        """Parameters a layer's ``tp`` ranks hold beyond its own (key/value heads replicated)."""
        return 2 * self.hidden * (tp * self.kv_rank(tp) - self.kv_dim)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    # -- parameters (counts) ------------------------------------------------------------------
    def _norm_params(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def layer_params(self) -> int:
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        weights = h * (h + 2 * kv) + h * h + self.mlp_matrices * h * f
        biases = (h + 2 * kv) + h + (self.mlp_matrices - 1) * f + h if self.bias else (h + 2 * kv) * self.qkv_bias
        return weights + biases + 2 * self._norm_params()

    def embedding_params(self) -> int:
        """Token table (+ learned positions)."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.positions == "learned" else 0)

    def head_params(self) -> int:
        """The final norm and, unless tied to the embedding, the LM head."""
        return self._norm_params() + (0 if self.tied else self.vocab * self.hidden)

    def total_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    # -- FLOPs of one microbatch of ``samples`` sequences ---------------------------------------
    def attention_core_flops(self, samples: int) -> float:
        """QK^T and the product with V, forward: 2 x 2bs^2h."""
        return 4.0 * samples * self.seq * self.seq * self.hidden

    def layer_flops(self, samples: int) -> float:
        """One layer's forward."""
        h, kv, tokens = self.hidden, self.kv_dim, samples * self.seq
        proj = 2.0 * tokens * h * (h + 2 * kv) + 2.0 * tokens * h * h
        mlp = 2.0 * tokens * h * self.ffn * self.mlp_matrices
        return proj + mlp + self.attention_core_flops(samples)

    def head_flops(self, samples: int) -> float:
        """The LM head's forward: 2bshV."""
        return 2.0 * samples * self.seq * self.hidden * self.vocab

    def layer_training_flops(self, samples: int, recompute: str = "none") -> float:
        """Forward + backward (2 x forward) + what ``recompute`` runs again."""
        again = {"none": 0.0, "selective": self.attention_core_flops(samples),
                 "full": self.layer_flops(samples)}[_recompute(recompute)]
        return 3.0 * self.layer_flops(samples) + again

    def model_flops_per_sample(self) -> float:
        """Forward + backward of one sample, no recomputation: the FLOPs MFU counts."""
        return 3.0 * (self.layers * self.layer_flops(1) + self.head_flops(1))

    # -- activation memory (bytes one layer keeps for its backward) ----------------------------
    def layer_activation_bytes(self, samples: int, tp: int = 1, sp: bool = False,
                               recompute: str = "none") -> float:
        """Korthikanti et al. 2022 §4 for this layer's layout (module docstring)."""
        rc = _recompute(recompute)
        s, b, h, f = self.seq, samples, self.hidden, self.ffn
        sbh = s * b * h
        if rc == "full":
            return BF16 * sbh / (tp if sp else 1)
        mask = 1 if self.dropout else 0
        # kept whole on every rank of a tensor-parallel group unless sequence-parallel:
        # the two norms' inputs, the QKV and first MLP matrices' inputs, the two dropout masks
        replicated = 2 * BF16 * sbh + 2 * BF16 * sbh + 2 * mask * sbh
        # divided over the group: Q and K for the scores, V, the output projection's input,
        # the MLP's intermediate tensors, the attention core
        split = BF16 * sbh + BF16 * sbh  # Q, the output projection's input
        split += (3 if self.gated else 2) * BF16 * s * b * f
        if rc == "none":
            split += self.attention_core_bytes(samples)
        keys_values = 2 * BF16 * s * b * self.kv_rank(tp)  # K and V: a rank's share, or a replicated head
        return replicated / (tp if sp else 1) + split / tp + keys_values

    def attention_core_bytes(self, samples: int) -> float:
        """What the attention core keeps besides Q, K, V and its output: the softmax output
        (and its dropout mask and dropped-out copy) per head, s x s each; a fused (flash)
        kernel keeps each row's log-sum-exp (fp32) instead."""
        s, b, a = self.seq, samples, self.heads
        if self.flash:
            return 4 * b * a * s
        return (BF16 + (1 + BF16 if self.dropout else 0)) * a * s * s * b

    def attention_core_traffic(self, samples: int, backward: bool = False) -> float:
        """Bytes an unfused attention core moves through memory, per s x s score of each head.
        Forward: the scores written (2), a fused scale-mask-softmax reading and writing them
        (4), with dropout its read, write and mask (5), and the product with V reading the
        probabilities (2). Backward: the probabilities read for dV (2), dP written (2), with
        dropout its backward reading dP and the mask and writing (5), the softmax backward
        reading P and dP and writing dS (6), dS read by the dQ and dK products (4). A fused
        (flash) kernel keeps them on chip (0)."""
        if self.flash:
            return 0.0
        drop = 5 if self.dropout else 0
        per_score = (2 + 2 + drop + 6 + 4) if backward else (2 + 4 + drop + 2)
        return float(per_score * samples * self.heads * self.seq * self.seq)

    def as_dict(self) -> dict:
        return asdict(self)


def decoder_of(meta: dict, where: str = "model") -> DecoderSpec:
    """The ``DecoderSpec`` a graph's ``meta["decoder"]`` records, or one line on what is wrong."""
    d = meta.get("decoder")
    if not isinstance(d, dict):
        raise PipeplanError(f"{where}: meta 'decoder' must be an object of a decoder's dimensions, got {d!r}")
    known = {f.name: f.type for f in fields(DecoderSpec)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise PipeplanError(f"{where}: meta 'decoder' has unknown key {unknown[0]!r}")
    missing = [k for k in ("name", "hidden", "layers", "heads", "seq", "vocab", "ffn", "kv_heads") if k not in d]
    if missing:
        raise PipeplanError(f"{where}: meta 'decoder' lacks {missing[0]!r}")
    for key, kind in known.items():
        want = {"bool": bool, "str": str}.get(str(kind))
        if key in d and want is not None and not isinstance(d[key], want):
            raise PipeplanError(f"{where}: meta 'decoder' {key!r} must be {'true or false' if want is bool else 'a string'}"
                                f", got {d[key]!r}")
    return DecoderSpec(**d)


def _recompute(value: str) -> str:
    if value not in RECOMPUTE:
        raise PipeplanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {value!r}")
    return value


def gpt(name: str, hidden: int, layers: int, heads: int, seq: int = 2048, vocab: int = 51200,
        ffn: int | None = None, kv_heads: int | None = None) -> DecoderSpec:
    """A GPT-3-style decoder (Brown et al. 2020; Megatron-LM's GPT): LayerNorm, biases,
    learned positions, GELU MLP of 4 x hidden, dropout, tied embedding and LM head."""
    return DecoderSpec(name, hidden, layers, heads, seq, vocab, ffn or 4 * hidden, kv_heads or heads,
                       tied=True)


def llama(name: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int = 128256,
          seq: int = 8192) -> DecoderSpec:
    """A Llama-style decoder (Touvron et al. 2023; Llama 3, Dubey et al. 2024): RMSNorm, no
    biases, rotary positions, SwiGLU MLP, grouped-query attention, no dropout, fused attention,
    an LM head of its own."""
    return DecoderSpec(name, hidden, layers, heads, seq, vocab, ffn, kv_heads, gated=True, tied=False,
                       norm="rmsnorm", bias=False, positions="rope", dropout=False, flash=True)


#: Published dimensions. GPT-3 175B: Brown et al. 2020, Table 2.1 (Narayanan et al. 2021 use
#: vocab 51,200); Llama 3: Dubey et al. 2024, Table 3, vocabulary 128,256 as released.
PRESETS: dict[str, DecoderSpec] = {s.name: s for s in (
    gpt("gpt3-175b", 12288, 96, 96),
    llama("llama3-8b", 4096, 32, 32, 8, 14336),
    llama("llama3-70b", 8192, 80, 64, 8, 28672),
    llama("llama3-405b", 16384, 126, 128, 8, 53248),
)}


# -- compute time on a GPU (bf16) ---------------------------------------------------------------
@dataclass(frozen=True)
class Rates:
    """A GPU's bf16 rates: a GEMM of F FLOPs takes F / (peak x gemm_efficiency) +
    gemm_overhead_s; memory-bound ops move bytes at ``hbm`` bytes/s."""

    peak: float
    gemm_efficiency: float
    gemm_overhead_s: float
    hbm: float

    def gemm_s(self, flops: float) -> float:
        return flops / (self.peak * self.gemm_efficiency) + self.gemm_overhead_s


#: The device LLM graphs are costed on: an H100 SXM, with the rates cluster/kinds.py gives the
#: H100-SXM kind (measured on a lent one, docs/llm.md).
REFERENCE_DEVICE = "H100-SXM"
REFERENCE = Rates(989e12, 0.708, 17e-6, 3350e9)
#: Graph times are for the simulator's reference device, a V100 (speed 1): an H100's time x the
#: H100-SXM kind's speed (67 / 15.7, cluster/kinds.py), so that the simulator, dividing by a
#: device's speed, gives the H100's time back on H100s (docs/llm.md: other kinds are priced by
#: their FP32 ratio until stage costs come from each kind's own rates)
H100_SPEED = 67.0 / 15.7


def _gemm_flops(spec: DecoderSpec, tokens: int, tp: int) -> list[float]:
    """FLOPs of each forward GEMM of one of ``tp`` ranks: QKV and the MLP's first matrices
    (gate and up fused for SwiGLU) split by columns (keys and values: ``kv_rank``, replicated
    where the ranks outnumber the key/value heads), the output projection and the MLP's last
    matrix by rows (Megatron-LM, Shoeybi et al. 2019 §3)."""
    h, f = spec.hidden, spec.ffn
    first = (2 if spec.gated else 1) * f
    return [2.0 * tokens * h * (h / tp + 2 * spec.kv_rank(tp)), 2.0 * tokens * h * h / tp,
            2.0 * tokens * h * first / tp, 2.0 * tokens * f * h / tp]


def _elementwise_bytes(spec: DecoderSpec, tokens: int, backward: bool = False) -> tuple[float, float]:
    """Bytes a layer's memory-bound ops read and write (16-bit values, 1-byte masks), as
    (replicated over a tensor-parallel group unless sequence-parallel, split over it).
    Replicated, forward: two norms (read x, write y), two residual adds (read 2, write 1),
    with dropout two dropouts (read, write, the mask); backward: the norms read x and dy and
    write dx, the residual branches' gradients are added (read 2, write 1), the dropouts read
    dy and the mask and write dx. Split: the MLP's activation, forward GELU read and write ffn
    wide (SwiGLU: read gate and up, write their product); backward GELU reads x and dy and
    writes dx (SwiGLU: reads gate, up and dy, writes both gradients)."""
    h, f = spec.hidden, spec.ffn
    norm, add, drop = ((3, 3, 2 * BF16 + 1) if backward else (2, 3, 2 * BF16 + 1))
    replicated = 2 * norm * BF16 * h + 2 * add * BF16 * h + (2 * drop * h if spec.dropout else 0)
    split = ((5 if spec.gated else 3) if backward else (3 if spec.gated else 2)) * BF16 * f
    return tokens * float(replicated), tokens * float(split)


def layer_compute_s(spec: DecoderSpec, rates: Rates, samples: int, tp: int = 1,
                    sp: bool = False) -> tuple[float, float, float]:
    """(forward, backward, attention core's forward) seconds of one layer on one of ``tp``
    ranks: its GEMMs (backward: the input and weight gradients, a GEMM of the same size each),
    the attention core (its FLOPs at the GEMM efficiency, backward 2 x, and, unfused, its
    scores' memory traffic each way, ``attention_core_traffic``) and the memory-bound ops
    (``_elementwise_bytes`` each way; those outside the MLP divided over the ranks only with
    sequence parallelism)."""
    tokens = samples * spec.seq
    gemm = sum(rates.gemm_s(f) for f in _gemm_flops(spec, tokens, tp))
    core_flops = spec.attention_core_flops(samples) / (rates.peak * rates.gemm_efficiency) / tp
    core = core_flops + spec.attention_core_traffic(samples) / rates.hbm / tp
    core_bwd = 2 * core_flops + spec.attention_core_traffic(samples, backward=True) / rates.hbm / tp
    passes = []
    for backward in (False, True):
        replicated, split = _elementwise_bytes(spec, tokens, backward)
        passes.append((replicated / (tp if sp else 1) + split / tp) / rates.hbm)
    return gemm + core + passes[0], 2 * gemm + core_bwd + passes[1], core


def head_compute_s(spec: DecoderSpec, rates: Rates, samples: int, tp: int = 1) -> tuple[float, float]:
    """(forward, backward) of the final norm, the LM head's GEMM (its vocabulary split over the
    ranks) and the cross-entropy over fp32 logits (memory-bound)."""
    tokens = samples * spec.seq
    logits = tokens * spec.vocab / tp * (BF16 + 2 * 4)  # write 16-bit logits, read and write fp32 ones
    fwd = rates.gemm_s(spec.head_flops(samples) / tp) + (logits + 2 * BF16 * tokens * spec.hidden) / rates.hbm
    return fwd, 2 * fwd


def embedding_compute_s(spec: DecoderSpec, rates: Rates, samples: int) -> tuple[float, float]:
    """(forward, backward): a table lookup writing s x b x h values; backward adds the output
    gradient into the table's gradient."""
    nbytes = 2 * BF16 * samples * spec.seq * spec.hidden
    return nbytes / rates.hbm, 2 * nbytes / rates.hbm


# -- the model graph ------------------------------------------------------------------------------
def build_graph(spec: DecoderSpec, microbatch: int, rates: Rates = REFERENCE) -> Graph:
    """A chain: ``embed``, ``layer0`` ... ``layer{L-1}``, ``head``, for one microbatch of
    ``microbatch`` sequences on an H100 (``rates``; in V100-reference seconds, ``H100_SPEED``)
    without tensor parallelism:
    times, FLOPs, parameters (16-bit bytes: the optimizer's state is the memory model's), the
    hidden state handed on (s x b x h, 16-bit) and what each layer keeps for its backward
    (Korthikanti's count, no recomputation). ``meta["decoder"]`` keeps the dimensions, from
    which costs at other tensor-parallel degrees and microbatch sizes are computed."""
    b, hidden_bytes = microbatch, BF16 * microbatch * spec.seq * spec.hidden
    e_f, e_b = (t * H100_SPEED for t in embedding_compute_s(spec, rates, b))
    l_f, l_b, _ = (t * H100_SPEED for t in layer_compute_s(spec, rates, b))
    h_f, h_b = (t * H100_SPEED for t in head_compute_s(spec, rates, b))
    nodes = [NodeSpec("embed", e_f, e_b, BF16 * spec.embedding_params(), hidden_bytes,
                      f"Embedding({spec.vocab}x{spec.hidden})", 0.0)]
    nodes += [NodeSpec(f"layer{i}", l_f, l_b, BF16 * spec.layer_params(), hidden_bytes,
                       f"DecoderLayer(h={spec.hidden}, heads={spec.heads}/{spec.kv_heads}, ffn={spec.ffn})",
                       spec.layer_flops(b), saved=spec.layer_activation_bytes(b)) for i in range(spec.layers)]
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
}


def describe() -> list[dict]:
    """``pipeplan models`` entries (as ``zoo.describe``), ``family`` ``llm``."""
    out = []
    for name, text in DESCRIPTIONS.items():
        defaults = {"microbatch": 1} if name == "gpt" else {"seq": PRESETS[name].seq, "microbatch": 1}
        params = None if name == "gpt" else PRESETS[name].total_params()
        out.append({"name": name, "description": text, "defaults": defaults, "granularities": ["layer"],
                    "published_params": params, "family": "llm"})
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
