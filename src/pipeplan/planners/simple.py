"""The simplest baselines: data parallelism and GPipe's partition."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import Graph, linearize
from ..plan import Plan, Stage
from ..errors import PipeplanError
from ..sim import simulate
from .base import PlanOptions, register


@register("dp", "data parallelism: every device holds the whole model, one all-reduce; "
          "microbatches whole (round-robin) or split over the devices, whichever is faster", "1f1b")
def plan_dp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Data parallelism (each device a full replica, gradients all-reduced once per
    iteration). ``-O replicas=split|round-robin|auto``: each microbatch split over every
    device (its samples in proportion to speed), or whole microbatches in turn; ``auto``
    (default) simulates both and keeps the faster."""
    mode = options.option("replicas", "auto")
    if mode not in ("split", "round-robin", "auto"):
        raise PipeplanError(f"dp: replicas must be split, round-robin or auto, got {mode!r}")
    plans = [Plan(graph, cluster, [Stage(list(graph.ids), cluster.names)], options.microbatches,
                  schedule=options.schedule or "1f1b", optimizer=options.optimizer, replicas=m)
             for m in (("round-robin", "split") if mode == "auto" else (mode,))]
    return min(plans, key=lambda p: simulate(p, timeline=False).iteration_s)


@register("gpipe", "GPipe: equal numbers of layers per stage, one device per stage, "
          "re-materialization", "gpipe")
def plan_gpipe(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """GPipe's partition (Huang et al. 2019): the layers (nodes in topological order) cut
    into min(V, L) consecutive stages whose sizes differ by at most one; stage i on device i;
    every stage re-materializes its activations in the backward pass (§2.3)."""
    lin = linearize(graph)
    n_stages = min(len(cluster), lin.n)
    bounds = np.linspace(0, lin.n, n_stages + 1).round().astype(int)
    stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], [cluster.devices[i].name])
              for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "gpipe",
                optimizer=options.optimizer, recompute=[True] * len(stages))
