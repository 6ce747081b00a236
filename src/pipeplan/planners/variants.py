"""Plans that fit: when a planner's plan overflows a device's memory, the fastest variant of
it that fits — the same stages, devices and microbatches, with activation re-materialization
(GPipe §2.3) on the stages that overflow, and/or a schedule that keeps fewer microbatches in
flight (1F1B keeps at most S-s on stage s, GPipe all M).

Re-materialization changes only its own stage's memory and only adds work, so the smallest
set that can make a plan fit is exactly the stages whose devices overflow without it; a
stage that still overflows with it cannot be helped this way. ``tests/test_variants.py``
checks the result against every subset of stages.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import Infeasible, PipeplanError
from ..plan import Plan
from ..sim import SimResult, simulate

#: Schedules that keep fewer microbatches in flight than the one named, to try when it overflows.
FEWER_IN_FLIGHT = {"gpipe": ("1f1b",), "spp-pe": ("1f1b",)}


def _overflowing_stages(result: SimResult) -> list[int]:
    return sorted({s for s, m, lim in zip(result.stage_of_device, result.memory_bytes, result.memory_limit) if m > lim})


def _with(plan: Plan, schedule: str, stages: list[int]) -> Plan:
    rec = [bool(plan.recomputes(s)) or s in stages for s in range(plan.num_stages)]
    return replace(plan, schedule=schedule, recompute=rec if any(rec) else None, prediction={}, extra=dict(plan.extra))


def fit_memory(plan: Plan) -> Plan:
    """The plan if it fits; else its fastest variant that fits; else the plan unchanged."""
    first = simulate(plan, timeline=False)
    if not first.over_memory:
        return plan
    best: tuple[float, Plan] | None = None
    for schedule in (plan.schedule, *FEWER_IN_FLIGHT.get(plan.schedule, ())):
        base = _with(plan, schedule, [])
        try:
            r = simulate(base, timeline=False) if schedule != plan.schedule else first
            tried = [(base, r)]
            if r.over_memory:
                fixed = _with(plan, schedule, _overflowing_stages(r))
                tried.append((fixed, simulate(fixed, timeline=False)))
        except (Infeasible, PipeplanError):
            continue
        for cand, res in tried:
            if not res.over_memory and (best is None or res.iteration_s < best[0]):
                best = (res.iteration_s, cand)
    if best is None:
        return plan
    chosen = best[1]
    chosen.extra["memory_variant"] = {"schedule": chosen.schedule,
                                      "recompute": [s for s in range(chosen.num_stages) if chosen.recomputes(s)]}
    return chosen
