"""The yardstick of Auto-MAP's online search: the optimum of the pruned problem.

The same candidates and rules as the DQN (``CutProblem.windows`` and ``mask``), generated
cut by cut with numpy. ``exhaustive`` scores every plan with the batched evaluator, the
enumeration the paper compares against (§5.2.3); ``optimum`` finds the same best plan by
branch and bound: every plan gets a lower bound (``bounds.py``); the plans with the lowest
bounds give an incumbent, and only plans whose bound is below it are evaluated, in order of
their bound, until the bound reaches the best value found.
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
        step = max(1, chunk // max(1, problem.windows[j].size))  # rows of prefix per extension
        for start in range(0, len(prefix), step):
            yield from walk(_extend(problem, prefix[start:start + step], j), j + 1)
    yield from walk(problem.windows[0][:, None], 1)


@dataclass
class Optimum:
    cuts: list[int]
    iteration_s: float
    fits: bool
    plans: int        # plans in the pruned problem
    evaluated: int    # plans the simulator scored
    seconds: float


class _Best:
    """Fitting plans first, then the fastest."""

    def __init__(self) -> None:
        self.key, self.cuts, self.evaluated = (False, -np.inf), [], 0

    def offer(self, problem: CutProblem, rows: np.ndarray) -> None:
        it, fits = problem.values(rows)
        self.evaluated += len(rows)
        i = int(np.lexsort((it, ~fits))[0])
        if (bool(fits[i]), -float(it[i])) > self.key:
            self.key, self.cuts = (bool(fits[i]), -float(it[i])), [int(c) for c in rows[i]]

    def result(self, plans: int, t0: float) -> Optimum:
        return Optimum(self.cuts, -self.key[1], self.key[0], plans, self.evaluated, time.perf_counter() - t0)


def exhaustive(problem: CutProblem, chunk: int = 4096) -> Optimum:
    """Every plan of the pruned problem, scored."""
    t0, best, total = time.perf_counter(), _Best(), 0
    for rows in plans(problem, chunk):
        best.offer(problem, rows)
        total += len(rows)
    return best.result(total, t0)


SLACK = 1e-9  # the bound is computed in another order than the simulator's sums


def optimum(problem: CutProblem, chunk: int = 4096) -> Optimum:
    """The best plan of the pruned problem, by branch and bound (exact: a plan is skipped
    only when its lower bound reaches a value already found)."""
    t0, best, total = time.perf_counter(), _Best(), 0
    low = np.zeros((0, problem.stages - 1), dtype=np.int64)
    low_lb = np.zeros(0)
    for rows in plans(problem, 1 << 16):  # pass 1: the lowest bounds give an incumbent
        lb = problem.lower_bounds(rows)
        total += len(rows)
        low, low_lb = np.concatenate([low, rows]), np.concatenate([low_lb, lb])
        if len(low) > chunk:
            keep = np.argpartition(low_lb, chunk)[:chunk]
            low, low_lb = low[keep], low_lb[keep]
    best.offer(problem, low)
    for rows in plans(problem, 1 << 16):  # pass 2: whatever might still beat it
        lb = problem.lower_bounds(rows)
        for part in np.array_split(np.argsort(lb), max(1, len(rows) // chunk)):
            if best.key[0]:  # a plan that fits: only faster plans can beat it
                part = part[lb[part] < -best.key[1] * (1 + SLACK)]
            if len(part):
                best.offer(problem, rows[part])
    return best.result(total, t0)
