"""The configuration a practitioner writes for Megatron-LM (Narayanan et al. 2021, §2-3),
tensor parallelism left out: a pipeline of p stages with equal numbers of layers, replicated
d = V / p times for data parallelism (identical pipelines, each taking whole microbatches in
turn), ranks laid out as Megatron does (data-parallel rank fastest, pipeline rank slowest:
stage s on devices s*d ... s*d + d - 1 of the cluster's order), 1F1B, activation
recomputation only when the model does not fit otherwise.

The pipeline depth is what a practitioner sweeps: every p dividing V (and at most the number
of layers) is simulated, with and without recomputation, and the fastest that fits is kept."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import Graph, linearize
from ..plan import Plan, Stage
from ..sim import simulate
from .base import PlanOptions, register


def megatron_plan(graph: Graph, cluster: Cluster, options: PlanOptions, depth: int, recompute: bool) -> Plan:
    """Megatron's plan of pipeline depth ``depth`` (a divisor of the device count)."""
    lin = linearize(graph)
    d = len(cluster) // depth
    bounds = np.linspace(0, lin.n, depth + 1).round().astype(int)
    names = cluster.names
    stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], names[s * d:(s + 1) * d])
              for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "1f1b",
                optimizer=options.optimizer, replicas="round-robin",
                recompute=[True] * depth if recompute else None)


def depths(layers: int, devices: int) -> list[int]:
    """Pipeline depths a practitioner tries: divisors of the device count, at most the layers."""
    return [p for p in range(1, min(layers, devices) + 1) if devices % p == 0]


@register("megatron", "Megatron-LM as practitioners configure it (no tensor parallelism): equal layers per "
          "stage, identical data-parallel pipelines, 1F1B; the pipeline depth swept", "1f1b")
def plan_megatron(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """The fastest fitting plan over the depths of ``depths`` x recomputation off/on (the
    fastest overall when none fits)."""
    best, best_key = None, None
    for p in depths(linearize(graph).n, len(cluster)):
        for recompute in (False, True):
            plan = megatron_plan(graph, cluster, options, p, recompute)
            r = simulate(plan, timeline=False)
            key = (bool(r.over_memory) and not options.allow_over_memory, r.iteration_s, recompute)
            if best_key is None or key < best_key:
                best, best_key = plan, key
    return best
