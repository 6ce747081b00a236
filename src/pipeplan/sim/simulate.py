"""Simulate one training iteration of a plan under a schedule (SPP §III cost model).

``compile`` turns plan + schedule into a task graph, ``engine`` runs it, ``memory`` and
``bounds`` read it, ``steady`` evaluates asynchronous schedules; this module ties them and
applies contention. It never looks at a schedule's name: what to evaluate is in the IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster.model import Resource
from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import Kind, Schedule, check_schedule, make_schedule
from .bounds import path_bound, work_bound
from .compile import TaskGraph, compile_tasks
from .costs import stage_costs
from .engine import run_tasks
from .memory import device_memory
from .steady import period, steady_iteration
from .timeline import Timeline, build_timeline


@dataclass
class SimResult:
    iteration_s: float
    lower_s: float
    work_bound_s: float
    path_bound_s: float
    devices: list[str]
    stage_of_device: list[int]
    busy_s: np.ndarray
    memory_bytes: np.ndarray
    memory_limit: np.ndarray
    num_tasks: int
    timeline: Timeline | None = None
    extra: dict = field(default_factory=dict)
    #: every stage each device holds (several: model chunks); empty: ``stage_of_device`` alone
    device_stages: list[list[int]] = field(default_factory=list)

    def stages_of(self, i: int) -> list[int]:
        """The stages device i (of ``devices``) holds."""
        return self.device_stages[i] if self.device_stages else [self.stage_of_device[i]]

    def stage_text(self, i: int) -> str:
        """``stage 3``, or ``stages 1,5`` for a device that holds model chunks."""
        st = self.stages_of(i)
        return f"stage {st[0]}" if len(st) == 1 else f"stages {','.join(map(str, st))}"

    @property
    def efficiency(self) -> float:
        return self.lower_s / self.iteration_s if self.iteration_s > 0 else 1.0

    @property
    def utilization(self) -> np.ndarray:
        return self.busy_s / self.iteration_s if self.iteration_s > 0 else np.ones_like(self.busy_s)

    @property
    def bubble_fraction(self) -> float:
        return float(1.0 - self.utilization.mean())

    @property
    def over_memory(self) -> list[str]:
        return [d for d, m, lim in zip(self.devices, self.memory_bytes, self.memory_limit) if m > lim]

    def summary(self) -> dict:
        """The prediction as stored in a plan and printed by ``--json``."""
        return {
            "iteration_s": self.iteration_s, "lower_bound_s": self.lower_s,
            "work_bound_s": self.work_bound_s, "path_bound_s": self.path_bound_s,
            "efficiency": self.efficiency, "bubble_fraction": self.bubble_fraction,
            "devices": [{"name": d, "stage": s, "busy_s": float(b), "utilization": float(u),
                         "memory_bytes": float(m), "memory_limit_bytes": float(lim),
                         **({"stages": self.stages_of(i)} if len(self.stages_of(i)) > 1 else {})}
                        for i, (d, s, b, u, m, lim) in enumerate(zip(self.devices, self.stage_of_device, self.busy_s,
                                                                     self.utilization, self.memory_bytes,
                                                                     self.memory_limit))],
            "over_memory": self.over_memory, **self.extra,
        }


def pass_speeds(plan: Plan, lanes: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each device's forward and backward speed. With ``lanes`` (resalloc.txt
    §III-B) forward gets beta_j of each resource j and backward the rest (a single resource
    is time-shared), beta from the plan's allocation (default 0.5); speeds are linear in beta."""
    cl = plan.cluster
    if not lanes:
        return cl.fspeed, cl.bspeed
    f, b = np.zeros(len(cl)), np.zeros(len(cl))
    for s, st in enumerate(plan.stages):
        alloc = (plan.allocation[s] if plan.allocation else None) or {}
        for d in cl.device_indices(st.devices):
            dev = cl.devices[d]
            for r in dev.resources or (Resource("*", dev.speed, dev.speed),):
                beta = float(alloc.get(r.name, alloc.get("*", 0.5)))
                f[d] += beta * r.fwd_speed
                b[d] += (1.0 - beta) * r.bwd_speed
    return f, b


def schedule_of(plan: Plan, schedule: Schedule | None = None) -> Schedule:
    """The plan's schedule (generated from its name), or ``schedule`` checked against the plan."""
    stage_devs = plan.stage_devices()
    if schedule is None:
        return make_schedule(plan.schedule, stage_devs, plan.microbatches, plan.replicas)
    check_schedule(schedule, len(stage_devs))
    for s, devs in enumerate(stage_devs):
        holders = sorted(d for d, p in zip(schedule.devices, schedule.programs) if np.any(p.stages == s))
        if holders != sorted(devs):
            raise PipeplanError(f"schedule {schedule.name}: stage {s} runs on other devices than the plan gives it")
    return schedule


def simulate(plan: Plan, schedule: Schedule | None = None, timeline: bool = True) -> SimResult:
    """Run the plan's iteration; ``timeline=False`` skips building the timeline (searches).

    Devices that know their ``solo_speed`` (calibrated) are simulated twice: first alone,
    then at a speed between alone and all-busy by how much of their time the other devices
    of their server are busy (``contention_scale``)."""
    sched = schedule_of(plan, schedule)
    cl = plan.cluster
    if all(d.solo_speed is None for d in cl.devices):
        return _simulate(plan, sched, timeline)
    solo = np.array([d.solo_speed or d.speed for d in cl.devices])
    first = _simulate(plan, sched, False, scale=solo / cl.speed)
    scale = contention_scale(plan, first)
    result = _simulate(plan, sched, timeline, scale=scale)
    used = [cl.index[n] for n in first.devices]
    result.extra["contention"] = {cl.devices[i].name: float(scale[i] * cl.devices[i].speed) for i in used}
    return result


def contention_scale(plan: Plan, alone: SimResult) -> np.ndarray:
    """Effective speed / speed of each device: between its solo speed and its all-busy
    speed, by the probability that another device of its server is busy (from their
    utilization when simulated alone), harmonically (time per unit of work interpolates)."""
    cl = plan.cluster
    util = dict(zip((cl.index[n] for n in alone.devices), alone.utilization))
    scale = np.ones(len(cl))
    for i, d in enumerate(cl.devices):
        if i not in util:
            continue
        solo = d.solo_speed or d.speed
        others = [util[j] for j, e in enumerate(cl.devices) if j != i and j in util and e.server == d.server]
        overlap = 1.0 - float(np.prod([1.0 - min(u, 1.0) for u in others])) if others else 0.0
        scale[i] = 1.0 / ((1.0 - overlap) / solo + overlap / d.speed) / d.speed
    return scale


def _busy(tg: TaskGraph, n_dev: int, lanes: bool) -> np.ndarray:
    """Compute time of each device (the busier lane with lanes)."""
    busy = np.zeros(n_dev)
    comp = tg.owner >= 0
    for gi, g in enumerate(tg.groups):
        sel = comp & (tg.owner == gi)
        if lanes:
            f = float(tg.dur[sel & (tg.kind == Kind.F)].sum())
            b = float(tg.dur[sel & (tg.kind != Kind.F)].sum())
            busy[g.devices] = max(f, b)
        else:
            busy[g.devices] = float(tg.dur[sel].sum())
    return busy


def _simulate(plan: Plan, sched: Schedule, timeline: bool, scale: np.ndarray | None = None) -> SimResult:
    cl = plan.cluster
    fspeed, bspeed = pass_speeds(plan, sched.lanes)
    if scale is not None:  # contention: the effective speed of each device
        fspeed, bspeed = fspeed * scale, bspeed * scale
    costs = stage_costs(plan)
    tg = compile_tasks(plan, sched, costs, fspeed, bspeed)
    start_a, end_a, done = run_tasks(tg.dur, tg.ptr, tg.succ, tg.npred, tg.chan, len(tg.channels))
    if done != tg.n:
        raise PipeplanError(f"schedule {sched.name!r} deadlocks on this plan: only {done} of {tg.n} "
                            "tasks can run (a device waits for data its order never lets arrive)")
    busy = _busy(tg, len(cl), sched.lanes)
    m_eval = sched.steady_state or sched.microbatches
    window = None
    if sched.steady_state is not None:
        ar = np.zeros(len(cl))
        for t in np.flatnonzero(tg.kind == Kind.AR).tolist():
            ar[plan.stage_devices()[int(tg.stage[t])]] += tg.dur[t]
        window = period(tg, end_a, sched.steady_state, sched.microbatches)
        iteration = steady_iteration(tg, window, sched.steady_state, sched.microbatches, busy, ar)
        busy = busy * (sched.steady_state / sched.microbatches)
        path = 0.0
    else:
        iteration = float(end_a.max(initial=0.0))
        path = path_bound(tg)
    work = work_bound(plan.graph, cl, m_eval)
    mem = device_memory(tg.groups, costs, plan.optimizer, fspeed, tg.share_f, sched.steady_state is not None)
    stage_devs = plan.stage_devices()
    plan_devs = list(dict.fromkeys(d for grp in stage_devs for d in grp))  # a device once, however many stages
    held = {d: [s for s, grp in enumerate(stage_devs) if d in grp] for d in plan_devs}
    tl = build_timeline(cl, tg, start_a, end_a, iteration, plan_devs, stage_devs, sched.lanes,
                        window) if timeline else None
    extra = {"steady_state_of": sched.steady_state} if sched.steady_state is not None else {}
    return SimResult(iteration_s=iteration, lower_s=max(work, path), work_bound_s=work, path_bound_s=path,
                     devices=[cl.devices[d].name for d in plan_devs],
                     stage_of_device=[held[d][0] for d in plan_devs],
                     busy_s=busy[plan_devs], memory_bytes=np.array([mem[d] for d in plan_devs]),
                     memory_limit=cl.memory[plan_devs], num_tasks=tg.n, timeline=tl, extra=extra,
                     device_stages=[held[d] for d in plan_devs] if any(len(h) > 1 for h in held.values()) else [])
