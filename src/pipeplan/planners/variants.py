"""Plans that fit, and the microbatch size for a global batch (docs/memory-variants.md).

``fit_memory(plan)``: when a planner's plan overflows a device's memory, the fastest variant
of it that fits. A variant keeps the planner's stages, devices and microbatches and changes
only (a) activation re-materialization (GPipe §2.3) on some stages, added to the ones the
planner chose, and (b) a synchronous schedule that keeps more microbatches in flight than
1F1B (GPipe keeps all M) for 1F1B (PipeDream-flush / DAPPLE, at most S-s on stage s).
Per schedule, re-materialization is switched on greedily: among the stages that overflow,
the one that saves the most memory per second of extra compute, then simulate again, until
the plan fits or an overflowing stage already re-materializes. Where a stage's memory
depends only on its own flag (the simulator's memory model, but for contention shifting
the shares of split replicas) and added work never shortens the iteration, this ends with
exactly the stages that overflow without it, which is optimal; ``tests/test_variants.py``
checks the result against every subset of stages under each schedule.

``batch_choices`` / ``plan_for_global_batch``: a global batch N = samples x M; each split is
planned on the graph scaled to its microbatch size (``graph.scale``) and the fastest plan
that fits wins (GPipe §2.2: larger M shrinks the bubble, smaller microbatches pay the fixed
per-call costs more often).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..cluster import Cluster
from ..errors import Infeasible, PipeplanError
from ..graph import Graph
from ..graph.scale import profiled_microbatch, with_microbatch
from ..plan import Plan
from ..schedule import SCHEDULES, Kind, make_schedule
from ..sim import SimResult, simulate
from .ranking import rank_key

#: The schedule tried when the plan's keeps more microbatches in flight.
FEWER_IN_FLIGHT = "1f1b"
#: At most this many (samples, microbatches) splits of a global batch are planned.
MAX_BATCH_CHOICES = 12


# -- memory variants ---------------------------------------------------------------------------

def _variant(plan: Plan, schedule: str, recompute: list[bool]) -> Plan:
    return replace(plan, schedule=schedule, recompute=list(recompute) if any(recompute) else None,
                   prediction={}, extra=dict(plan.extra))


def overflowing_stages(result: SimResult) -> list[int]:
    """Stages with a device over its memory."""
    return sorted({s for i, (m, lim) in enumerate(zip(result.memory_bytes, result.memory_limit)) if m > lim
                   for s in result.stages_of(i)})


def _in_flight(plan: Plan, schedule: str) -> dict[int, int] | None:
    """Most microbatches in flight on each device under a synchronous ``schedule``; None for
    a steady state or lanes (their iteration is not comparable with a flushed one)."""
    sched = make_schedule(schedule, plan.stage_devices(), plan.microbatches, plan.replicas)
    if sched.steady_state is not None or sched.lanes:
        return None
    out = {}
    for d, p in zip(sched.devices, sched.programs):
        step = np.where(p.kinds == Kind.F, 1, np.where((p.kinds == Kind.B) | (p.kinds == Kind.W), -1, 0))
        out[d] = int(np.cumsum(step).max(initial=0))
    return out


def schedules_to_try(plan: Plan) -> list[str]:
    """The plan's schedule, then 1F1B if the plan's is synchronous and keeps more
    microbatches in flight than 1F1B on some device."""
    kind = SCHEDULES.get(plan.schedule)
    if plan.schedule == FEWER_IN_FLIGHT or (kind is not None and kind.placement != "single"):
        return [plan.schedule]  # model chunks: no one-stage-per-device schedule runs them
    mine, fewer = _in_flight(plan, plan.schedule), _in_flight(plan, FEWER_IN_FLIGHT)
    if mine is None or fewer is None or not any(n > fewer[d] for d, n in mine.items()):
        return [plan.schedule]
    return [plan.schedule, FEWER_IN_FLIGHT]


def recompute_payoffs(plan: Plan, result: SimResult, stages: list[int]) -> dict[int, float] | None:
    """Memory saved per second of extra compute by re-materializing each of ``stages``
    (measured by one simulation with all of them on); None if one of them overflows even so."""
    rec = [plan.recomputes(s) or s in stages for s in range(plan.num_stages)]
    on = simulate(_variant(plan, plan.schedule, rec), timeline=False)
    if set(overflowing_stages(on)) & set(stages):
        return None
    out = {}
    for s in stages:
        sel = np.array([s in result.stages_of(i) for i in range(len(result.devices))])
        saved = float((result.memory_bytes[sel] - on.memory_bytes[sel]).max())
        extra = float((on.busy_s[sel] - result.busy_s[sel]).max())
        out[s] = saved / extra if extra > 0 else math.inf
    return out


def greedy_recompute(plan: Plan, result: SimResult | None = None) -> tuple[Plan, SimResult] | None:
    """Switch re-materialization on, stage by stage, until ``plan`` fits: each time the
    overflowing stage with the best payoff (memory saved per second of extra compute),
    simulating again after each. None when an overflowing stage cannot be helped."""
    result = result or simulate(plan, timeline=False)
    payoff: dict[int, float] = {}
    while result.over_memory:
        over = [s for s in overflowing_stages(result) if not plan.recomputes(s)]
        if not over:
            return None
        missing = [s for s in over if s not in payoff]
        if missing:
            got = recompute_payoffs(plan, result, missing)
            if got is None:
                return None
            payoff.update(got)
        best = max(over, key=lambda s: (payoff[s], -s))
        rec = [plan.recomputes(s) or s == best for s in range(plan.num_stages)]
        plan = _variant(plan, plan.schedule, rec)
        result = simulate(plan, timeline=False)
    return plan, result


def _candidates(plan: Plan, first: SimResult) -> list[tuple[float, Plan]]:
    """(iteration, plan) of every variant tried that fits, in the order tried."""
    out = []
    floor = [plan.recomputes(s) for s in range(plan.num_stages)]
    for schedule in schedules_to_try(plan):
        try:
            base = plan if schedule == plan.schedule else _variant(plan, schedule, floor)
            res = first if base is plan else simulate(base, timeline=False)
            if not res.over_memory:
                out.append((res.iteration_s, base))
                continue  # adding work to a plan that fits does not pay
            got = greedy_recompute(base, res)
        except (Infeasible, PipeplanError):
            continue
        if got is not None:
            out.append((got[1].iteration_s, got[0]))
    return out


def fit_memory(plan: Plan) -> Plan:
    """``plan`` itself if it fits; else its fastest variant that fits (same stages, devices
    and microbatches; more re-materialization and/or 1F1B), recorded in
    ``extra["memory_variant"]``; else ``plan`` unchanged (the caller flags it)."""
    first = simulate(plan, timeline=False)
    if not first.over_memory:
        return plan
    found = _candidates(plan, first)
    if not found:
        return plan
    chosen = min(found, key=lambda c: c[0])[1]  # ties: the first tried
    chosen.extra["memory_variant"] = {
        "schedule": chosen.schedule,
        "recompute": [s for s in range(chosen.num_stages) if chosen.recomputes(s)],
        "added_recompute": [s for s in range(chosen.num_stages) if chosen.recomputes(s) and not plan.recomputes(s)],
        "original_schedule": plan.schedule,
    }
    return chosen


# -- the microbatch size for a global batch -------------------------------------------------

def _spread(divisors: list[int], anchors: set[int], count: int) -> list[int]:
    """``count`` of ``divisors`` spread geometrically: the anchors, 1 and N, then again and
    again the divisor farthest (in log) from those chosen (ties: the smaller)."""
    chosen = sorted({divisors[0], divisors[-1], *anchors} & set(divisors))[:count]
    logs = {m: math.log(m) for m in divisors}
    while len(chosen) < count:
        rest = [m for m in divisors if m not in chosen]
        chosen.append(max(rest, key=lambda m: (min(abs(logs[m] - logs[c]) for c in chosen), -m)))
    return sorted(chosen)


def batch_choices(global_batch: int, graph: Graph, devices: int) -> list[tuple[int, int]]:
    """(samples per microbatch, microbatches M) with samples x M = ``global_batch``: every
    divisor M of N, or, when N has more than ``MAX_BATCH_CHOICES``, that many spread
    geometrically over [1, N] that include the M nearest ``devices`` and ``4 x devices`` (the
    pipeline fills / its bubble (S-1)/(M+S-1) drops under ~20%, GPipe §2.2) and the split at
    the graph's profiled microbatch size (its figures measured, not extrapolated)."""
    n = global_batch
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise PipeplanError(f"global batch must be an integer >= 1, got {n!r}")
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
        raise PipeplanError(f"global batch {n}: devices must be an integer >= 1, got {devices!r}")
    b0 = profiled_microbatch(graph)
    n = int(n)
    divisors = [m for m in range(1, math.isqrt(n) + 1) if n % m == 0]
    divisors = sorted(set(divisors) | {n // m for m in divisors})
    if len(divisors) > MAX_BATCH_CHOICES:
        near = lambda x: min(divisors, key=lambda m: (abs(math.log(m) - math.log(x)), m))  # noqa: E731
        anchors = {near(devices), near(4 * devices)} | ({n // b0} if n % b0 == 0 else set())
        divisors = _spread(divisors, anchors, MAX_BATCH_CHOICES)
    return [(n // m, m) for m in divisors]


def _plan_split(planner_fn: Callable[..., Plan], graph: Graph, cluster: Cluster, options: Any,
                samples: int, m: int, memory_variants: bool) -> tuple[Plan, SimResult]:
    plan = planner_fn(with_microbatch(graph, samples), cluster, replace(options, microbatches=m))
    if memory_variants:
        plan = fit_memory(plan)
    return plan, simulate(plan, timeline=False)


def plan_for_global_batch(planner_fn: Callable[..., Plan], graph: Graph, cluster: Cluster, options: Any,
                          global_batch: int, memory_variants: bool = True) -> Plan:
    """Plan every split of ``batch_choices`` (``planner_fn(scaled graph, cluster, options with
    microbatches=M)``, then ``fit_memory`` unless ``memory_variants`` is False or
    ``options.allow_over_memory``) and keep the first by ``ranking.rank_key``; ``extra["global_batch"]`` records the splits tried.
    ``options`` is a dataclass with a ``microbatches`` field (``PlanOptions``)."""
    t0 = time.perf_counter()
    fit = memory_variants and not getattr(options, "allow_over_memory", False)
    tried: list[dict] = []
    best: tuple[tuple, Plan, int] | None = None
    for samples, m in batch_choices(global_batch, graph, len(cluster)):
        row: dict[str, Any] = {"samples_per_microbatch": samples, "microbatches": m}
        try:
            plan, res = _plan_split(planner_fn, graph, cluster, options, samples, m, fit)
        except (Infeasible, PipeplanError) as e:
            tried.append({**row, "error": str(e)})
            continue
        tried.append({**row, "iteration_s": res.iteration_s, "fits": not res.over_memory})
        key = rank_key(res)
        if best is None or key < best[0]:
            best = (key, plan, samples)
    if best is None:
        raise PipeplanError(f"global batch {global_batch}: no split into microbatches could be planned "
                            f"({tried[0]['error']})")
    _, plan, samples = best
    plan.extra["global_batch"] = {"samples_per_microbatch": samples,
                                  "microbatches": plan.microbatches, "tried": tried}
    plan.search_s = time.perf_counter() - t0
    return plan
