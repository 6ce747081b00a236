"""The yardstick of Auto-MAP's online search: every plan of the pruned problem, evaluated.

The same candidates and rules as the DQN (``CutProblem.windows`` and ``mask``), generated
cut by cut with numpy and scored by the batched evaluator in chunks: the optimum of the
pruned problem by exhaustive enumeration, as the paper compares against (§5.2.3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .problem import CutProblem


def _extend(problem: CutProblem, prefix: np.ndarray, j: int) -> np.ndarray:
    """Rows of ``prefix`` (cuts 0..j-1) extended by every valid j-th cut."""
    w = problem.windows[j]
    last = prefix[:, -1]
    dev, tr = problem.device_cut, problem.trainable
    ok = (w[None, :] > last[:, None]) & (dev[w][None, :] > dev[last][:, None]) & (tr[w][None, :] > tr[last][:, None])
    rows, cols = np.nonzero(ok)
    return np.concatenate([prefix[rows], w[cols][:, None]], axis=1)


def count(problem: CutProblem) -> int:
    """How many plans the pruned problem holds (dynamic programming over the cuts)."""
    ways = np.ones(problem.windows[-1].size, dtype=object)
    dev, tr = problem.device_cut, problem.trainable
    for j in reversed(range(problem.stages - 2)):
        w, nxt = problem.windows[j], problem.windows[j + 1]
        ok = (nxt[None, :] > w[:, None]) & (dev[nxt][None, :] > dev[w][:, None]) & (tr[nxt][None, :] > tr[w][:, None])
        ways = np.array([int(sum(ways[row])) for row in ok], dtype=object)
    return int(sum(ways))


def plans(problem: CutProblem, chunk: int = 4096) -> Iterator[np.ndarray]:
    """Every plan (rows of K-1 cuts), in chunks of about ``chunk`` rows."""
    def walk(prefix: np.ndarray, j: int) -> Iterator[np.ndarray]:
        if j == problem.stages - 1:
            yield prefix
            return
        for start in range(0, len(prefix), max(1, chunk // max(1, problem.windows[j].size))):
            yield from walk(_extend(problem, prefix[start:start + max(1, chunk // max(1, problem.windows[j].size))],
                                    j), j + 1)
    yield from walk(problem.windows[0][:, None], 1)


@dataclass
class Optimum:
    cuts: list[int]
    iteration_s: float
    fits: bool
    plans: int
    seconds: float


def optimum(problem: CutProblem, chunk: int = 4096) -> Optimum:
    """The best plan of the pruned problem (fitting plans first, then the fastest)."""
    t0 = time.perf_counter()
    best: tuple[bool, float] = (False, np.inf)
    best_cuts: list[int] = []
    seen = 0
    for rows in plans(problem, chunk):
        it, fits = problem.values(rows)
        seen += len(rows)
        i = int(np.lexsort((it, ~fits))[0])
        if (fits[i], -it[i]) > (best[0], -best[1]):
            best, best_cuts = (bool(fits[i]), float(it[i])), [int(c) for c in rows[i]]
    return Optimum(best_cuts, best[1], best[0], seen, time.perf_counter() - t0)
