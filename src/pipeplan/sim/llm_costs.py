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

from ..cluster.kinds import Kind
from ..errors import PipeplanError
from ..graph.llm import BF16, DecoderSpec, Rates, _gemm_flops, layer_compute_s
from .collectives import collective_s


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


#: The share of the kernel-level compute rate (the GEMM, attention and memory-bound op times
#: above: one layer as Korthikanti et al. measured it, GEMMs as a lent H100 timed them) that a
#: training run keeps end to end: what Megatron-LM SC'21 Table 1's per-GPU figures include and
#: the priced terms do not (gaps between kernels, loss scaling, data loading, logging; the
#: optimizer step, the collectives and the pipeline are priced apart). The one constant
#: calibrated on published end-to-end throughput, on SC'21 Table 1 alone
#: (benchmarks/published/calibrate.py, docs/llm.md); the simulator divides a node's compute by
#: it (``sim.tensor_groups``), never a collective or the optimizer step.
END_TO_END = 0.972


def rates_of(kind: Kind) -> Rates:
    """A kind's bf16 rates (``graph.llm.Rates``); refused for a kind without measured GEMMs."""
    if kind.gemm_efficiency <= 0:
        raise PipeplanError(f"device kind {kind.name!r} has no measured bf16 GEMM efficiency "
                            "(LLM costs need A100/H100 kinds)")
    return Rates(kind.bf16_flops, kind.gemm_efficiency, kind.gemm_overhead_s, kind.hbm_bytes_per_s)


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
                          latency: float) -> float:
    """What of a layer's backward tensor-parallel collectives stays on the critical path
    (Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication.backward``): the QKV and
    first MLP linears' input-gradient all-reduces overlap their weight-gradient GEMMs; with
    sequence parallelism their inputs' all-gathers overlap the input-gradient GEMMs and the
    reduce-scatters the weight-gradient GEMMs, while the all-gathers of the output gradient
    that start each block's backward wait for nothing to hide behind."""
    if tp <= 1:
        return 0.0
    nbytes = BF16 * samples * spec.seq * spec.hidden
    qkv, _, fc1, _ = _gemm_flops(spec, samples * spec.seq, tp)
    rates = rates_of(kind)
    gemm = rates.gemm_s(qkv) + rates.gemm_s(fc1)
    if not sp:
        return max(0.0, 2 * collective_s("all_reduce", nbytes, tp, bus, latency) - gemm)
    waiting = 2 * collective_s("all_gather", nbytes, tp, bus, latency)
    hidden = 2 * (collective_s("all_gather", nbytes, tp, bus, latency)
                  + collective_s("reduce_scatter", nbytes, tp, bus, latency))
    return waiting + max(0.0, hidden - 2 * gemm)


def layer_cost(spec: DecoderSpec, kind: Kind, samples: int, tp: int = 1, sp: bool = False,
               recompute: str = "none", tp_bus: float = 0.0, tp_latency: float = 0.0) -> LayerCost:
    """One layer on one of ``tp`` ranks (module docstring); ``tp_bus``, ``tp_latency``: the
    group's links (``collectives.group_links``)."""
    if spec.heads % tp:
        raise PipeplanError(f"model {spec.name!r}: {spec.heads} heads cannot be split over {tp} tensor-parallel ranks")
    spec.kv_rank(tp)  # key/value heads split or replicated, else one line
    fwd, bwd, core = layer_compute_s(spec, rates_of(kind), samples, tp, sp)
    again = {"none": 0.0, "selective": core, "full": fwd}[recompute]
    fwd_c, bwd_c = tp_collectives(spec, samples, tp, sp)
    if tp > 1 and tp_bus <= 0:
        raise PipeplanError(f"tensor parallelism over {tp} ranks needs the group's bandwidth")
    fwd_comm = comm_s(fwd_c, tp, tp_bus, tp_latency)
    bwd_comm = exposed_backward_comm(spec, kind, samples, tp, sp, tp_bus, tp_latency)
    bwd_comm += fwd_comm if recompute == "full" else 0.0  # the recomputed forward's, not overlapped
    return LayerCost(fwd, bwd, again, fwd_c, bwd_c, fwd_comm, bwd_comm,
                     spec.layer_activation_bytes(samples, tp, sp, recompute),
                     (spec.layer_params() + spec.kv_replicated_params(tp)) / tp)
