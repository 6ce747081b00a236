"""``spp``: Synchronous Pipeline Planning (Luo et al., SPP Alg. 3).

RDO orders the devices; for every number of stages xi, PRM finds the partition, replication
and mapping minimising 𝒲(xi); PE schedules it (schedule ``spp-pe``); the plan with the
shortest simulated iteration wins. SPP partitions a chain of layers: a branching model is
linearized along its topological order (``graph.linearize``), whose every cut is a valid
stage boundary and carries the activations that cross it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...cluster import Cluster
from ...errors import Infeasible, PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan, Stage
from ...sim import simulate
from ...sim.formulas import precision_of
from ..base import PlanOptions, register
from .bounds import spp_bounds
from ..ranking import rank_key
from .prm import prm
from .rdo import device_order


@dataclass(frozen=True)
class SppOptions:
    stages: int | None = field(default=None, metadata={"min": 1,
        "help": "only this number of stages (xi); default: every xi from 1 to min(layers, devices), the "
                "fastest kept"})


#: SPP's run time on this project's 2-core machine, to refuse up front what would not
#: finish: RDO's min-cut ordering (networkx's Stoer-Wagner, recursively) took 0.74 s on 64
#: devices and 10.8 s on 128 (grows as V^3.9); PRM does 0.7e8 to 5e8 numpy steps per second
#: (benchmarks/results/spp/speed.json). The largest grid cell that benchmark runs (64
#: layers x 128 devices, ~80 s) is taken on; 256 devices are not.
RDO_S_AT_64 = 0.74
PRM_STEPS_PER_S = 1.5e8
MAX_SPP_S = 120.0


def spp_seconds(layers: int, devices: int) -> float:
    """Estimated seconds of RDO + PRM: PRM is O(xi_max V (L V^2 + L^2 V)) steps (prm module
    docstring)."""
    steps = min(layers, devices) * devices * (layers * devices**2 + layers**2 * devices)
    return RDO_S_AT_64 * (devices / 64) ** 3.9 + steps / PRM_STEPS_PER_S


def check_spp_size(layers: int, devices: int, model: str) -> None:
    """Refuse an instance SPP would take minutes on, before any work."""
    est = spp_seconds(layers, devices)
    if est > MAX_SPP_S:
        raise Infeasible(f"spp: {layers:,} layers of {model!r} on {devices:,} devices would take it about "
                         f"{est / 60:,.0f} min (device ordering and dynamic program); merge layers into blocks "
                         "or plan for fewer devices (e.g. one data-parallel replica's share of the cluster)")


@register("spp", "SPP: min-cut device order, DP partition/replication/mapping, PE schedule "
          "with proven bounds", "spp-pe", options=SppOptions,
          estimate=lambda graph, cluster, options: spp_seconds(len(graph), len(cluster)))
def plan_spp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """SPP Alg. 3: PRM for every stage count xi (or the one ``-O stages`` names), each
    simulated under the schedule; the fastest that fits wins (the one that overflows least
    when none fits). A stage count whose plan cannot run is skipped."""
    only = options.settings_of(SppOptions).stages
    lin = linearize(graph)
    if only is not None and not 1 <= only <= min(lin.n, len(cluster)):
        raise PipeplanError(f"planner 'spp' option stages={only}: expected 1 to {min(lin.n, len(cluster))} "
                            f"(min of {lin.n} layers and {len(cluster)} devices)")
    check_spp_size(lin.n, len(cluster), graph.name)
    order = device_order(cluster)
    precision = precision_of(graph.meta)
    res = prm(lin, cluster, order, options.microbatches, options.optimizer, precision=precision)
    if all(parts is None for parts in res.stages):  # no partition fits: SPP's plan with memory ignored
        res = prm(lin, cluster.with_memory(float("inf")), order, options.microbatches, options.optimizer,
                  precision=precision)
    best: tuple | None = None
    per_xi = []
    for xi, parts in enumerate(res.stages, start=1):
        if parts is None or (only is not None and xi != only):
            continue
        stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], [cluster.devices[order[k]].name for k in range(d, e)])
                  for a, b, d, e in parts]
        plan = Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "spp-pe",
                    optimizer=options.optimizer, replicas="split")
        try:
            result = simulate(plan, timeline=False)
        except Infeasible:
            continue
        per_xi.append({"stages": xi, "w_prm_s": res.w[xi - 1], "iteration_s": result.iteration_s})
        key = rank_key(result, options.allow_over_memory)  # nothing fits: the plan that overflows least
        if best is None or key < best[0]:
            best = (key, plan, result)
    if best is None:
        raise Infeasible(f"spp: no partition of {graph.name!r} can run on {cluster.name!r} (every stage "
                         f"count needs a link of zero bandwidth)")
    _, plan, result = best
    plan.extra = {"w_prm_s": min(res.w), "per_stage_count": per_xi,
                  "device_order": [cluster.devices[d].name for d in order],
                  "bounds": spp_bounds(plan, result.iteration_s, lin.cut_bytes)}
    return plan
