"""``spp``: Synchronous Pipeline Planning (Luo et al., SPP Alg. 3).

RDO orders the devices; for every number of stages xi, PRM finds the partition, replication
and mapping minimising 𝒲(xi); PE schedules it (schedule ``spp-pe``); the plan with the
shortest simulated iteration wins. SPP partitions a chain of layers: a branching model is
linearized along its topological order (``graph.linearize``), whose every cut is a valid
stage boundary and carries the activations that cross it.
"""

from __future__ import annotations

from ...cluster import Cluster
from ...costmodel import state_bytes
from ...units import fmt_bytes
from ...errors import PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan, Stage
from ...sim import simulate
from ..base import PlanOptions, register
from .bounds import spp_bounds
from .prm import prm
from .rdo import device_order


@register("spp", "SPP: min-cut device order, DP partition/replication/mapping, PE schedule "
          "with proven bounds", "spp-pe")
def plan_spp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    lin = linearize(graph)
    order = device_order(cluster)
    res = prm(lin, cluster, order, options.microbatches, options.optimizer)
    if all(parts is None for parts in res.stages):  # no partition fits: SPP's plan with memory ignored
        res = prm(lin, cluster.with_memory(float("inf")), order, options.microbatches, options.optimizer)
    schedule = options.schedule or "spp-pe"
    best: tuple | None = None
    overflowing = None
    per_xi = []
    for xi, (w, parts) in enumerate(zip(res.w, res.stages), start=1):
        if parts is None:
            continue
        stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], [cluster.devices[order[k]].name for k in range(d, e)])
                  for a, b, d, e in parts]
        plan = Plan(graph, cluster, stages, options.microbatches, schedule=schedule,
                    optimizer=options.optimizer, replicas="split")
        result = simulate(plan, timeline=False)
        per_xi.append({"stages": xi, "w_prm_s": w, "iteration_s": result.iteration_s})
        if result.over_memory and not options.allow_over_memory:
            over = float((result.memory_bytes - result.memory_limit).max())
            if overflowing is None or over < overflowing[0]:
                overflowing = (over, plan, result)
            continue
        if best is None or result.iteration_s < best[0]:
            best = (result.iteration_s, plan, result)
    if best is None and overflowing is not None:  # nothing fits: the plan that overflows least
        best = overflowing
    if best is None:
        need = state_bytes(graph.total_params, options.optimizer) / len(cluster)
        have = float(cluster.memory.max())
        raise PipeplanError(
            f"spp: no plan fits in memory: spread over all {len(cluster)} devices, the weights, gradients "
            f"and optimizer state of {graph.name!r} need {fmt_bytes(need)} per device of "
            f"{fmt_bytes(have)} (over by {fmt_bytes(max(need - have, 0.0))})")
    _, plan, result = best
    plan.extra = {"w_prm_s": min(res.w), "per_stage_count": per_xi,
                  "device_order": [cluster.devices[d].name for d in order],
                  "bounds": spp_bounds(plan, result.iteration_s, lin.cut_bytes)}
    return plan
