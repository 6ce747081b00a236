"""Forward/backward resource allocation of one worker (Duan & Wu, §III-B, §IV-A).

Model (§III-B, linear and linearly separable resources). A worker has m resources. For a
partition p, ``f[j]`` (``g[j]``) is p's forward (backward) time when it runs alone on *all*
of resource j. Giving fraction ``beta[j]`` of resource j to the forward pass and the rest to
the backward pass, and letting resources add their rates, the two passes take

    F = 1 / sum_j beta_j / f_j          G = 1 / sum_j (1 - beta_j) / g_j.

This is the paper's f(p, sum_j beta_j r_j) with a per-resource efficiency: with
f_j = c1 p / r_j (and g_j = c2 p / r_j) it reduces to the paper's c1 p / sum_j beta_j r_j.
An infinite time means the resource cannot run that pass; a worker with one resource
time-shares it between the passes (§III-B, "time sharing").

Three solvers of the same problem, min max(F, G) (Eq. 4-6), which agree:

* :func:`optimal_allocation` - the linear program of Eq. (4)-(6) (HiGHS);
* :func:`closed_form_allocation` - Theorem 1, when f_j / g_j = c for every j;
* :func:`greedy_allocation` / :func:`batch_allocation` - an exact O(m log m) sort (derived
  below), vectorised over many (f, g) rows; the partition and grouping algorithms use it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from ...errors import Infeasible, PipeplanError

__all__ = ["optimal_allocation", "closed_form_beta", "closed_form_allocation", "times_for",
           "greedy_allocation", "batch_allocation", "batch_time"]


def _pair(f, g) -> tuple[np.ndarray, np.ndarray]:
    """Validate one worker's per-resource times: equal-length 1-D, positive, inf allowed."""
    f = np.asarray(f, dtype=float)
    g = np.asarray(g, dtype=float)
    if f.ndim != 1 or g.ndim != 1 or f.shape != g.shape or f.size == 0:
        raise PipeplanError(f"resource allocation: f and g must be 1-D arrays of the same length >= 1, "
                            f"got shapes {f.shape} and {g.shape}")
    for name, x in (("f", f), ("g", g)):
        if np.isnan(x).any() or (x <= 0).any():
            raise PipeplanError(f"resource allocation: {name} must hold positive times (inf = resource "
                                f"unusable), got {x.tolist()}")
    if np.isinf(f).all():
        raise Infeasible("resource allocation: no resource can run the forward pass (all f are inf)")
    if np.isinf(g).all():
        raise Infeasible("resource allocation: no resource can run the backward pass (all g are inf)")
    return f, g


def times_for(f, g, beta) -> tuple[float, float]:
    """(F, G) of §III-C under allocation ``beta``: F = 1/sum beta_j/f_j, G = 1/sum (1-beta_j)/g_j."""
    f, g = _pair(f, g)
    beta = np.asarray(beta, dtype=float)
    if beta.shape != f.shape or np.isnan(beta).any() or (beta < 0).any() or (beta > 1).any():
        raise PipeplanError(f"resource allocation: beta must hold {f.size} ratios in [0, 1] (Eq. 2/6), "
                            f"got {beta.tolist()}")
    a, b = 1.0 / f, 1.0 / g
    rate_f, rate_g = float(beta @ a), float((1.0 - beta) @ b)
    return (1.0 / rate_f if rate_f > 0 else np.inf), (1.0 / rate_g if rate_g > 0 else np.inf)


def optimal_allocation(f, g) -> tuple[np.ndarray, float]:
    """The LP of Eq. (4)-(6), solved by HiGHS; returns (beta, time) with time = F = G.

    In rates a_j = 1/f_j, b_j = 1/g_j the problem is linear in (beta, t): maximise the
    throughput t subject to sum_j beta_j a_j >= t, sum_j (1-beta_j) b_j >= t, 0 <= beta <= 1,
    plus Eq. (5) itself, sum_j beta_j a_j = sum_j (1-beta_j) b_j. Eq. (5) does not change the
    optimum (the greedy below always reaches it with F = G) but pins a balanced vertex, so
    Lemma 1 (F = G) holds even where resources are usable by only one pass and the optimum is
    otherwise not unique. time = 1/t. One resource: beta = f/(f+g), time = f+g (time sharing).
    """
    f, g = _pair(f, g)
    m = f.size
    a, b = 1.0 / f, 1.0 / g
    scale = max(a.max(), b.max())             # rates ~1 keep HiGHS' tolerances meaningful
    a, b = a / scale, b / scale
    c = np.zeros(m + 1)
    c[-1] = -1.0                              # maximise t
    a_ub = np.vstack([np.append(-a, 1.0),     # t - sum beta a <= 0
                      np.append(b, 1.0)])     # t + sum beta b <= sum b
    b_ub = np.array([0.0, b.sum()])
    a_eq = np.append(a + b, 0.0)[None, :]     # Eq. (5): sum beta (a + b) = sum b
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[b.sum()],
                  bounds=[(0.0, 1.0)] * m + [(0.0, None)], method="highs")
    if res.status != 0:                       # cannot happen for validated input
        raise RuntimeError(f"resource allocation LP failed: {res.message}")
    beta = np.clip(res.x[:m], 0.0, 1.0)
    fwd, bwd = times_for(f, g, beta)
    return beta, max(fwd, bwd)


def closed_form_beta(c: float) -> float:
    """Theorem 1: beta_j = c / (c + 1) for every resource when f_j / g_j = c for all j."""
    if not np.isfinite(c) or c <= 0:
        raise PipeplanError(f"closed-form allocation: the ratio c = f/g must be positive and finite, got {c}")
    return c / (c + 1.0)


def closed_form_allocation(f, g, rtol: float = 1e-9) -> tuple[np.ndarray, float]:
    """Theorem 1 for a worker whose f_j / g_j is one constant c; returns (beta, time), F = G.

    Needs finite times; a ratio that varies by more than ``rtol`` is a PipeplanError (use
    :func:`optimal_allocation`). time = (c+1) / (c sum_j 1/f_j) = F = G.
    """
    f, g = _pair(f, g)
    if not (np.isfinite(f).all() and np.isfinite(g).all()):
        raise PipeplanError("closed-form allocation (Theorem 1) needs finite f and g on every resource")
    ratio = f / g
    c = float(ratio[0])
    if not np.allclose(ratio, c, rtol=rtol, atol=0.0):
        raise PipeplanError(f"closed-form allocation (Theorem 1) needs a constant f_j/g_j, got ratios "
                            f"{ratio.tolist()}; use optimal_allocation")
    beta = np.full(f.size, closed_form_beta(c))
    fwd, bwd = times_for(f, g, beta)
    return beta, max(fwd, bwd)


def batch_allocation(f, g) -> tuple[np.ndarray, np.ndarray]:
    """Exact optimum of Eq. (4)-(6) for many workers at once: (beta (..., m), time (...)).

    Derivation. With rates a_j = 1/f_j, b_j = 1/g_j the throughput is
    t = min(A, B), A = sum beta_j a_j, B = sum (1-beta_j) b_j. For a required backward rate
    B >= T, maximising A is a fractional knapsack (item j weighs b_j, is worth a_j), solved by
    moving resources to the forward pass in decreasing a_j / b_j = g_j / f_j - forward gets the
    resources on which it is relatively fastest. Along that walk A - B grows from -sum b to
    sum a, so it crosses 0 inside some resource k: beta = 1 before k, x_k in k, 0 after, with
    x_k = (B_k - A_k) / (a_k + b_k) and A = B = t (Lemma 1). Rows whose passes cannot both run
    (sum a = 0 or sum b = 0) get time inf. No validation: callers pass positive times.
    """
    f = np.asarray(f, dtype=float)
    g = np.asarray(g, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = 1.0 / f, 1.0 / g
        key = np.where(b > 0, a / np.where(b > 0, b, 1.0), np.inf)
    key = np.where((a == 0) & (b == 0), 0.0, key)
    order = np.argsort(-key, axis=-1, kind="stable")
    a_s = np.take_along_axis(a, order, axis=-1)
    b_s = np.take_along_axis(b, order, axis=-1)
    cum_a = np.cumsum(a_s, axis=-1)
    cum_b = np.cumsum(b_s, axis=-1)
    b_tot = cum_b[..., -1:]
    diff = cum_a - (b_tot - cum_b)            # A - B after moving resources 0..k entirely
    k = np.argmax(diff >= 0, axis=-1)[..., None]
    a_k = np.take_along_axis(a_s, k, axis=-1)
    b_k = np.take_along_axis(b_s, k, axis=-1)
    before_a = np.take_along_axis(cum_a, k, axis=-1) - a_k
    before_b = b_tot - np.take_along_axis(cum_b, k, axis=-1) + b_k
    denom = a_k + b_k
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.clip((before_b - before_a) / np.where(denom > 0, denom, 1.0), 0.0, 1.0)
    t = (before_a + x * a_k)[..., 0]
    idx = np.arange(a.shape[-1])
    beta_s = np.where(idx < k, 1.0, np.where(idx == k, x, 0.0))
    beta = np.empty_like(beta_s)
    np.put_along_axis(beta, order, beta_s, axis=-1)
    ok = (cum_a[..., -1] > 0) & (b_tot[..., 0] > 0)
    with np.errstate(divide="ignore"):
        time = np.where(ok & (t > 0), 1.0 / np.where(t > 0, t, 1.0), np.inf)
    return beta, time


def batch_time(f, g) -> np.ndarray:
    """Optimal max(F, G) (= F = G) for many workers; see :func:`batch_allocation`."""
    return batch_allocation(f, g)[1]


def greedy_allocation(f, g) -> tuple[np.ndarray, float]:
    """Exact optimum of Eq. (4)-(6) by the O(m log m) sort of :func:`batch_allocation`."""
    f, g = _pair(f, g)
    beta, time = batch_allocation(f, g)
    return beta, float(time)
