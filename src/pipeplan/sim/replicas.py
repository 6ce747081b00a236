"""Identical data-parallel replicas simulated as two (docs/llm.md, "Scale").

A plan whose every stage runs r >= 3 tensor-parallel groups round-robin (replica k takes
microbatches k, k + r, ...) on GPUs of one speed and memory, with replica k's pipeline on
links equal to replica 0's, runs every replica's pipeline alike: they meet only in each
stage's data-parallel all-reduce, which waits for all of them. Two replicas with 2M / r
microbatches then run as any two of the r do, and the all-reduce is priced as over r by the
link between the two: 2(r - 1)/r x bytes / bandwidth + 2 ceil(log2 r) latencies
(``collective_s``) equals 2(2 - 1)/2 x bytes / bandwidth' + 2 latency' with bandwidth' =
bandwidth x r / (2(r - 1)) and latency' = ceil(log2 r) latency, where bandwidth and latency are the slowest and largest between the
r groups of the stage, as the full simulation takes them. The simulation of the two equals
the full one (tests/test_llm_parallel.py) with r / 2 times fewer tasks.
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..cluster.collectives import latency_steps
from ..plan import Plan


def between_groups(cl: Cluster, a: list[list[int]], b: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth, latency) from each group of ``a`` to each of ``b`` (len(a) x len(b)): rank i
    sends to rank i over min(t_a, t_b) rails (Megatron's scatter/gather), so the bandwidth is
    the rails x the slowest rank pair's, the latency the largest."""
    ta, tb = np.array([len(g) for g in a]), np.array([len(g) for g in b])
    rails = np.minimum(ta[:, None], tb[None, :])
    slow, late = np.full(rails.shape, np.inf), np.zeros(rails.shape)
    for i in range(int(rails.max(initial=0))):
        ra, rb = np.flatnonzero(ta > i), np.flatnonzero(tb > i)
        ia, ib = np.array([a[k][i] for k in ra]), np.array([b[k][i] for k in rb])
        sub = np.ix_(ra, rb)
        slow[sub] = np.minimum(slow[sub], cl.bandwidth[np.ix_(ia, ib)])
        late[sub] = np.maximum(late[sub], cl.latency[np.ix_(ia, ib)])
    return rails * slow, late


def symmetric_count(plan: Plan, groups: list[list[int]], of_stage: list[list[int]]) -> int | None:
    """r when the plan's r replicas may be simulated as two (module docstring), else None."""
    counts = {len(s) for s in of_stage}
    r = counts.pop() if len(counts) == 1 else 0
    cl = plan.cluster
    if plan.replicas != "round-robin" or r < 3 or plan.microbatches % r:
        return None
    gpus = [d for g in groups for d in g]
    if np.ptp(cl.speed[gpus]) or np.ptp(cl.memory[gpus]) or any(cl.devices[d].solo_speed for d in gpus):
        return None
    for s in range(len(of_stage) - 1):
        here, there = [groups[g] for g in of_stage[s]], [groups[g] for g in of_stage[s + 1]]
        for x, y in ((here, there), (there, here)):
            bw, lat = paired_links(cl, x, y)
            if (bw != bw[0]).any() or (lat != lat[0]).any():  # not ptp: a V's turn is inf (one device)
                return None
    return r


def paired_links(cl: Cluster, a: list[list[int]], b: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``between_groups``' bandwidth and latency from ``a[k]`` to ``b[k]`` for each k alone
    (a replica's chain), without the other pairs."""
    rails = {min(len(x), len(y)) for x, y in zip(a, b)}
    if len(rails) == 1:  # every pair at once
        r = rails.pop()
        ix, iy = np.array([x[:r] for x in a]), np.array([y[:r] for y in b])
        return r * np.asarray(cl.bandwidth[ix, iy], dtype=float).min(axis=1), \
            np.asarray(cl.latency[ix, iy], dtype=float).max(axis=1)
    bw, lat = np.empty(len(a)), np.empty(len(a))
    for k, (x, y) in enumerate(zip(a, b)):
        rails = min(len(x), len(y))
        ix, iy = np.array(x[:rails]), np.array(y[:rails])
        bw[k] = rails * float(cl.bandwidth[ix, iy].min())
        lat[k] = float(cl.latency[ix, iy].max())
    return bw, lat


def ring_links(cl: Cluster, ring: list[list[int]]) -> tuple[float, float]:
    """The slowest bandwidth and largest latency between the groups of a stage's ring."""
    bw, lat = between_groups(cl, ring, ring)
    off = ~np.eye(len(ring), dtype=bool)
    return float(bw[off].min()), float(lat[off].max())


def as_two(r: int, bandwidth: float, latency: float) -> tuple[float, float]:
    """The link between two groups whose all-reduce takes what r groups' does (module docstring)."""
    return bandwidth * r / (2.0 * (r - 1)), latency * latency_steps("all_reduce", r) / latency_steps("all_reduce", 2)
