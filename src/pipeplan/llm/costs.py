"""One transformer layer of a decoder-only LLM on one rank of a tensor-parallel group, for one
microbatch (docs/llm.md): its GEMMs, attention core and memory-bound ops on a device kind, and
the collectives Megatron-LM's tensor parallelism runs (Shoeybi et al. 2019 §3; with sequence
parallelism, Korthikanti et al. 2022 §4.2.2).

- GEMMs: QKV (columns split over the t ranks), the output projection (rows split), the MLP's
  first matrices (gate and up fused for SwiGLU: columns) and its last (rows). A GEMM of F
  FLOPs takes F / (peak x efficiency) + a fixed overhead (the kind's ``gemm_efficiency``,
  ``gemm_overhead_s``); backward runs two GEMMs of the same size per forward GEMM.
- Attention core (QK^T, softmax, x V) of the rank's heads: its FLOPs at the GEMM efficiency;
  backward 2 x, recomputed forward once more under selective or full recomputation.
- Memory-bound ops (norms, activation, dropout, residual adds, biases): the bytes they read
  and write at the kind's HBM bandwidth; divided over the group only with sequence parallelism.
- Tensor-parallel collectives, each of s x b x h 16-bit values: without sequence parallelism,
  an all-reduce after the attention block and one after the MLP in the forward, and one for
  each block's input gradient in the backward (Megatron's g and f operators: 2 + 2 a layer);
  with it, an all-gather before and a reduce-scatter after each block, forward and backward
  alike (4 + 4 of the same bytes). The backward's overlap the QKV and first MLP GEMMs' backward
  (``exposed_backward_comm``); full recomputation runs the forward's again, exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.collectives import collective_s
from ..cluster.kinds import Kind
from ..errors import PipeplanError
from .spec import BF16, DecoderSpec


# -- compute time on a GPU (bf16) ---------------------------------------------------------------
@dataclass(frozen=True)
class Rates:
    """A GPU's bf16 rates: a GEMM of F FLOPs takes F / (peak x gemm_efficiency) +
    gemm_overhead_s; memory-bound ops move bytes at ``hbm`` bytes/s. ``fp8_peak`` > 0: the
    layers' GEMMs run in FP8 (Transformer Engine) at that peak and the same efficiency, the
    attention core and everything else in bf16."""

    peak: float
    gemm_efficiency: float
    gemm_overhead_s: float
    hbm: float
    fp8_peak: float = 0.0

    def gemm_s(self, flops: float) -> float:
        return flops / ((self.fp8_peak or self.peak) * self.gemm_efficiency) + self.gemm_overhead_s


#: The device LLM graphs are costed on: an H100 SXM, with the rates cluster/kinds.py gives the
#: H100-SXM kind (measured on a lent one, docs/llm.md).
REFERENCE_DEVICE = "H100-SXM"
REFERENCE = Rates(989e12, 0.708, 17e-6, 3350e9)
#: Graph times are for the simulator's reference device, a V100 (speed 1): an H100's time x the
#: H100-SXM kind's speed (67 / 15.7, cluster/kinds.py), so that the simulator, dividing by a
#: device's speed, gives the H100's time back on H100s (docs/llm.md: other kinds are priced by
#: their FP32 ratio until stage costs come from each kind's own rates)
H100_SPEED = 67.0 / 15.7


def gemm_flops(spec: DecoderSpec, tokens: int, tp: int, moe: bool = False) -> list[float]:
    """FLOPs of each forward GEMM of one of ``tp`` ranks: QKV and the MLP's first matrices
    (gate and up fused for SwiGLU) split by columns (keys and values: ``kv_rank``, replicated
    where the ranks outnumber the key/value heads), the output projection and the MLP's last
    matrix by rows (Megatron-LM, Shoeybi et al. 2019 §3). Other head widths and latent
    attention: the attention's input projections (``attention_weights``) split by columns.
    A mixture's layer (``moe``): its shared experts' matrices in place of the MLP's (none
    without shared experts) and the router's, its routed experts apart (``llm.experts``)."""
    h = spec.hidden
    if spec.standard_heads:
        attention = [2.0 * tokens * h * (h / tp + 2 * spec.kv_rank(tp)), 2.0 * tokens * h * h / tp]
    else:
        inputs, output = spec.attention_weights()
        attention = [2.0 * tokens * inputs / tp, 2.0 * tokens * output / tp]
    f = spec.shared_ffn if moe else spec.ffn
    first = (2 if spec.gated else 1) * f
    mlp = [2.0 * tokens * h * first / tp, 2.0 * tokens * f * h / tp] if f else [0.0, 0.0]
    return attention + mlp + ([2.0 * tokens * h * spec.experts / tp] if moe else [])


def elementwise_bytes(spec: DecoderSpec, tokens: int, backward: bool = False, moe: bool = False) -> tuple[float, float]:
    """Bytes a layer's memory-bound ops read and write (16-bit values, 1-byte masks), as
    (replicated over a tensor-parallel group unless sequence-parallel, split over it).
    Replicated, forward: two norms (read x, write y), two residual adds (read 2, write 1),
    with dropout two dropouts (read, write, the mask); backward: the norms read x and dy and
    write dx, the residual branches' gradients are added (read 2, write 1), the dropouts read
    dy and the mask and write dx. Split: the MLP's activation, forward GELU read and write ffn
    wide (SwiGLU: read gate and up, write their product); backward GELU reads x and dy and
    writes dx (SwiGLU: reads gate, up and dy, writes both gradients); a mixture's layer
    (``moe``): its shared experts' (``llm.experts`` prices the routed ones)."""
    h, f = spec.hidden, (spec.shared_ffn if moe else spec.ffn)
    norm, add, drop = ((3, 3, 2 * BF16 + 1) if backward else (2, 3, 2 * BF16 + 1))
    replicated = 2 * norm * BF16 * h + 2 * add * BF16 * h + (2 * drop * h if spec.dropout else 0)
    split = ((5 if spec.gated else 3) if backward else (3 if spec.gated else 2)) * BF16 * f
    return tokens * float(replicated), tokens * float(split)


def layer_compute_s(spec: DecoderSpec, rates: Rates, samples: int, tp: int = 1, sp: bool = False,
                    keys: int = 0, moe: bool = False) -> tuple[float, float, float]:
    """(forward, backward, attention core's forward) seconds of one layer on one of ``tp``
    ranks: its GEMMs (backward: the input and weight gradients, a GEMM of the same size each),
    the attention core (its FLOPs at the GEMM efficiency, backward 2 x, and, unfused, its
    scores' memory traffic each way, ``attention_core_traffic``) and the memory-bound ops
    (``elementwise_bytes`` each way; those outside the MLP divided over the ranks only with
    sequence parallelism); ``keys``: the key positions a query sees (``attention_core_flops``),
    ``moe``: a mixture's layer without its routed experts (``gemm_flops``)."""
    tokens = samples * spec.seq
    gemm = sum(rates.gemm_s(f) for f in gemm_flops(spec, tokens, tp, moe) if f)
    core_flops = spec.attention_core_flops(samples, keys) / (rates.peak * rates.gemm_efficiency) / tp
    core = core_flops + spec.attention_core_traffic(samples, keys=keys) / rates.hbm / tp
    core_bwd = 2 * core_flops + spec.attention_core_traffic(samples, backward=True, keys=keys) / rates.hbm / tp
    passes = []
    casts = fp8_cast_bytes(spec, tokens, tp, moe) if rates.fp8_peak else (0.0, 0.0)
    for backward in (False, True):
        replicated, split = elementwise_bytes(spec, tokens, backward, moe)
        passes.append((replicated / (tp if sp else 1) + split / tp + casts[backward]) / rates.hbm)
    return gemm + core + passes[0], 2 * gemm + core_bwd + passes[1], core


#: bytes Transformer Engine's FP8 cast moves an element: reads it in 16 bits, writes 8 (its
#: amax reduction fused in)
CAST_BYTES = BF16 + 1


def fp8_cast_bytes(spec: DecoderSpec, tokens: int, tp: int, moe: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes of a layer's FP8 casts on one of ``tp`` ranks: forward, each
    linear's input (tokens x its input width, whole under sequence parallelism's gather) and
    its weights (cast again every microbatch); backward, each linear's output gradient. The
    router stays in bf16; the routed experts' casts are ``llm.experts``'."""
    h, f = spec.hidden, (spec.shared_ffn if moe else spec.ffn)
    inputs, output = (spec.attention_weights() if not spec.standard_heads else
                      (h * (h + 2 * spec.kv_dim), h * h))
    first = (2 if spec.gated else 1) * f
    widths_in = [h, output / h / tp] + ([h, f / tp] if f else [])
    widths_out = [inputs / h / tp, h] + ([first / tp, h] if f else [])
    weights = (inputs + output + spec.mlp_matrices * h * f) / tp
    return CAST_BYTES * (tokens * sum(widths_in) + weights), CAST_BYTES * tokens * sum(widths_out)


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


# -- one layer on one rank of a tensor-parallel group --------------------------------------------
@dataclass(frozen=True)
class Collective:
    """``count`` collectives ``kind`` of ``nbytes`` each over the tensor-parallel group."""

    kind: str
    count: int
    nbytes: float


@dataclass(frozen=True)
class LayerCost:
    """One layer, one microbatch, one rank: compute seconds (forward, backward, what
    recomputation runs again), the tensor-parallel collectives of each pass and their seconds
    on the group's links, the bytes kept for backward and the parameters held (a count)."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    fwd_collectives: tuple[Collective, ...]
    bwd_collectives: tuple[Collective, ...]
    fwd_comm_s: float
    bwd_comm_s: float
    activation_bytes: float
    params: float
    core_s: float = 0.0  # the attention core's forward (in fwd_s)


#: The share of the kernel-level compute rate (the GEMM, attention and memory-bound op times
#: above: one layer as Korthikanti et al. measured it, GEMMs as a lent H100 timed them) that a
#: training run keeps end to end: what Megatron-LM SC'21 Table 1's per-GPU figures include and
#: the priced terms do not (gaps between kernels, loss scaling, data loading, logging; the
#: optimizer step, the collectives and the pipeline are priced apart). The one constant
#: calibrated on published end-to-end throughput, on SC'21 Table 1 alone
#: (benchmarks/published/calibrate.py, docs/llm.md); the simulator divides a node's compute by
#: it (``sim.tensor_groups``), never a collective or the optimizer step.
END_TO_END = 0.972


def rates_of(kind: Kind, fp8: bool = False) -> Rates:
    """A kind's bf16 rates (``Rates``), its GEMMs in FP8 with ``fp8``; refused for a kind
    without measured GEMMs, or FP8 on one without FP8 tensor cores."""
    if kind.gemm_efficiency <= 0:
        raise PipeplanError(f"device kind {kind.name!r} has no measured bf16 GEMM efficiency "
                            "(LLM costs need A100/H100 kinds)")
    if fp8 and kind.fp8_flops <= 0:
        raise PipeplanError(f"device kind {kind.name!r} has no FP8 tensor cores: precision fp8 needs H100 or H800")
    return Rates(kind.bf16_flops, kind.gemm_efficiency, kind.gemm_overhead_s, kind.hbm_bytes_per_s,
                 kind.fp8_flops if fp8 else 0.0)


def gemm_s(kind: Kind, flops: float) -> float:
    """One bf16 GEMM of ``flops`` on ``kind`` (its fitted efficiency and overhead)."""
    return rates_of(kind).gemm_s(flops)


def tp_collectives(spec: DecoderSpec, samples: int, tp: int, sp: bool) -> tuple[tuple[Collective, ...], ...]:
    """(forward, backward) collectives of one layer over a group of ``tp`` ranks: 2 all-reduces
    each way (Megatron's f and g operators); with sequence parallelism 2 all-gathers and 2
    reduce-scatters forward, and backward the g operators' all-gathers of the output gradient,
    the reduce-scatters of the input gradient and the all-gathers of the inputs again for the
    weight gradients (the forward keeps them sharded; Korthikanti et al. 2022 §4.2.2)."""
    if tp <= 1:
        return (), ()
    nbytes = BF16 * samples * spec.seq * spec.hidden
    if sp:
        return ((Collective("all_gather", 2, nbytes), Collective("reduce_scatter", 2, nbytes)),
                (Collective("all_gather", 4, nbytes), Collective("reduce_scatter", 2, nbytes)))
    return (Collective("all_reduce", 2, nbytes),), (Collective("all_reduce", 2, nbytes),)


def comm_s(collectives: tuple[Collective, ...], tp: int, bus: float, latency: float) -> float:
    """Seconds of ``collectives`` over ``tp`` ranks on links of ``bus`` bytes/s and ``latency``."""
    return sum(c.count * collective_s(c.kind, c.nbytes, tp, bus, latency) for c in collectives)


def exposed_backward_comm(spec: DecoderSpec, kind: Kind, samples: int, tp: int, sp: bool, bus: float,
                          latency: float, moe: bool = False, fp8: bool = False) -> float:
    """What of a layer's backward tensor-parallel collectives stays on the critical path
    (Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication.backward``): the QKV and
    first MLP linears' input-gradient all-reduces overlap their weight-gradient GEMMs; with
    sequence parallelism their inputs' all-gathers overlap the input-gradient GEMMs and the
    reduce-scatters the weight-gradient GEMMs, while the all-gathers of the output gradient
    that start each block's backward wait for nothing to hide behind."""
    if tp <= 1:
        return 0.0
    nbytes = BF16 * samples * spec.seq * spec.hidden
    qkv, _, fc1, _ = gemm_flops(spec, samples * spec.seq, tp, moe)[:4]
    rates = rates_of(kind, fp8)
    gemm = rates.gemm_s(qkv) + (rates.gemm_s(fc1) if fc1 else 0.0)
    if not sp:
        return max(0.0, 2 * collective_s("all_reduce", nbytes, tp, bus, latency) - gemm)
    waiting = 2 * collective_s("all_gather", nbytes, tp, bus, latency)
    hidden = 2 * (collective_s("all_gather", nbytes, tp, bus, latency)
                  + collective_s("reduce_scatter", nbytes, tp, bus, latency))
    return waiting + max(0.0, hidden - 2 * gemm)


def layer_cost(spec: DecoderSpec, kind: Kind, samples: int, tp: int = 1, sp: bool = False,
               recompute: str = "none", tp_bus: float = 0.0, tp_latency: float = 0.0, keys: int = 0,
               moe: bool = False, fp8: bool = False) -> LayerCost:
    """One layer on one of ``tp`` ranks (module docstring); ``tp_bus``, ``tp_latency``: the
    group's links (``collectives.group_links``); ``keys``, ``moe``: as ``layer_compute_s``
    (a mixture's routed experts, context parallelism's exchange: ``llm.rank_costs``); ``fp8``:
    its GEMMs in FP8 (``Rates``)."""
    if spec.heads % tp:
        raise PipeplanError(f"model {spec.name!r}: {spec.heads} heads cannot be split over {tp} tensor-parallel ranks")
    spec.kv_rank(tp)  # key/value heads split or replicated, else one line
    fwd, bwd, core = layer_compute_s(spec, rates_of(kind, fp8), samples, tp, sp, keys, moe)
    again = {"none": 0.0, "selective": core, "full": fwd}[recompute]
    fwd_c, bwd_c = tp_collectives(spec, samples, tp, sp)
    if tp > 1 and tp_bus <= 0:
        raise PipeplanError(f"tensor parallelism over {tp} ranks needs the group's bandwidth")
    fwd_comm = comm_s(fwd_c, tp, tp_bus, tp_latency)
    bwd_comm = exposed_backward_comm(spec, kind, samples, tp, sp, tp_bus, tp_latency, moe, fp8)
    bwd_comm += fwd_comm if recompute == "full" else 0.0  # the recomputed forward's, not overlapped
    return LayerCost(fwd, bwd, again, fwd_c, bwd_c, fwd_comm, bwd_comm,
                     spec.layer_activation_bytes(samples, tp, sp, recompute, moe, keys, fp8),
                     (spec.layer_params() + spec.kv_replicated_params(tp)) / tp, core)
