"""How long each task class lasts, per candidate (SPP §III cost model): the one place a
cost is written. ``simulate`` calls it with a batch of one, the batched evaluator with many.

A *layout* says, per candidate, which devices form each group of the task graph and which
hold each stage; durations follow from it, the stage costs and the devices' speeds:

- compute: the varying part of a stage's whole-microbatch time over the summed speed of the
  devices sharing the microbatch (split in proportion to speed, so they finish together),
  the fixed per-call part on the slowest working device of the group, the runtime's
  per-action overhead; a re-materializing stage runs its forward again inside its backward
  (or the input half I of a split backward, W being the rest);
- transfer between groups: bytes / (|senders| |receivers| slowest link) + largest latency
  (SPP §III-B2, ``sim.formulas.transfer_time``);
- ring all-reduce of a replicated stage (SPP Eq. 1, ``sim.formulas.allreduce_time``);
- the optimizer step (``sim.formulas.update_time``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..cluster.collectives import collective_s
from ..cluster.model import Resource
from .formulas import update_time
from ..schedule import Kind
from .compile import TaskGraph, mat
from .stage_costs import StageCosts

_F, _B, _I, _W = int(Kind.F), int(Kind.B), int(Kind.I), int(Kind.W)
_AR, _UP, _SF, _SB = int(Kind.AR), int(Kind.UPDATE), int(Kind.SEND_F), int(Kind.SEND_B)


#: graph meta key: each stage's all-reduce overlaps its last microbatch's backward (bucketed
#: gradients reduced as they are ready, Megatron-LM's ``--overlap-grad-reduce``); its value is
#: the plan's replica mode
OVERLAP = "overlap_grad_reduce"
#: graph meta key: each stage's data-parallel collectives in seconds, priced by the graph's own
#: family (decoder LLMs: ``sim.tensor_groups``: gradient dtype, ZeRO-1, rings on the servers'
#: rails) instead of SPP's ring over the slowest link
STAGE_ALLREDUCE_S = "stage_allreduce_s"
#: graph meta key: per stage, seconds a device holding it spends before its optimizer step
#: besides the step (decoder LLMs: a tied embedding's all-reduce between first and last stage)
STAGE_STEP_EXTRA_S = "stage_step_extra_s"


@dataclass(frozen=True)
class Layout:
    """Per candidate b: ``groups[b, g, v]``: device v runs group g's program;
    ``stages[b, s, v]``: device v holds stage s."""

    groups: np.ndarray
    stages: np.ndarray

    @property
    def used(self) -> np.ndarray:
        """(candidates, devices): the device runs some program."""
        return self.groups.any(axis=1)

    def group_sum(self, x: np.ndarray) -> np.ndarray:
        """(candidates, groups): ``x[b, v]`` summed over each group's devices."""
        return np.einsum("bgv,bv->bg", self.groups, x)

    def group_min(self, x: np.ndarray) -> np.ndarray:
        """(candidates, groups): the least ``x[b, v]`` over each group's devices with x > 0 (inf if none)."""
        return np.where(self.groups & (x > 0)[:, None, :], x[:, None, :], np.inf).min(axis=2)


def pass_speeds(cluster: Cluster, lanes: bool, beta: list[dict] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each device's forward and backward speed. With ``lanes`` (resalloc.txt §III-B)
    forward gets beta_j of each resource j and backward the rest (a single resource is
    time-shared), ``beta[v]`` the allocation of device v's stage (default 0.5); speeds are
    linear in beta."""
    if not lanes:
        return cluster.fspeed, cluster.bspeed
    f, b = np.zeros(len(cluster)), np.zeros(len(cluster))
    for d, dev in enumerate(cluster.devices):
        alloc = (beta[d] if beta else None) or {}
        for r in dev.resources or (Resource("*", dev.speed, dev.speed),):
            share = float(alloc.get(r.name, alloc.get("*", 0.5)))
            f[d] += share * r.fwd_speed
            b[d] += (1.0 - share) * r.bwd_speed
    return f, b


def class_shares(tg: TaskGraph, lay: Layout, speed: np.ndarray) -> np.ndarray:
    """(candidates, classes): summed ``speed`` of the devices sharing each compute class's
    microbatches (0 for other classes)."""
    return mat(lay.group_sum(speed), tg.sharers.T)


def _compute_classes(tg: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], np.ndarray]:
    """The compute classes, their groups and stages, which are F, B, I, W, and the stage of
    each one's overlapped partner (-1: none)."""
    sel = tg.of_kinds(_F, _B, _I, _W)
    k = tg.kind[tg.rep[sel]]
    return sel, tg.owner[tg.rep[sel]], tg.stage[tg.rep[sel]], [k == _F, k == _B, k == _I, k == _W], \
        tg.partner[tg.rep[sel]]


#: Share of a GPU's SMs an overlapped pair's exchanges hold while they run: DeepSeek-V3 gives
#: its all-to-all kernels 20 of the H800's 132 SMs (arXiv 2412.19437 §3.2.2)
PAIR_COMM_SMS = 20 / 132


def pair_s(compute: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """Seconds of an overlapped pair whose two passes compute ``compute`` seconds and exchange
    ``comm`` seconds in all (DeepSeek-V3 §3.2.1, Fig. 4: each pass's all-to-alls behind the
    other's compute): compute runs on the SMs the exchanges leave while they run (a rate of
    1 - ``PAIR_COMM_SMS``), then on all; the exchanges end no sooner than they take alone."""
    return np.maximum(comm, compute + PAIR_COMM_SMS * comm)


def _passes(c: StageCosts, s: np.ndarray, share_f, share_b, slow_f, slow_b) -> tuple[np.ndarray, ...]:
    """(forward, backward, recomputed forward) seconds of stages ``s`` on the shares given,
    and the forward's and backward's (its recomputation's included) exchanges."""
    ffix, bfix = c.fwd_fixed[:, s], c.bwd_fixed[:, s]
    with np.errstate(divide="ignore", invalid="ignore"):
        fwd = (c.fwd[:, s] - ffix) / share_f + np.where(ffix > 0, ffix / slow_f, 0.0)
        bwd = (c.bwd[:, s] - bfix) / share_b + np.where(bfix > 0, bfix / slow_b, 0.0)
        redo = np.where(c.recompute[:, s], fwd, 0.0)
        a_f = c.fwd_comm[:, s] / share_f
        a_b = c.bwd_comm[:, s] / share_b + np.where(c.recompute[:, s], a_f, 0.0)
    return fwd, bwd, redo, a_f, a_b


def _compute(tg: TaskGraph, lay: Layout, c: StageCosts, fs: np.ndarray, bs: np.ndarray, overhead: float,
             dur: np.ndarray) -> None:
    sel, g, s, which, partner = tg.memo(_compute_classes)
    share_f, share_b = class_shares(tg, lay, fs)[:, sel], class_shares(tg, lay, bs)[:, sel]
    slow_f, slow_b = lay.group_min(fs)[:, g], lay.group_min(bs)[:, g]
    fwd, bwd, redo, a_f, a_b = _passes(c, s, share_f, share_b, slow_f, slow_b)
    frac, cost = c.input_fraction, c.split_cost
    out = np.select(which, [fwd, bwd + redo, cost * frac * bwd + redo, cost * (1.0 - frac) * bwd])
    paired = partner >= 0
    if paired.any():  # F and B of an overlapped pair: the pair's time, shared in proportion
        pf, pb, pr, pa_f, pa_b = _passes(c, np.maximum(partner, 0), share_f, share_b, slow_f, slow_b)
        is_f = which[0]
        d_f, d_b = np.where(is_f, fwd, pf), np.where(is_f, pb + pr, bwd + redo)
        comm = np.where(is_f, a_f + pa_b, pa_f + a_b)
        with np.errstate(divide="ignore", invalid="ignore"):
            mine = np.where(is_f, d_f, d_b) / (d_f + d_b)
        out = np.where(paired, np.nan_to_num(pair_s(d_f + d_b - comm, comm) * mine), out)
    dur[:, sel] = out + overhead


def _allreduce_classes(tg: TaskGraph) -> list[tuple[int, int]]:
    """Each all-reduce class and its stage."""
    return [(t, int(tg.stage[tg.rep[t]])) for t in tg.of_kinds(_AR).tolist()]


def _allreduce(tg: TaskGraph, lay: Layout, c: StageCosts, cl: Cluster, dur: np.ndarray, bad: np.ndarray,
               overlap: str | None, fixed: list[float] | None = None) -> None:
    """Ring all-reduce of each stage (``fixed``: its seconds, ``STAGE_ALLREDUCE_S``); with
    ``overlap`` (``OVERLAP``: the plan's replica mode) only what outlasts the backward of the
    stage's last microbatch stays after it."""
    eff = float(cl.meta.get("allreduce_efficiency", 1.0))  # measured by calibrate
    for t, s in tg.memo(_allreduce_classes):
        m = lay.stages[:, s]
        k = m.sum(axis=1)
        live = (k >= 2) & (c.params[:, s] > 0)
        if fixed is not None:
            dur[:, t] = np.where(live, float(fixed[s]), 0.0)
        else:
            bw, lat = _slowest(m, m, cl)
            bad[:, t] = live & (bw <= 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                dur[:, t] = np.where(live, collective_s("all_reduce", c.params[:, s], k, bw * eff, lat), 0.0)
        if overlap:  # a microbatch's backward: on one replica in turn, or split over all of them
            speed = (np.where(m, cl.speed[None], 0.0).sum(axis=1) if overlap == "split"
                     else np.where(m, cl.speed[None], np.inf).min(axis=1))
            dur[:, t] = np.maximum(dur[:, t] - c.bwd[:, s] / speed, 0.0)


def _links(gmask: np.ndarray, ga: int, gb: int, cl: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Slowest bandwidth and largest latency from group ga's devices to gb's, per candidate."""
    if (gmask[:, ga].sum(axis=1) == 1).all() and (gmask[:, gb].sum(axis=1) == 1).all():
        i, j = gmask[:, ga].argmax(axis=1), gmask[:, gb].argmax(axis=1)
        return cl.bandwidth[i, j], cl.latency[i, j]
    return _slowest(gmask[:, ga], gmask[:, gb], cl)


#: The slowest link is found by masking the whole link matrix of every candidate at once on a
#: cluster of at most ``_DENSE_DEVICES`` devices (masks of at most ``_DENSE_LIMIT`` entries in
#: all); else per candidate among its own devices (a stage of a large cluster uses few of them)
_DENSE_DEVICES, _DENSE_LIMIT = 128, 1 << 22


def _slowest(a: np.ndarray, b: np.ndarray, cl: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate (rows of the device masks ``a``, ``b``): the slowest bandwidth and the
    largest latency of the links from a's devices to b's (inf and 0 where either is empty)."""
    count, v = a.shape
    if v <= _DENSE_DEVICES and count * v * v <= _DENSE_LIMIT:
        pm = a[:, :, None] & b[:, None, :]
        return np.where(pm, cl.bandwidth[None], np.inf).min(axis=(1, 2)), np.where(pm, cl.latency[None], 0.0).max(axis=(1, 2))
    bw, lat = np.full(count, np.inf), np.zeros(count)
    for r in range(count):  # large clusters: each candidate's devices are few of them
        i, j = np.flatnonzero(a[r]), np.flatnonzero(b[r])
        if i.size and j.size:
            bw[r] = cl.bandwidth[np.ix_(i, j)].min()
            lat[r] = cl.latency[np.ix_(i, j)].max()
    return bw, lat


def _transfer_classes(tg: TaskGraph) -> list[tuple[int, int, list[tuple[int, np.ndarray, np.ndarray]]]]:
    """Per pair of groups (ga, gb): each direction's transfer classes and the cuts they cross."""
    n_g = len(tg.groups)
    pair, kinds, stage = tg.pair[tg.rep], tg.kind[tg.rep], tg.stage[tg.rep]
    out = []
    for code in np.unique(pair[pair >= 0]).tolist():
        ga, gb = divmod(code, n_g)
        ways = []
        for kind in (_SF, _SB):
            sel = np.flatnonzero((pair == code) & (kinds == kind))
            ways.append((kind, sel, stage[sel] - (0 if kind == _SF else 1)))
        out.append((ga, gb, ways))
    return out


def _transfers(tg: TaskGraph, lay: Layout, c: StageCosts, cl: Cluster, dur: np.ndarray, bad: np.ndarray) -> None:
    """A transfer class's pair is (the group of stage s, the group of s+1) in both directions."""
    for ga, gb, ways in tg.memo(_transfer_classes):
        size = lay.groups[:, ga].sum(axis=1) * lay.groups[:, gb].sum(axis=1)
        for kind, sel, cut in ways:
            if not sel.size:
                continue
            bw, lat = _links(lay.groups, ga, gb, cl) if kind == _SF else _links(lay.groups, gb, ga, cl)
            bad[:, sel] = (bw <= 0)[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                dur[:, sel] = c.boundary[:, cut] / (size * bw)[:, None] + lat[:, None]


def _update_classes(tg: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    sel = tg.of_kinds(_UP)
    return sel, tg.owner[tg.rep[sel]]


def _updates(tg: TaskGraph, lay: Layout, c: StageCosts, cl: Cluster, meta: dict, dur: np.ndarray) -> None:
    sel, g = tg.memo(_update_classes)
    if sel.size:
        slow = np.where(lay.groups, cl.speed[None, None], np.inf).min(axis=2)[:, g]
        dur[:, sel] = update_time(meta, cl, mat(c.params, tg.group_stages.T)[:, g], slow)
        if meta.get(STAGE_STEP_EXTRA_S):
            dur[:, sel] += (tg.group_stages @ np.asarray(meta[STAGE_STEP_EXTRA_S], dtype=float))[g][None, :]


def durations(tg: TaskGraph, lay: Layout, c: StageCosts, cl: Cluster, graph_meta: dict, fs: np.ndarray,
              bs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(candidates, classes): every class's duration, and whether it needs a link that is
    not there (zero bandwidth between devices that must talk)."""
    dur = np.zeros((fs.shape[0], tg.rep.size))
    bad = np.zeros(dur.shape, dtype=bool)
    _compute(tg, lay, c, fs, bs, float(cl.meta.get("action_overhead_s", 0.0)), dur)
    _allreduce(tg, lay, c, cl, dur, bad, graph_meta.get(OVERLAP), graph_meta.get(STAGE_ALLREDUCE_S))
    _transfers(tg, lay, c, cl, dur, bad)
    _updates(tg, lay, c, cl, graph_meta, dur)
    return dur, bad
