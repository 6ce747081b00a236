"""Model partition for homogeneous workers (Duan & Wu, §IV-B, Alg. 1).

A chain of L layers is cut into consecutive runs, one per worker (at most n). Layer l takes
``lf[l, j]`` (``lg[l, j]``) forward (backward) on all of resource j, and a run's per-resource
time is the sum over its layers. Cutting after layer l sends its output in ``comm[l]`` (h of
§III-B); the last layer's entry is ignored. Objective, Eq. (1): minimise over partitions the
bottleneck max over runs of max(F, G, h), F and G under the run's optimal allocation
(§IV-A, computed exactly by :func:`.allocation.batch_allocation`) or under one fixed ``beta``
for every worker (the paper's "without resource allocation" is beta = 0.5).

* :func:`feasible` - §IV-B's greedy check: from layer 0, take the longest run whose cost and
  outgoing h fit the limit; feasible with n runs or fewer (but more than 0), as the paper says.
  max(F, G) grows with the run (times are additive and positive) and a later start only
  shrinks a run, so the greedy "stays ahead" of any feasible partition and is exact.
* :func:`partition` - binary search on the limit. ``method="exact"`` (default) searches the
  finite set of values the optimum can take (every run's cost and every h) and returns the
  exact optimum; ``method="eps"`` is Alg. 1 as printed, optimal within ``eps``.
* :func:`brute_force_partition` - every partition into <= n runs, with the LP; for tests.

Costs of all O(L^2) runs are tabulated once (O(L^2 m) time, O(L^2) memory). Zero layer
times are raised to 1e-12 x the largest time (an all-zero run would otherwise have an
infinite rate); inf means the resource cannot run that layer's pass.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from ...errors import Infeasible, PipeplanError
from .allocation import batch_allocation, optimal_allocation, times_for

__all__ = ["feasible", "partition", "brute_force_partition", "paper_bounds", "run_costs"]

Runs = list[tuple[int, int]]


def _inputs(lf, lg, comm, n, beta):
    lf = np.asarray(lf, dtype=float)
    lg = np.asarray(lg, dtype=float)
    comm = np.asarray(comm, dtype=float)
    if lf.ndim != 2 or lf.shape != lg.shape or lf.shape[0] == 0 or lf.shape[1] == 0:
        raise PipeplanError(f"partition: lf and lg must be (layers, resources) arrays of one shape, "
                            f"got {lf.shape} and {lg.shape}")
    if comm.shape != (lf.shape[0],):
        raise PipeplanError(f"partition: comm must hold one time per layer ({lf.shape[0]}), got shape {comm.shape}")
    for name, x in (("lf", lf), ("lg", lg), ("comm", comm)):
        if np.isnan(x).any() or (x < 0).any():
            raise PipeplanError(f"partition: {name} must hold non-negative times (inf allowed)")
    finite = np.concatenate([lf[np.isfinite(lf) & (lf > 0)], lg[np.isfinite(lg) & (lg > 0)]])
    floor = 1e-12 * (finite.max() if finite.size else 1.0)
    lf, lg = np.maximum(lf, floor), np.maximum(lg, floor)    # a zero-time layer: negligible, not free
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise PipeplanError(f"partition: the number of workers n must be an integer >= 1, got {n!r}")
    if beta is not None:
        beta = np.asarray(beta, dtype=float)
        if beta.shape != (lf.shape[1],) or np.isnan(beta).any() or (beta < 0).any() or (beta > 1).any():
            raise PipeplanError(f"partition: beta must hold {lf.shape[1]} ratios in [0, 1], got {beta.tolist()}")
    return lf, lg, comm, int(n), beta


def _fixed_time(f: np.ndarray, g: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """max(F, G) of many runs under one fixed allocation (§III-C)."""
    with np.errstate(divide="ignore"):
        rate_f = (beta / f).sum(axis=-1)
        rate_g = ((1.0 - beta) / g).sum(axis=-1)
        return np.maximum(1.0 / rate_f, 1.0 / rate_g)


def run_costs(lf, lg, beta=None) -> np.ndarray:
    """(L, L) table: [s, e] = max(F, G) of layers s..e (inf below the diagonal)."""
    lf = np.asarray(lf, dtype=float)
    lg = np.asarray(lg, dtype=float)
    n_layers = lf.shape[0]
    table = np.full((n_layers, n_layers), np.inf)
    for s in range(n_layers):
        f, g = np.cumsum(lf[s:], axis=0), np.cumsum(lg[s:], axis=0)
        table[s, s:] = batch_allocation(f, g)[1] if beta is None else _fixed_time(f, g, beta)
    return table


def _greedy(table: np.ndarray, comm: np.ndarray, n: int, limit: float) -> Runs | None:
    n_layers = table.shape[0]
    runs: Runs = []
    s = 0
    while s < n_layers:
        if len(runs) == n:
            return None
        ok = table[s, s:] <= limit
        reach = s + (int(np.argmin(ok)) if not ok.all() else n_layers - s) - 1   # last layer that fits
        if reach == n_layers - 1:
            runs.append((s, reach))
            return runs
        cuts = np.nonzero(comm[s:reach + 1] <= limit)[0]
        if cuts.size == 0:
            return None
        e = s + int(cuts[-1])
        runs.append((s, e))
        s = e + 1
    return runs


def _bottleneck(table: np.ndarray, comm: np.ndarray, runs: Runs) -> float:
    last = len(runs) - 1
    return max(max(table[s, e], comm[e] if i < last else 0.0) for i, (s, e) in enumerate(runs))


def _betas(lf, lg, beta, runs: Runs) -> list[np.ndarray]:
    if beta is not None:
        return [beta.copy() for _ in runs]
    f = np.array([lf[s:e + 1].sum(axis=0) for s, e in runs])
    g = np.array([lg[s:e + 1].sum(axis=0) for s, e in runs])
    return list(batch_allocation(f, g)[0])


def feasible(limit: float, lf, lg, comm, n: int, beta=None) -> Runs | None:
    """§IV-B's greedy feasibility check: the runs (inclusive (start, end)), or None."""
    lf, lg, comm, n, beta = _inputs(lf, lg, comm, n, beta)
    return _greedy(run_costs(lf, lg, beta), comm, n, float(limit))


def paper_bounds(lf, lg, comm) -> tuple[float, float]:
    """Alg. 1 lines 1-2 as printed: x = min over layers and resources of {f, g, h},
    y = max over resources of the whole model's f and g, and over layers of h (finite values)."""
    lf, lg, comm = (np.asarray(x, dtype=float) for x in (lf, lg, comm))
    lo = np.concatenate([lf.ravel(), lg.ravel(), comm])
    hi = np.concatenate([lf.sum(axis=0), lg.sum(axis=0), comm])
    lo, hi = lo[np.isfinite(lo)], hi[np.isfinite(hi)]
    return float(lo.min()) if lo.size else 0.0, float(hi.max()) if hi.size else np.inf


def partition(lf, lg, comm, n: int, beta=None, eps: float | None = None,
              method: str = "exact") -> tuple[float, Runs, list[np.ndarray]]:
    """Alg. 1: the smallest feasible limit by binary search; returns (limit, runs, betas).

    ``limit`` is the bottleneck the returned runs achieve (Eq. 1), ``runs`` the inclusive
    (start, end) layer ranges (n or fewer, §IV-B), ``betas`` each run's allocation.

    ``method="exact"`` (default): binary search over the sorted candidate values (every run's
    cost and every h); the optimum is one of them, so the result is exactly optimal.
    ``method="eps"``: Alg. 1 with granularity ``eps`` (default 1e-6 x the lower bound), the
    branches as the text describes them (the printed pseudo-code swaps lines 6 and 8:
    infeasible -> x = mid + eps, feasible -> y = mid). The printed bounds are not always valid
    (one resource: the whole model takes f + g > max(f, g); m >= 3 identical resources: a layer
    can take less than min_j f_j), so they are widened to [min(x, max single-layer cost),
    max(y, whole-model cost)]. The result is within eps of the optimum. Raises Infeasible
    when no split into <= n runs can run (a layer, or every run, lacks a resource for a pass).
    """
    lf, lg, comm, n, beta = _inputs(lf, lg, comm, n, beta)
    table = run_costs(lf, lg, beta)
    single = np.diag(table)
    if not np.isfinite(single).all():
        bad = int(np.nonzero(~np.isfinite(single))[0][0])
        raise Infeasible(f"partition: layer {bad} cannot run its forward and backward passes "
                            f"{'under the fixed beta' if beta is not None else 'on any resource'}")
    lower = float(single.max())                    # every layer lies in some run
    cand = np.concatenate([table[np.isfinite(table)], comm[:-1]])
    cand = np.unique(cand[(cand >= lower) & np.isfinite(cand)])
    if _greedy(table, comm, n, float(cand[-1])) is None:   # feasibility is monotone in the limit
        raise Infeasible(f"partition: no split into at most {n} runs gives every run a resource for "
                            f"each pass (layers need disjoint resources)")
    whole = float(table[0, -1]) if np.isfinite(table[0, -1]) else float(cand[-1])
    if method == "exact":
        lo, hi = 0, int(np.searchsorted(cand, whole))  # cand[hi] = whole is feasible
        while lo < hi:
            mid = (lo + hi) // 2
            if _greedy(table, comm, n, float(cand[mid])) is not None:
                hi = mid
            else:
                lo = mid + 1
        runs = _greedy(table, comm, n, float(cand[lo]))
    elif method == "eps":
        x, y = paper_bounds(lf, lg, comm)
        x, y = min(x, lower), max(y, whole)
        eps = 1e-6 * lower if eps is None else eps
        if not eps > 0:
            raise PipeplanError(f"partition: eps must be positive, got {eps}")
        runs = _greedy(table, comm, n, y)
        for _ in range(10_000):                    # ends after ~log2((y - x) / eps) rounds
            if not x < y:
                break
            mid = (x + y) / 2
            found = _greedy(table, comm, n, mid)
            if found is None:
                x = mid + eps
            else:
                y, runs = mid, found
    else:
        raise PipeplanError(f"partition: method must be 'exact' or 'eps', got {method!r}")
    assert runs is not None
    return float(_bottleneck(table, comm, runs)), runs, _betas(lf, lg, beta, runs)


def brute_force_partition(lf, lg, comm, n: int, beta=None) -> tuple[float, Runs]:
    """Min over all partitions into <= n runs of max over runs of max(F, G, h) (Eq. 1).

    Independent of :func:`partition`: each run's allocation comes from the LP
    (:func:`.allocation.optimal_allocation`) or :func:`.allocation.times_for`. For tests.
    """
    lf, lg, comm, n, beta = _inputs(lf, lg, comm, n, beta)
    n_layers = lf.shape[0]
    cache: dict[tuple[int, int], float] = {}

    def cost(s: int, e: int) -> float:
        if (s, e) not in cache:
            f, g = lf[s:e + 1].sum(axis=0), lg[s:e + 1].sum(axis=0)
            if beta is None:
                try:
                    cache[s, e] = optimal_allocation(f, g)[1]
                except Infeasible:                 # a pass no resource can run
                    cache[s, e] = np.inf
            else:
                cache[s, e] = max(times_for(f, g, beta))
        return cache[s, e]

    best: tuple[float, Runs] = (np.inf, [(0, n_layers - 1)])
    for k in range(min(n, n_layers)):
        for cuts in combinations(range(n_layers - 1), k):
            bounds = [-1, *cuts, n_layers - 1]
            runs = [(bounds[i] + 1, bounds[i + 1]) for i in range(k + 1)]
            value = max(max(cost(s, e), comm[e] if i < k else 0.0) for i, (s, e) in enumerate(runs))
            if value < best[0]:
                best = (value, runs)
    return best
