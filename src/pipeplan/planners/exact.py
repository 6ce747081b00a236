"""``exact``: the yardstick — the best simulated plan of a small instance, by exhaustive search.

Searches every interval partition of the (linearized) layers x every assignment of disjoint
device sets to the stages (devices may stay idle) x replica sharing {split, round-robin}
x schedules {gpipe, 1f1b, spp-pe}, and simulates each candidate; a candidate that overflows
is tried again with re-materialization on the stages that overflow. Interchangeable devices
(same speed and memory, and swapping them leaves every link unchanged) are counted, not
named, so symmetric assignments are tried once. Branch and bound: a partial plan whose
busiest stage or channel already needs at least the incumbent's time is cut:

- a stage needs at least ``M (f+b) / (sum of its devices' peak rates)`` (the fastest each
  device can go: solo speed, sum of resources; fixed per-call times, overhead, recomputation
  and the optimizer step only add), after the first microbatch's forwards and before the
  last one's backwards through the stages before it (each at least ``(f+b)/(sum of rates)``
  per microbatch, whichever replica runs it);
- a channel: ``channel_bound``, valid for both replica modes and either duplex;
- memory: a stage whose weights, gradients and optimizer state alone overflow one of its
  devices overflows in every completion (the simulator counts at least that).

The search starts from the SPP plan (an incumbent only). A time budget stops it; the plan
then says ``complete: false``. ``tests/test_exact.py`` checks it against a brute force.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from ..cluster import Cluster
from ..costmodel import state_bytes, transfer_time
from ..errors import Infeasible, PipeplanError
from ..graph import Graph, linearize
from ..plan import Plan, Stage
from ..sim import simulate
from ..sim.bounds import peak_rates
from .base import PlanOptions, register

MAX_LAYERS, MAX_DEVICES = 12, 8
SCHEDULES = ("gpipe", "1f1b", "spp-pe")


def device_classes(cluster: Cluster) -> list[list[int]]:
    """Partition devices into classes of pairwise interchangeable devices."""
    bw, lat = cluster.bandwidth, cluster.latency
    v = len(cluster)

    def same(a: int, b: int) -> bool:
        da, db = cluster.devices[a], cluster.devices[b]
        # everything the simulator reads of a device: speed, memory, contention (solo speed,
        # server), resources
        if (da.speed, da.memory, da.solo_speed, da.server, da.resources) != \
                (db.speed, db.memory, db.solo_speed, db.server, db.resources):
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


def _rematerialized(plan: Plan, r, least_over: list) -> tuple[Plan, object]:
    """The plan with re-materialization on the stages that overflow (the least work that can
    make it fit: re-materialization only changes its own stage's memory and only adds time);
    remembers the plan that overflows least in case nothing fits."""
    over = sorted({s for s, b, lim in zip(r.stage_of_device, r.memory_bytes, r.memory_limit) if b > lim})
    fixed = Plan(plan.graph, plan.cluster, plan.stages, plan.microbatches, schedule=plan.schedule,
                 optimizer=plan.optimizer, replicas=plan.replicas, recompute=[s in over for s in range(plan.num_stages)])
    fr = simulate(fixed, timeline=False)
    if fr.over_memory:
        excess = float((fr.memory_bytes - fr.memory_limit).max())
        if least_over[1] is None or excess < least_over[0]:
            least_over[0], least_over[1] = excess, fixed
    return fixed, fr


def channel_bound(cluster: Cluster, a: list[int], b: list[int], nbytes: float, m: int) -> float:
    """Least time the busiest channel between device sets a (stage s) and b (s+1) needs for M
    microbatches, in either replica mode. Split replicas: one channel per direction carries
    all M transfers (both directions share it on a half-duplex cluster). Round-robin: each
    microbatch goes from one replica of a to one of b, over one of at most |a||b| channels,
    so one channel carries at least ceil(M / |a||b|) transfers, each at least the fastest
    pair's time. Raises Infeasible when a link has no bandwidth."""
    half = cluster.meta.get("duplex", "full") == "half"
    tf, tb = transfer_time(cluster, a, b, nbytes), transfer_time(cluster, b, a, nbytes)
    split = m * ((tf + tb) if half else max(tf, tb))
    ia, ib = np.ix_(a, b)
    with np.errstate(divide="ignore"):
        pf = float((nbytes / cluster.bandwidth[ia, ib] + cluster.latency[ia, ib]).min())
        pb = float((nbytes / cluster.bandwidth[ib.T, ia.T] + cluster.latency[ib.T, ia.T]).min())
    count = -(-m // (len(a) * len(b)))
    return min(split, count * ((pf + pb) if half else max(pf, pb)))


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
    speed, mem = peak_rates(cluster), cluster.memory  # the fastest each device can go
    comp = lin.fwd_cum + lin.bwd_cum
    par = lin.params_cum
    stats = {"candidates": 0, "simulated": 0, "complete": True, "device_classes": len(classes)}
    best: list = [np.inf, None]
    least_over: list = [np.inf, None]  # reported when nothing fits

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
                if r.over_memory and not options.allow_over_memory:
                    plan, r = _rematerialized(plan, r, least_over)
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
    except (PipeplanError, Infeasible):
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
                if state > float(mem[devs].min()) and not options.allow_over_memory:
                    continue
                total_speed = float(speed[devs].sum())
                # the stage's M microbatches, after the first one's forwards through the stages
                # before it and before the last one's backwards through them
                bound = max(load, path + work / total_speed)
                if prev is not None:
                    try:
                        bound = max(bound, channel_bound(cluster, prev, devs, float(lin.cut_bytes[layer]), m))
                    except Infeasible:  # no link between the two device sets
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
    plan = best[1] if best[1] is not None else least_over[1]
    if plan is None:
        raise Infeasible("exact: no plan fits in memory: the weights, gradients and optimizer state "
                         "alone overflow every device set")
    stats["seconds"] = time.perf_counter() - t0
    plan.extra = {"exact": stats}
    return plan
