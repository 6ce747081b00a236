"""Rewards for the learning planners and the search baselines, from the batched evaluator.

A candidate is ``part[u]`` (the partition of node u, in stage order) and ``device_part[d]``
(the partition device d holds). Candidates with the same number of partitions are scored in
one call of a ``BatchEvaluator`` for that stage count. The reward is DRL-PP's Eq. 2,
``-ln(iteration time)``; a plan that overflows a device's memory loses ``1 + ln(worst
memory / limit)`` more (it cannot run, and more overflow is worse); one that cannot run at
all (no link between stages that talk) scores as a plan e^3 times slower than running the
whole model on one reference device. Every candidate scored counts as one evaluation.

A scorer may offer several *executions*, (schedule, replica mode) pairs; a candidate then also
names the execution it runs under (an index into ``executions``; 0 when not given), so that a
planner can choose the schedule and how replicas share microbatches along with the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph
from ..plan import Plan
from ..sim.batch import BatchEvaluator

OVER_MEMORY_PENALTY = 1.0
INFEASIBLE_PENALTY = 3.0


@dataclass
class Scores:
    """Per candidate: ``iteration_s`` (inf if it cannot run), ``fits`` and ``reward``."""

    iteration_s: np.ndarray
    fits: np.ndarray
    reward: np.ndarray


Execution = tuple[str, str]  # (schedule, replica mode)

#: every (schedule, replica mode) the plans of DRL-PP's action space run under (its execution
#: head scores them all, whatever an instance allows: one vocabulary, so that a checkpoint
#: plans under any allowed set), and the search planners choose among
EXECUTIONS: tuple[Execution, ...] = tuple(
    (schedule, replicas) for schedule in ("gpipe", "1f1b", "zb-h1", "spp-pe", "async-1f1b")
    for replicas in ("round-robin", "split"))
#: the synchronous ones (one weight version, a flush per iteration): what is chosen among
#: unless a schedule is named
SYNCHRONOUS = tuple(e for e in EXECUTIONS if e[0] != "async-1f1b")


def executions(schedule: str | None, replicas: str | None, who: str = "drl-pp") -> tuple[Execution, ...]:
    """What a planner of this action space chooses among: the named schedule, else every
    synchronous one (the asynchronous pipeline changes what training computes, so it is chosen
    only by name); with the named replica mode, else both (whole microbatches in turn,
    PipeDream's and DRL-PP's, or each microbatch split across a partition's accelerators)."""
    pool = [e for e in EXECUTIONS if e[0] == schedule] if schedule else list(SYNCHRONOUS)
    if not pool:
        names = sorted({e[0] for e in EXECUTIONS})
        raise PipeplanError(f"{who}: schedule {schedule!r} is not one it can choose (it knows {', '.join(names)})")
    return tuple(e for e in pool if replicas in (None, e[1]))


class Scorer:
    """Scores candidates of one (graph, cluster) under one schedule and replica mode, or under
    the execution each candidate names among ``executions``; counts evaluations."""

    def __init__(self, graph: Graph, cluster: Cluster, microbatches: int, schedule: str,
                 replicas: str = "round-robin", optimizer: str = "adam",
                 executions: tuple[Execution, ...] | None = None) -> None:
        self.graph, self.cluster = graph, cluster
        self.executions = tuple(executions) if executions else ((schedule, replicas),)
        self.microbatches, self.optimizer = microbatches, optimizer
        self.evaluators: dict[tuple[int, int], BatchEvaluator] = {}
        self.evaluations = 0
        serial = float(graph.fwd.sum() + graph.bwd.sum()) * microbatches
        self.infeasible_reward = -np.log(max(serial, 1e-12)) - INFEASIBLE_PENALTY

    def evaluator(self, partitions: int, execution: int = 0) -> BatchEvaluator:
        key = (partitions, execution)
        if key not in self.evaluators:
            schedule, replicas = self.executions[execution]
            self.evaluators[key] = BatchEvaluator(self.graph, self.cluster, partitions, self.microbatches,
                                                  schedule, replicas, self.optimizer)
        return self.evaluators[key]

    def score(self, part: np.ndarray, device_part: np.ndarray, execution: np.ndarray | None = None) -> Scores:
        """Scores of candidates ``part`` (B, nodes) and ``device_part`` (B, devices), each
        run under ``executions[execution[b]]`` (all under the first when None)."""
        part, device_part = np.atleast_2d(part), np.atleast_2d(device_part)
        count = part.shape[0]
        it = np.full(count, np.inf)
        fits = np.zeros(count, dtype=bool)
        reward = np.full(count, self.infeasible_reward)
        ex = np.zeros(count, dtype=np.int64) if execution is None else np.asarray(execution, dtype=np.int64)
        groups = (part.max(axis=1) + 1) * len(self.executions) + ex
        for group in np.unique(groups):
            idx = np.flatnonzero(groups == group)
            partitions, e = divmod(int(group), len(self.executions))
            res = self.evaluator(partitions, e).evaluate(part[idx], device_part[idx])
            ok = res.feasible
            ratio = np.max(res.memory_bytes / res.memory_limit[None, :], axis=1)
            over = ratio > 1.0
            with np.errstate(divide="ignore"):
                r = -np.log(res.iteration_s) - np.where(over, OVER_MEMORY_PENALTY + np.log(np.maximum(ratio, 1.0)), 0)
            it[idx[ok]] = res.iteration_s[ok]
            fits[idx] = ok & ~over
            reward[idx[ok]] = r[ok]
        self.evaluations += count
        return Scores(it, fits, reward)

    def plan(self, part: np.ndarray, device_part: np.ndarray, execution: int = 0) -> Plan:
        """The Plan of one candidate."""
        return self.evaluator(int(part.max()) + 1, int(execution)).plan(part, device_part)
