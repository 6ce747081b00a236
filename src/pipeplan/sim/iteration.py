"""One iteration of a compiled task graph for a batch of layouts (candidates): durations
(``durations``), the discrete-event run (``engine``), then the iteration time (makespan, or
``steady`` state), the path bound, per-device busy time and memory. ``simulate`` runs it
with a batch of one, the batched evaluator with many: the one place these are derived.

Devices that know their ``solo_speed`` (calibrated) are run twice: first alone, then at a
speed between alone and all-busy by how much of their time the other devices of their
server are busy (``contention_scale``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..schedule import Kind
from .bounds import path_bound
from .compile import TaskGraph, mat
from .stage_costs import StageCosts
from .durations import Layout, durations
from .engine import run_batch, run_tasks
from .formulas import optimizer_shards, precision_of
from .memory import GroupWalk, device_memory
from .steady import period, round_sync, steady_iteration

_F, _AR = int(Kind.F), int(Kind.AR)


@dataclass(frozen=True)
class Shape:
    """What the candidates share: the task graph, its memory walks and the schedule's kind."""

    tg: TaskGraph
    walks: list[GroupWalk]
    steady: int | None  # N of a steady state, None for a synchronous iteration
    stream: int  # microbatches the programs run
    lanes: bool


@dataclass
class Outcome:
    """Per candidate: class durations ``table``, task end (and, when asked, start) times,
    ``ran`` (tasks completed), ``done`` (every task ran and every needed link exists), ``bad`` (classes that need a
    missing link), iteration, path bound, busy time (over the iteration's microbatches)
    and memory per device, the steady state's ``window`` and the contention ``scale``."""

    table: np.ndarray
    start: np.ndarray | None
    end: np.ndarray
    ran: np.ndarray
    done: np.ndarray
    bad: np.ndarray
    iteration: np.ndarray
    path: np.ndarray
    busy: np.ndarray
    memory: np.ndarray
    window: np.ndarray | None
    scale: np.ndarray | None


def _busy_counts(tg: TaskGraph, lanes: bool) -> list[np.ndarray]:
    """(classes, groups) task counts of each group's compute (per lane with lanes)."""
    n_g = len(tg.groups)
    comp = tg.owner >= 0
    sels = [comp & (tg.kind == _F), comp & (tg.kind != _F)] if lanes else [comp]
    return [tg.counts(sel, tg.owner[sel], n_g) for sel in map(np.flatnonzero, sels)]


def busy_time(tg: TaskGraph, lay: Layout, table: np.ndarray, lanes: bool) -> np.ndarray:
    """(candidates, devices): compute time of each device (the busier lane with lanes)."""
    counts = tg.memo(_busy_counts, lanes)
    per_g = np.maximum(mat(table, counts[0]), mat(table, counts[1])) if lanes else mat(table, counts[0])
    return np.einsum("bgv,bg->bv", lay.groups, per_g)


def contention_scale(cl: Cluster, used: np.ndarray, util: np.ndarray) -> np.ndarray:
    """Effective speed / speed of each device: between its solo speed and its all-busy
    speed, by the probability that another used device of its server is busy (from their
    utilization when run alone), harmonically (time per unit of work interpolates)."""
    servers = np.array([d.server for d in cl.devices])
    same = (servers[:, None] == servers[None, :]) & ~np.eye(len(cl), dtype=bool)
    idle = np.where(used, 1.0 - np.minimum(util, 1.0), 1.0)
    overlap = 1.0 - np.prod(np.where(same[None], idle[:, None, :], 1.0), axis=2)
    solo = np.array([d.solo_speed or d.speed for d in cl.devices])
    scale = 1.0 / ((1.0 - overlap) / solo + overlap / cl.speed) / cl.speed
    return np.where(used, scale, 1.0)


def _allreduce_per_device(tg: TaskGraph, lay: Layout, table: np.ndarray) -> np.ndarray:
    out = np.zeros(lay.stages.shape[::2])
    for c in tg.of_kinds(_AR).tolist():
        out += table[:, c, None] * lay.stages[:, tg.stage[tg.rep[c]]]
    return out


def _run(sh: Shape, lay: Layout, c: StageCosts, cl: Cluster, meta: dict, fs: np.ndarray, bs: np.ndarray,
         starts: bool) -> Outcome:
    """One pass at the given speeds; memory left empty."""
    tg = sh.tg
    table, bad = durations(tg, lay, c, cl, meta, fs, bs)
    if starts:
        start, end1, done = run_tasks(table[0, tg.cls], tg.ptr, tg.succ, tg.npred, tg.chan, len(tg.channels))
        start, end, ran = start[None], end1[None], np.array([done])
    else:
        start = None
        end, ran = run_batch(table, tg.cls, tg.ptr, tg.succ, tg.npred, tg.chan, len(tg.channels))
    window = None
    with np.errstate(invalid="ignore"):  # inf durations (a missing link) times zero counts
        busy = busy_time(tg, lay, table, sh.lanes)
        if sh.steady is None:
            iteration, path = end.max(axis=1, initial=0.0), path_bound(tg, table)
        else:
            window = period(tg, end, sh.steady, sh.stream)
            sync = round_sync(tg, lay.groups, _allreduce_per_device(tg, lay, table))
            iteration = steady_iteration(tg, table, window, sh.steady, sh.stream, busy, sync)
            busy, path = busy * (sh.steady / sh.stream), np.zeros(table.shape[0])
    return Outcome(table, start, end, ran, (ran == tg.n) & ~bad.any(axis=1), bad, iteration, path, busy,
                   np.zeros(0), window, None)


def run_layouts(sh: Shape, lay: Layout, c: StageCosts, cl: Cluster, meta: dict, optimizer: str, fs: np.ndarray,
                bs: np.ndarray, starts: bool = False) -> Outcome:
    """Evaluate every candidate (``fs``, ``bs``: (candidates, devices) pass speeds);
    ``starts``: also the start times (a batch of one, for a timeline)."""
    scale = None
    if any(d.solo_speed is not None for d in cl.devices):
        solo = np.array([d.solo_speed or d.speed for d in cl.devices]) / cl.speed
        alone = _run(sh, lay, c, cl, meta, fs * solo, bs * solo, False)
        with np.errstate(divide="ignore", invalid="ignore"):
            util = np.where(alone.iteration[:, None] > 0, alone.busy / alone.iteration[:, None], 1.0)
        scale = contention_scale(cl, lay.used, util)
        fs, bs = fs * scale, bs * scale
    out = _run(sh, lay, c, cl, meta, fs, bs, starts)
    out.memory = device_memory(sh.tg, sh.walks, lay, c, optimizer, fs, sh.steady is not None,
                               precision_of(meta), optimizer_shards(meta), meta.get("stage_extra_bytes"))
    out.scale = scale
    return out
