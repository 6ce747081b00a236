"""Plan + schedule -> task graph: every action of the schedule and every transfer it implies,
with its dependencies and its channel, and its *class* (``durations`` costs a class once).

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

The graph holds no durations: they depend on which devices run each group and on the
stage costs, so one graph serves every candidate of the same structure (``batch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypeVar

import numpy as np

from ..cluster import Cluster
from .formulas import update_time
from ..plan import Plan
from ..schedule import Kind, Program, Schedule

# plain ints: comparing an array with an IntEnum member costs numpy a slow attribute lookup
_F, _B, _I, _AR, _UP = (int(k) for k in (Kind.F, Kind.B, Kind.I, Kind.AR, Kind.UPDATE))
T = TypeVar("T")


@dataclass
class Group:
    """Devices that run ``program`` in lockstep; ``ids[i]`` is the task of its action i."""

    devices: list[int]
    program: Program
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass
class TaskGraph:
    """Aligned task arrays plus successor lists in CSR form (``succ[ptr[i]:ptr[i+1]]``).
    Tasks of one class (same kind, group, stage, channel pair and, for compute, the same
    groups sharing its microbatch and the same overlapped partner) last the same: ``cls[t]``
    is t's class, ``rep[c]`` a task of class c, ``sharers[c, g]`` whether group g runs class c's microbatches and
    ``sharer_set[c]`` an id of that set of groups (compute classes; -1 for others)."""

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
    cls: np.ndarray
    rep: np.ndarray
    sharers: np.ndarray
    sharer_set: np.ndarray
    group_stages: np.ndarray  # (groups, stages): 1 where the group's program runs the stage
    partner: np.ndarray  # the stage of the action a compute task runs overlapped with, else -1
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def memo(self, fn: Callable[["TaskGraph"], T], *args) -> T:
        """``fn(self, *args)``, computed once: for what depends on the graph alone (which
        classes or tasks a step reads), so that a compiled graph reused across plans does
        not redo it. The result is shared: treat it as read-only."""
        key = (fn, *args)
        if key not in self._memo:
            self._memo[key] = fn(self, *args)
        return self._memo[key]

    @property
    def n(self) -> int:
        return int(self.kind.size)

    @property
    def num_stages(self) -> int:
        return int(self.group_stages.shape[1])

    def counts(self, tasks: np.ndarray, column: np.ndarray, width: int) -> np.ndarray:
        """(classes, width): how many of ``tasks`` of each class fall in each ``column``."""
        count = np.zeros((self.rep.size, width))
        np.add.at(count, (self.cls[tasks], column), 1.0)
        return count

    def of_kinds(self, *kinds: int) -> np.ndarray:
        """The classes of these kinds (memoized)."""
        return self.memo(_of_kinds, tuple(int(k) for k in kinds))


def _of_kinds(tg: TaskGraph, kinds: tuple[int, ...]) -> np.ndarray:
    return np.flatnonzero(np.isin(tg.kind[tg.rep], kinds))


class _Builder:
    """Appends tasks (arrays) and dependency edges; ids are assigned in order."""

    def __init__(self) -> None:
        self.parts: dict[str, list] = {k: [] for k in ("kind", "stage", "micro", "owner", "chan", "pair", "partner")}
        self.edges: list[np.ndarray] = []
        self.counts: list[int] = []
        self.n = 0

    def add(self, k: int, kind, stage, micro, owner=-1, chan=-1, pair=-1, partner=-1) -> np.ndarray:
        """Append k tasks: each field an array of k or one value for all of them (expanded
        in ``finish``)."""
        self.counts.append(k)
        for key, v in (("kind", kind), ("stage", stage), ("micro", micro), ("owner", owner),
                       ("chan", chan), ("pair", pair), ("partner", partner)):  # a Kind as int: numpy reads an IntEnum slowly
            self.parts[key].append(v if isinstance(v, np.ndarray) else int(v))
        ids = np.arange(self.n, self.n + k)
        self.n += k
        return ids

    def _column(self, key: str) -> np.ndarray:
        vals = self.parts[key]
        if not vals:
            return np.zeros(0)
        if not any(isinstance(v, np.ndarray) for v in vals):
            return np.repeat(np.array(vals), self.counts)
        return np.concatenate([v if isinstance(v, np.ndarray) else np.full(k, v) for v, k in zip(vals, self.counts)])

    def edge(self, a, b) -> None:
        self.edges.append(np.stack([np.asarray(a, dtype=np.int64).ravel(), np.asarray(b, dtype=np.int64).ravel()]))

    def finish(self, channels: list[str], groups: list[Group], s_count: int, m_count: int) -> TaskGraph:
        arr = {k: self._column(k).astype(np.int64) for k in self.parts}
        edges = np.concatenate(self.edges, axis=1) if self.edges else np.zeros((2, 0), dtype=np.int64)
        order = np.argsort(edges[0], kind="stable")
        ptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(edges[0], minlength=self.n), out=ptr[1:])
        cls, rep, sharers, sharer_set = _classes(arr, groups, s_count, m_count)
        g_st = np.zeros((len(groups), s_count))
        for gi, g in enumerate(groups):
            g_st[gi, np.unique(g.program.stages)] = 1.0
        return TaskGraph(arr["kind"], arr["stage"], arr["micro"], arr["owner"], arr["chan"], arr["pair"], ptr,
                         edges[1][order], np.bincount(edges[1], minlength=self.n), channels, groups, cls, rep,
                         sharers, sharer_set, g_st, arr["partner"])


def _classes(arr: dict[str, np.ndarray], groups: list[Group], s_count: int,
             m_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each task's class, a task of each class, which groups share each class's
    microbatches (devices listing the same (stage, microbatch) split it by speed) and an id
    of that set."""
    runs = np.zeros((len(groups), s_count, m_count), dtype=bool)
    for gi, g in enumerate(groups):
        f = g.program.kinds == _F
        runs[gi, g.program.stages[f], g.program.micro[f]] = True
    flat = runs.reshape(len(groups), -1).T
    first, set_of = _row_ids(flat)
    kind, owner = arr["kind"], arr["owner"]
    compute = (owner >= 0) & (kind != _UP)
    sharer = np.where(compute, set_of[np.where(compute, arr["stage"] * m_count + arr["micro"], 0)], -1)
    rep, cls = _row_ids(np.stack([kind, owner, arr["stage"], arr["pair"], sharer, arr["partner"]], axis=1))
    shared = np.where(sharer[rep, None] >= 0, flat[first][np.maximum(sharer[rep], 0)], False)
    return cls, rep, shared.astype(float), sharer[rep]


def _row_ids(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0)``'s first index of each distinct row and each row's id, by
    one integer key per row where the columns' ranges allow (much faster)."""
    if not rows.size:
        return np.zeros(0, dtype=np.int64), np.zeros(rows.shape[0], dtype=np.int64)
    if rows.dtype == bool and rows.shape[1] >= 62:  # which groups share a microbatch: a byte string a row
        packed = np.ascontiguousarray(np.packbits(rows, axis=1))
        keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
        _, first, ids = np.unique(keys, return_index=True, return_inverse=True)
        return first, ids.ravel()
    rows = rows.astype(np.int64) - rows.min(axis=0)
    span = rows.max(axis=0) + 1
    if np.prod(span.astype(float)) >= 2.0 ** 62:
        _, first, ids = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return first, ids.ravel()
    key = np.zeros(rows.shape[0], dtype=np.int64)
    for j in range(rows.shape[1]):
        key = key * span[j] + rows[:, j]
    _, first, ids = np.unique(key, return_index=True, return_inverse=True)
    return first, ids


def mat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (2-D) in numpy's own loops: the products here are small, and OpenBLAS's
    threads, left spinning after a call, slow the engine down on a loaded machine."""
    return np.einsum("ij,jk->ik", a, b)


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


def _chain(b: _Builder, g: Group, lanes: bool) -> None:
    """Program order as dependencies; with lanes, forwards and backwards chain separately,
    each backward after its forward and each forward at most ``window`` ahead (twice
    a one-forward-one-backward order's in flight, so both lanes stay busy: resalloc.txt Fig. 2)."""
    ids, kinds, micro = g.ids, g.program.kinds, g.program.micro
    if not lanes or not np.any(kinds == _B):
        b.edge(ids[:-1], ids[1:])
        return
    f_sel, b_sel = kinds == _F, kinds == _B
    fi, bi = ids[f_sel], ids[b_sel]
    fo, bo = fi[np.argsort(micro[f_sel])], bi[np.argsort(micro[b_sel])]
    window = 2 * int(np.argmax(b_sel)) + 2
    b.edge(fi[:-1], fi[1:]), b.edge(bi[:-1], bi[1:]), b.edge(fo, bo)
    b.edge(bo[:-window], fo[window:])


def _add_groups(b: _Builder, sched: Schedule, groups: list[Group]) -> None:
    """Compute and all-reduce tasks (one per stage, shared by the groups that list it), and
    each group's chain."""
    ar_task: dict[int, int] = {}
    for gi, g in enumerate(groups):
        p = g.program
        is_ar = p.kinds == _AR
        for s in p.stages[is_ar].tolist():
            if s not in ar_task:
                ar_task[s] = int(b.add(1, Kind.AR, s, -1)[0])
        g.ids = np.empty(len(p), dtype=np.int64)
        partner = p.partners()[~is_ar] if sched.overlap_pairs else -1
        g.ids[~is_ar] = b.add(int((~is_ar).sum()), p.kinds[~is_ar], p.stages[~is_ar], p.micro[~is_ar], owner=gi,
                              partner=partner)
        g.ids[is_ar] = [ar_task[s] for s in p.stages[is_ar].tolist()]
        _chain(b, g, sched.lanes)


def _add_updates(b: _Builder, plan: Plan, groups: list[Group]) -> None:
    """The optimizer step closes each device's iteration, after its last action
    (``sim.formulas.update_time``), unless no rate is known, measured or profiled."""
    if update_time(plan.graph.meta, plan.cluster, 1.0, 1.0) <= 0:
        return
    for gi, g in enumerate(groups):
        t = b.add(1, Kind.UPDATE, int(np.unique(g.program.stages)[0]), -1, owner=gi)
        b.edge([g.ids[-1]], t)


def _task_index(groups: list[Group], s_count: int, m_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Task of each (stage, microbatch)'s forward and of its gradient-sending backward
    (B or I), and the group that runs it."""
    f_task = np.full((s_count, m_count), -1, dtype=np.int64)
    b_task = np.full((s_count, m_count), -1, dtype=np.int64)
    owner = np.full((s_count, m_count), -1, dtype=np.int64)
    for gi, g in enumerate(groups):
        p = g.program
        f = p.kinds == _F
        back = (p.kinds == _B) | (p.kinds == _I)
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


#: graph meta key: a sender's next action waits for its pipeline sends (Megatron-LM's 1F1B
#: p2p, ``send_forward_recv_backward`` and kin, blocks; docs/llm.md), instead of overlapping them
BLOCKING_SENDS = "blocking_sends"


def _next_in_chain(groups: list[Group], n: int) -> np.ndarray:
    """Each task's next task in its group's program (-1: none or several)."""
    nxt = np.full(n, -1, dtype=np.int64)
    for g in groups:
        nxt[g.ids[:-1]] = g.ids[1:]
    return nxt


def _add_transfers(b: _Builder, plan: Plan, groups: list[Group], crossing: np.ndarray, m_count: int,
                   channels: list[str]) -> None:
    """Forward transfers s -> s+1 and backward transfers s+1 -> s of every microbatch; with
    ``BLOCKING_SENDS`` the sender's next action waits for each."""
    cl = plan.cluster
    stage_devs = plan.stage_devices()
    half = cl.meta.get("duplex", "full") == "half"
    f_task, b_task, owner = _task_index(groups, len(stage_devs), m_count)
    nxt = _next_in_chain(groups, b.n) if plan.graph.meta.get(BLOCKING_SENDS) else None
    keys: dict[tuple, int] = {}
    for s in range(len(stage_devs) - 1):
        src_g, dst_g = owner[s], owner[s + 1]
        local = (src_g == dst_g) | (not crossing[s])
        b.edge(f_task[s][local], f_task[s + 1][local])
        b.edge(b_task[s + 1][local], b_task[s][local])
        ms = np.flatnonzero(~local)
        pairs, inv = np.unique(src_g[ms] * len(groups) + dst_g[ms], return_inverse=True)
        for forward in (True, False):
            chan = np.empty(pairs.size, dtype=np.int64)
            for u, code in enumerate(pairs.tolist()):
                ga, gb = divmod(code, len(groups))
                src, dst = groups[ga].devices, groups[gb].devices
                chan[u] = _channel(keys, channels, _channel_name(cl, stage_devs, s, src, dst, forward, half),
                                   (min(ga, gb), max(ga, gb)) if half else ((ga, gb) if forward else (gb, ga)))
            t = b.add(ms.size, Kind.SEND_F if forward else Kind.SEND_B, s if forward else s + 1, ms,
                      chan=chan[inv], pair=pairs[inv])
            sender = f_task[s][ms] if forward else b_task[s + 1][ms]
            b.edge(sender, t), b.edge(t, f_task[s + 1][ms] if forward else b_task[s][ms])
            if nxt is not None:
                after = nxt[sender]
                b.edge(t[after >= 0], after[after >= 0])


def compile_tasks(plan: Plan, sched: Schedule, crossing: np.ndarray) -> TaskGraph:
    """The task graph of one iteration (or stream, for a steady state) of ``sched``;
    ``crossing[s]``: some edge crosses cut s|s+1 (``StageCosts.crossing``)."""
    groups = groups_of(sched)
    b = _Builder()
    _add_groups(b, sched, groups)
    if sched.steady_state is None:
        _add_updates(b, plan, groups)
    channels: list[str] = []
    _add_transfers(b, plan, groups, crossing, sched.microbatches, channels)
    return b.finish(channels, groups, plan.num_stages, sched.microbatches)
