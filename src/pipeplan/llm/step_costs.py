"""What a decoder LLM's iteration spends outside its layers (docs/llm.md): the data-parallel
gradient reduction (fp32 by default, ZeRO-1 as a reduce-scatter plus an all-gather) on the
servers' rails, the pipeline's hand-over of the hidden state (Megatron's scatter/gather), the
tied embedding's gradient reduction and the bytes the optimizer step moves through HBM; every
collective priced by ``cluster.collectives.collective_s``."""

from __future__ import annotations

from ..cluster.collectives import collective_s, group_links
from ..cluster.model import Cluster
from .parallelism import DTYPE_BYTES
from .spec import BF16, DecoderSpec


#: Bytes Megatron-LM's optimizer step moves through HBM per parameter it updates (on its shard
#: with the distributed optimizer; Megatron's ``MixedPrecisionOptimizer.step``): the gradient
#: norm reads the fp32 gradient (4), fused Adam reads it (4) and reads and writes the fp32
#: master weight (8) and the two fp32 moments (16), the master weights are copied to the 16-bit
#: model weights (read 4, write 2), the gradient buffer is zeroed (4); SGD moves no moments,
#: momentum one
OPTIMIZER_STEP_BYTES = {"adam": 42.0, "momentum": 34.0, "sgd": 26.0}


def dp_ring(cluster: Cluster, ring: list[int]) -> tuple[float, float]:
    """(bus bytes/s, latency) of one data-parallel ring, rank ``ring[k]`` of replica k: TP
    concurrent rings share their servers' adapters, and ``collectives.group_links`` counts this
    ring's members in each server as the adapters it gets (the servers' rails)."""
    return group_links(cluster, ring)


def dp_collectives_s(dp: int, zero: int, grad_reduce: str, params_per_rank: float,
                     links: tuple[float, float], weight_bytes: float = BF16) -> float:
    """Seconds of one rank's data-parallel gradient reduction over ``dp`` replicas on a ring of
    ``links`` (``dp_ring``): an all-reduce of the gradients in ``grad_reduce`` (fp32 by default
    for bf16, Megatron's ``accumulate_allreduce_grads_in_fp32``), or with ZeRO-1 (``zero``) a
    reduce-scatter of them and an all-gather of the weights (16-bit, or ``weight_bytes``: 1 for
    FP8 weights, Megatron's ``--fp8-param-gather``)."""
    if dp < 2 or params_per_rank <= 0:
        return 0.0
    grads = params_per_rank * DTYPE_BYTES[grad_reduce]
    if zero:
        return (collective_s("reduce_scatter", grads, dp, *links)
                + collective_s("all_gather", params_per_rank * weight_bytes, dp, *links))
    return collective_s("all_reduce", grads, dp, *links)


def pipeline_send_s(spec: DecoderSpec, cluster: Cluster, par) -> float:
    """One microbatch's hidden state from position 0 to 1, each of the TP x CP ranks sending
    its 1 / (TP x CP) over its own link (Megatron's scatter/gather, Narayanan et al. 2021 §4.1;
    a CP rank holds its share of the sequence)."""
    width = par.dp * par.tp * par.cp
    a, b = 0, width if len(cluster) > width else 0
    nbytes = BF16 * par.microbatch * spec.seq * spec.hidden / (par.tp * par.cp)
    return nbytes / float(cluster.bandwidth[a, b]) + float(cluster.latency[a, b]) if a != b else 0.0


def tied_reduction_s(spec: DecoderSpec, cluster: Cluster, tp: int, grad: str, first: int, last: int) -> float:
    """One rank's all-reduce of its 1 / TP of a tied embedding's gradient (``grad`` dtype) between
    GPU ``first`` of the first stage and ``last`` of the last."""
    bw, lat = group_links(cluster, [first, last])
    return collective_s("all_reduce", spec.vocab * spec.hidden / tp * DTYPE_BYTES[grad], 2, bw, lat)
