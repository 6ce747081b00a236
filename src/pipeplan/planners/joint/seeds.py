"""Where the joint search starts: the other planners' plans (each run as it runs on its
own) and balanced plans of every stage count."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...budget import Budget
from ...cluster import Cluster
from ...errors import Infeasible, PipeplanError
from ...graph import Graph
from ...plan import Plan
from ...sim import SimResult
from ..base import PlanOptions, get_planner, run_planner
from .candidate import Candidate, balanced_bounds, make

#: Planners whose plans seed the search (each skipped when its estimate exceeds SEED_LIMIT_S).
SEED_PLANNERS = ("spp", "pipedream", "megatron", "hetpipe", "dp", "gpipe", "resalloc")
#: On large clusters: those that plan in about a second there (spp's device ordering grows as
#: V^3.9; megatron's plans are among the symmetric search's configurations).
LARGE_SEED_PLANNERS = ("pipedream", "hetpipe", "dp", "gpipe")
#: A seed planner whose own size model (``PlannerInfo.estimate``) says it takes longer is
#: skipped: a rule on the instance, not on the clock, so every machine runs the same seeds.
SEED_LIMIT_S = 60.0


def seed_plans(graph: Graph, cluster: Cluster, options: PlanOptions, budget: Budget,
               planners: tuple[str, ...] = SEED_PLANNERS, share: float = 0.5) -> dict[str, tuple[Plan, SimResult]]:
    """Each seed planner's plan and simulation. One is skipped when its estimate exceeds
    ``SEED_LIMIT_S`` or, under a wall-clock cap, ``share`` of the time left, or when it cannot
    plan the instance."""
    out: dict[str, tuple[Plan, SimResult]] = {}
    multi = any(len(d.resources) > 1 for d in cluster.devices)
    plain = replace(options, global_batch=None, known_plans=None)  # each seed reads its own settings
    for name in planners:
        if name == "resalloc" and not multi:
            continue
        known = _known(options, name, graph, cluster)
        if known is not None:
            out[name] = known
            continue
        estimate = get_planner(name).estimate
        seconds = 0.0 if estimate is None else float(estimate(graph, cluster, plain) or 0.0)
        if budget.out_of_time() or seconds > SEED_LIMIT_S or (
                budget.seconds is not None and seconds > share * (budget.seconds - budget.elapsed)):
            continue
        try:
            out[name] = run_planner(name, graph, cluster, plain)
        except (PipeplanError, Infeasible):
            continue
    return out


def device_ranking(cluster: Cluster) -> list[int]:
    """Devices, servers together: the fastest server (summed speed) first, inside a server
    the fastest device first."""
    speed = cluster.speed
    total: dict[str, float] = {}
    for d, dev in enumerate(cluster.devices):
        total[dev.server] = total.get(dev.server, 0.0) + float(speed[d])
    return sorted(range(len(cluster)), key=lambda d: (-total[cluster.devices[d].server], cluster.devices[d].server,
                                                      -float(speed[d]), d))


def subset_sizes(cluster: Cluster, ranking: list[int], every_up_to: int = 16) -> list[int]:
    """How many of the ranked devices the balanced starts use: every count up to
    ``every_up_to``, beyond that whole servers."""
    v = len(ranking)
    ends = {i + 1 for i in range(v - 1) if cluster.devices[ranking[i]].server != cluster.devices[ranking[i + 1]].server}
    return sorted({k for k in range(1, v + 1) if k <= every_up_to or k in ends or k == v})


def _known(options: PlanOptions, name: str, graph: Graph, cluster: Cluster) -> tuple[Plan, SimResult] | None:
    """``name``'s plan from ``options.known_plans`` when it is for these very inputs."""
    known = (options.known_plans or {}).get(name)
    if known is None:
        return None
    plan, result = known
    same = plan.graph is graph and plan.cluster is cluster and plan.microbatches == options.microbatches
    return (plan, result) if same else None


def balanced_starts(order: int, work_cum: np.ndarray, ranking: list[int], sizes: list[int], max_stages: int,
                    schedule: str, modes: tuple[str, ...]) -> list[Candidate]:
    """For each device count k of ``sizes`` and stage count S: S stages of work in
    proportion to their devices, the first k ranked devices dealt into S contiguous groups
    of about equal size."""
    n = work_cum.size - 1
    out = []
    for k in sizes:
        for s in range(1, min(n, k, max_stages) + 1):
            groups = [list(g) for g in np.array_split(np.asarray(ranking[:k]), s)]
            bounds = balanced_bounds(work_cum, np.array([len(g) for g in groups], dtype=float))
            out += [make(order, bounds, groups, None, schedule, m) for m in modes]
    return out
