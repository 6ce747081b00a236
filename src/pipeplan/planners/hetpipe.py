"""``hetpipe``: HetPipe (Park et al., ATC'20) as SPP's evaluation uses it (SPP §II, §V-A).

Grouping rule (HetPipe's "NP" policy, the one SPP describes): each server is one virtual
worker. Every virtual worker pipelines the whole model over its GPUs without stage
replication — partitioned by PipeDream's DP with ``straight_pipeline`` over the server's
GPUs at its slowest intra-server link — and the virtual workers train data-parallel:
microbatches go to them in turn and each stage's gradients are all-reduced across them
once per iteration (the synchronous setting of the comparison). Servers of unequal size
are cut to the smallest size (the extra GPUs stay idle), so that every virtual worker runs
the same pipeline. On one server HetPipe is a straight pipeline (SPP omits it there).
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import Graph
from ..plan import Plan, Stage
from ..errors import Infeasible
from .base import PlanOptions, fits, register
from .pipedream import run_pipedream
from .pipedream.dp import DPOptions, Level


def virtual_workers(cluster: Cluster) -> list[list[int]]:
    servers = cluster.servers()
    depth = min(len(s) for s in servers)
    return [s[:depth] for s in servers]


@register("hetpipe", "HetPipe: one virtual worker per server pipelines the whole model, "
          "data parallelism across virtual workers (ATC'20)", "1f1b")
def plan_hetpipe(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Balanced partition first; HetPipe partitions under the GPUs' memory (Park et al. §4),
    so if that does not fit, PipeDream's memory-constrained straight DP."""
    plan = _hetpipe_plan(graph, cluster, options, DPOptions(straight_pipeline=True))
    if not options.allow_over_memory and not fits(plan):
        try:
            plan = _hetpipe_plan(graph, cluster, options, DPOptions(
                straight_pipeline=True, memory_size=float(cluster.usable.min())))
        except Infeasible:
            pass  # no partition fits: the balanced one, flagged by the caller
    return plan


def _hetpipe_plan(graph: Graph, cluster: Cluster, options: PlanOptions, opts: DPOptions) -> Plan:
    vws = virtual_workers(cluster)
    depth = len(vws[0])
    bw = cluster.bandwidth
    intra = min((float(bw[np.ix_(v, v)][~np.eye(depth, dtype=bool)].min()) for v in vws),
                default=float("inf")) if depth > 1 else float("inf")
    result, nodes, _, notes = run_pipedream(graph, cluster, opts, levels=[Level(depth, intra)])
    stages = [Stage([graph.ids[u] for u in ns], [cluster.devices[vw[s]].name for vw in vws])
              for s, ns in enumerate(nodes)]
    return Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "1f1b",
                optimizer=options.optimizer, replicas="round-robin",
                extra={"hetpipe": {"virtual_workers": len(vws), "depth": depth,
                                   "per_stage_s": result.objective_s,
                                   "antichain_states": notes["antichain_states"],
                                   "compressed_branches": notes["compressed_branches"],
                                   "linearized": notes["linearized"]}})
