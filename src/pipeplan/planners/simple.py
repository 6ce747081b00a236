"""The simplest baselines: data parallelism and GPipe's partition."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph, linearize
from ..plan import REPLICA_MODES, Plan, Stage
from ..sim import simulate
from .base import PlanOptions, register
from .ranking import rank_key


@dataclass(frozen=True)
class DataParallelOptions:
    replicas: str = field(default="auto", metadata={
        "help": "split: every microbatch split over all devices (samples in proportion to speed); "
                "round-robin: whole microbatches in turn; auto: the faster of the two that fits, simulated",
        "choices": (*REPLICA_MODES, "auto")})


@register("dp", "data parallelism: every device holds the whole model, one all-reduce; "
          "microbatches whole (round-robin) or split over the devices, the faster that fits", "1f1b",
          options=DataParallelOptions)
def plan_dp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Data parallelism as DRL-PP §1 describes it (Krizhevsky et al. 2012): the input is
    distributed over the devices, each holding every parameter, and the gradients are
    aggregated once at the end of the iteration (one all-reduce). Its devices share the
    microbatches as any replicated stage's do: ``-O replicas=split|round-robin|auto``."""
    mode = options.settings_of(DataParallelOptions).replicas
    plans = [Plan(graph, cluster, [Stage(list(graph.ids), cluster.names)], options.microbatches,
                  schedule=options.schedule or "1f1b", optimizer=options.optimizer, replicas=m)
             for m in (("round-robin", "split") if mode == "auto" else (mode,))]
    if len(plans) == 1:
        return plans[0]
    ranked = []
    for i, p in enumerate(plans):  # ties: round-robin
        try:
            ranked.append((rank_key(simulate(p, timeline=False), options.allow_over_memory), i, p))
        except PipeplanError:  # a decoder LLM's microbatch does not split into whole samples
            continue
    return min(ranked)[2] if ranked else plans[0]


@dataclass(frozen=True)
class GPipeOptions:
    recompute: bool = field(default=True, metadata={
        "help": "re-materialize every stage's activations in the backward pass (GPipe §2.3); "
                "false keeps them (what-if)"})


@register("gpipe", "GPipe: equal numbers of layers per stage, one device per stage, "
          "re-materialization", "gpipe", options=GPipeOptions)
def plan_gpipe(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """GPipe's partition (Huang et al. 2019): the layers (nodes in topological order) cut
    into min(V, L) consecutive stages whose sizes differ by at most one; stage i on device i;
    every stage re-materializes its activations in the backward pass (§2.3)."""
    recompute = options.settings_of(GPipeOptions).recompute
    lin = linearize(graph)
    n_stages = min(len(cluster), lin.n)
    bounds = np.linspace(0, lin.n, n_stages + 1).round().astype(int)
    stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], [cluster.devices[i].name])
              for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "gpipe",
                optimizer=options.optimizer, recompute=[True] * len(stages) if recompute else None)
