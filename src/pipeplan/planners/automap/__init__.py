"""Auto-MAP's pipeline planners (auto-map.txt; the DQN is ``learn/dqn.py``):

- ``automap`` (§3.4, §4.4): a DQN that cuts the model into K stages one pivot at a time,
  trained online on the model it plans (``online.py`` over ``problem.py``). Training is
  planning time; the search stops when the greedy policy's plan has stopped changing or the
  budget is spent, and the plan is the best one seen.
- ``automap-infer`` (§3.5, §4.5): a DQN trained once on generated array-partition problems
  (``arrays.py``, ``infer.py``), shipped with pipeplan, that plans any model zero-shot.

torch is imported only when a planner runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...cluster import Cluster
from ...errors import PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan
from ..base import PlanOptions, register
from ..options import SEED_RANGE
from ...learn.found import no_worse_than_trivial
from .problem import RADIUS, CutProblem, layer_of, server_boundaries

#: Episodes of online training by default: about 5 minutes here, within which the Table 7
#: cases converge (benchmarks/results/automap/table7.md).
DEFAULT_EPISODES = 40_000
#: automap-infer's stage share bound: a quarter of an equal share of the compute at least
MIN_SHARE = 0.25
#: Episodes per second, for progress bars (table7.md: 10,000-35,000 episodes in 40-300 s).
EPISODES_PER_S = 120.0


@dataclass(frozen=True)
class AutomapOptions:
    stages: int | None = field(default=None, metadata={"min": 2, "help": (
        "K, the number of stages (default: one per server, as in the paper's experiments, at least 2)")})
    episodes: int = field(default=DEFAULT_EPISODES, metadata={"min": 1, "help": (
        "most episodes of online training (the budget: the same command gives the same plan on any machine); it "
        "stops earlier once the greedy policy has converged")})
    budget: float | None = field(default=None, metadata={"above": 0, "duration": True, "help": (
        "a wall-clock cap on training (90s, 3m, 1h; a bare number is seconds; default: none)")})
    radius: int = field(default=RADIUS, metadata={"min": 0, "help": (
        "devices around each center device cut (network boundary) a cut may map to (§4.4)")})
    seed: int = field(default=0, metadata={**SEED_RANGE, "help": "seed of the DQN's weights and exploration"})


def default_stages(cluster: Cluster) -> int:
    """One stage per server (§5.2.3), at least 2, at most one per device."""
    return min(len(cluster), max(2, len(server_boundaries(cluster)) + 1))


def problem_for(graph: Graph, cluster: Cluster, options: PlanOptions, stages: int | None,
                radius: int = RADIUS) -> CutProblem:
    """The pruned cut problem of a planning request (schedule 1F1B unless asked, replicas
    splitting each microbatch as in DAPPLE, the paper's pipeline runtime)."""
    if options.schedule not in (None, "1f1b", "gpipe"):
        raise PipeplanError(f"automap: schedule {options.schedule!r} is not a synchronous pipeline "
                            "(use 1f1b or gpipe)")
    return CutProblem(graph, cluster, stages or default_stages(cluster), options.microbatches,
                      options.schedule or "1f1b", "split", options.optimizer, radius)


def _estimate_s(graph: Graph, cluster: Cluster, options: PlanOptions) -> float:
    """Seconds of training at most, for progress bars."""
    opts = options.settings_of(AutomapOptions)
    return min(opts.episodes / EPISODES_PER_S, opts.budget or float("inf"))


@register("automap", "Auto-MAP (online training): a DQN cuts the model into K stages at pruned pivots "
          "near network boundaries; stages get devices in proportion to their compute", "1f1b",
          options=AutomapOptions, estimate=_estimate_s, in_best=False)
def plan_automap(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Train the DQN on this model and cluster; the best plan it met."""
    from ...budget import Budget
    from .online import online_config, train_online

    opts = options.settings_of(AutomapOptions)
    problem = problem_for(graph, cluster, options, opts.stages, opts.radius)
    budget = Budget(opts.budget, opts.episodes)
    run = train_online(problem, budget, online_config(opts.seed))
    if not run.cuts:
        raise PipeplanError(f"automap: no plan found for {graph.name!r} within {budget.why_stopped(run.episodes)}")
    plan = problem.plan(run.cuts)
    converged = "the greedy policy converged" if run.converged_s is not None else budget.why_stopped(run.episodes)
    plan.extra = {"automap": {**problem.describe(run.cuts), "fits": run.fits, "episodes": run.episodes,
                              "evaluations": run.evaluations, "converged_s": run.converged_s, "complete": False,
                              "incomplete": f"the best plan a DQN met ({converged}), not an exhaustive search"}}
    return plan


@dataclass(frozen=True)
class InferOptions:
    checkpoint: str | None = field(default=None, metadata={
        "help": "a checkpoint from `pipeplan train automap-infer` (default: the one shipped with pipeplan)"})
    stages: int | None = field(default=None, metadata={"min": 2, "help": (
        "K, the number of stages (default: one per server, at least 2, at most 8)")})
    beam: int = field(default=16, metadata={"min": 1, "help": (
        "partial plans kept per step, ranked by the agent; the complete ones are scored with the value "
        "function and the best kept (1: the paper's greedy plan)")})
    min_share: float = field(default=MIN_SHARE, metadata={"min": 0, "max": 1, "help": (
        "no stage gets less than this share of an equal split of the compute (0: any)")})


@register("automap-infer", "Auto-MAP (online inference): a DQN trained once on generated array-partition "
          "problems picks stage boundaries and device cuts for any model zero-shot", "1f1b",
          options=InferOptions, in_best=False, searches=False)
def plan_automap_infer(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Coarsen the model to 128 points (§4.5.1), let the trained agent pick K-1 boundaries
    and device cuts (greedily, or keeping a beam of its best partial plans, no stage below
    ``min_share`` of an equal share), map them back to the model, and keep the faster of that
    and the trivial plans (data parallelism, the equal-compute splits: ``learn.found``)."""
    from .arrays import MAX_STAGES, from_graph, real_plan
    from .infer import InferEnv, agent_loads, beam, load_agent

    opts = options.settings_of(InferOptions)
    if options.schedule not in (None, "1f1b", "gpipe"):
        raise PipeplanError(f"automap-infer: schedule {options.schedule!r} is not a synchronous pipeline "
                            "(use 1f1b or gpipe)")
    inst = from_graph(graph, cluster, options.microbatches, opts.stages or min(default_stages(cluster), MAX_STAGES))
    t0, loads = time.perf_counter(), agent_loads()
    policy = load_agent(opts.checkpoint)  # torch and the agent: once a process
    setup_s = time.perf_counter() - t0 if agent_loads() > loads else 0.0  # 0: it was loaded already
    found = beam(policy, InferEnv(min_share=opts.min_share), inst, opts.beam)
    plan = real_plan(graph, cluster, inst, found.bounds, found.dcuts, options.microbatches,
                     options.schedule or "1f1b", options.optimizer)
    plan, trivial = no_worse_than_trivial(plan, options.microbatches, options.schedule or "1f1b", options.optimizer)
    cuts = [int(inst.positions[b]) for b in found.bounds]
    order = linearize(graph).order
    after = [graph.ids[int(order[c - 1])] for c in cuts]
    plan.extra = {"automap-infer": {"cuts": cuts, "nodes": len(graph), "after": after,
                                    "layers": [layer_of(a) for a in after], "device_cuts": [d * inst.unit for d in found.dcuts],
                                    "boundaries": found.bounds, "granularity": 128, "beam": opts.beam,
                                    "checkpoint": opts.checkpoint or "shipped", "inference_s": found.seconds,
                                    "setup_s": setup_s, "min_share": opts.min_share, "trivial": trivial}}
    return plan
