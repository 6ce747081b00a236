"""Steady state of an asynchronous pipeline (PipeDream, SOSP'19 §3: no flush, weight
stashing; resalloc.txt §III-B with forward and backward lanes).

The schedule runs a stream of microbatches; the time per N microbatches is the time between
the last backward of microbatch N-1 and of 2N-1 on stage 0 (the pipeline is full by then),
and never less than the busiest resource's work for N microbatches: a device's compute
(a replicated stage's plus its all-reduce, which overlaps the stream) or a channel's
transfers. A true steady state cannot run faster than its busiest resource.
"""

from __future__ import annotations

import numpy as np

from ..schedule import Kind
from .compile import TaskGraph


def period(tg: TaskGraph, end: np.ndarray, steady: int, m_count: int) -> tuple[float, float]:
    """The measured period: from the last backward of microbatch N-1 to that of 2N-1 on stage 0."""
    sel = ((tg.kind == Kind.B) | (tg.kind == Kind.I) | (tg.kind == Kind.W)) & (tg.stage == 0)
    last_b0 = np.zeros(m_count)
    np.maximum.at(last_b0, tg.micro[sel], end[sel])
    return float(last_b0[steady - 1]), float(last_b0[2 * steady - 1])


def steady_iteration(tg: TaskGraph, window: tuple[float, float], steady: int, m_count: int, busy: np.ndarray,
                     allreduce: np.ndarray) -> float:
    """``window``: the ``period``; ``busy`` per device over the whole stream; ``allreduce``
    per device (its stage's)."""
    scale = steady / m_count
    chan = tg.chan >= 0
    load = np.bincount(tg.chan[chan], weights=tg.dur[chan]) * scale if chan.any() else np.zeros(1)
    return max(window[1] - window[0], float((busy * scale + allreduce).max(initial=0.0)), float(load.max(initial=0.0)))
