"""``exact``: the yardstick — the best simulated plan of a small instance, by exhaustive search.

Searches every interval partition of the (linearized) layers x every assignment of disjoint
device sets to the stages (devices may stay idle) x replica sharing {split, round-robin}
x schedules {gpipe, 1f1b, spp-pe}, and simulates each candidate. Interchangeable devices
(same speed and memory, and swapping them leaves every link unchanged) are counted, not
named, so symmetric assignments are tried once. Branch and bound: a partial plan whose
busiest stage or channel already needs at least the incumbent's time is cut — a stage
needs at least ``M (f+b) / (sum of its devices' speeds)`` after the first microbatch's
forwards and before the last one's backwards through the stages before it; a channel
``M (c^f + c^b)``. The
search starts from the SPP plan (an incumbent only). A time budget stops it; the plan then
says ``complete: false``.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from ..cluster import Cluster
from ..costmodel import state_bytes, transfer_time
from ..errors import PipeplanError
from ..graph import Graph, linearize
from ..plan import Plan, Stage
from ..sim import simulate
from .base import PlanOptions, register

MAX_LAYERS, MAX_DEVICES = 12, 8
SCHEDULES = ("gpipe", "1f1b", "spp-pe")


def device_classes(cluster: Cluster) -> list[list[int]]:
    """Partition devices into classes of pairwise interchangeable devices."""
    bw, lat = cluster.bandwidth, cluster.latency
    v = len(cluster)

    def same(a: int, b: int) -> bool:
        da, db = cluster.devices[a], cluster.devices[b]
        if (da.speed, da.memory) != (db.speed, db.memory):
            return False
        others = [x for x in range(v) if x not in (a, b)]
        return (np.array_equal(bw[a, others], bw[b, others]) and np.array_equal(bw[others, a], bw[others, b])
                and np.array_equal(lat[a, others], lat[b, others]) and np.array_equal(lat[others, a], lat[others, b])
                and bw[a, b] == bw[b, a] and lat[a, b] == lat[b, a])

    classes: list[list[int]] = []
    for d in range(v):
        for cls in classes:
            if same(cls[0], d):
                cls.append(d)
                break
        else:
            classes.append([d])
    return classes


@register("exact", "exhaustive search over partitions, replication, mapping and schedules "
          "(small instances: <= 12 layers, <= 8 devices)", "best")
def plan_exact(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    lin = linearize(graph)
    n, v, m = lin.n, len(cluster), options.microbatches
    if n > MAX_LAYERS or v > MAX_DEVICES:
        raise PipeplanError(f"exact: instance too large ({n} layers, {v} devices; "
                            f"at most {MAX_LAYERS} and {MAX_DEVICES})")
    budget = options.float_option("budget") or options.time_budget_s
    t0 = time.perf_counter()
    classes = device_classes(cluster)
    speed, mem = cluster.speed, cluster.memory
    comp = lin.fwd_cum + lin.bwd_cum
    par = lin.params_cum
    stats = {"candidates": 0, "simulated": 0, "complete": True, "device_classes": len(classes)}
    best: list = [np.inf, None]

    def consider(stages_idx: list[tuple[int, int, list[int]]]) -> None:
        stats["candidates"] += 1
        replicated = any(len(d) > 1 for _, _, d in stages_idx)
        stages = [Stage([graph.ids[u] for u in lin.interval(a, b)], [cluster.devices[d].name for d in devs])
                  for a, b, devs in stages_idx]
        for mode in (("split", "round-robin") if replicated else ("split",)):
            for sched in SCHEDULES:
                plan = Plan(graph, cluster, stages, m, schedule=sched, optimizer=options.optimizer, replicas=mode)
                r = simulate(plan, timeline=False)
                stats["simulated"] += 1
                if (not r.over_memory or options.allow_over_memory) and r.iteration_s < best[0]:
                    best[0], best[1] = r.iteration_s, plan

    # incumbent: SPP's plan, when it has one
    try:
        from .spp import plan_spp

        seed = plan_spp(graph, cluster, options)
        r = simulate(seed, timeline=False)
        if not r.over_memory or options.allow_over_memory:
            best[0], best[1] = r.iteration_s, seed
    except PipeplanError:
        pass

    def choices(avail: list[int]):
        """Non-empty count vectors over the classes, within what is still available."""
        for counts in itertools.product(*[range(a + 1) for a in avail]):
            if any(counts):
                yield counts

    def search(layer: int, avail: list[int], prev: list[int] | None, stages: list, load: float,
               path: float) -> None:
        if time.perf_counter() - t0 > budget:
            stats["complete"] = False
            return
        for b in range(layer + 1, n + 1):
            work = m * float(comp[b] - comp[layer])
            state = state_bytes(float(par[b] - par[layer]), options.optimizer)
            for counts in choices(avail):
                devs = [d for k, c in enumerate(counts) for d in classes[k][len(classes[k]) - avail[k]:][:c]]
                if state > float(mem[devs].min()):
                    continue
                total_speed = float(speed[devs].sum())
                # the stage's M microbatches, after the first one's forwards through the stages
                # before it and before the last one's backwards through them
                bound = max(load, path + work / total_speed)
                if prev is not None:
                    try:
                        bound = max(bound, m * (transfer_time(cluster, prev, devs, lin.cut_bytes[layer])
                                                + transfer_time(cluster, devs, prev, lin.cut_bytes[layer])))
                    except PipeplanError:  # no link between the two device sets
                        continue
                if bound >= best[0]:
                    continue
                rest = [a - c for a, c in zip(avail, counts)]
                here = stages + [(layer, b, devs)]
                if b == n:
                    consider(here)
                elif any(rest):
                    search(b, rest, devs, here, bound, path + work / (m * total_speed))
                if not stats["complete"]:
                    return

    search(0, [len(c) for c in classes], None, [], 0.0, 0.0)
    if best[1] is None:
        raise PipeplanError("exact: no plan fits in memory")
    plan = best[1]
    stats["seconds"] = time.perf_counter() - t0
    plan.extra = {"exact": stats}
    return plan
