"""The simplest baselines: data parallelism and GPipe's partition."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import Graph, linearize
from ..plan import Plan, Stage
from .base import PlanOptions, register


@register("dp", "data parallelism: every device holds the whole model, microbatches "
          "round-robin, one all-reduce", "1f1b")
def plan_dp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    return Plan(graph, cluster, [Stage(list(graph.ids), cluster.names)], options.microbatches,
                schedule=options.schedule or "1f1b", optimizer=options.optimizer, replicas="round-robin")


@register("gpipe", "GPipe: equal numbers of layers per stage, one device per stage", "gpipe")
def plan_gpipe(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """GPipe's partition (Huang et al. 2019): the layers (nodes in topological order) cut
    into min(V, L) consecutive stages whose sizes differ by at most one; stage i on device i."""
    lin = linearize(graph)
    n_stages = min(len(cluster), lin.n)
    bounds = np.linspace(0, lin.n, n_stages + 1).round().astype(int)
    stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], [cluster.devices[i].name])
              for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "gpipe",
                optimizer=options.optimizer)
