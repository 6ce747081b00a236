"""Scores candidates with the batched evaluator (``sim/batch.py``: every figure equals
``simulate``), grouped by shape, memoized, counting evaluations against the budget.

A candidate that overflows is scored again with re-materialization (GPipe §2.3) added on
exactly the stages that overflow (the best recompute setting when a stage's memory depends
only on its own flag, ``planners/variants.py``), and stands for that repaired candidate.
Score: ``ranking.rank_score``, the project's one order on plans as a number (the iteration
time of a plan that fits; ``OVER`` plus its overflow ratio otherwise). The same repair for a
single plan, simulated: ``simulate_fitting``."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from ...budget import Budget
from ...cluster import Cluster
from ...graph import Graph
from ...errors import Infeasible, PipeplanError
from ...plan import Plan
from ...sim import SimResult, simulate
from ...sim.batch import BatchEvaluator
from ..ranking import rank_key, rank_score
from ..variants import overflowing_stages
from .candidate import Candidate, canonical

def simulate_fitting(plan: Plan, allow_over: bool) -> tuple[Plan, SimResult] | None:
    """The plan simulated; when it overflows, again with re-materialization added on the
    stages whose devices overflow, kept if it then fits or is faster. None if it cannot run."""
    try:
        r = simulate(plan, timeline=False)
        if r.over_memory and not allow_over:
            over = set(overflowing_stages(r))
            fixed = replace(plan, recompute=[plan.recomputes(s) or s in over for s in range(plan.num_stages)])
            r2 = simulate(fixed, timeline=False)
            if rank_key(r2) < rank_key(r):
                plan, r = fixed, r2
        return plan, r
    except (PipeplanError, Infeasible):
        return None


class Scorer:
    def __init__(self, graph: Graph, cluster: Cluster, orders: list[np.ndarray], microbatches: int,
                 optimizer: str, allow_over_memory: bool, budget: Budget,
                 classes: list[list[int]] | None = None) -> None:
        self.graph, self.cluster, self.orders = graph, cluster, orders
        self.microbatches, self.optimizer = microbatches, optimizer
        self.allow_over = allow_over_memory
        self.budget = budget
        self.memo: dict[Candidate, tuple[float, Candidate]] = {}
        self.evaluators: dict[tuple, BatchEvaluator] = {}
        self.evaluations = 0
        self.classes = [k for k in classes or [] if len(k) > 1]

    def out_of_time(self) -> bool:
        """The budget is spent (its evaluations, or its wall-clock cap)."""
        return not self.budget.left(self.evaluations)

    def score(self, cands: list[Candidate]) -> list[tuple[float, Candidate]]:
        """(score, the candidate it stands for: itself up to swaps of interchangeable
        devices, or repaired) of each."""
        cands = [canonical(c, self.classes) for c in cands]
        todo = list(dict.fromkeys(c for c in cands if c not in self.memo))
        repairs: dict[Candidate, Candidate] = {}
        for c, (it, mem, ok) in zip(todo, self._evaluate(todo)):
            if not ok:
                self.memo[c] = (np.inf, c)
                continue
            ratio = float((mem / self.cluster.usable).max())
            self.memo[c] = (rank_score(it, ratio, self.allow_over), c)
            if ratio > 1.0 and not self.allow_over:
                fixed = c.with_recompute(self._overflowing_stages(c, mem))
                if fixed != c:
                    repairs[c] = fixed
        if repairs:
            for c, (score, stand) in zip(repairs, self.score(list(repairs.values()))):
                if score < self.memo[c][0]:
                    self.memo[c] = (score, stand)
        return [self.memo[c] for c in cands]

    def _overflowing_stages(self, c: Candidate, mem: np.ndarray) -> set[int]:
        over = mem > self.cluster.usable
        return {s for s, g in enumerate(c.groups) if over[list(g)].any()}

    def _evaluator(self, shape: tuple[int, str, str]) -> BatchEvaluator:
        ev = self.evaluators.get(shape)
        if ev is None:
            ev = self.evaluators[shape] = BatchEvaluator(self.graph, self.cluster, shape[0], self.microbatches,
                                                         shape[1], shape[2], self.optimizer)
        return ev

    def _evaluate(self, cands: list[Candidate]) -> list[tuple[float, np.ndarray, bool]]:
        """(iteration, memory per device, feasible) of each, one batch per shape."""
        out: list = [None] * len(cands)
        by_shape: dict[tuple, list[int]] = defaultdict(list)
        for i, c in enumerate(cands):
            by_shape[c.shape()].append(i)
        v = len(self.cluster)
        for shape, idx in by_shape.items():
            son = np.stack([cands[i].stage_of_node(self.orders[cands[i].order]) for i in idx])
            dst = np.stack([cands[i].device_stage(v) for i in idx])
            rec = np.array([cands[i].recompute for i in idx], dtype=bool)
            res = self._evaluator(shape).evaluate(son, dst, rec)
            for j, i in enumerate(idx):
                out[i] = (float(res.iteration_s[j]), res.memory_bytes[j], bool(res.feasible[j]))
        self.evaluations += len(cands)
        return out
