"""Lower bounds reported with every prediction (docs/design.md, "Lower bound").

- work bound: all the work of M microbatches spread perfectly over every device of the
  cluster, each at the fastest it can go (its solo speed when calibrated; a device with
  several compute resources at the sum over its resources of the faster pass). Extra work
  (recomputation, fixed per-call times, the optimizer step) only adds time, so no plan on
  this cluster beats it. Exchanges an overlapped pair can hide (``stage_costs.PAIR_COMM``)
  are not work: left out.
- path bound: the longest chain of one microbatch through this plan: its forwards and
  forward transfers, then its gradient-sending backwards (B or I) and backward transfers,
  then stage 0's W. No schedule of this plan beats it. A steady state has no such chain.
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import Graph
from ..schedule import Kind
from .compile import TaskGraph, mat
from .stage_costs import PAIR_COMM


def peak_rates(cluster: Cluster) -> np.ndarray:
    """The most reference-work per second each device can do, in any mix of passes."""
    out = np.empty(len(cluster))
    for i, d in enumerate(cluster.devices):
        alone = max(1.0, (d.solo_speed or d.speed) / d.speed)  # contention only slows it down
        if d.resources:
            out[i] = alone * sum(max(r.fwd_speed, r.bwd_speed) for r in d.resources)
        else:
            out[i] = alone * d.speed
    return out


def work_bound(graph: Graph, cluster: Cluster, microbatches: int) -> float:
    hidden = sum(sum(pair) for pair in (graph.meta.get(PAIR_COMM) or {}).values())
    return microbatches * float(graph.fwd.sum() + graph.bwd.sum() - hidden) / float(peak_rates(cluster).sum())


def _path_counts(tg: TaskGraph) -> np.ndarray | None:
    """(classes, microbatches): each class's tasks on each microbatch's chain; None if none."""
    chain = np.isin(tg.kind, [Kind.F, Kind.B, Kind.I, Kind.SEND_F, Kind.SEND_B])
    last_w = (tg.kind == Kind.W) & (tg.stage == 0)
    sel = np.flatnonzero((chain | last_w) & (tg.micro >= 0))
    return tg.counts(sel, tg.micro[sel], int(tg.micro[sel].max()) + 1) if sel.size else None


def path_bound(tg: TaskGraph, table: np.ndarray) -> np.ndarray:
    """(candidates,): the longest one-microbatch chain, from each candidate's class durations."""
    count = tg.memo(_path_counts)
    return np.zeros(table.shape[0]) if count is None else mat(table, count).max(axis=1)
