"""Discrete-event core: tasks with durations and dependencies; channel tasks queue FIFO.

A device's order is encoded as dependencies (each action waits for the one before it), so
only channels need arbitration: a channel carries one transfer at a time, in the order the
transfers become ready (SPP §IV-A: a communication block runs as soon as its data is ready
and the channel is idle). Events are processed in time order from a binary heap; ties are
broken by task id, so results are deterministic.

This is the inner loop of every search and learning agent (10^5-10^6 evaluations), so it is
compiled with numba: flat arrays, an array heap, channel queues as linked lists.
``run_batch`` runs many candidates that share one task graph and differ in durations.

The kernels are plain Python functions, compiled (or loaded from numba's cache) the first time
a call is large (``PYTHON_BELOW`` task runs or more), once this process has spent
``PYTHON_BUDGET_S`` running them as Python, or when a planner warms them up: a command that
simulates a few plans runs them as Python and never loads numba (loading it and the cached
kernels takes about a second), while a long-lived process soon runs them compiled. The two run the same code on the same float64 arithmetic, and
their results are identical (``tests/test_sim_properties.py``).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import interrupts_deferred


def _less(ta: float, ia: int, tb: float, ib: int) -> bool:
    return ta < tb or (ta == tb and ia < ib)


def _push(ht: np.ndarray, hi: np.ndarray, size: int, t: float, i: int) -> int:
    k = size
    while k > 0:
        parent = (k - 1) >> 1
        if not _less(t, i, ht[parent], hi[parent]):
            break
        ht[k], hi[k] = ht[parent], hi[parent]
        k = parent
    ht[k], hi[k] = t, i
    return size + 1


def _pop(ht: np.ndarray, hi: np.ndarray, size: int) -> int:
    """Remove the root (the caller has read it); returns the new size."""
    size -= 1
    t, i = ht[size], hi[size]
    k = 0
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and _less(ht[c + 1], hi[c + 1], ht[c], hi[c]):
            c += 1
        if not _less(ht[c], hi[c], t, i):
            break
        ht[k], hi[k] = ht[c], hi[c]
        k = c
    ht[k], hi[k] = t, i
    return size


def _workspace(n: int, nchan: int):
    c = max(nchan, 1)
    return (np.empty(n, dtype=np.int64), np.empty(c, dtype=np.bool_), np.empty(c, dtype=np.int64),
            np.empty(c, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.float64),
            np.empty(n, dtype=np.int64))


def _run(dur, ptr, succ, npred, chan, nchan, start, end, ws) -> int:
    """Fill ``start`` and ``end``; return the number of tasks completed. ``ws``: scratch
    arrays from ``_workspace`` (reused across the rows of a batch)."""
    n = dur.size
    cnt, busy, qhead, qtail, qnext, ht, hi = ws
    cnt[:] = npred
    busy[:] = False
    qhead[:] = -1
    qtail[:] = -1
    qnext[:] = -1
    size = 0
    for i in range(n):
        if cnt[i] == 0:
            start[i] = 0.0
            c = chan[i]
            if c >= 0:
                if busy[c]:
                    if qtail[c] >= 0:
                        qnext[qtail[c]] = i
                    else:
                        qhead[c] = i
                    qtail[c] = i
                    continue
                busy[c] = True
            size = _push(ht, hi, size, dur[i], i)
    done = 0
    while size > 0:
        t, i = ht[0], hi[0]
        size = _pop(ht, hi, size)
        end[i] = t
        done += 1
        c = chan[i]
        if c >= 0:
            j = qhead[c]
            if j >= 0:
                qhead[c] = qnext[j]
                if qhead[c] < 0:
                    qtail[c] = -1
                start[j] = t
                size = _push(ht, hi, size, t + dur[j], j)
            else:
                busy[c] = False
        for k in range(ptr[i], ptr[i + 1]):
            j = succ[k]
            cnt[j] -= 1
            if cnt[j] == 0:
                c = chan[j]
                if c >= 0:
                    if busy[c]:
                        if qtail[c] >= 0:
                            qnext[qtail[c]] = j
                        else:
                            qhead[c] = j
                        qtail[c] = j
                        continue
                    busy[c] = True
                start[j] = t
                size = _push(ht, hi, size, t + dur[j], j)
    return done


def run_tasks(dur: np.ndarray, ptr: np.ndarray, succ: np.ndarray, npred: np.ndarray, chan: np.ndarray,
              nchan: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Return (start, end, number of tasks completed). Task i's successors are
    ``succ[ptr[i]:ptr[i+1]]`` (CSR); ``chan[i]`` is its channel or -1."""
    n = dur.size
    python = _as_python(n)
    start, end = np.empty(n), np.empty(n)
    done = _run(np.ascontiguousarray(dur, dtype=np.float64), ptr.astype(np.int64), succ.astype(np.int64),
                npred.astype(np.int64), chan.astype(np.int64), int(nchan), start, end, _workspace(n, int(nchan)))
    _spent(python)
    return start, end, int(done)


def _run_rows(table, cls, ptr, succ, npred, chan, nchan, end, done) -> None:
    n = cls.size
    ws = _workspace(n, nchan)
    dur = np.empty(n)
    start = np.empty(n)
    for b in range(table.shape[0]):
        for i in range(n):
            dur[i] = table[b, cls[i]]
        done[b] = _run(dur, ptr, succ, npred, chan, nchan, start, end[b], ws)


def run_batch(table: np.ndarray, cls: np.ndarray, ptr: np.ndarray, succ: np.ndarray, npred: np.ndarray,
              chan: np.ndarray, nchan: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates share the dependencies and channels; task i of candidate b lasts
    ``table[b, cls[i]]``. Returns the end times (candidates x tasks) and tasks completed."""
    python = _as_python(table.shape[0] * cls.size)
    end = np.empty((table.shape[0], cls.size))
    done = np.empty(table.shape[0], dtype=np.int64)
    _run_rows(np.ascontiguousarray(table, dtype=np.float64), cls.astype(np.int64), ptr.astype(np.int64),
              succ.astype(np.int64), npred.astype(np.int64), chan.astype(np.int64), int(nchan), end, done)
    _spent(python)
    return end, done


def _as_python(runs: int) -> float | None:
    """Whether this call of ``runs`` task runs goes as Python (its start time) or compiled
    (None: compiling first if it is large or Python has had its budget)."""
    if _ready():
        return None
    if runs >= PYTHON_BELOW or _PYTHON_SPENT >= PYTHON_BUDGET_S:
        _compile()
        return None
    return time.perf_counter()


def _spent(started: float | None) -> None:
    global _PYTHON_SPENT
    if started is not None:
        _PYTHON_SPENT += time.perf_counter() - started


def warm_up() -> float:
    """Compile the kernels, or load them from numba's on-disk cache (``cache=True``: a
    ``__pycache__`` beside this file, else the user's cache directory, else
    ``NUMBA_CACHE_DIR``), by running both entry points on two tasks; the seconds it took, 0
    when this process has done it already. Planners call it before timing their search, so
    that one-time set-up is reported apart from search."""
    if _ready():
        return 0.0
    t0 = time.perf_counter()
    _compile()
    return time.perf_counter() - t0


_COMPILED = False  # both kernels compiled or loaded in this process (``_compile``)


def _ready() -> bool:
    return _COMPILED


#: a call of fewer task runs (tasks x candidates) runs the kernels as Python while numba is
#: not loaded: ~1 us a task event, where loading numba costs about a second
PYTHON_BELOW = 20_000
#: seconds of kernels run as Python after which the process compiles them (a long-lived
#: process: a benchmark, compare, a learning planner)
PYTHON_BUDGET_S = 0.25
_PYTHON_SPENT = 0.0  # seconds this process has run the kernels as Python
#: the kernels numba compiles: helpers inlined into the others, entry points
_INLINE, _KERNELS = ("_less", "_push", "_pop"), ("_workspace", "_run", "_run_rows")
_LOCK = threading.Lock()


def _compile() -> None:
    """Compile the kernels with numba (or load them from its cache), once a process: the
    module's functions are replaced by their compiled versions, so compiled kernels call
    compiled helpers; then both entry points run on two tasks, with the argument types every
    call has, Ctrl-C held."""
    global _COMPILED
    with _LOCK:
        if _COMPILED:
            return
        from numba import njit

        ptr, succ, npred, chan = (np.array(a, dtype=np.int64) for a in ([0, 1, 1], [1], [0, 1], [-1, 0]))
        g = globals()
        with interrupts_deferred():
            for name in _INLINE:
                g[name] = njit(cache=True, inline="always", error_model="numpy")(g[name])
            for name in _KERNELS:
                g[name] = njit(cache=True, error_model="numpy")(g[name])
            _run(np.ones(2), ptr, succ, npred, chan, 1, np.empty(2), np.empty(2), _workspace(2, 1))
            _run_rows(np.ones((1, 2)), np.array([0, 1], dtype=np.int64), ptr, succ, npred, chan, 1,
                      np.empty((1, 2)), np.empty(1, dtype=np.int64))
        _COMPILED = True
