"""The optimum of an abstract array-partition instance (``arrays.Instance``): the yardstick
of the zero-shot agent, by branch and bound over every (boundaries, device cuts) pair.

Plans are boundary tuples among the points at distinct real positions times device-cut
tuples (device cuts in the instance's units). A device tuple is dropped whole when its best bottleneck over all boundaries
(``M c_k / n_k``, by a parametric search) cannot beat the incumbent; for the others every
boundary tuple gets the pipeline lower bound of ``bounds.py`` and those below the incumbent
are evaluated, in order of their bound, until the bound reaches the best value found.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from ...errors import PipeplanError
from .arrays import Instance
from .bounds import pipeline_lower_bound
from .enumerate import SLACK

MAX_PLANS = 2_000_000  # boundary tuples held at once
GROUP = 32             # device tuples bounded together


@dataclass
class CoarseOptimum:
    bounds: list[int]
    dcuts: list[int]
    value: float
    evaluated: int
    seconds: float


def boundary_points(inst: Instance) -> np.ndarray:
    """One point per distinct real position strictly inside the model."""
    pos = inst.positions
    _, first = np.unique(pos, return_index=True)
    pts = np.sort(first)
    return pts[(pos[pts] > 0) & (pos[pts] < pos[-1])]


def lower_bounds(inst: Instance, bounds: np.ndarray, dcuts: np.ndarray) -> np.ndarray:
    """``bounds.pipeline_lower_bound`` of boundary rows (T, K-1) on one device tuple (K-1,)."""
    t, n_dev, topo = len(bounds), inst.devices, inst.topology
    edges = np.concatenate([np.zeros((t, 1), dtype=np.int64), bounds, np.full((t, 1), inst.C.size - 1)], axis=1)
    devs = [0, *[int(d) * inst.unit for d in dcuts], n_dev]
    sizes = np.diff(devs).astype(float)
    work = np.diff(inst.C[edges], axis=1) / sizes[None, :]
    ar_unit = _ar_units(inst, dcuts)
    x_unit = np.array([1.0 / (sizes[j] * sizes[j + 1] * topo[devs[j]:devs[j + 1], devs[j + 1]:devs[j + 2]].min())
                       for j in range(len(sizes) - 1)])
    ar = np.diff(inst.W[edges], axis=1) * ar_unit[None, :]
    xfer = inst.A[bounds] * x_unit[None, :]
    return pipeline_lower_bound(work / 3, 2 * work / 3, xfer, ar, inst.microbatches)


def _ar_units(inst: Instance, dcuts: np.ndarray) -> np.ndarray:
    """All-reduce seconds per normalized byte of each stage's device group (ring, SPP Eq. 1)."""
    devs = [0, *[int(d) * inst.unit for d in dcuts], inst.devices]
    return np.array([2 * (b - a - 1) / (b - a) / inst.topology[a:b, a:b].min() if b - a > 1 else 0.0
                     for a, b in zip(devs, devs[1:])])


def best_bottleneck(inst: Instance, sizes: np.ndarray, ar_units: np.ndarray, iters: int = 40) -> float:
    """min over boundaries of max_k (M c_k / n_k + all-reduce_k), a lower bound of every plan
    on these stage sizes: bisection on the bottleneck T; each stage's term grows with its
    end and shrinks with its start, so taking each stage as far as T allows is optimal."""
    m, c, w = inst.microbatches, inst.C, inst.W
    lo, hi = 0.0, float(np.max(m * c[-1] / sizes + w[-1] * ar_units))
    for _ in range(iters):
        t = (lo + hi) / 2
        at = 0
        for n, u in zip(sizes, ar_units):
            g = m * c / n + w * u  # non-decreasing along the points
            at = int(np.searchsorted(g, g[at] + t, side="right")) - 1
        lo, hi = (lo, t) if at >= c.size - 1 else (t, hi)
    return lo


def optimum(inst: Instance, chunk: int = 2048) -> CoarseOptimum:
    """The best plan of ``inst`` (exact: every plan is evaluated or bounded out)."""
    t0 = time.perf_counter()
    k, n_dev = inst.stages, inst.devices
    pts = boundary_points(inst)
    if len(pts) < k - 1:
        raise PipeplanError(f"{inst.name}: fewer than {k - 1} places to cut")
    tuples = np.array(list(itertools.combinations(pts.tolist(), k - 1)), dtype=np.int64)
    if len(tuples) > MAX_PLANS:
        raise PipeplanError(f"{inst.name}: {len(tuples):,} boundary tuples; the exact search holds {MAX_PLANS:,}")
    dtuples = np.array(list(itertools.combinations(range(1, inst.units), k - 1)), dtype=np.int64)  # in units
    sizes = np.diff(np.concatenate([np.zeros((len(dtuples), 1), dtype=np.int64), dtuples * inst.unit,
                                    np.full((len(dtuples), 1), n_dev)], axis=1), axis=1).astype(float)
    neck = np.array([best_bottleneck(inst, s, _ar_units(inst, d)) for s, d in zip(sizes, dtuples)])
    best, best_b, best_d, evaluated = np.inf, [], [], 0
    order_d = np.argsort(neck)
    for start in range(0, len(order_d), GROUP):
        group = [int(d) for d in order_d[start:start + GROUP] if neck[d] < best * (1 + SLACK)]
        if not group:
            break
        lbs = np.stack([lower_bounds(inst, tuples, dtuples[d]) for d in group])  # (G, T)
        cand = np.flatnonzero(lbs.ravel() < best * (1 + SLACK))
        cand = cand[np.argsort(lbs.ravel()[cand])]
        for part in range(0, len(cand), chunk):
            rows = cand[part:part + chunk]
            rows = rows[lbs.ravel()[rows] < best * (1 + SLACK)]
            if not len(rows):
                break
            d_idx, t_idx = np.asarray(group)[rows // len(tuples)], rows % len(tuples)
            vals = inst.values(tuples[t_idx], dtuples[d_idx])
            evaluated += len(rows)
            i = int(np.argmin(vals))
            if vals[i] < best:
                best, best_b, best_d = float(vals[i]), tuples[t_idx[i]].tolist(), dtuples[d_idx[i]].tolist()
    return CoarseOptimum([int(b) for b in best_b], [int(d) for d in best_d], best, evaluated,
                         time.perf_counter() - t0)
