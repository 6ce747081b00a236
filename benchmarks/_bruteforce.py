"""An enumeration of small instances that shares no code with the planners: every interval
partition of the linearized layers x every assignment of disjoint non-empty device sets to
the stages (devices may stay idle) x replica mode x every order of each round-robin stage's
devices x schedule, each simulated with ``simulate``; a candidate that overflows is simulated
again with re-materialization on the stages that overflowed (the space ``exact`` and joint's
exhaustive phase name, docs/joint.md). Plain itertools over device labels: no symmetry
reduction, no bounds. The yardstick of ``tests/test_exact.py`` and ``joint/optimality.py``."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from pipeplan.errors import Infeasible
from pipeplan.graph import Graph, linearize
from pipeplan.cluster import Cluster
from pipeplan.plan import Plan, Stage
from pipeplan.sim import simulate

EXACT_SCHEDULES = ("gpipe", "1f1b", "spp-pe")


def fitting_time(plan: Plan) -> tuple[float, bool, bool]:
    """(iteration, fits, re-materialized): the plan, or when it overflows the plan with
    re-materialization on the stages whose devices overflow."""
    try:
        r = simulate(plan, timeline=False)
        if not r.over_memory:
            return r.iteration_s, True, False
        over = {s for s, b, lim in zip(r.stage_of_device, r.memory_bytes, r.memory_limit) if b > lim}
        r = simulate(replace(plan, recompute=[s in over for s in range(plan.num_stages)]), timeline=False)
        return r.iteration_s, not r.over_memory, True
    except Infeasible:
        return np.inf, False, False


def candidates(graph: Graph, cluster: Cluster, m: int, schedules: tuple[str, ...] = EXACT_SCHEDULES):
    """Every plan of the space (module docstring)."""
    ids = [graph.ids[u] for u in linearize(graph).order]
    n, v = len(ids), len(cluster)
    for s_count in range(1, min(n, v) + 1):
        for cuts in itertools.combinations(range(1, n), s_count - 1):
            bounds = (0, *cuts, n)
            layers = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
            for labels in itertools.product(range(-1, s_count), repeat=v):  # -1: idle
                sets = [[cluster.names[d] for d in range(v) if labels[d] == s] for s in range(s_count)]
                if not all(sets):
                    continue
                for mode in ("split", "round-robin"):
                    orders = [sets] if mode == "split" else itertools.product(*map(itertools.permutations, sets))
                    for devs in orders:
                        stages = [Stage(ls, list(ds)) for ls, ds in zip(layers, devs)]
                        for sched in schedules:
                            yield Plan(graph, cluster, stages, m, schedule=sched, replicas=mode)


def brute_force(graph: Graph, cluster: Cluster, m: int, schedules: tuple[str, ...] = EXACT_SCHEDULES) -> dict:
    """The fastest fitting candidate's time (inf when none fits), what it needed, and how
    many candidates were simulated."""
    return brute_force_by_schedule(graph, cluster, m, schedules)[schedules]


def brute_force_by_schedule(graph: Graph, cluster: Cluster, m: int, schedules: tuple[str, ...],
                            subsets: tuple[tuple[str, ...], ...] = ()) -> dict[tuple[str, ...], dict]:
    """``brute_force``'s answer over ``schedules`` and over each of ``subsets`` of them, from
    one enumeration (each candidate simulated once)."""
    spaces = (schedules, *subsets)
    out = {s: {"time": np.inf, "mode": None, "recompute": False, "overflowing": 0, "candidates": 0} for s in spaces}
    for plan in candidates(graph, cluster, m, schedules):
        t, fits, rec = fitting_time(plan)
        for space in spaces:
            if plan.schedule not in space:
                continue
            best = out[space]
            best["overflowing"] += rec
            best["candidates"] += 1
            if fits and t < best["time"]:
                best.update(time=t, mode=plan.replicas, recompute=rec, schedule=plan.schedule,
                            replication=plan.replication())
    return out
