"""The joint search on large clusters (docs/joint.md, "Large clusters"): instead of moving
devices one by one, it searches the plans that treat identical servers alike.

A configuration is a pipeline depth p and a width k (every stage on k devices, p x k at
most the cluster), a layout of the ranked devices (servers together, ``seeds.device_ranking``):
``stage-major`` (stage s on devices s*k .. s*k+k-1: a stage fills whole servers, Megatron's
rank order) or ``pipeline-major`` (replica r of every stage on devices r*p .. r*p+p-1: a
pipeline inside a server), a replica mode, a schedule, and the cut points, chosen by a
min-max dynamic programme over the linearized layers (each stage's compute on k devices plus
what its cut sends). Every configuration is first ranked by a closed-form estimate of a
flushed pipeline, sum of stage times + (M' - 1) x the slowest stage + the largest
all-reduce (M' = microbatches per replica); the best are simulated in full (re-materializing
the stages that overflow), then the winner's schedule is varied and its cuts moved off its
busiest stage while that helps. The work grows with the number of depths, not of devices."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...budget import Budget
from ...cluster import Cluster
from ...sim.formulas import allreduce_time, transfer_time
from ...errors import Infeasible
from ...graph import Graph, Linearization, linearize
from ...plan import Plan, Stage
from ...sim import SimResult
from ..base import PlanOptions
from ..ranking import overflow_ratio, rank_score
from .score import simulate_fitting
from .seeds import device_ranking

LAYOUTS = ("stage-major", "pipeline-major")
SIMULATED = 8  # configurations simulated in full, best estimates first
MAX_REFINE = 24  # cut moves simulated on the winner


@dataclass(frozen=True)
class Config:
    groups: tuple[tuple[int, ...], ...]
    bounds: tuple[int, ...]
    replicas: str
    schedule: str
    layout: str
    recompute: tuple[bool, ...] = ()


def depths(layers: int, devices: int) -> list[int]:
    """Pipeline depths tried: 1, 2, 3, 4, 6, 8, 12, 16, ... up to the layers and devices."""
    out, x = set(), 1
    while x <= min(layers, devices):
        out.update(d for d in (x, 3 * x // 2) if 1 <= d <= min(layers, devices))
        x *= 2
    return sorted(out)


def layout_groups(ranking: list[int], p: int, k: int, layout: str) -> list[list[int]]:
    if layout == "stage-major":
        return [ranking[s * k:(s + 1) * k] for s in range(p)]
    return [[ranking[r * p + s] for r in range(k)] for s in range(p)]


def min_max_partition(work_cum: np.ndarray, cut_cost: np.ndarray, p: int) -> list[int]:
    """Cut positions of p intervals minimizing the largest (interval work + the cost of the
    cut closing it): the classic linear-partition DP, one numpy min per stage."""
    n = work_cum.size - 1
    span = work_cum[None, :] - work_cum[:, None]  # span[i, j]: work of nodes i..j-1
    span = np.where(np.triu(np.ones((n + 1, n + 1), dtype=bool), 1), span + cut_cost[None, :], np.inf)
    best = span[0].copy()  # best[j]: first nodes 0..j-1 in one stage
    choice = np.zeros((p, n + 1), dtype=np.int64)
    for s in range(1, p):
        cand = np.maximum(best[:, None], span)
        choice[s] = np.argmin(cand, axis=0)
        best = cand[choice[s], np.arange(n + 1)]
    bounds, j = [n], n
    for s in range(p - 1, 0, -1):
        j = int(choice[s, j])
        bounds.append(j)
    return [0] + bounds[::-1]


class _Space:
    """The instance and what every configuration's estimate reuses."""

    def __init__(self, graph: Graph, cluster: Cluster, options: PlanOptions) -> None:
        self.graph, self.cluster, self.options = graph, cluster, options
        self.lin: Linearization = linearize(graph)
        self.ranking = device_ranking(cluster)
        self.work_cum = self.lin.fwd_cum + self.lin.bwd_cum

    def configs(self, schedule: str) -> list[Config]:
        out = []
        v, m = len(self.cluster), self.options.microbatches
        for p in depths(self.lin.n, v):
            k = v // p
            for layout in LAYOUTS if k > 1 and p > 1 else LAYOUTS[:1]:
                groups = layout_groups(self.ranking, p, k, layout)
                speed = float(self.cluster.speed[groups[0]].sum())
                cut = self.lin.cut_bytes / max(self._link(groups), 1.0) / (k * k) * speed
                bounds = tuple(min_max_partition(self.work_cum, cut, p))
                for mode in ("split", "round-robin") if 1 < k <= m else ("split",):
                    out.append(Config(tuple(map(tuple, groups)), bounds, mode, schedule, layout))
        return out

    def _link(self, groups: list[list[int]]) -> float:
        if len(groups) < 2:
            return np.inf
        return self.cluster.min_bandwidth(groups[0], groups[1])

    def estimate(self, c: Config) -> float:
        """Closed form of a flushed pipeline (module docstring); inf if it cannot run."""
        cl, lin, m = self.cluster, self.lin, self.options.microbatches
        k = len(c.groups[0])
        per = m if c.replicas == "split" else -(-m // k)
        div = np.array([cl.speed[list(g)].sum() if c.replicas == "split" else cl.speed[list(g)].min()
                        for g in c.groups])
        b = np.asarray(c.bounds)
        t = (self.work_cum[b[1:]] - self.work_cum[b[:-1]]) / div
        try:
            comm = np.array([transfer_time(cl, c.groups[s], c.groups[s + 1], float(lin.cut_bytes[b[s + 1]]))
                             if c.replicas == "split" else
                             transfer_time(cl, c.groups[s][:1], c.groups[s + 1][:1], float(lin.cut_bytes[b[s + 1]]))
                             for s in range(len(c.groups) - 1)])
            ar = max(allreduce_time(cl, g, float(lin.params_cum[b[s + 1]] - lin.params_cum[b[s]]))
                     for s, g in enumerate(c.groups))
        except Infeasible:
            return np.inf
        slowest = max(t.max(), comm.max(initial=0.0))
        return float(t.sum() + 2 * comm.sum() + (per - 1) * slowest + ar)

    def plan(self, c: Config) -> Plan:
        g, cl, o = self.graph, self.cluster, self.options
        stages = [Stage([g.ids[u] for u in self.lin.interval(c.bounds[s], c.bounds[s + 1])],
                        [cl.devices[d].name for d in grp]) for s, grp in enumerate(c.groups)]
        rec = list(c.recompute) if any(c.recompute) else None
        return Plan(g, cl, stages, o.microbatches, schedule=c.schedule, optimizer=o.optimizer,
                    replicas=c.replicas, recompute=rec)


class _Runner:
    """Simulates configurations (each overflowing one again with its overflowing stages
    re-materialized), keeps the best and counts."""

    def __init__(self, space: _Space, budget: Budget) -> None:
        self.space, self.budget = space, budget
        self.best: tuple[float, Config, SimResult] | None = None
        self.simulations = 0

    def run(self, c: Config) -> float:
        allow_over = self.space.options.allow_over_memory
        done = simulate_fitting(self.space.plan(c), allow_over)
        if done is None:
            return np.inf
        plan, r = done
        self.simulations += 1
        c = replace(c, recompute=tuple(plan.recompute or ()))
        key = rank_score(r.iteration_s, overflow_ratio(r), allow_over)
        if self.best is None or key < self.best[0]:
            self.best = (key, c, r)
        return key

    def out_of_time(self) -> bool:
        """The budget is spent (each full simulation is one evaluation)."""
        return not self.budget.left(self.simulations)


def _refine(runner: _Runner, space: _Space) -> bool:
    """Move one node off the busiest stage to a neighbour while that helps; True when it
    stopped because nothing helped (not the budget or the move limit)."""
    for _ in range(MAX_REFINE):
        if runner.out_of_time():
            return False
        key, c, r = runner.best
        busy = np.zeros(len(c.groups))
        np.maximum.at(busy, np.asarray(r.stage_of_device), r.busy_s)
        s = int(np.argmax(busy))
        b = list(c.bounds)
        moves = []
        if s > 0 and b[s + 1] - b[s] > 1:
            moves.append(b[:s] + [b[s] + 1] + b[s + 1:])
        if s < len(c.groups) - 1 and b[s + 1] - b[s] > 1:
            moves.append(b[:s + 1] + [b[s + 1] - 1] + b[s + 2:])
        if not any(runner.run(replace(c, bounds=tuple(m))) < key for m in moves):
            return True
    return False


def symmetric_search(graph: Graph, cluster: Cluster, options: PlanOptions, schedules: tuple[str, ...],
                     budget: Budget) -> tuple[Plan | None, dict]:
    """The best symmetric plan found and the search's facts (module docstring). Never
    ``complete``: only the configurations best by the closed form are simulated."""
    space = _Space(graph, cluster, options)
    runner = _Runner(space, budget)
    configs = space.configs(schedules[0])
    estimates = np.array([space.estimate(c) for c in configs])
    ranked = [configs[i] for i in np.argsort(estimates, kind="stable") if np.isfinite(estimates[i])]
    for c in ranked[:SIMULATED]:
        if runner.out_of_time():
            break
        runner.run(c)
    facts = {"complete": False, "simulations": runner.simulations, "evaluations": runner.simulations,
             "configurations": len(configs), "incomplete": (
                 f"symmetric search: {min(SIMULATED, len(ranked))} of {len(configs)} symmetric configurations "
                 "simulated (the best by a closed-form estimate); asymmetric plans not searched")}
    if runner.best is None:
        return None, facts
    for sch in schedules[1:]:
        if not runner.out_of_time():
            runner.run(replace(runner.best[1], schedule=sch, recompute=()))
    facts.update(converged=_refine(runner, space), simulations=runner.simulations, evaluations=runner.simulations,
                 layout=runner.best[1].layout)
    why = budget.why_stopped(runner.simulations)
    if why is not None:
        facts["incomplete"] += f"; {why}"
    return space.plan(runner.best[1]), facts
