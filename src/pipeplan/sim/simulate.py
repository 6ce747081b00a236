"""Simulate one training iteration of a plan under a schedule (SPP §III cost model).

``compile`` turns plan + schedule into a task graph; ``iteration`` costs it (``durations``),
runs it (``engine``) and reads it (``memory``, ``bounds``, ``steady``, contention) for a
batch of one. It never looks at a schedule's name: what to evaluate is in the IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .formulas import allreduce_time, transfer_time, update_time
from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import Kind, Schedule, check_schedule, make_schedule
from .bounds import work_bound
from .compile import BLOCKING_SENDS, TaskGraph, compile_tasks
from .stage_costs import StageCosts, plan_costs
from .durations import Layout, pass_speeds
from .iteration import Outcome, Shape, run_layouts
from .memory import walks
from .tensor_groups import Lowered, lower, needs_lowering, throughput
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
    #: a device that stands for a tensor-parallel group -> its GPUs (``sim.tensor_groups``)
    members: dict[str, list[str]] = field(default_factory=dict)

    def device_of(self) -> dict[str, int]:
        """Each plan device (a GPU of a tensor-parallel group too) -> its index in ``devices``."""
        return {m: k for k, d in enumerate(self.devices) for m in self.members.get(d, [d])}

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


def plan_layout(plan: Plan, tg: TaskGraph) -> Layout:
    """The plan's devices per group and per stage, as a batch of one."""
    lay = Layout(np.zeros((1, len(tg.groups), len(plan.cluster)), dtype=bool),
                 np.zeros((1, plan.num_stages, len(plan.cluster)), dtype=bool))
    for gi, g in enumerate(tg.groups):
        lay.groups[0, gi, g.devices] = True
    for s, devs in enumerate(plan.stage_devices()):
        lay.stages[0, s, devs] = True
    return lay


def plan_speeds(plan: Plan, lanes: bool) -> tuple[np.ndarray, np.ndarray]:
    """``durations.pass_speeds`` with the plan's allocation of each device's stage, (1, devices)."""
    beta = None
    if lanes and plan.allocation:
        beta = [{} for _ in plan.cluster.devices]
        for s, devs in enumerate(plan.stage_devices()):
            for d in devs:
                beta[d] = beta[d] or plan.allocation[s] or {}
    fs, bs = pass_speeds(plan.cluster, lanes, beta)
    return fs[None], bs[None]


def _refuse(plan: Plan, tg: TaskGraph, costs: StageCosts, out: Outcome, name: str) -> None:
    """Raise the first reason the plan cannot run: a missing link (the message of
    ``sim.formulas``' formula for it), else a deadlock."""
    bad = np.flatnonzero(out.bad[0])
    if bad.size:
        t = int(tg.rep[bad[np.argmin(tg.rep[bad])]])
        s, cl, stage_devs = int(tg.stage[t]), plan.cluster, plan.stage_devices()
        ga, gb = divmod(int(tg.pair[t]), len(tg.groups))
        if tg.kind[t] == Kind.AR:
            allreduce_time(cl, stage_devs[s], float(costs.params[0, s]), where=f"stage {s} all-reduce")
        elif tg.kind[t] == Kind.SEND_F:
            transfer_time(cl, tg.groups[ga].devices, tg.groups[gb].devices, 0.0, where=f"stages {s} -> {s + 1}")
        else:
            transfer_time(cl, tg.groups[gb].devices, tg.groups[ga].devices, 0.0, where=f"stages {s} -> {s - 1}")
    raise PipeplanError(f"schedule {name!r} deadlocks on this plan: only {int(out.ran[0])} of "
                        f"{tg.n} tasks can run (a device waits for data its order never lets arrive)")


#: compiled shapes and layouts by structure key (``_structure``); read-only once stored. At
#: most ``_SHAPES_MAX_TASKS`` tasks are kept over all of them (the oldest go first), so that
#: searches over thousands of devices do not fill memory with task graphs
_SHAPES: dict[tuple, tuple[Shape, Layout]] = {}
_SHAPES_MAX_TASKS = 2_000_000
_shape_tasks = [0]


def _structure(plan: Plan, sched: Schedule, crossing: np.ndarray) -> tuple:
    """Everything ``compile_tasks``, ``walks`` and ``plan_layout`` read: the schedule's
    programs, the stages' devices (and their names, in channel names), the cuts crossed,
    the cluster's duplex and size and whether an optimizer step is timed."""
    cl = plan.cluster
    stage_devs = tuple(tuple(g) for g in plan.stage_devices())
    return (sched.microbatches, sched.steady_state, sched.lanes, tuple(sched.devices),
            tuple((p.kinds.tobytes(), p.stages.tobytes(), p.micro.tobytes()) for p in sched.programs),
            stage_devs, tuple(cl.devices[d].name for g in stage_devs for d in g), crossing.tobytes(),
            len(cl), cl.meta.get("duplex", "full") == "half", update_time(plan.graph.meta, cl, 1.0, 1.0) > 0,
            bool(plan.graph.meta.get(BLOCKING_SENDS)))


def forget_compiled() -> None:
    """Empty the structure cache: the next simulation of any plan compiles its shape again
    (what a search's first plan of a shape costs; ``benchmarks/sim_throughput.py``)."""
    _SHAPES.clear()
    _shape_tasks[0] = 0


def compiled(plan: Plan, sched: Schedule, crossing: np.ndarray) -> tuple[Shape, Layout]:
    """The plan's shape (task graph, memory walks) and layout, compiled once per structure
    (searches simulate many plans that differ only in their numbers); treat as read-only."""
    key = _structure(plan, sched, crossing)
    hit = _SHAPES.get(key)
    if hit is None:
        tg = compile_tasks(plan, sched, crossing)
        hit = (Shape(tg, walks(tg), sched.steady_state, sched.microbatches, sched.lanes), plan_layout(plan, tg))
        while _SHAPES and _shape_tasks[0] + tg.n > _SHAPES_MAX_TASKS:
            _shape_tasks[0] -= _SHAPES.pop(next(iter(_SHAPES)))[0].tg.n
        _SHAPES[key] = hit
        _shape_tasks[0] += tg.n
    return hit


def simulate(plan: Plan, schedule: Schedule | None = None, timeline: bool = True) -> SimResult:
    """Run the plan's iteration; ``timeline=False`` skips building the timeline (searches).
    The batched evaluator's pipeline (``iteration.run_layouts``) with a batch of one."""
    if needs_lowering(plan):
        return _simulate_groups(plan, schedule, timeline)
    sched = schedule_of(plan, schedule)
    cl = plan.cluster
    costs = plan_costs(plan)
    shape, lay = compiled(plan, sched, costs.crossing[0])
    tg = shape.tg
    fs, bs = plan_speeds(plan, sched.lanes)
    out = run_layouts(shape, lay, costs, cl, plan.graph.meta, plan.optimizer, fs, bs, starts=timeline)
    if not out.done[0]:
        _refuse(plan, tg, costs, out, sched.name)
    return _result(plan, sched, tg, out, timeline)


def _simulate_groups(plan: Plan, schedule: Schedule | None, timeline: bool) -> SimResult:
    """A decoder LLM plan simulated on its tensor-parallel groups (``sim.tensor_groups``);
    memory per GPU (a group's / its size), throughput in TFLOP/s per GPU."""
    if schedule is not None and plan.tensor_parallel:
        raise PipeplanError("a schedule given by hand runs on devices, not on tensor-parallel groups: "
                            "give the plan's schedule by name")
    low = lower(plan)
    r = _per_group(simulate(low.plan, schedule, timeline), low)
    if "replicas" in low.plan.extra:
        r.extra["replicas_simulated"] = low.plan.extra["replicas"]
    r.extra.update(throughput(plan, r.iteration_s))
    costs, speed = plan_costs(low.plan), [float(low.plan.cluster.speed[g].min()) for g in low.plan.stage_devices()]
    share = [len(g) if plan.replicas == "split" else 1 for g in low.plan.stage_devices()]
    r.extra["stage_s_per_microbatch"] = [float((costs.fwd[0, s] + costs.bwd[0, s]) / (speed[s] * share[s]))
                                         for s in range(plan.num_stages)]
    return r


def _per_group(r: SimResult, low: Lowered) -> SimResult:
    """``r`` (on the lowered plan's devices) for every tensor-parallel group of the plan, each
    as the device it runs as: memory per GPU (a group's / its size)."""
    row = {d: i for i, d in enumerate(r.devices)}
    rows = [row[low.plan.cluster.names[g.runs_as]] for g in low.groups]
    size = np.array([len(g.gpus) for g in low.groups], dtype=float)
    stages = [r.stages_of(i) for i in rows]
    return replace(r, devices=[g.name for g in low.groups], stage_of_device=[r.stage_of_device[i] for i in rows],
                   busy_s=r.busy_s[rows], memory_bytes=r.memory_bytes[rows] / size,
                   memory_limit=r.memory_limit[rows] / size,
                   device_stages=stages if any(len(st) > 1 for st in stages) else [],
                   members={g.name: g.gpus for g in low.groups})


def _result(plan: Plan, sched: Schedule, tg: TaskGraph, out: Outcome, timeline: bool) -> SimResult:
    cl = plan.cluster
    iteration, path = float(out.iteration[0]), float(out.path[0])
    work = work_bound(plan.graph, cl, sched.steady_state or sched.microbatches)
    stage_devs = plan.stage_devices()
    held: dict[int, list[int]] = {}  # device -> the stages it holds, devices in order of first use
    for s, grp in enumerate(stage_devs):
        for d in dict.fromkeys(grp):
            held.setdefault(d, []).append(s)
    plan_devs = list(held)
    window = None if out.window is None else (float(out.window[0, 0]), float(out.window[0, 1]))
    tl = build_timeline(cl, tg, out.start[0], out.end[0], iteration, plan_devs, stage_devs, sched.lanes,
                        window) if timeline else None
    extra: dict = {"steady_state_of": sched.steady_state} if sched.steady_state is not None else {}
    if out.scale is not None:
        extra["contention"] = {cl.devices[d].name: float(out.scale[0, d] * cl.devices[d].speed) for d in plan_devs}
    return SimResult(iteration_s=iteration, lower_s=max(work, path), work_bound_s=work, path_bound_s=path,
                     devices=[cl.devices[d].name for d in plan_devs],
                     stage_of_device=[held[d][0] for d in plan_devs],
                     busy_s=out.busy[0, plan_devs], memory_bytes=out.memory[0, plan_devs],
                     memory_limit=cl.usable[plan_devs], num_tasks=tg.n, timeline=tl, extra=extra,
                     device_stages=[held[d] for d in plan_devs] if any(len(h) > 1 for h in held.values()) else [])


def predicted_s(plan: Plan) -> float:
    """The plan's predicted seconds per iteration (what the runtime's measurements are held
    against)."""
    return simulate(plan, timeline=False).iteration_s
