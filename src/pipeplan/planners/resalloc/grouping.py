"""Grouping heterogeneous devices into q workers (Duan & Wu, §V, Alg. 2; §VI baselines).

Each device has a per-resource-type capacity ``rates[d, j]`` (any positive unit, 0 = the
device lacks that type); a worker's resource vector is the sum of its devices' (§V). A
worker's cost is the time of a reference workload under the optimal allocation (§IV-A):
the workload has forward/backward *work* ``wf[j]``, ``wg[j]`` (time x rate on resource type
j), so on summed rates R it takes f_j = wf_j / R_j, g_j = wg_j / R_j (inf if R_j = 0) and

    cost(V_i) = max(F, G) at the optimal beta  (= F = G, Lemma 1).

The paper writes f(p_i, sum_v sum_j r_j), i.e. one scalar power; keeping the types apart is
the same when wf_j and wg_j do not depend on j, and finer otherwise. Costs are evaluated
exactly and vectorised by :func:`.allocation.batch_allocation`.

* :func:`local_search_groups` - Alg. 2, plus an optional move/swap pass (an addition);
* :func:`brute_force_groups` - the optimum, for up to ~12 devices (§VI's "BF");
* :func:`sorting_groups` - §VI's sorting baseline.
"""

from __future__ import annotations

import numpy as np

from ...errors import PipeplanError
from .allocation import batch_time

__all__ = ["worker_cost", "groups_cost", "local_search_groups", "brute_force_groups",
           "sorting_groups", "EXAMPLE_DEVICE_KINDS", "EXAMPLE_WORKLOAD"]

def _kind_rates() -> dict[str, tuple[float, float]]:
    """§VI's three device kinds as (cpu, gpu) forward rates, from pipeplan's device kinds
    (``cluster/kinds.py``: vendor peak figures; see the sources there)."""
    from ...cluster.kinds import kind

    out = {}
    for name in ("laptop-i7-gtx1650", "laptop-i5-irisxe", "rpi4b"):
        res = {r.name: r.fwd_speed for r in kind(name).resources}
        out[name] = (res.get("cpu", 0.0), res.get("gpu", 0.0))
    return out


EXAMPLE_DEVICE_KINDS: dict[str, tuple[float, float]] = _kind_rates()
# A reference workload per resource type (time x forward rate): AlexNet's forward and
# backward time in PipeDream's V100 profile (44.8 ms, 40.5 ms); a CPU's backward runs at
# 0.51 x its forward rate (measured, cluster/kinds.py), hence the larger backward work there.
_CPU_BWD = 0.87 / 1.72
EXAMPLE_WORKLOAD: tuple[tuple[float, float], tuple[float, float]] = ((0.0448, 0.0448), (0.0405 / _CPU_BWD, 0.0405))

Groups = list[list[int]]


def _inputs(rates, q, wf, wg) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    rates = np.asarray(rates, dtype=float)
    wf = np.asarray(wf, dtype=float)
    wg = np.asarray(wg, dtype=float)
    if rates.ndim != 2 or rates.shape[0] == 0 or rates.shape[1] == 0:
        raise PipeplanError(f"grouping: rates must be a (devices, resource types) array, got shape {rates.shape}")
    m = rates.shape[1]
    if wf.shape != (m,) or wg.shape != (m,):
        raise PipeplanError(f"grouping: wf and wg must hold one work value per resource type ({m}), "
                            f"got shapes {wf.shape} and {wg.shape}")
    if not (np.isfinite(wf).all() and np.isfinite(wg).all() and (wf > 0).all() and (wg > 0).all()):
        raise PipeplanError("grouping: wf and wg must be positive and finite")
    if not np.isfinite(rates).all() or (rates < 0).any():
        raise PipeplanError("grouping: rates must be non-negative and finite")
    dead = np.nonzero(rates.sum(axis=1) == 0)[0]
    if dead.size:
        raise PipeplanError(f"grouping: device {int(dead[0])} has no compute (all rates are 0)")
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 1:
        raise PipeplanError(f"grouping: the pipeline depth q must be an integer >= 1, got {q!r}")
    if rates.shape[0] < q:
        raise PipeplanError(f"grouping: {rates.shape[0]} devices cannot form {q} non-empty workers")
    return rates, int(q), wf, wg


def worker_cost(rates_sum, wf, wg) -> np.ndarray:
    """cost(V_i) of §V for summed rates ``rates_sum`` (..., m): optimal max(F, G), inf if empty."""
    rates_sum = np.asarray(rates_sum, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        f = np.asarray(wf, dtype=float) / rates_sum
        g = np.asarray(wg, dtype=float) / rates_sum
    return batch_time(f, g)


def groups_cost(rates, groups: Groups, wf, wg) -> float:
    """The objective of §V: the largest worker cost of a grouping."""
    rates = np.asarray(rates, dtype=float)
    sums = np.array([rates[list(grp)].sum(axis=0) for grp in groups])
    return float(worker_cost(sums, wf, wg).max())


def local_search_groups(rates, q: int, wf, wg, improve: bool = False, max_rounds: int = 10_000) -> Groups:
    """Alg. 2: q empty workers; repeatedly give the costliest worker (ties: lowest index) the
    unassigned device that lowers its cost most (ties: lowest device index) until none is left.

    Every worker is empty (cost inf) at first, so the q strongest devices seed the q workers;
    with n >= q devices all q workers are non-empty. One round evaluates every unassigned
    device at once (O(n m log m) numpy work, n rounds: Theorem 3's O(n^2 m)).

    ``improve=True`` (an addition, not in the paper; off by default) then repeats the best
    single move or swap of a device between the costliest worker and another one while it
    lowers the pair's larger cost below the bottleneck (the sorted cost vector then drops
    lexicographically, so it terminates; at most ``max_rounds``).
    """
    rates, q, wf, wg = _inputs(rates, q, wf, wg)
    n_dev, m = rates.shape
    owner = np.full(n_dev, -1)
    sums = np.zeros((q, m))
    cost = np.full(q, np.inf)
    free = np.arange(n_dev)
    for _ in range(n_dev):
        i = int(np.argmax(cost))
        cand = worker_cost(sums[i] + rates[free], wf, wg)
        pick = int(np.argmin(cand))               # lowest cost after adding = largest decrease
        d = int(free[pick])
        owner[d] = i
        sums[i] += rates[d]
        cost[i] = cand[pick]
        free = np.delete(free, pick)
    if improve:
        owner = _improve(rates, owner, q, wf, wg, max_rounds)
    return [np.nonzero(owner == i)[0].tolist() for i in range(q)]


def _improve(rates, owner, q, wf, wg, max_rounds: int) -> np.ndarray:
    owner = owner.copy()
    for _ in range(max_rounds if q > 1 else 0):
        sums = np.array([rates[owner == k].sum(axis=0) for k in range(q)])   # fresh: no drift
        cost = worker_cost(sums, wf, wg)
        i = int(np.argmax(cost))
        mine = np.nonzero(owner == i)[0]
        others = np.nonzero(owner != i)[0]
        best, best_val = None, cost[i] * (1 - 1e-12)
        if mine.size > 1:                         # move d from i to worker k (i stays non-empty)
            ks = np.array([k for k in range(q) if k != i])
            new_i = worker_cost(np.maximum(sums[i] - rates[mine], 0.0), wf, wg)[:, None]
            new_k = worker_cost(sums[ks][None, :, :] + rates[mine][:, None, :], wf, wg)
            val = np.maximum(new_i, new_k)
            a, b = np.unravel_index(int(np.argmin(val)), val.shape)
            if val[a, b] < best_val:
                best, best_val = (int(mine[a]), int(ks[b]), None), float(val[a, b])
        delta = rates[others][None, :, :] - rates[mine][:, None, :]          # swap d (in i), e (in k)
        new_i = worker_cost(np.maximum(sums[i] + delta, 0.0), wf, wg)
        new_k = worker_cost(np.maximum(sums[owner[others]][None, :, :] - delta, 0.0), wf, wg)
        val = np.maximum(new_i, new_k)
        a, b = np.unravel_index(int(np.argmin(val)), val.shape)
        if val[a, b] < best_val:
            best = (int(mine[a]), int(owner[others[b]]), int(others[b]))
        if best is None:
            break
        d, k, e = best
        owner[d] = k
        if e is not None:
            owner[e] = i
    return owner


def _set_partitions(n: int, q: int) -> np.ndarray:
    """All partitions of n items into exactly q unlabeled blocks, as restricted growth
    strings (item 0 in block 0; each item joins a used block or opens the next one)."""
    labels = np.zeros((1, 1), dtype=np.int8)
    used = np.ones(1, dtype=np.int8)
    for item in range(1, n):
        left = n - item - 1                       # items after this one
        rows, new_used = [], []
        for lab in range(q):
            keep = used >= lab                    # lab <= used: an existing block or the next
            nu = np.maximum(used, lab + 1)
            keep &= nu + left >= q                # enough items left to open every block
            rows.append(np.hstack([labels[keep], np.full((int(keep.sum()), 1), lab, dtype=np.int8)]))
            new_used.append(nu[keep])
        labels, used = np.vstack(rows), np.concatenate(new_used).astype(np.int8)
    return labels[used == q]


def brute_force_groups(rates, q: int, wf, wg, max_devices: int = 12) -> Groups:
    """The optimum of §V: min over all groupings of the devices into q non-empty workers of
    the largest worker cost. Workers are unlabeled, so each grouping is enumerated once (a
    restricted growth string, S(n, q) of them: 34,105 for 10 devices into 4); every subset's
    cost is computed once (2^n) and looked up by bitmask."""
    rates, q, wf, wg = _inputs(rates, q, wf, wg)
    n_dev = rates.shape[0]
    if n_dev > max_devices:
        raise PipeplanError(f"grouping: brute force is for at most {max_devices} devices, got {n_dev}")
    bits = (np.arange(1 << n_dev)[:, None] >> np.arange(n_dev)) & 1
    subset_cost = worker_cost(bits @ rates, wf, wg)
    labels = _set_partitions(n_dev, q)
    weight = (1 << np.arange(n_dev)).astype(np.int64)
    masks = np.stack([((labels == k) * weight).sum(axis=1) for k in range(q)], axis=1)
    best = int(np.argmin(subset_cost[masks].max(axis=1)))
    return [np.nonzero(labels[best] == k)[0].tolist() for k in range(q)]


def sorting_groups(rates, q: int, wf, wg) -> Groups:
    """§VI's sorting baseline. A device's power is its throughput on the reference workload
    alone, 1 / cost({v}) (proportional to sum_j r_j when wf, wg do not depend on the type);
    devices sorted by power ascending (stable); from the slowest, add devices to the current
    group until its summed power reaches the average per group (total / q), then open the
    next. Edge cases: a group is also closed when the devices left are just enough to give
    every later group one, so exactly q groups are non-empty; the last group takes the rest.
    """
    rates, q, wf, wg = _inputs(rates, q, wf, wg)
    n_dev = rates.shape[0]
    power = 1.0 / worker_cost(rates, wf, wg)
    target = power.sum() / q
    groups: Groups = [[]]
    total = 0.0
    for pos, d in enumerate(np.argsort(power, kind="stable")):
        groups[-1].append(int(d))
        total += power[d]
        later = q - len(groups)                   # groups still to open after this one
        if later > 0 and (total >= target * (1 - 1e-12) or n_dev - pos - 1 == later):
            groups.append([])
            total = 0.0
    return [sorted(grp) for grp in groups]
