"""Plan + schedule -> task graph: every action of the schedule and every transfer it implies,
with its duration (SPP §III cost model), its dependencies and its channel.

- Devices that run the same program form one *group* (lockstep replicas); a group's
  actions are one chain of tasks. Devices listing the same (stage, microbatch) split it in
  proportion to their speeds, so they finish together.
- A stage's all-reduce is one task shared by the groups that list it.
- A microbatch's activations go from the group that ran its forward on stage s to the group
  that runs it on s+1, and its gradients back, over a *channel* per ordered pair of groups
  (full-duplex links, SPP §III: b(v,v') and b(v',v) are separate); on a half-duplex cluster
  (``duplex: half``) both directions share one channel. Groups that hold several stages
  (model chunks) send every cut's data between them over the same channel.
- Schedules with ``lanes`` (forward and backward side by side) chain them separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster import Cluster
from ..costmodel import allreduce_time, transfer_time, update_time
from ..plan import Plan
from ..schedule import Kind, Program, Schedule
from .costs import StageCosts

_F, _B, _I, _W = int(Kind.F), int(Kind.B), int(Kind.I), int(Kind.W)


@dataclass
class Group:
    """Devices that run ``program`` in lockstep; ``ids[i]`` is the task of its action i."""

    devices: list[int]
    program: Program
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass
class TaskGraph:
    """Aligned task arrays plus successor lists in CSR form (``succ[ptr[i]:ptr[i+1]]``)."""

    dur: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    micro: np.ndarray
    owner: np.ndarray  # group of a compute/update task, -1 for all-reduces and transfers
    chan: np.ndarray  # channel of a transfer, -1 otherwise
    pair: np.ndarray  # a transfer's (sender group, receiver group) as sender * #groups + receiver, else -1
    ptr: np.ndarray
    succ: np.ndarray
    npred: np.ndarray
    channels: list[str]
    groups: list[Group]
    share_f: np.ndarray  # summed forward speed of the devices running each (stage, microbatch)

    @property
    def n(self) -> int:
        return int(self.dur.size)


class _Builder:
    """Appends tasks (arrays) and dependency edges; ids are assigned in order."""

    def __init__(self) -> None:
        self.parts: dict[str, list] = {k: [] for k in ("dur", "kind", "stage", "micro", "owner", "chan", "pair")}
        self.edges: list[np.ndarray] = []
        self.counts: list[int] = []
        self.n = 0

    def add(self, dur, kind, stage, micro, owner=-1, chan=-1, pair=-1) -> np.ndarray:
        """Append tasks: ``dur`` an array (or one value); the other fields arrays or one value
        for all of them (expanded in ``finish``)."""
        dur = np.atleast_1d(np.asarray(dur, dtype=float))
        k = dur.size
        self.counts.append(k)
        for key, v in (("dur", dur), ("kind", kind), ("stage", stage), ("micro", micro), ("owner", owner),
                       ("chan", chan), ("pair", pair)):
            self.parts[key].append(v)
        ids = np.arange(self.n, self.n + k)
        self.n += k
        return ids

    def _column(self, key: str) -> np.ndarray:
        vals = self.parts[key]
        if not vals:
            return np.zeros(0)
        if all(np.ndim(v) == 0 for v in vals):
            return np.repeat(np.array(vals), self.counts)
        return np.concatenate([v if np.ndim(v) else np.full(k, v) for v, k in zip(vals, self.counts)])

    def edge(self, a, b) -> None:
        self.edges.append(np.stack([np.asarray(a, dtype=np.int64).ravel(), np.asarray(b, dtype=np.int64).ravel()]))

    def finish(self, channels: list[str], groups: list[Group], share_f: np.ndarray) -> TaskGraph:
        arr = {k: self._column(k) for k in self.parts}
        edges = np.concatenate(self.edges, axis=1) if self.edges else np.zeros((2, 0), dtype=np.int64)
        order = np.argsort(edges[0], kind="stable")
        ptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(edges[0], minlength=self.n), out=ptr[1:])
        return TaskGraph(arr["dur"].astype(float), arr["kind"].astype(np.int64), arr["stage"].astype(np.int64),
                         arr["micro"].astype(np.int64), arr["owner"].astype(np.int64), arr["chan"].astype(np.int64),
                         arr["pair"].astype(np.int64), ptr, edges[1][order], np.bincount(edges[1], minlength=self.n), channels, groups, share_f)


def groups_of(schedule: Schedule) -> list[Group]:
    """Devices with the same program, in the schedule's device order."""
    groups: dict[bytes, Group] = {}
    for d, p in zip(schedule.devices, schedule.programs):
        key = p.kinds.tobytes() + p.stages.tobytes() + p.micro.tobytes()
        if key in groups:
            groups[key].devices.append(d)
        else:
            groups[key] = Group([d], p)
    return list(groups.values())


def fixed_part(fixed: float, speeds: np.ndarray) -> float:
    """A microbatch share's fixed time on the slowest working replica (a device with no
    speed for a pass takes no share of it)."""
    working = speeds[speeds > 0]
    return fixed / float(working.min()) if fixed > 0 and working.size else 0.0


def _fixed_parts(fixed: np.ndarray, speeds: np.ndarray) -> np.ndarray:
    """``fixed_part`` of every stage (zeros when nothing was profiled as fixed)."""
    if not fixed.any():
        return np.zeros(fixed.size)
    return np.array([fixed_part(x, speeds) for x in fixed.tolist()])


def _shares(groups: list[Group], s_count: int, m_count: int, fspeed: np.ndarray,
            bspeed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Summed forward and backward speed of the devices that run each (stage, microbatch)."""
    share_f, share_b = np.zeros((s_count, m_count)), np.zeros((s_count, m_count))
    for g in groups:
        p = g.program
        sel = p.kinds == Kind.F
        np.add.at(share_f, (p.stages[sel], p.micro[sel]), float(fspeed[g.devices].sum()))
        np.add.at(share_b, (p.stages[sel], p.micro[sel]), float(bspeed[g.devices].sum()))
    return share_f, share_b


def _compute_durations(groups: list[Group], costs: StageCosts, share_f: np.ndarray, share_b: np.ndarray,
                       fspeed: np.ndarray, bspeed: np.ndarray, overhead: float) -> list[np.ndarray]:
    """Duration of each non-AR action of each group: the varying part shared by speed, the
    fixed per-call part in full, the runtime's per-action overhead; a re-materializing stage
    runs its forward again inside the backward (or its I half)."""
    comp = [g.program.kinds != Kind.AR for g in groups]
    k = np.concatenate([g.program.kinds[c] for g, c in zip(groups, comp)])
    s = np.concatenate([g.program.stages[c] for g, c in zip(groups, comp)])
    m = np.concatenate([g.program.micro[c] for g, c in zip(groups, comp)])
    gi = np.repeat(np.arange(len(groups)), [int(c.sum()) for c in comp])
    ff = np.stack([_fixed_parts(costs.fwd_fixed, fspeed[g.devices]) for g in groups])[gi, s]
    bf = np.stack([_fixed_parts(costs.bwd_fixed, bspeed[g.devices]) for g in groups])[gi, s]
    with np.errstate(divide="ignore", invalid="ignore"):
        fwd = (costs.fwd[s] - costs.fwd_fixed[s]) / share_f[s, m] + ff
        bwd = (costs.bwd[s] - costs.bwd_fixed[s]) / share_b[s, m] + bf
    redo = np.where(costs.recompute[s], fwd, 0.0)
    frac, cost = costs.input_fraction, costs.split_cost
    dur = np.select([k == _F, k == _B, k == _I, k == _W],
                    [fwd, bwd + redo, cost * frac * bwd + redo, cost * (1.0 - frac) * bwd])
    return np.split(dur + overhead, np.cumsum([int(c.sum()) for c in comp])[:-1])


def _chain(b: _Builder, g: Group, lanes: bool) -> None:
    """Program order as dependencies; with lanes, forwards and backwards chain separately,
    each backward after its forward and each forward at most ``window`` ahead (twice
    a one-forward-one-backward order's in flight, so both lanes stay busy: resalloc.txt Fig. 2)."""
    ids, kinds, micro = g.ids, g.program.kinds, g.program.micro
    if not lanes or not np.any(kinds == _B):
        b.edge(ids[:-1], ids[1:])
        return
    f_sel, b_sel = kinds == Kind.F, kinds == Kind.B
    fi, bi = ids[f_sel], ids[b_sel]
    fo, bo = fi[np.argsort(micro[f_sel])], bi[np.argsort(micro[b_sel])]
    window = 2 * int(np.argmax(b_sel)) + 2
    b.edge(fi[:-1], fi[1:]), b.edge(bi[:-1], bi[1:]), b.edge(fo, bo)
    b.edge(bo[:-window], fo[window:])


def _add_groups(b: _Builder, plan: Plan, sched: Schedule, groups: list[Group], costs: StageCosts,
                fspeed: np.ndarray, bspeed: np.ndarray) -> np.ndarray:
    """Compute and all-reduce tasks, and each group's chain; returns the forward shares."""
    cl = plan.cluster
    stage_devs = plan.stage_devices()
    share_f, share_b = _shares(groups, len(stage_devs), sched.microbatches, fspeed, bspeed)
    overhead = float(cl.meta.get("action_overhead_s", 0.0))  # the runtime's, per compute action
    ar_task: dict[int, int] = {}
    durations = _compute_durations(groups, costs, share_f, share_b, fspeed, bspeed, overhead)
    for gi, g in enumerate(groups):
        p = g.program
        is_ar = p.kinds == Kind.AR
        for s in p.stages[is_ar].tolist():
            if s not in ar_task:
                ar_task[s] = int(b.add(allreduce_time(cl, stage_devs[s], costs.params[s], where=f"stage {s} all-reduce"),
                                       Kind.AR, s, -1)[0])
        g.ids = np.empty(len(p), dtype=np.int64)
        g.ids[~is_ar] = b.add(durations[gi], p.kinds[~is_ar], p.stages[~is_ar], p.micro[~is_ar], owner=gi)
        g.ids[is_ar] = [ar_task[s] for s in p.stages[is_ar].tolist()]
        _chain(b, g, sched.lanes)
    return share_f


def _add_updates(b: _Builder, plan: Plan, groups: list[Group], costs: StageCosts) -> None:
    """The optimizer step closes each device's iteration, after its last action
    (``costmodel.update_time``)."""
    if update_time(plan.graph.meta, plan.cluster, 1.0, 1.0) <= 0:  # no rate, measured or profiled
        return
    speed = plan.cluster.speed
    for gi, g in enumerate(groups):
        stages = np.unique(g.program.stages)
        t = b.add(update_time(plan.graph.meta, plan.cluster, float(costs.params[stages].sum()),
                              float(speed[g.devices].min())),
                  Kind.UPDATE, int(stages[0]), -1, owner=gi)
        b.edge([g.ids[-1]], t)


def _task_index(groups: list[Group], s_count: int, m_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Task of each (stage, microbatch)'s forward and of its gradient-sending backward
    (B or I), and the group that runs it."""
    f_task = np.full((s_count, m_count), -1, dtype=np.int64)
    b_task = np.full((s_count, m_count), -1, dtype=np.int64)
    owner = np.full((s_count, m_count), -1, dtype=np.int64)
    for gi, g in enumerate(groups):
        p = g.program
        f = p.kinds == Kind.F
        back = (p.kinds == Kind.B) | (p.kinds == Kind.I)
        f_task[p.stages[f], p.micro[f]] = g.ids[f]
        b_task[p.stages[back], p.micro[back]] = g.ids[back]
        owner[p.stages[f], p.micro[f]] = gi
    return f_task, b_task, owner


def _channel_name(cl: Cluster, stage_devs: list[list[int]], s: int, src: list[int], dst: list[int],
                  forward: bool, half: bool) -> str:
    """``ch:a-b``: stage a's data to stage b (both directions on a half-duplex cluster),
    with ``:senders>receivers`` when only some of the stages' devices use it."""
    a, c = (s, s + 1) if forward or half else (s + 1, s)
    if len(src) == len(stage_devs[s]) and len(dst) == len(stage_devs[s + 1]):
        return f"ch:{a}-{c}"
    names = ("+".join(cl.devices[d].name for d in src), "+".join(cl.devices[d].name for d in dst))
    return f"ch:{a}-{c}:" + (f"{names[0]}>{names[1]}" if forward or half else f"{names[1]}>{names[0]}")


def _channel(keys: dict[tuple, int], channels: list[str], name: str, key: tuple[int, int]) -> int:
    """The channel of a transfer from group ``key[0]`` to ``key[1]`` (either way on a
    half-duplex cluster): one per physical direction, shared by every stage cut that uses it
    (model chunks: the link from device d to d+1 carries cut d|d+1 and cut d+p|d+p+1), named
    by the cuts it carries (``ch:0-1,2-3``)."""
    if key not in keys:
        keys[key] = len(channels)
        channels.append(name)
    elif name not in channels[keys[key]].split(","):
        channels[keys[key]] += "," + name.removeprefix("ch:")
    return keys[key]


def _transfer(cl: Cluster, a: list[int], c: list[int], nbytes: float, s: int, forward: bool) -> float:
    """``costmodel.transfer_time`` (the same formula, without building its message unless a
    link has no bandwidth)."""
    ia, ic = np.ix_(a, c)
    bw = float(cl.bandwidth[ia, ic].min())
    if bw <= 0:
        return transfer_time(cl, a, c, nbytes, where=f"stages {s} -> {s + 1}" if forward else f"stages {s + 1} -> {s}")
    return nbytes / (len(a) * len(c) * bw) + float(cl.latency[ia, ic].max())


def _add_transfers(b: _Builder, plan: Plan, groups: list[Group], costs: StageCosts, m_count: int,
                   channels: list[str]) -> None:
    """Forward transfers s -> s+1 and backward transfers s+1 -> s of every microbatch."""
    cl = plan.cluster
    stage_devs = plan.stage_devices()
    half = cl.meta.get("duplex", "full") == "half"
    f_task, b_task, owner = _task_index(groups, len(stage_devs), m_count)
    keys: dict[tuple, int] = {}
    for s in range(len(stage_devs) - 1):
        src_g, dst_g = owner[s], owner[s + 1]
        local = (src_g == dst_g) | (not costs.crossing[s])
        b.edge(f_task[s][local], f_task[s + 1][local])
        b.edge(b_task[s + 1][local], b_task[s][local])
        ms = np.flatnonzero(~local)
        pairs, inv = np.unique(src_g[ms] * len(groups) + dst_g[ms], return_inverse=True)
        for forward in (True, False):
            dur, chan = np.empty(pairs.size), np.empty(pairs.size, dtype=np.int64)
            for u, code in enumerate(pairs.tolist()):
                ga, gb = divmod(code, len(groups))
                src, dst = groups[ga].devices, groups[gb].devices
                chan[u] = _channel(keys, channels, _channel_name(cl, stage_devs, s, src, dst, forward, half),
                                   (min(ga, gb), max(ga, gb)) if half else ((ga, gb) if forward else (gb, ga)))
                a, c = (src, dst) if forward else (dst, src)
                dur[u] = _transfer(cl, a, c, float(costs.boundary[s]), s, forward)
            t = b.add(dur[inv], Kind.SEND_F if forward else Kind.SEND_B, s if forward else s + 1, ms,
                      chan=chan[inv], pair=pairs[inv])
            if forward:
                b.edge(f_task[s][ms], t), b.edge(t, f_task[s + 1][ms])
            else:
                b.edge(b_task[s + 1][ms], t), b.edge(t, b_task[s][ms])


def compile_tasks(plan: Plan, sched: Schedule, costs: StageCosts, fspeed: np.ndarray,
                  bspeed: np.ndarray) -> TaskGraph:
    """The task graph of one iteration (or stream, for a steady state) of ``sched``."""
    groups = groups_of(sched)
    b = _Builder()
    share_f = _add_groups(b, plan, sched, groups, costs, fspeed, bspeed)
    if sched.steady_state is None:
        _add_updates(b, plan, groups, costs)
    channels: list[str] = []
    _add_transfers(b, plan, groups, costs, sched.microbatches, channels)
    return b.finish(channels, groups, share_f)
