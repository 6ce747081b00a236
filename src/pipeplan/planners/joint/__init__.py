"""``joint``: one search over partition, replication, device mapping (any subset of the
devices), replica mode, per-stage re-materialization and schedule, scored by the batched
evaluator, started from the other planners' plans (docs/joint.md).

On instances within ``exact``'s limits an exhaustive phase first searches exact's space with
joint's schedules (every contiguous partition of the linearized layers x device subsets x
replica mode x round-robin replica order x schedule, re-materializing the stages that
overflow), the seeds as incumbents. Up to ``LOCAL_MAX_DEVICES`` devices an iterated local
search over single changes follows (``local.py``, ``moves.py``); larger clusters get a search
over the symmetric plans of their identical servers (``symmetric.py``). The answer is the
best of the searches and of the seeds, simulated in full.

The budget counts evaluations (``-O evaluations``), so the same command gives the same plan
on any machine; wall-clock seconds are only an optional cap (``-O budget``). The seed planners
run by a fixed rule (their own size model, not the clock) outside it, so they cannot starve
the search. ``extra["joint"]["complete"]`` is True only when the exhaustive phase searched its
whole space; otherwise ``incomplete`` says what was not searched."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ...budget import Budget
from ...cluster import Cluster
from ...errors import PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan, is_decoder
from ...sim.tensor_groups import has_rates
from .. import llm3d
from ...schedule import SCHEDULES
from ...sim import SimResult, simulate
from ..base import PlanOptions, register
from ..options import SEED_RANGE
from ..ranking import rank_key
from ...cluster.symmetry import device_classes
from ..exact import MAX_DEVICES, MAX_LAYERS, search_exhaustively, within_limits
from ..variants import batch_choices
from . import chunked
from .candidate import from_plan, order_of_plan, to_plan
from .local import LocalSearch
from .moves import Space
from .score import Scorer
from .seeds import LARGE_SEED_PLANNERS, SEED_PLANNERS, balanced_starts, device_ranking, seed_plans, subset_sizes
from .symmetric import symmetric_search

#: Synchronous schedules the search tries (those the schedule module has): one stage per
#: device in the local and symmetric searches, several model chunks per device on the best
#: plan found (``chunked.py``).
SEARCH_SCHEDULES = ("1f1b", "gpipe", "spp-pe", "zb-h1")
CHUNK_SCHEDULES = ("interleaved-1f1b", "zb-v")
#: the schedules of decoder LLM configurations (``llm3d``)
DECODER_SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b")
MODES = ("split", "round-robin")
LOCAL_MAX_DEVICES = 64
#: Evaluations by default: small instances converge well within them (benchmarks/joint/gap.py),
#: tens of devices get their best in seconds (docs/joint.md).
DEFAULT_EVALUATIONS = 30_000
#: At most this share of the evaluations goes to the exhaustive phase (partial plans bounded
#: and plans simulated); the local search has the rest.
EXHAUSTIVE_SHARE = 0.5
#: Evaluations per second the progress bar expects (the batched evaluator on this project's
#: 2-core machine, benchmarks/joint/speed.py).
EVALUATIONS_PER_S = 4000.0
#: Decoder LLMs: configurations simulated after the closed-form screening (``llm3d.search``)
LLM_SIMULATIONS = 8


@dataclass(frozen=True)
class JointOptions(llm3d.LLMOptions):
    evaluations: int = field(default=DEFAULT_EVALUATIONS, metadata={"min": 1, "help": (
        "plans the search may score (the exhaustive phase's simulations and the local search's evaluations; "
        "the seed planners run apart from them)")})
    budget: float | None = field(default=None, metadata={"above": 0, "duration": True, "help": (
        "a wall-clock cap (90s, 3m, 1h; a bare number is seconds), the seed planners included (default: none, so that the same command gives "
        "the same plan on any machine); a plan it stops says complete: false")})
    schedules: str = field(default="auto", metadata={
        "help": "comma-separated schedules to search (auto: " + ", ".join(SEARCH_SCHEDULES) + " where built)"})
    patience: int = field(default=16, metadata={"help": "kicks in a row without improvement before the "
                                                        "local search stops", "min": 1})
    seed: int = field(default=0, metadata={**SEED_RANGE, "help": "seed of the local search's kicks"})
    simulations: int = field(default=LLM_SIMULATIONS, metadata={"min": 1, "help": (
        "decoder LLMs: 3D configurations simulated, the best by the closed-form estimate of all of them, "
        "Megatron-LM's rule-of-thumb configuration besides")})


def search_schedules(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(one-stage-per-device schedules, chunked schedules) of the ``schedules`` option."""
    known = [s for s in SEARCH_SCHEDULES + CHUNK_SCHEDULES if s in SCHEDULES]
    names = tuple(known) if text == "auto" else tuple(s.strip() for s in text.split(",") if s.strip())
    single = tuple(s for s in names if s in SEARCH_SCHEDULES)
    if not single or any(s not in known for s in names):
        raise PipeplanError(f"planner 'joint': option schedules={text!r}: expected a comma-separated list of "
                            f"{', '.join(known)} with at least one of {', '.join(s for s in known if s in SEARCH_SCHEDULES)}")
    return single, tuple(s for s in names if s in CHUNK_SCHEDULES)


def _schedules_text(option: str, schedule: str | None) -> str:
    """The schedules searched: ``-O schedules``, or with ``--schedule X`` X (a chunked X on
    the best plan of every one-stage-per-device schedule); both given, X must be among them."""
    if schedule is None:
        return option
    listed = [x.strip() for x in option.split(",")]
    if option != "auto" and schedule not in listed:
        raise PipeplanError(f"planner 'joint': --schedule {schedule} is not among -O schedules={option}")
    if schedule in CHUNK_SCHEDULES:
        return ",".join([x for x in SEARCH_SCHEDULES if x in SCHEDULES] + [schedule])
    return schedule


def _estimate_s(graph: Graph, cluster: Cluster, options: PlanOptions) -> float:
    """Seconds the search may take, for progress bars: its cap, else its evaluations at the
    expected rate."""
    opts = options.settings_of(JointOptions)
    return opts.budget if opts.budget is not None else opts.evaluations / EVALUATIONS_PER_S


def _splits(graph: Graph, cluster: Cluster, options: PlanOptions) -> int:
    """How many (microbatch size, count) splits of ``--global-batch`` the planner layer runs
    joint on (``variants.plan_for_global_batch``): they share the budget; 1 without one."""
    if options.global_batch is None:
        return 1
    return max(len(batch_choices(options.global_batch, graph, len(cluster))), 1)


def _budget(opts: JointOptions, splits: int) -> Budget:
    cap = None if opts.budget is None else opts.budget / splits
    return Budget(cap, max(opts.evaluations // splits, 1))


def _rest(budget: Budget, spent: int) -> Budget | None:
    """What is left of ``budget`` after ``spent`` evaluations (None: nothing)."""
    if not budget.left(spent):
        return None
    cap = None if budget.seconds is None else budget.seconds - budget.elapsed
    return Budget(cap, None if budget.evaluations is None else budget.evaluations - spent)


def _exhaustive(graph: Graph, cluster: Cluster, options: PlanOptions, schedules: tuple[str, ...],
                budget: Budget, seeds: dict) -> tuple[Plan | None, dict]:
    """Exact's space with joint's schedules, the seeds as incumbents (module docstring)."""
    if not within_limits(graph, cluster):
        return None, {"complete": False, "evaluations": 0, "incomplete": (
            f"exhaustive phase skipped: it searches at most {MAX_LAYERS} layers and {MAX_DEVICES} devices "
            f"(here {len(graph)} and {len(cluster)}); the local search is not exhaustive")}
    share = Budget(budget.seconds, max(int((budget.evaluations or 0) * EXHAUSTIVE_SHARE), 1), t0=budget.t0)
    plan, stats = search_exhaustively(graph, cluster, options, share, schedules, list(seeds.values()))
    if not stats["complete"]:
        stats["incomplete"] = f"exhaustive phase stopped: {stats['incomplete']}"
    return plan, stats


def _local(graph: Graph, cluster: Cluster, options: PlanOptions, opts: JointOptions, schedules: tuple[str, ...],
           starts_from: list[Plan], budget: Budget | None) -> tuple[Plan | None, dict]:
    """Iterated local search from ``starts_from`` (seeds, the exhaustive phase's answer) and
    the balanced plans; the best plan and facts (no plan when no budget is left)."""
    if budget is None:
        return None, {"converged": False, "evaluations": 0}
    lin = linearize(graph)
    orders, starts = [lin.order], []
    for plan in starts_from:
        if plan.allocation is None and plan.schedule in schedules:
            orders.append(order_of_plan(plan, lin.order))
            starts.append(from_plan(plan, len(orders) - 1, orders[-1]))
    works = [np.concatenate(([0.0], np.cumsum((graph.fwd + graph.bwd)[o]))) for o in orders]
    ranking = device_ranking(cluster)
    starts += balanced_starts(0, works[0], ranking, subset_sizes(cluster, ranking), 16, schedules[0], MODES)
    scorer = Scorer(graph, cluster, orders, options.microbatches, options.optimizer, options.allow_over_memory,
                    budget, device_classes(cluster))
    space = Space(len(cluster), cluster.speed, works, schedules, MODES)
    search = LocalSearch(scorer, space, np.random.default_rng(opts.seed))
    _, best, converged = search.run(scorer.score(starts), climbs=8, patience=opts.patience)
    plan = to_plan(best, orders[best.order], graph, cluster, options.microbatches, options.optimizer)
    return plan, {"converged": converged, "evaluations": scorer.evaluations}


def _search(graph: Graph, cluster: Cluster, options: PlanOptions, opts: JointOptions, schedules: tuple[str, ...],
            budget: Budget, seeds: dict) -> tuple[dict[str, Plan], dict]:
    """The searches' plans, by name, and their facts (``complete``, ``incomplete``)."""
    if len(cluster) > LOCAL_MAX_DEVICES:
        found, facts = symmetric_search(graph, cluster, options, schedules, budget)
        return ({"search": found} if found is not None else {}), facts
    plans: dict[str, Plan] = {}
    exhaustive, ex = _exhaustive(graph, cluster, options, schedules, budget, seeds)
    if exhaustive is not None:
        plans["exhaustive"] = exhaustive
    local, lo = _local(graph, cluster, options, opts, schedules,
                       [p for p, _ in seeds.values()] + list(plans.values()), _rest(budget, ex["evaluations"]))
    if local is not None:
        plans["search"] = local
    facts = {"complete": ex["complete"], "evaluations": ex["evaluations"] + lo["evaluations"],
             "exhaustive": {k: ex[k] for k in ("complete", "evaluations", "bounded", "simulated") if k in ex},
             "local_converged": lo["converged"]}
    if not ex["complete"]:
        facts["incomplete"] = ex["incomplete"]
    else:
        facts["complete_space"] = complete_space(schedules)
    return plans, facts


def complete_space(schedules: tuple[str, ...]) -> str:
    """What ``complete: true`` covers (docs/joint.md, "What complete means"): no plan of it
    is faster than the answer."""
    return ("every contiguous partition of the linearized layers x every set of devices for each stage (devices may "
            "stay idle) x replica mode x round-robin order x schedule (" + ", ".join(schedules) + "), re-materializing "
            "the stages that overflow; not chunked schedules or other recomputation settings")


#: JointOptions that steer the search over graphs, not over decoder configurations
_GRAPH_ONLY = ("evaluations", "patience", "seed")


def _decoder_pins(opts: JointOptions, schedule: str | None) -> llm3d.Pins:
    """The decoder search's pins: the LLM options, ``--schedule`` or ``-O schedules``; an option
    of the graph search set on a decoder graph is refused (it would change nothing)."""
    default = JointOptions()
    for key in _GRAPH_ONLY:
        if getattr(opts, key) != getattr(default, key):
            raise PipeplanError(f"planner 'joint': option {key} steers the search over layer graphs; on decoder LLMs "
                                "the search is budgeted by -O simulations (and -O budget)")
    pins = llm3d.pins_of(opts, schedule)
    if opts.schedules == "auto":
        return pins
    allowed = tuple(x.strip() for x in opts.schedules.split(",") if x.strip())
    wrong = [x for x in allowed if x not in DECODER_SCHEDULES]
    if wrong or not allowed:
        raise PipeplanError(f"planner 'joint': option schedules={opts.schedules!r}: on decoder LLMs expected some of "
                            f"{', '.join(DECODER_SCHEDULES)}" + (f", not {wrong[0]!r}" if wrong else ""))
    if schedule is not None and schedule not in allowed:
        raise PipeplanError(f"planner 'joint': --schedule {schedule} is not among -O schedules={opts.schedules}")
    return replace(pins, schedules=(schedule,) if schedule is not None else allowed)


def _refuse_decoder_pins(opts: JointOptions, graph: Graph) -> None:
    """A decoder-only pin on another graph (or on GPUs without bf16 rates) is one line."""
    for f in fields(llm3d.LLMOptions):
        if getattr(opts, f.name) is not None:
            raise PipeplanError(f"planner 'joint': option {f.name} is for decoder LLM graphs on GPUs with bf16 rates "
                                f"(zoo:gpt, zoo:llama3-*, hf: on dgx-*), not {graph.name!r} here")


def _holds(pins: llm3d.Pins, seed: Plan) -> bool:
    """Whether another planner's plan may stand as joint's answer: it agrees with every pin
    (unpinned: any plan; pinned: one whose parallel configuration shows it)."""
    if seed.parallelism is None:
        return pins == llm3d.Pins()
    return pins.holds(seed.parallelism)


def _plan_decoder(graph: Graph, cluster: Cluster, options: PlanOptions, opts: JointOptions) -> Plan:
    """A decoder LLM: TP x PP x DP x microbatch x schedule x recomputation x ZeRO, every
    realizable configuration screened in closed form, the best ``opts.simulations`` and
    Megatron-LM's rule of thumb simulated (``llm3d.search``); the other planners' plans, when
    ``compare`` hands them over, win where they are better."""
    batch = llm3d.global_batch_of(graph, options.global_batch, options.microbatches)
    pins = _decoder_pins(opts, options.schedule)
    spec = llm3d.spec_of(graph)
    try:
        baseline: tuple[llm3d.Parallelism, ...] = (llm3d.rule_of_thumb(spec, cluster, batch, pins,
                                                                        options.optimizer),)
    except PipeplanError:
        baseline = ()
    deadline = None if opts.budget is None else time.monotonic() + opts.budget
    found = llm3d.search(graph, cluster, batch, pins, options.optimizer, opts.simulations, options.allow_over_memory,
                         baseline, deadline)
    answers: dict[str, tuple[Plan, SimResult]] = {"search": (found, simulate(found, timeline=False))}
    answers.update((f"seed:{name}", pr) for name, pr in (options.known_plans or {}).items() if _holds(pins, pr[0]))
    source = min(answers, key=lambda k: rank_key(answers[k][1], options.allow_over_memory))
    chosen = answers[source][0]
    plan = replace(chosen, extra={k: v for k, v in chosen.extra.items() if k != "llm3d"}, prediction={})
    facts = found.extra["llm3d"]
    plan.extra["joint"] = {**facts, "evaluations": len(facts["simulated"]), "from": source}
    return plan


@register("joint", "joint search over partition, replication, device subsets, replica mode, recomputation and "
          "schedule, from the other planners' plans (exhaustive on small instances, then local search; symmetric "
          "plans on large clusters); on decoder LLMs over TP x PP x DP x microbatch x schedule x recomputation x "
          "ZeRO", "1f1b", options=JointOptions, estimate=_estimate_s, after_others=True, own_batch=True)
def plan_joint(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    opts = options.settings_of(JointOptions)
    if is_decoder(graph) and has_rates(cluster):
        return _plan_decoder(graph, cluster, options, opts)
    _refuse_decoder_pins(opts, graph)
    schedules, chunk_schedules = search_schedules(_schedules_text(opts.schedules, options.schedule))
    budget = _budget(opts, _splits(graph, cluster, options))
    seeds = seed_plans(graph, cluster, options, budget,
                       SEED_PLANNERS if len(cluster) <= LOCAL_MAX_DEVICES else LARGE_SEED_PLANNERS)
    wanted = (options.schedule,) if options.schedule else schedules + chunk_schedules
    if options.schedule or opts.schedules != "auto":  # the seeds are candidates (and incumbents) too
        seeds = {name: pr for name, pr in seeds.items() if pr[0].schedule in wanted}
    found, facts = _search(graph, cluster, options, opts, schedules, budget, seeds)
    answers: dict[str, tuple[Plan, SimResult]] = {f"seed:{name}": pr for name, pr in seeds.items()}
    answers.update((name, (p, simulate(p, timeline=False))) for name, p in found.items())
    if not answers:
        raise PipeplanError("joint: no plan found (no seed planner could plan this and the search found none)")
    key = lambda k: rank_key(answers[k][1], options.allow_over_memory)  # noqa: E731
    single = [k for k in answers if SCHEDULES[answers[k][0].schedule].placement == "single"]
    if single:
        base = min(single, key=key)
        for variant, done in chunked.simulated_variants(answers[base][0], chunk_schedules, options.allow_over_memory):
            answers[f"{base}+{variant.schedule}x{variant.num_stages // answers[base][0].num_stages}"] = done
    answers = {k: a for k, a in answers.items() if options.schedule is None or a[0].schedule == options.schedule}
    if not answers:
        raise PipeplanError(f"joint: no plan of schedule {options.schedule} found (the stages' shapes do not take it)")
    source = min(answers, key=key)
    chosen = answers[source][0]  # a copy: a seed's plan may be another planner's answer too (compare)
    plan = replace(chosen, extra=dict(chosen.extra), prediction={})
    plan.extra["joint"] = {**facts, "from": source, "seconds": budget.elapsed,
                           "seeds": {k[5:]: answers[k][1].iteration_s for k in answers if k.startswith("seed:")}}
    return plan
