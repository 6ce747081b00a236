"""Serving a stream of trees (ours, beyond DynPartition's one tree at a time): trees arrive
as a Poisson process, each is placed by a policy, and independent trees share (pipeline
across) the devices. Simulated on a cost model (``sim.formulas.simulate_jobs``) or run for real
on the executor's device workers; reported as throughput and p50/p99 latency."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .simulator import Machine, TreeProfile, simulate_jobs
from .executor import Executor
from .trees import Tree

Policy = Callable[[int, Tree], tuple[list[int], list[int] | None]]  # (arrival index, tree) -> placements


def poisson_arrivals(rate_per_s: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of ``count`` trees at ``rate_per_s`` on average."""
    return np.cumsum(rng.exponential(1 / rate_per_s, size=count))


def summary(arrivals: np.ndarray, latencies: np.ndarray) -> dict:
    """Throughput (trees completed per second, from the first arrival to the last finish) and
    latency percentiles."""
    span = float(np.max(arrivals + latencies) - arrivals[0])
    return {"trees": len(arrivals), "throughput_per_s": len(arrivals) / span if span > 0 else float("inf"),
            "p50_ms": float(np.percentile(latencies, 50) * 1e3), "p99_ms": float(np.percentile(latencies, 99) * 1e3),
            "mean_ms": float(np.mean(latencies) * 1e3)}


def simulate_stream(m: Machine, trees: list[Tree], profiles: list[TreeProfile], arrivals: np.ndarray,
                    policy: Policy) -> dict:
    """The stream on the cost model: every tree's latency from its arrival to its last part."""
    jobs = []
    for k, (t, p, a) in enumerate(zip(trees, profiles, arrivals)):
        place, out = policy(k, t)
        jobs.append((p, list(place), None if out is None else list(out), float(a)))
    return summary(arrivals, simulate_jobs(jobs, m))


def run_stream(ex: Executor, trees: list[Tree], arrivals: np.ndarray, policy: Policy) -> dict:
    """The stream for real: each tree submitted to the executor's device workers at its arrival
    time (this thread sleeps until then), latency from arrival to the tree's last part."""
    jobs, t0 = [], time.perf_counter()
    for k, (t, a) in enumerate(zip(trees, arrivals)):
        wait = t0 + a - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        place, out = policy(k, t)
        jobs.append(ex.submit(t, place, out))
    for j in jobs:
        j.finished.wait()
        if j.errors:
            raise j.errors[0]
    latencies = np.array([j.end - (t0 + a) for j, a in zip(jobs, arrivals)])
    return summary(arrivals, np.maximum(latencies, 0.0))
