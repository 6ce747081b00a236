"""``random`` and ``anneal``: random search and simulated annealing over DRL-PP's action space
(``learn.search``), the yardsticks its evaluation standard names, as planners a user can run:
the same partitions and placements the agent can reach, the same reward (``learn.scoring``),
the same executions (schedule and replica mode) to choose among, a budget in evaluations.
Like the learning planners they weigh the trivial plans (data parallelism, the equal-compute
splits: ``learn.found``) beside what they find.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..budget import Budget
from ..cluster import Cluster
from ..graph import Graph
from ..learn.found import trivial_under
from ..learn.scoring import Scorer, executions
from ..learn.search import SearchResult, random_search, simulated_annealing
from ..plan import Plan
from .base import PlanOptions, register
from .options import SEED_RANGE

DEFAULT_EVALUATIONS = 3000
#: plans scored per second (about 500 in 5 s on GNMT here), for progress bars
EVALUATIONS_PER_S = 100.0


@dataclass(frozen=True)
class SearchOptions:
    evaluations: int = field(default=DEFAULT_EVALUATIONS, metadata={"min": 1, "help": (
        "plans scored (the budget: the same command gives the same plan on any machine)")})
    budget: float | None = field(default=None, metadata={"above": 0, "duration": True, "help": (
        "a wall-clock cap (90s, 3m, 1h; a bare number is seconds; default: none)")})
    seed: int = field(default=0, metadata={**SEED_RANGE, "help": "seed of the search's draws"})
    replicas: str | None = field(default=None, metadata={"choices": ("round-robin", "split"), "help": (
        "how a partition's devices share the microbatches (default: chosen per plan, as DRL-PP's)")})


def _estimate_s(graph: Graph, cluster: Cluster, options: PlanOptions) -> float:
    opts = options.settings_of(SearchOptions)
    return min(opts.evaluations / EVALUATIONS_PER_S, opts.budget or float("inf"))


def _search(name: str, graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Run ``name``'s search, weigh the trivial plans, return the best as a Plan."""
    opts = options.settings_of(SearchOptions)
    allowed = executions(options.schedule, opts.replicas, name)
    scorer = Scorer(graph, cluster, options.microbatches, allowed[0][0], allowed[0][1], options.optimizer, allowed)
    budget = Budget(opts.budget, opts.evaluations)
    search = random_search if name == "random" else simulated_annealing
    found = search(scorer, graph, len(cluster), budget, np.random.default_rng(opts.seed))
    best = _with_trivial(scorer, graph, len(cluster), found)
    plan = scorer.plan(best.part, best.device_part, best.execution)
    stopped = budget.why_stopped(scorer.evaluations)
    plan.extra = {name: {"evaluations": scorer.evaluations, "complete": False, "trivial": best is not found,
                         "incomplete": f"the best plan of a {name} search ({stopped}), not an exhaustive one"}}
    return plan


def _with_trivial(scorer: Scorer, graph: Graph, devices: int, found: SearchResult) -> SearchResult:
    """``found``, or the trivial plan (under any allowed execution) that scores better."""
    parts, devs, ex = trivial_under(graph, devices, len(scorer.executions))
    res = scorer.score(parts, devs, ex)
    i = int(np.argmax(res.reward))
    if not np.isfinite(res.iteration_s[i]) or res.reward[i] <= found.reward:
        return found
    return SearchResult(float(res.reward[i]), parts[i], devs[i], int(ex[i]), float(res.iteration_s[i]),
                        bool(res.fits[i]), found.evaluations + len(parts), found.seconds, found.curve)


@register("random", "random search over DRL-PP's action space (partitions, placements, schedule and replica mode), "
          "the best of a budget of evaluations", "1f1b", options=SearchOptions, estimate=_estimate_s, in_best=False)
def plan_random(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    return _search("random", graph, cluster, options)


@register("anneal", "simulated annealing over DRL-PP's action space, the best of a budget of evaluations", "1f1b",
          options=SearchOptions, estimate=_estimate_s, in_best=False)
def plan_anneal(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    return _search("anneal", graph, cluster, options)
