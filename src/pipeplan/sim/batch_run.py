"""One bucket of the batched evaluator: candidates sharing a task graph, run together.

Mirrors ``simulate``'s pieces (``compile`` durations, ``steady``, ``memory``, ``bounds``,
contention) with a leading candidate axis; ``tests/test_batch.py`` holds them equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..costmodel import OPTIMIZER_STATE, update_time
from ..cluster.model import Resource
from ..plan import Plan
from ..schedule import Kind
from .batch_costs import BatchCosts
from .compile import TaskGraph, compile_tasks
from .costs import stage_costs
from .engine import run_batch
from .simulate import schedule_of

_F, _B, _I, _W, _AR, _UP = (int(k) for k in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.AR, Kind.UPDATE))
_SF, _SB = int(Kind.SEND_F), int(Kind.SEND_B)


@dataclass
class BucketResult:
    iteration: np.ndarray
    path: np.ndarray
    memory: np.ndarray
    done: np.ndarray


@dataclass
class _Shape:
    """The shared task graph and, per candidate, which devices form each group. Tasks of
    one *class* (same kind, group, stage and channel pair) have the same duration, so
    durations are computed per class (``rep[c]``: a task of class c; ``cls[t]``: t's class)."""

    tg: TaskGraph
    gmask: np.ndarray  # (candidates, groups, devices)
    stage_of_group: np.ndarray
    steady: int | None
    stream: int
    lanes: bool
    cls: np.ndarray
    rep: np.ndarray

    def count(self, tasks: np.ndarray, column: np.ndarray, width: int) -> np.ndarray:
        """(classes x width) matrix: how many of ``tasks`` of each class fall in each column."""
        out = np.zeros((self.rep.size, width))
        np.add.at(out, (self.cls[tasks], column), 1.0)
        return out


@dataclass(frozen=True)
class Compiled:
    """What a bucket's candidates share, reusable by later batches of the same structure
    key: the task graph, each group's stage and (round-robin) replica ranks, task classes."""

    tg: TaskGraph
    stage_of_group: np.ndarray
    ranks: tuple[tuple[int, ...], ...] | None
    steady: int | None
    stream: int
    lanes: bool
    cls: np.ndarray
    rep: np.ndarray


def compile_bucket(template: Plan) -> Compiled:
    """Raises Infeasible if the template cannot be compiled (no link)."""
    sched = schedule_of(template)
    fs, bs = _speeds(template.cluster, sched.lanes)
    tg = compile_tasks(template, sched, stage_costs(template), fs, bs)
    stage_devs = template.stage_devices()
    sog = np.array([int(g.program.stages[0]) if len(g.program) else 0 for g in tg.groups], dtype=np.int64)
    ranks = None if template.replicas == "split" else tuple(
        tuple(stage_devs[s].index(d) for d in g.devices) for s, g in zip(sog.tolist(), tg.groups))
    key = np.stack([tg.kind, tg.owner, tg.stage, tg.pair], axis=1)
    _, rep, cls = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return Compiled(tg, sog, ranks, sched.steady_state, sched.microbatches, sched.lanes, cls.ravel(), rep)


def _shape(comp: Compiled, dst: np.ndarray) -> _Shape:
    count, v = dst.shape
    gmask = np.zeros((count, len(comp.tg.groups), v), dtype=bool)
    if comp.ranks is None:
        for gi, s in enumerate(comp.stage_of_group.tolist()):
            gmask[:, gi] = dst == s
    else:
        rank = np.full(dst.shape, -1)
        for st in np.unique(comp.stage_of_group).tolist():  # a device's position among its stage's devices
            held = dst == st
            rank = np.where(held, np.cumsum(held, axis=1) - 1, rank)
        for gi, s in enumerate(comp.stage_of_group.tolist()):
            gmask[:, gi] = (dst == s) & np.isin(rank, comp.ranks[gi])
    return _Shape(comp.tg, gmask, comp.stage_of_group, comp.steady, comp.stream, comp.lanes, comp.cls, comp.rep)


def _pair_links(gmask: np.ndarray, ga: int, gb: int, bw: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slowest bandwidth and largest latency from group ga's devices to gb's, per candidate."""
    if (gmask[:, ga].sum(axis=1) == 1).all() and (gmask[:, gb].sum(axis=1) == 1).all():
        i, j = gmask[:, ga].argmax(axis=1), gmask[:, gb].argmax(axis=1)
        return bw[i, j], lat[i, j]
    pm = gmask[:, ga, :, None] & gmask[:, gb, None, :]
    return np.where(pm, bw[None], np.inf).min(axis=(1, 2)), np.where(pm, lat[None], 0.0).max(axis=(1, 2))


def _compute(sh: _Shape, c: BatchCosts, fs: np.ndarray, bs: np.ndarray, overhead: float, dur: np.ndarray) -> None:
    tg = sh.tg
    rep = sh.rep
    sel = np.flatnonzero(np.isin(tg.kind[rep], [_F, _B, _I, _W]))
    g, s, k = tg.owner[rep[sel]], tg.stage[rep[sel]], tg.kind[rep[sel]]
    gf = np.einsum("bgv,bv->bg", sh.gmask, fs)[:, g]
    gb = np.einsum("bgv,bv->bg", sh.gmask, bs)[:, g]
    slow_f = np.where(sh.gmask & (fs > 0)[:, None, :], fs[:, None, :], np.inf).min(axis=2)[:, g]
    slow_b = np.where(sh.gmask & (bs > 0)[:, None, :], bs[:, None, :], np.inf).min(axis=2)[:, g]
    ffix, bfix = c.fwd_fixed[:, s], c.bwd_fixed[:, s]
    with np.errstate(divide="ignore", invalid="ignore"):
        fwd = (c.fwd[:, s] - ffix) / gf + np.where(ffix > 0, ffix / slow_f, 0.0)
        bwd = (c.bwd[:, s] - bfix) / gb + np.where(bfix > 0, bfix / slow_b, 0.0)
    redo = np.where(c.recompute[:, s], fwd, 0.0)
    frac, cost = c.input_fraction, c.split_cost
    dur[:, sel] = np.select([k == _F, k == _B, k == _I, k == _W],
                            [fwd, bwd + redo, cost * frac * bwd + redo, cost * (1.0 - frac) * bwd]) + overhead


def _allreduce(sh: _Shape, c: BatchCosts, cl, dst: np.ndarray, dur: np.ndarray, bad: np.ndarray) -> None:
    eff = float(cl.meta.get("allreduce_efficiency", 1.0))
    off = ~np.eye(len(cl), dtype=bool)
    for t in np.flatnonzero(sh.tg.kind[sh.rep] == _AR).tolist():
        s = int(sh.tg.stage[sh.rep[t]])
        m = dst == s
        k = m.sum(axis=1)
        pm = m[:, :, None] & m[:, None, :] & off[None]
        bw = np.where(pm, cl.bandwidth[None], np.inf).min(axis=(1, 2))
        lat = np.where(pm, cl.latency[None], 0.0).max(axis=(1, 2))
        live = (k >= 2) & (c.params[:, s] > 0)
        bad |= live & (bw <= 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            dur[:, t] = np.where(live, 2.0 * (k - 1) / k * c.params[:, s] / (bw * eff) + 2 * (k - 1) * lat, 0.0)


def _transfers(sh: _Shape, c: BatchCosts, cl, dur: np.ndarray, bad: np.ndarray) -> None:
    tg = sh.tg
    n_g = len(tg.groups)
    pair, kinds, stage = tg.pair[sh.rep], tg.kind[sh.rep], tg.stage[sh.rep]
    for code in np.unique(pair[pair >= 0]).tolist():
        ga, gb = divmod(code, n_g)
        size = sh.gmask[:, ga].sum(axis=1) * sh.gmask[:, gb].sum(axis=1)
        for kind, (bw, lat) in ((_SF, _pair_links(sh.gmask, ga, gb, cl.bandwidth, cl.latency)),
                                (_SB, _pair_links(sh.gmask, gb, ga, cl.bandwidth, cl.latency))):
            sel = np.flatnonzero((pair == code) & (kinds == kind))
            if not sel.size:
                continue
            cut = stage[sel] - (0 if kind == _SF else 1)
            bad |= bw <= 0
            with np.errstate(divide="ignore", invalid="ignore"):
                dur[:, sel] = c.boundary[:, cut] / (size * bw)[:, None] + lat[:, None]


def _updates(sh: _Shape, c: BatchCosts, template: Plan, dur: np.ndarray) -> None:
    for t in np.flatnonzero(sh.tg.kind[sh.rep] == _UP).tolist():
        g = int(sh.tg.owner[sh.rep[t]])
        slow = np.where(sh.gmask[:, g], template.cluster.speed[None], np.inf).min(axis=1)
        dur[:, t] = update_time(template.graph.meta, template.cluster, c.params[:, sh.stage_of_group[g]], slow)


def durations(sh: _Shape, template: Plan, dst: np.ndarray, c: BatchCosts, fs: np.ndarray,
              bs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every class's duration per candidate, and which candidates cannot run (no link)."""
    cl = template.cluster
    dur = np.zeros((dst.shape[0], sh.rep.size))
    bad = np.zeros(dst.shape[0], dtype=bool)
    _compute(sh, c, fs, bs, float(cl.meta.get("action_overhead_s", 0.0)), dur)
    _allreduce(sh, c, cl, dst, dur, bad)
    _transfers(sh, c, cl, dur, bad)
    _updates(sh, c, template, dur)
    return dur, bad


def _busy(sh: _Shape, table: np.ndarray) -> np.ndarray:
    """Compute time per device (the busier lane with lanes), (candidates, devices)."""
    tg = sh.tg
    n_g = len(tg.groups)
    comp = tg.owner >= 0
    if sh.lanes:
        isf = tg.kind == _F
        per_g = np.maximum(table @ sh.count(np.flatnonzero(comp & isf), tg.owner[comp & isf], n_g),
                           table @ sh.count(np.flatnonzero(comp & ~isf), tg.owner[comp & ~isf], n_g))
    else:
        per_g = table @ sh.count(np.flatnonzero(comp), tg.owner[comp], n_g)
    return np.einsum("bgv,bg->bv", sh.gmask, per_g)


def _one_pass(sh: _Shape, template: Plan, dst: np.ndarray, c: BatchCosts, fs: np.ndarray,
              bs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Durations per class, end times per task, and which candidates ran to the end."""
    table, bad = durations(sh, template, dst, c, fs, bs)
    tg = sh.tg
    end, done = run_batch(table, sh.cls, tg.ptr, tg.succ, tg.npred, tg.chan, len(tg.channels))
    return table, end, (done == tg.n) & ~bad


def _iteration(sh: _Shape, dur: np.ndarray, end: np.ndarray, dst: np.ndarray) -> np.ndarray:
    if sh.steady is None:
        return end.max(axis=1, initial=0.0)
    tg = sh.tg
    sel = np.flatnonzero(np.isin(tg.kind, [_B, _I, _W]) & (tg.stage == 0))
    last = np.zeros((dur.shape[0], sh.stream))
    np.maximum.at(last, (np.arange(dur.shape[0])[:, None], tg.micro[sel][None, :]), end[:, sel])
    window = last[:, 2 * sh.steady - 1] - last[:, sh.steady - 1]
    scale = sh.steady / sh.stream
    ar = np.zeros_like(dst, dtype=float)
    for c in np.flatnonzero(tg.kind[sh.rep] == _AR).tolist():
        ar = np.where(dst == tg.stage[sh.rep[c]], dur[:, c][:, None], ar)
    dev = (_busy(sh, dur) * scale + ar).max(axis=1, initial=0.0)
    ch = np.flatnonzero(tg.chan >= 0)
    load = (dur @ sh.count(ch, tg.chan[ch], len(tg.channels))) * scale if ch.size else np.zeros((dur.shape[0], 1))
    return np.maximum(np.maximum(window, dev), load.max(axis=1))


def _path(sh: _Shape, dur: np.ndarray) -> np.ndarray:
    if sh.steady is not None:
        return np.zeros(dur.shape[0])
    tg = sh.tg
    chain = np.isin(tg.kind, [_F, _B, _I, _SF, _SB]) | ((tg.kind == _W) & (tg.stage == 0))
    sel = np.flatnonzero(chain & (tg.micro >= 0))
    return (dur @ sh.count(sel, tg.micro[sel], sh.stream)).max(axis=1, initial=0.0)


def _memory(sh: _Shape, c: BatchCosts, fs: np.ndarray, optimizer: str) -> np.ndarray:
    """Peak bytes per device (``memory.device_memory`` over the batch). A group holds one
    stage, so its activation curve is the stage's bytes per microbatch times the program's
    count of microbatches in flight; a re-materializing stage peaks at a backward."""
    mem = np.zeros_like(fs)
    factor = 2.0 + OPTIMIZER_STATE[optimizer]
    gf = np.einsum("bgv,bv->bg", sh.gmask, fs)
    for gi, g in enumerate(sh.tg.groups):
        k = g.program.kinds[g.program.kinds != _AR]
        st = sh.stage_of_group[gi]
        frees = (k == _B) | (k == _W)
        count = np.cumsum(np.where(k == _F, 1.0, np.where(frees, -1.0, 0.0)))
        at_back = (k == _B) | (k == _I)
        rec = c.recompute[:, st]
        keep = np.where(rec, c.kept_recomputing[:, st], c.stash[:, st])
        most, before_back = count.max(initial=0.0), (count + frees)[at_back].max(initial=0.0)
        redo = np.where(rec, c.outputs[:, st], 0.0) + c.workspace[:, st]
        peak = np.where(at_back.any(), np.maximum(keep * most, keep * before_back + redo), keep * most)
        fixed = c.params[:, st] * factor + (max(most - 1, 0) * c.params[:, st] if sh.steady else 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(gf[:, gi:gi + 1] > 0, fs / gf[:, gi:gi + 1], 0.0)
        mem += sh.gmask[:, gi] * (fixed[:, None] + frac * peak[:, None])
    return mem


def _contention(sh: _Shape, template: Plan, dst: np.ndarray, busy: np.ndarray, iteration: np.ndarray) -> np.ndarray:
    """``simulate.contention_scale`` per candidate."""
    cl = template.cluster
    used = dst >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(iteration[:, None] > 0, busy / iteration[:, None], 1.0)
    servers = np.array([d.server for d in cl.devices])
    same = (servers[:, None] == servers[None, :]) & ~np.eye(len(cl), dtype=bool)
    idle = np.where(used, 1.0 - np.minimum(util, 1.0), 1.0)  # unused devices do not count
    overlap = 1.0 - np.prod(np.where(same[None], idle[:, None, :], 1.0), axis=2)
    solo = np.array([d.solo_speed or d.speed for d in cl.devices])
    scale = 1.0 / ((1.0 - overlap) / solo + overlap / cl.speed) / cl.speed
    return np.where(used, scale, 1.0)


def _speeds(cl, lanes: bool) -> tuple[np.ndarray, np.ndarray]:
    """``simulate.pass_speeds`` for every device, with no allocation (beta = 0.5)."""
    if not lanes:
        return cl.fspeed, cl.bspeed
    res = [d.resources or (Resource("*", d.speed, d.speed),) for d in cl.devices]
    return (np.array([sum(0.5 * r.fwd_speed for r in rs) for rs in res]),
            np.array([sum(0.5 * r.bwd_speed for r in rs) for rs in res]))


def run_bucket(template: Plan, dst: np.ndarray, c: BatchCosts, comp: Compiled | None = None) -> BucketResult:
    """Raises Infeasible if the template itself cannot be compiled (no link); ``comp``: the
    bucket's compiled structure when already known (``compile_bucket``)."""
    sh = _shape(comp or compile_bucket(template), dst)
    cl = template.cluster
    f0, b0 = _speeds(cl, sh.lanes)
    fs, bs = np.broadcast_to(f0, dst.shape), np.broadcast_to(b0, dst.shape)
    if any(d.solo_speed is not None for d in cl.devices):
        solo = np.array([d.solo_speed or d.speed for d in cl.devices]) / cl.speed
        dur, end, ok = _one_pass(sh, template, dst, c, fs * solo, bs * solo)
        busy = _busy(sh, dur) * (sh.steady / sh.stream if sh.steady else 1.0)
        scale = _contention(sh, template, dst, busy, _iteration(sh, dur, end, dst))
        fs, bs = fs * scale, bs * scale
    dur, end, ok = _one_pass(sh, template, dst, c, fs, bs)
    return BucketResult(_iteration(sh, dur, end, dst), _path(sh, dur), _memory(sh, c, fs, template.optimizer), ok)
