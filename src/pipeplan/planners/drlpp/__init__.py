"""``drl-pp``: DRL-PP (drl-pp.txt), a PPO agent that partitions the model's DAG without
compressing branches and places the partitions on accelerators (``ppo.py``).

As a planner it plans with a checkpoint (``-O checkpoint=ck.pt``: sample schemes and keep
the best scored plan), fine-tunes one (``checkpoint`` and ``budget``), or trains on the spot
within ``-O budget=SECONDS`` (default 60 s); training counts as planning time. torch is
imported only when the planner runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...cluster import Cluster
from ...graph import Graph
from ...plan import Plan
from ..base import SEED_RANGE, PlanOptions, planner_options, register

DEFAULT_BUDGET_S = 60.0


@dataclass(frozen=True)
class DrlppOptions:
    checkpoint: str | None = field(default=None, metadata={
        "help": "a checkpoint from `pipeplan train drl-pp` to plan with (no training unless budget is given)"})
    budget: float | None = field(default=None, metadata={"above": 0, "help": (
        f"seconds of training (from the checkpoint if given); default {DEFAULT_BUDGET_S:g} without a checkpoint, "
        "none with one")})
    seed: int = field(default=0, metadata={**SEED_RANGE, "help": "seed of the agent's weights and samples"})
    replicas: str = field(default="round-robin", metadata={"choices": ("round-robin", "split"), "help": (
        "how a partition's accelerators share the microbatches: whole ones in turn (PipeDream's, the paper's) "
        "or each split across them")})
    samples: int = field(default=32, metadata={"min": 1, "help": (
        "partition schemes sampled from the trained agent (each with its placements); the best scored is kept")})


def _budget_s(graph: Graph, cluster: Cluster, options: PlanOptions) -> float | None:
    opts = planner_options(DrlppOptions, options, "drl-pp")
    if opts.budget is not None:
        return opts.budget
    return None if opts.checkpoint else DEFAULT_BUDGET_S


@register("drl-pp", "DRL-PP: PPO agent (GCN encoder, recurrent DAG partitioner without branch compression, "
          "accelerator scheduler); trains on the spot or plans with -O checkpoint=", "1f1b",
          options=DrlppOptions, estimate=_budget_s, in_best=False)
def plan_drlpp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Train (or load) the agent, then sample plans from it; the best scored plan seen,
    training included."""
    from .run import plan_with_agent

    opts = planner_options(DrlppOptions, options, "drl-pp")
    return plan_with_agent(graph, cluster, options, opts.checkpoint, _budget_s(graph, cluster, options),
                           opts.seed, opts.samples, opts.replicas)
