"""Simulate one synchronous training iteration of a plan under a schedule (SPP §III cost model).

Replicas of a stage that run the same program form one group (one resource); they split each
microbatch in proportion to their speeds. Inter-stage transfers of a microbatch go over the channel between
the sending and receiving device sets; one channel carries both directions, one transfer at
a time. Each replicated stage all-reduces its gradients after its last backward. The
iteration ends with the last backward of stage 0 or the last all-reduce (SPP Eq. 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster.model import Resource
from ..costmodel import allreduce_time, state_bytes, transfer_time
from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import Schedule, make_schedule
from ..schedule.ir import ALLREDUCE, BWD, FWD
from .costs import StageCosts, stage_costs
from .engine import run_tasks
from .timeline import COMM_B, COMM_F, KIND_NAMES, UPDATE, Timeline


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
                         "memory_bytes": float(m), "memory_limit_bytes": float(lim)}
                        for d, s, b, u, m, lim in zip(self.devices, self.stage_of_device, self.busy_s,
                                                      self.utilization, self.memory_bytes, self.memory_limit)],
            "over_memory": self.over_memory, **self.extra,
        }


@dataclass
class _Group:
    stage: int
    devices: list[int]
    ops: np.ndarray
    micro: np.ndarray
    base: int = 0  # id of its first task


def pass_speeds(plan: Plan, lanes: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each device's forward and backward speed. With ``lanes`` (fb-parallel, resalloc.txt
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


def _groups(plan: Plan, sched: Schedule) -> list[_Group]:
    groups: list[_Group] = []
    progs: list = []
    for d, p in zip(sched.devices, sched.programs):
        for k, q in enumerate(progs):
            if q.same_as(p):
                groups[k].devices.append(d)
                break
        else:
            progs.append(p)
            groups.append(_Group(p.stage, [d], p.ops, p.micro))
    return groups


ASYNC = "async-1f1b"
FB_PARALLEL = "fb-parallel"


def fixed_part(fixed: float, speeds: np.ndarray) -> float:
    """A microbatch share's fixed time on the slowest working replica (a device with no
    speed for a pass takes no share of it)."""
    working = speeds[speeds > 0]
    return fixed / float(working.min()) if fixed > 0 and working.size else 0.0


def simulate(plan: Plan, schedule: Schedule | None = None, timeline: bool = True) -> SimResult:
    """Run the plan's iteration; ``timeline=False`` skips building the timeline (searches).

    ``async-1f1b`` is PipeDream's original pipeline (no flush, weight stashing): a stream of
    3M microbatches runs 1F1B without all-reduce barriers and the prediction is the
    steady-state time of M microbatches (the time between the last backward of microbatch
    M-1 and of 2M-1 on the first stage), or, if longer, a replicated stage's busy time for
    M microbatches plus its all-reduce (which overlaps with the pipeline). ``fb-parallel``
    is the same steady state with forward and backward side by side on each device
    (resalloc.txt §III-B).

    Devices that know their ``solo_speed`` (calibrated) are simulated twice: first alone,
    then at a speed between alone and all-busy by how much of their time the other devices
    of their server are busy (probability that at least one is, from their utilization)."""
    stage_devs = plan.stage_devices()
    steady, lanes = None, False
    if schedule is not None:
        schedule.check(len(stage_devs), [len(d) for d in stage_devs])
        m_count = plan.microbatches
    elif plan.schedule in (ASYNC, FB_PARALLEL):
        steady, lanes = plan.microbatches, plan.schedule == FB_PARALLEL
        m_count = 3 * plan.microbatches
        schedule = make_schedule("1f1b", stage_devs, m_count, plan.replicas, allreduce=False)
    else:
        m_count = plan.microbatches
        schedule = make_schedule(plan.schedule, stage_devs, m_count, plan.replicas)
    cl = plan.cluster
    if all(d.solo_speed is None for d in cl.devices):
        return _simulate(plan, schedule, m_count, timeline, steady, lanes)
    solo = np.array([d.solo_speed or d.speed for d in cl.devices])
    first = _simulate(plan, schedule, m_count, False, steady, lanes, scale=solo / cl.speed)
    util = dict(zip((cl.index[n] for n in first.devices), first.utilization))
    scale = np.ones(len(cl))
    for i, d in enumerate(cl.devices):
        if i not in util:
            continue
        others = [util[j] for j, e in enumerate(cl.devices) if j != i and j in util and e.server == d.server]
        overlap = 1.0 - float(np.prod([1.0 - min(u, 1.0) for u in others])) if others else 0.0
        eff = 1.0 / ((1.0 - overlap) / solo[i] + overlap / d.speed)
        scale[i] = eff / d.speed
    result = _simulate(plan, schedule, m_count, timeline, steady, lanes, scale=scale)
    result.extra["contention"] = {cl.devices[i].name: float(scale[i] * cl.devices[i].speed) for i in util}
    return result


def _simulate(plan: Plan, schedule: Schedule, m_count: int, timeline: bool,
              steady: int | None = None, lanes: bool = False, scale: np.ndarray | None = None) -> SimResult:
    cl = plan.cluster
    stage_devs = plan.stage_devices()
    s_count = len(stage_devs)
    costs = stage_costs(plan)
    groups = _groups(plan, schedule)
    g_count = len(groups)

    # -- compute tasks: each group's program, in order; a stage's all-reduce is one task
    # shared by its groups. Devices sharing a (stage, microbatch) split it in proportion to
    # their speeds, so they finish together (evenly, for identical devices).
    fspeed, bspeed = pass_speeds(plan, lanes)
    overhead = float(cl.meta.get("action_overhead_s", 0.0))  # the runtime's, per compute action
    if scale is not None:  # contention: the effective speed of each device
        fspeed, bspeed = fspeed * scale, bspeed * scale
    share_n = np.zeros((s_count, m_count))
    share_f = np.zeros((s_count, m_count))
    share_b = np.zeros((s_count, m_count))
    f_task = np.zeros((s_count, m_count), dtype=np.int64)
    b_task = np.zeros((s_count, m_count), dtype=np.int64)
    for gr in groups:
        mics = gr.micro[gr.ops == FWD]
        share_n[gr.stage, mics] += len(gr.devices)
        share_f[gr.stage, mics] += float(fspeed[gr.devices].sum())
        share_b[gr.stage, mics] += float(bspeed[gr.devices].sum())
    ar_task = np.full(s_count, -1)
    last_task: list[int] = []  # each group's last action
    dur_parts, kind_parts, stage_parts, micro_parts, owner_parts, chain_parts = [], [], [], [], [], []
    n = 0
    for gi, gr in enumerate(groups):
        s = gr.stage
        is_ar = gr.ops == ALLREDUCE
        if is_ar.any() and ar_task[s] < 0:
            ar_task[s] = n
            dur_parts.append([allreduce_time(cl, stage_devs[s], costs.params[s],
                                             where=f"stage {s} all-reduce")])
            kind_parts.append([ALLREDUCE]), stage_parts.append([s]), micro_parts.append([-1])
            owner_parts.append([-1])
            n += 1
        comp = ~is_ar
        k = int(comp.sum())
        ops, mic = gr.ops[comp], gr.micro[comp]
        gr.base = n
        ids = np.arange(n, n + k)
        # the varying part is shared in proportion to speed; the fixed part is paid in full
        ff, bf = fixed_part(costs.fwd_fixed[s], fspeed[gr.devices]), fixed_part(costs.bwd_fixed[s], bspeed[gr.devices])
        ff, bf = ff + overhead, bf + overhead
        with np.errstate(divide="ignore"):
            per = np.where(ops == FWD, (costs.fwd[s] - costs.fwd_fixed[s]) / share_f[s, mic] + ff,
                           (costs.bwd[s] - costs.bwd_fixed[s]) / share_b[s, mic] + bf)
        dur_parts.append(per), kind_parts.append(ops), stage_parts.append(np.full(k, s))
        micro_parts.append(mic), owner_parts.append(np.full(k, gi))
        f_task[s, mic[ops == FWD]] = ids[ops == FWD]
        b_task[s, mic[ops == BWD]] = ids[ops == BWD]
        if lanes:  # forward and backward run side by side, each in program order, with the
            # microbatches in flight: the extra data of Fig. 2 keep both lanes busy
            fi, bi = ids[ops == FWD], ids[ops == BWD]
            fo, bo = fi[np.argsort(mic[ops == FWD])], bi[np.argsort(mic[ops == BWD])]
            window = 2 * int(np.argmax(ops == BWD)) + 2  # twice 1F1B's, so F and B overlap (Fig. 2)
            chain_parts += [np.stack([fi[:-1], fi[1:]]), np.stack([bi[:-1], bi[1:]]), np.stack([fo, bo]),
                            np.stack([bo[:-window], fo[window:]])]
        else:
            order = np.empty(gr.ops.size, dtype=np.int64)  # task id of each program position
            order[comp] = ids
            order[is_ar] = ar_task[s]
            chain_parts.append(np.stack([order[:-1], order[1:]]))
            last_task.append(int(order[-1]))
        n += k
    # The optimizer step closes each device's iteration, after its last action (profiled
    # rate per parameter byte on the reference device, graph meta ``update_s_per_byte``).
    rate = float(plan.graph.meta.get("update_s_per_byte") or 0.0)
    if rate > 0 and steady is None:
        for gi, gr in enumerate(groups):
            t = n
            dur_parts.append([rate * costs.params[gr.stage] / float(cl.speed[gr.devices].min())])
            kind_parts.append([UPDATE]), stage_parts.append([gr.stage]), micro_parts.append([-1])
            owner_parts.append([gi])
            chain_parts.append(np.array([[last_task[gi]], [t]]))
            n += 1
    task_group = np.concatenate([np.asarray(x, dtype=np.int64) for x in owner_parts])

    # -- transfers between consecutive stages, one channel per (sender group, receiver group).
    chan_names: list[str] = []
    edge_parts = chain_parts
    chan_parts = [np.full(n, -1, dtype=np.int64)]
    c_count = 0
    for s in range(s_count - 1):
        fa, fb = f_task[s], f_task[s + 1]
        ba, bb = b_task[s], b_task[s + 1]
        if not costs.crossing[s]:
            edge_parts += [np.stack([fa, fb]), np.stack([bb, ba])]
            continue
        pair = task_group[fa] * g_count + task_group[fb]
        uniq, inv = np.unique(pair, return_inverse=True)
        tt = np.empty(uniq.size)   # forward: activations src -> dst
        tb_ = np.empty(uniq.size)  # backward: gradients dst -> src, same channel
        for u, code in enumerate(uniq.tolist()):
            src, dst = groups[code // g_count].devices, groups[code % g_count].devices
            tt[u] = transfer_time(cl, src, dst, costs.boundary[s], where=f"stages {s} -> {s + 1}")
            tb_[u] = transfer_time(cl, dst, src, costs.boundary[s], where=f"stages {s + 1} -> {s}")
            if len(src) == len(stage_devs[s]) and len(dst) == len(stage_devs[s + 1]):
                chan_names.append(f"ch:{s}-{s + 1}")
            else:
                chan_names.append(f"ch:{s}-{s + 1}:" + "+".join(cl.devices[d].name for d in src)
                                  + ">" + "+".join(cl.devices[d].name for d in dst))
        tf = np.arange(n, n + m_count)
        tb = tf + m_count
        dur_parts += [tt[inv], tb_[inv]]
        kind_parts += [np.full(m_count, COMM_F), np.full(m_count, COMM_B)]
        stage_parts += [np.full(m_count, s), np.full(m_count, s + 1)]
        micro_parts += [np.arange(m_count), np.arange(m_count)]
        chan_parts += [c_count + inv, c_count + inv]
        edge_parts += [np.stack([fa, tf]), np.stack([tf, fb]), np.stack([bb, tb]), np.stack([tb, ba])]
        c_count += uniq.size
        n += 2 * m_count

    dur_a = np.concatenate([np.asarray(x, dtype=float) for x in dur_parts])
    kind_a = np.concatenate([np.asarray(x, dtype=np.int64) for x in kind_parts])
    stage_a = np.concatenate([np.asarray(x, dtype=np.int64) for x in stage_parts])
    micro_a = np.concatenate([np.asarray(x, dtype=np.int64) for x in micro_parts])
    chan_a = np.concatenate(chan_parts)
    chan_a = np.concatenate([chan_a, np.full(n - chan_a.size, -1)])
    edges = np.concatenate(edge_parts, axis=1)
    order = np.argsort(edges[0], kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(edges[0], minlength=n), out=ptr[1:])
    npred = np.bincount(edges[1], minlength=n)
    start, end, done = run_tasks(dur_a.tolist(), ptr.tolist(), edges[1][order].tolist(),
                                 npred.tolist(), chan_a.tolist(), c_count)
    if done != n:
        raise PipeplanError(f"schedule {schedule.name!r} deadlocks on this plan: only {done} of {n} "
                            "tasks can run (a device waits for data its order never lets arrive)")
    start_a = np.asarray(start)
    end_a = np.asarray(end)
    iteration = float(end_a.max())
    extra: dict = {}
    # -- per-device busy time and peak memory (weights, gradients, optimizer state, stash).
    plan_devs = [d for grp in stage_devs for d in grp]
    pos = {d: i for i, d in enumerate(plan_devs)}
    busy = np.zeros(len(plan_devs))
    memory = np.zeros(len(plan_devs))
    for gr in groups:
        s = gr.stage
        comp = gr.ops != ALLREDUCE
        seg = slice(gr.base, gr.base + int(comp.sum()))
        if lanes:  # busy = the busier lane
            gk = kind_a[seg]
            b = max(float(dur_a[seg][gk == FWD].sum()), float(dur_a[seg][gk == BWD].sum()))
        else:
            b = float(dur_a[seg].sum())
        delta = np.where(gr.ops == FWD, 1.0, np.where(gr.ops == BWD, -1.0, 0.0))
        per_mb = costs.stash[s] / share_n[s, np.maximum(gr.micro, 0)]
        peak_act = float(np.max(np.cumsum(delta * per_mb), initial=0.0))
        weights = 0.0
        if steady is not None:  # weight stashing: one version per microbatch in flight
            weights = max(float(np.max(np.cumsum(delta), initial=0.0)) - 1.0, 0.0) * costs.params[s]
            b *= steady / m_count
        for d in gr.devices:
            busy[pos[d]] = b
            memory[pos[d]] = state_bytes(costs.params[s], plan.optimizer) + peak_act + weights

    if steady is not None:
        last_b0 = np.zeros(m_count)
        sel = (kind_a == BWD) & (stage_a == 0)
        np.maximum.at(last_b0, micro_a[sel], end_a[sel])
        iteration = float(last_b0[2 * steady - 1] - last_b0[steady - 1])
        for s_ in range(s_count):
            if len(stage_devs[s_]) > 1:
                spd = float(cl.speed[stage_devs[s_]].min())
                busy_m = steady * float(costs.fwd[s_] + costs.bwd[s_]) / (len(stage_devs[s_]) * spd)
                iteration = max(iteration, busy_m + allreduce_time(cl, stage_devs[s_], costs.params[s_]))
        extra["steady_state_of"] = steady
        m_count = steady

    # -- lower bounds: all work spread over the whole cluster; one microbatch's path.
    work_bound = m_count * float(plan.graph.fwd.sum() + plan.graph.bwd.sum()) / float(cl.speed.sum())
    per = np.zeros((len(KIND_NAMES), s_count, micro_a.max() + 1))
    mb = micro_a >= 0
    np.maximum.at(per, (kind_a[mb], stage_a[mb], micro_a[mb]), dur_a[mb])
    path_bound = float(per.sum(axis=(0, 1)).max())
    if steady is not None:
        path_bound = 0.0  # a steady state has no fill or drain

    tl = None
    if timeline:
        tl = _timeline(cl, stage_devs, groups, chan_names, kind_a, stage_a, micro_a,
                       task_group, chan_a, start_a, end_a, iteration, plan_devs, pos, lanes)
    return SimResult(iteration_s=iteration, lower_s=max(work_bound, path_bound),
                     work_bound_s=work_bound, path_bound_s=path_bound,
                     devices=[cl.devices[d].name for d in plan_devs],
                     stage_of_device=[s for s, grp in enumerate(stage_devs) for _ in grp],
                     busy_s=busy, memory_bytes=memory, memory_limit=cl.memory[plan_devs],
                     num_tasks=n, timeline=tl, extra=extra)


def _timeline(cl, stage_devs, groups, chan_names, kind, stage, micro, owner, chan, start, end,
              iteration, plan_devs, pos, lanes: bool = False) -> Timeline:
    """Expand group tasks to each device, all-reduces to each device of the stage. With
    lanes (fb-parallel) each device has a forward and a backward row."""
    res_parts, idx_parts = [], []
    for gi, gr in enumerate(groups):
        ids = np.flatnonzero(owner == gi)
        for d in gr.devices:
            idx_parts.append(ids)
            res_parts.append(2 * pos[d] + (kind[ids] == BWD) if lanes else np.full(ids.size, pos[d]))
    for t in np.flatnonzero(kind == ALLREDUCE).tolist():
        devs = stage_devs[int(stage[t])]
        idx_parts.append(np.full(len(devs), t))
        res_parts.append(np.array([pos[d] for d in devs]))
    comm = np.flatnonzero(chan >= 0)
    idx_parts.append(comm)
    rows = 2 * len(plan_devs) if lanes else len(plan_devs)
    res_parts.append(rows + chan[comm])
    idx = np.concatenate(idx_parts) if idx_parts else np.zeros(0, dtype=np.int64)
    res = np.concatenate(res_parts) if res_parts else np.zeros(0, dtype=np.int64)
    dev_names = [cl.devices[d].name for d in plan_devs]
    if lanes:
        dev_names = [f"{n}/{lane}" for n in dev_names for lane in ("fwd", "bwd")]
    names = dev_names + chan_names
    return Timeline(resources=names, resource_is_device=[True] * rows + [False] * len(chan_names),
                    kind=kind[idx], stage=stage[idx], micro=micro[idx], resource=res,
                    start=start[idx], end=end[idx], iteration_s=iteration)
