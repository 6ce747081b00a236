"""Model chunks on the joint search's best plan (docs/joint.md): its p device groups each
take several chunks of the model, as the schedules with more than one stage per device
need (interleaved 1F1B, Narayanan et al. 2021 §2.2: chunk j on group j mod p; ZB-V, Qi et
al. 2024: two chunks in a V, chunk j on group min(j, 2p-1-j)). The model is cut again into
v x p chunks of work in proportion to their groups' summed speed; each variant is
simulated (its overflowing chunks re-materialized) and the fastest kept."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import PipeplanError
from ...graph import linearize
from ...plan import Plan, Stage
from ...schedule import SCHEDULES
from ...schedule.layout import placement_positions
from ...sim import SimResult
from .candidate import balanced_bounds
from .score import simulate_fitting

MAX_CHUNKS = 4


def chunked(plan: Plan, schedule: str, chunks: int) -> Plan:
    """``plan``'s device groups, each holding ``chunks`` chunks placed as ``schedule`` runs them."""
    placement = SCHEDULES[schedule].placement
    groups = plan.stage_devices()
    p, lin = len(groups), linearize(plan.graph)
    where = [groups[s] for s in placement_positions(placement, p * chunks, p)]
    weights = np.array([plan.cluster.speed[g].sum() for g in where])
    bounds = balanced_bounds(lin.fwd_cum + lin.bwd_cum, weights)
    names = plan.cluster.names
    stages = [Stage([plan.graph.ids[u] for u in lin.interval(a, b)], [names[d] for d in g])
              for g, a, b in zip(where, bounds[:-1], bounds[1:])]
    return replace(plan, stages=stages, schedule=schedule, recompute=None, allocation=None, prediction={}, extra={})


def variants(plan: Plan, schedules: tuple[str, ...]) -> list[Plan]:
    """Every chunked variant of ``plan`` the searched schedules allow."""
    p, n = plan.num_stages, linearize(plan.graph).n
    if p < 2:
        return []
    out = []
    for sch in schedules:
        placement = SCHEDULES[sch].placement
        counts = {"loop": range(2, MAX_CHUNKS + 1), "v": (2,)}.get(placement, ())
        out += [chunked(plan, sch, v) for v in counts if p * v <= n]
    return out


def simulated_variants(plan: Plan, schedules: tuple[str, ...],
                       allow_over: bool) -> list[tuple[Plan, tuple[Plan, SimResult]]]:
    """Each chunked variant that runs: (the variant, (itself or re-materialized, its simulation))."""
    try:
        candidates = variants(plan, schedules)
    except PipeplanError:  # a shape the chunked schedules cannot take
        return []
    out = []
    for v in candidates:
        done = simulate_fitting(v, allow_over)
        if done is not None:
            out.append((v, done))
    return out
