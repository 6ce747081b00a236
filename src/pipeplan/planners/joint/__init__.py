"""``joint``: one search over partition, replication, device mapping (any subset of the
devices), replica mode, per-stage re-materialization and schedule, scored by the batched
evaluator, started from the other planners' plans (docs/joint.md).

Up to ``LOCAL_MAX_DEVICES`` devices: iterated local search over single changes
(``local.py``, ``moves.py``). Larger clusters: a search over the symmetric plans of their
identical servers (``symmetric.py``). Either way the answer is the best of the search and
of the seeds, simulated in full; ``extra["joint"]["complete"]`` says whether the search
converged before its budget ran out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from ...cluster import Cluster
from ...errors import PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan
from ...schedule import SCHEDULES
from ...sim import simulate
from ..base import SEED_RANGE, PlanOptions, planner_options, register
from ..exact import device_classes
from ..variants import batch_choices
from . import chunked
from .candidate import from_plan, order_of_plan, to_plan
from .local import LocalSearch
from .moves import Space
from .score import Scorer, result_key
from .seeds import LARGE_SEED_PLANNERS, SEED_PLANNERS, balanced_starts, device_ranking, seed_plans, subset_sizes
from .symmetric import symmetric_search

#: Synchronous schedules the search tries (those the schedule module has): one stage per
#: device in the local and symmetric searches, several model chunks per device on the best
#: plan found (``chunked.py``).
SEARCH_SCHEDULES = ("1f1b", "gpipe", "spp-pe", "zb-h1")
CHUNK_SCHEDULES = ("interleaved-1f1b", "zb-v")
MODES = ("split", "round-robin")
LOCAL_MAX_DEVICES = 64
#: Seconds the search takes by default (at most the planner time budget): small instances
#: converge well within it (benchmarks/joint/gap.py), tens of devices get its best.
DEFAULT_BUDGET_S = 10.0


@dataclass(frozen=True)
class JointOptions:
    budget: float | None = field(default=None, metadata={
        "help": f"seconds the search may take, the seed planners included (default: {DEFAULT_BUDGET_S:g}, "
                "at most the planner time budget); when it runs out the plan says complete: false", "above": 0})
    schedules: str = field(default="auto", metadata={
        "help": "comma-separated schedules to search (auto: " + ", ".join(SEARCH_SCHEDULES) + " where built)"})
    patience: int = field(default=16, metadata={"help": "kicks in a row without improvement before the "
                                                        "local search stops", "min": 1})
    seed: int = field(default=0, metadata={**SEED_RANGE, "help": "seed of the local search's kicks"})


def search_schedules(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(one-stage-per-device schedules, chunked schedules) of the ``schedules`` option."""
    known = [s for s in SEARCH_SCHEDULES + CHUNK_SCHEDULES if s in SCHEDULES]
    names = tuple(known) if text == "auto" else tuple(s.strip() for s in text.split(",") if s.strip())
    single = tuple(s for s in names if s in SEARCH_SCHEDULES)
    if not single or any(s not in known for s in names):
        raise PipeplanError(f"planner 'joint': option schedules={text!r}: expected a comma-separated list of "
                            f"{', '.join(known)} with at least one of {', '.join(s for s in known if s in SEARCH_SCHEDULES)}")
    return single, tuple(s for s in names if s in CHUNK_SCHEDULES)


def _budget(graph: Graph, cluster: Cluster, options: PlanOptions) -> float:
    return planner_options(JointOptions, options, "joint").budget or min(DEFAULT_BUDGET_S, options.time_budget_s)


def _splits(graph: Graph, cluster: Cluster, options: PlanOptions) -> int:
    """How many (microbatch size, count) splits of ``--global-batch`` the planner layer runs
    joint on (``variants.plan_for_global_batch``): they share the budget; 1 without one."""
    if options.global_batch is None:
        return 1
    return max(len(batch_choices(options.global_batch, graph, len(cluster))), 1)


def _local(graph: Graph, cluster: Cluster, options: PlanOptions, opts: JointOptions, schedules: tuple[str, ...],
           seeds: dict, deadline: float) -> tuple[Plan | None, dict]:
    """Iterated local search from the seeds and the balanced plans; the best plan and facts
    (no plan when the seed planners used up the budget)."""
    if time.perf_counter() > deadline:
        return None, {"complete": False, "evaluations": 0}
    lin = linearize(graph)
    orders, starts = [lin.order], []
    for plan, _ in seeds.values():
        if plan.allocation is None and plan.schedule in schedules:
            orders.append(order_of_plan(plan, lin.order))
            starts.append(from_plan(plan, len(orders) - 1, orders[-1]))
    works = [np.concatenate(([0.0], np.cumsum((graph.fwd + graph.bwd)[o]))) for o in orders]
    ranking = device_ranking(cluster)
    starts += balanced_starts(0, works[0], ranking, subset_sizes(cluster, ranking), 16, schedules[0], MODES)
    scorer = Scorer(graph, cluster, orders, options.microbatches, options.optimizer, options.allow_over_memory,
                    deadline, device_classes(cluster))
    space = Space(len(cluster), cluster.speed, works, schedules, MODES)
    search = LocalSearch(scorer, space, np.random.default_rng(opts.seed))
    _, best, converged = search.run(scorer.score(starts), climbs=8, patience=opts.patience)
    plan = to_plan(best, orders[best.order], graph, cluster, options.microbatches, options.optimizer)
    return plan, {"complete": converged, "evaluations": scorer.evaluations}


@register("joint", "joint search over partition, replication, device subsets, replica mode, recomputation and "
          "schedule, from the other planners' plans (local search; symmetric plans on large clusters)",
          "1f1b", options=JointOptions, estimate=_budget, after_others=True)
def plan_joint(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    opts = planner_options(JointOptions, options, "joint")
    schedules, chunk_schedules = search_schedules(opts.schedules)
    t0 = time.perf_counter()
    deadline = t0 + _budget(graph, cluster, options) / _splits(graph, cluster, options)
    small = len(cluster) <= LOCAL_MAX_DEVICES
    seeds = seed_plans(graph, cluster, options, deadline, SEED_PLANNERS if small else LARGE_SEED_PLANNERS)
    if small:
        found, facts = _local(graph, cluster, options, opts, schedules, seeds, deadline)
    else:
        found, facts = symmetric_search(graph, cluster, options, schedules, deadline)
    answers = {f"seed:{name}": pr for name, pr in seeds.items()}
    if found is not None:
        answers["search"] = (found, simulate(found, timeline=False))
    if not answers:
        raise PipeplanError("joint: no plan found (no seed planner could plan this and the search found none)")
    key = lambda k: result_key(answers[k][1], options.allow_over_memory)  # noqa: E731
    single = [k for k in answers if SCHEDULES[answers[k][0].schedule].placement == "single"]
    if single:
        base = min(single, key=key)
        for variant, done in chunked.simulated_variants(answers[base][0], chunk_schedules, options.allow_over_memory):
            answers[f"{base}+{variant.schedule}x{variant.num_stages // answers[base][0].num_stages}"] = done
    source = min(answers, key=key)
    chosen = answers[source][0]  # a copy: a seed's plan may be another planner's answer too (compare)
    plan = replace(chosen, extra=dict(chosen.extra), prediction={})
    plan.extra["joint"] = {**facts, "from": source, "seconds": time.perf_counter() - t0,
                           "seeds": {k[5:]: answers[k][1].iteration_s for k in answers if k.startswith("seed:")}}
    return plan
