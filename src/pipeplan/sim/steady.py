"""Steady state of an asynchronous pipeline (PipeDream, SOSP'19 §3: no flush, weight
stashing; resalloc.txt §III-B with forward and backward lanes).

The schedule runs a stream of microbatches; the time per N microbatches is the time between
the last backward of microbatch N-1 and of 2N-1 on stage 0 (the pipeline is full by then),
and never less than the busiest resource's work for N microbatches: a device's compute or
its stage's gradient synchronization, or a channel's transfers. A true steady state cannot
run faster than its busiest resource.

Synchronization (PipeDream, SOSP'19 §3.1): the replicas of a stage all-reduce their
gradients once a round, a round being one backward on each replica (a round-robin replica's
every backward; with split replicas every microbatch's); the all-reduce of one round overlaps
the next round's compute, so a replicated stage of m devices takes, per microbatch,
(1/m) max(compute, all-reduce) -- PipeDream's T(i -> j, m). Per N microbatches a device is
busy max(its compute, its rounds x its stage's all-reduce).
Every function takes a leading candidate axis.
"""

from __future__ import annotations

import numpy as np

from ..schedule import Kind
from .compile import TaskGraph, mat


def _stage0_backwards(tg: TaskGraph) -> np.ndarray:
    return np.flatnonzero(np.isin(tg.kind, [Kind.B, Kind.I, Kind.W]) & (tg.stage == 0))


def _channel_counts(tg: TaskGraph) -> np.ndarray | None:
    """(classes, channels): each class's transfers on each channel; None without transfers."""
    ch = np.flatnonzero(tg.chan >= 0)
    return tg.counts(ch, tg.chan[ch], len(tg.channels)) if ch.size else None


def period(tg: TaskGraph, end: np.ndarray, steady: int, m_count: int) -> np.ndarray:
    """(candidates, 2): from the last backward of microbatch N-1 to that of 2N-1 on stage 0."""
    sel = tg.memo(_stage0_backwards)
    last = np.zeros((end.shape[0], m_count))
    np.maximum.at(last, (np.arange(end.shape[0])[:, None], tg.micro[sel][None, :]), end[:, sel])
    return last[:, [steady - 1, 2 * steady - 1]]


def steady_iteration(tg: TaskGraph, table: np.ndarray, window: np.ndarray, steady: int, m_count: int,
                     busy: np.ndarray, sync: np.ndarray) -> np.ndarray:
    """``window``: the ``period``; ``table``: class durations; ``busy`` per device over the
    whole stream; ``sync`` per device over the whole stream (its rounds' all-reduces)."""
    scale = steady / m_count
    count = tg.memo(_channel_counts)
    load = mat(table, count).max(axis=1) * scale if count is not None else 0.0
    dev = (np.maximum(busy, sync) * scale).max(axis=1, initial=0.0)
    return np.maximum(np.maximum(window[:, 1] - window[:, 0], dev), load)


def _backward_counts(tg: TaskGraph) -> np.ndarray:
    """(groups,): the backwards (B, or I of a split one) each group's program runs."""
    sel = (tg.owner >= 0) & np.isin(tg.kind, [Kind.B, Kind.I])
    return np.bincount(tg.owner[sel], minlength=len(tg.groups)).astype(float)


def round_sync(tg: TaskGraph, groups: np.ndarray, allreduce: np.ndarray) -> np.ndarray:
    """(candidates, devices): each device's all-reduces over the stream, one a round (module
    docstring): its stage's all-reduce (``allreduce``) times its program's backwards
    (``groups[b, g, v]``: device v runs group g)."""
    return allreduce * np.einsum("bgv,g->bv", groups, tg.memo(_backward_counts))
