"""SPP's cost model (§III), shared by planners and the simulator.

- compute of a stage per microbatch: sum of its layers' time / (sum of its replicas' speeds)
  (a microbatch is split over the replicas in proportion to their speeds);
- transfer between consecutive stages: bytes / (|F(s)| |F(s+1)| min bandwidth between the two
  device sets) + the largest latency among those links (§III-B2), each direction over its
  own links (full duplex) unless the cluster says ``duplex: half``;
- ring all-reduce of a replicated stage: 2(k-1)/k x parameter bytes / min bandwidth inside the
  group (Eq. 1), plus 2(k-1) link latencies (the ring's steps); a calibrated cluster also
  carries the collective's measured efficiency against its links (gloo's ring reaches a
  fraction of the point-to-point bandwidth);
- memory per device: parameters x (1 weights + 1 gradients + optimizer-state factor) plus the
  activations stashed for backward (see ``stash_bytes``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..cluster import Cluster
from ..cluster.collectives import collective_s
from ..errors import Infeasible, PipeplanError

#: Optimizer state as a multiple of the parameter bytes (Adam keeps two moments).
OPTIMIZER_STATE = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}
DEFAULT_OPTIMIZER = "adam"


def transfer_time(cluster: Cluster, src: Sequence[int], dst: Sequence[int], nbytes: float,
                  where: str = "transfer") -> float:
    """Time to move ``nbytes`` (one whole microbatch's data) from the devices ``src`` to ``dst``."""
    bw = cluster.min_bandwidth(src, dst)
    if bw <= 0:
        a, b = _slowest_pair(cluster, src, dst)
        raise Infeasible(f"{where}: zero bandwidth between {a} and {b}, which must exchange data")
    return nbytes / (len(src) * len(dst) * bw) + cluster.max_latency(src, dst)


def allreduce_time(cluster: Cluster, group: Sequence[int], param_bytes: float,
                   where: str = "all-reduce") -> float:
    """All-reduce of ``param_bytes`` over ``group`` on its slowest link (SPP Eq. 1's 2(k-1)/k
    bytes over the bandwidth), its latency as every collective's (``collective_s``)."""
    k = len(group)
    if k < 2 or param_bytes <= 0:
        return 0.0
    bw = cluster.group_min_bandwidth(group)
    if bw <= 0:
        a, b = _slowest_pair(cluster, group, group)
        raise Infeasible(f"{where}: zero bandwidth between {a} and {b}, which must all-reduce")
    lat = float(cluster.latency[np.ix_(list(group), list(group))].max())
    eff = float(cluster.meta.get("allreduce_efficiency", 1.0))  # measured by calibrate
    return collective_s("all_reduce", param_bytes, k, bw * eff, lat)


def update_time(graph_meta: dict, cluster: Cluster, param_bytes, slowest_speed):
    """The optimizer step over ``param_bytes`` (numpy-broadcastable): the rate calibrate
    measured on the cluster's own workers, all stepping at once (memory bandwidth shared),
    else the profiled rate of the reference device over the slowest replica's speed."""
    measured = float(cluster.meta.get("update_s_per_byte") or 0.0)
    if measured > 0:
        return measured * param_bytes
    return float(graph_meta.get("update_s_per_byte") or 0.0) * param_bytes / slowest_speed


def precision_of(graph_meta: dict) -> str:
    """How a graph counts its parameter bytes: ``bf16`` (mixed precision, 16-bit weights:
    the decoder LLM graphs) or ``fp32`` (every other graph)."""
    return str(graph_meta.get("precision", "fp32"))


def optimizer_shards(graph_meta: dict):
    """Over how many data-parallel replicas the optimizer state is sharded (ZeRO-1,
    ``sim.tensor_groups``): one count, or one a stage; 1 without."""
    shards = graph_meta.get("optimizer_shards", 1)
    return [float(s) for s in shards] if isinstance(shards, list) else int(shards)


def state_bytes(param_bytes: float, optimizer: str = DEFAULT_OPTIMIZER, precision: str = "fp32",
                shards: int = 1) -> float:
    """Weights + gradients + optimizer state held for ``param_bytes`` of parameters: as many
    again for the gradients and ``OPTIMIZER_STATE`` times for the optimizer; with ``precision``
    ``bf16`` (mixed precision: 16-bit weights, ``param_bytes`` counts them) also fp32 gradients,
    fp32 master weights and fp32 optimizer state, Megatron-LM's 18 bytes a parameter with Adam
    (2 + 4 + 4 + 8; its distributed-optimizer guide). ZeRO-1 over ``shards`` replicas (Megatron's
    distributed optimizer) keeps 1 / shards of the master weights and optimizer state: 6 + 12 / d
    bytes a parameter in mixed precision."""
    try:
        factor = OPTIMIZER_STATE[optimizer]
    except KeyError:
        raise PipeplanError(f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIMIZER_STATE)})") from None
    if precision == "bf16":
        return param_bytes * (1.0 + 2.0 + (2.0 + 2.0 * factor) / shards)
    return param_bytes * (2.0 + factor / shards)


def _slowest_pair(cluster: Cluster, a: Sequence[int], b: Sequence[int]) -> tuple[str, str]:
    sub = cluster.bandwidth[np.ix_(list(a), list(b))]
    i, j = np.unravel_index(int(np.argmin(sub)), sub.shape)
    return cluster.devices[list(a)[i]].name, cluster.devices[list(b)[j]].name
