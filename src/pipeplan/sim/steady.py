"""Steady state of an asynchronous pipeline (PipeDream, SOSP'19 §3: no flush, weight
stashing; resalloc.txt §III-B with forward and backward lanes).

The schedule runs a stream of microbatches; the time per N microbatches is the time between
the last backward of microbatch N-1 and of 2N-1 on stage 0 (the pipeline is full by then),
and never less than the busiest resource's work for N microbatches: a device's compute
(a replicated stage's plus its all-reduce, which overlaps the stream) or a channel's
transfers. A true steady state cannot run faster than its busiest resource.
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
                     busy: np.ndarray, allreduce: np.ndarray) -> np.ndarray:
    """``window``: the ``period``; ``table``: class durations; ``busy`` per device over the
    whole stream; ``allreduce`` per device (its stage's)."""
    scale = steady / m_count
    count = tg.memo(_channel_counts)
    load = mat(table, count).max(axis=1) * scale if count is not None else 0.0
    dev = (busy * scale + allreduce).max(axis=1, initial=0.0)
    return np.maximum(np.maximum(window[:, 1] - window[:, 0], dev), load)
