"""``drl-pp``: DRL-PP (drl-pp.txt), a PPO agent that partitions the model's DAG without
compressing branches and places the partitions on accelerators (``ppo.py``).

As a planner it plans with a checkpoint (``-O checkpoint=ck.pt``: the best plan its training
found when it was trained on this instance, data parallelism and the equal-compute splits
(``learn.found``), and schemes sampled from the agent; the best scored wins), fine-tunes one (``checkpoint`` and ``evaluations``), or trains on the
spot for ``-O evaluations=N`` plans scored (default 4,000, about a minute here), so that the
same command gives the same plan on any machine; ``-O budget=SECONDS`` caps the wall-clock.
Training counts as planning time. torch is imported only when the planner runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...budget import Budget
from ...cluster import Cluster
from ...graph import Graph
from ...plan import Plan
from ..base import PlanOptions, register
from ..options import SEED_RANGE

DEFAULT_EVALUATIONS = 4000
#: Plans the training scores per second (benchmarks/results/drlpp/evaluate.md: 702 in 10.3 s),
#: for progress bars.
EVALUATIONS_PER_S = 70.0


@dataclass(frozen=True)
class DrlppOptions:
    checkpoint: str | None = field(default=None, metadata={
        "help": "a checkpoint from `pipeplan train drl-pp` to plan with (no training unless evaluations or budget "
                "is given)"})
    evaluations: int | None = field(default=None, metadata={"min": 1, "help": (
        f"plans scored in training (from the checkpoint if given); default {DEFAULT_EVALUATIONS:,} without a "
        "checkpoint, none with one")})
    budget: float | None = field(default=None, metadata={"above": 0, "duration": True, "help": (
        "a wall-clock cap on training (90s, 3m, 1h; a bare number is seconds; default: none, so that the same "
        "command gives the same plan on any machine)")})
    seed: int = field(default=0, metadata={**SEED_RANGE, "help": "seed of the agent's weights and samples"})
    replicas: str | None = field(default=None, metadata={"choices": ("round-robin", "split"), "help": (
        "how a partition's accelerators share the microbatches: whole ones in turn (PipeDream's, the paper's) "
        "or each split across them (default: the agent chooses, per plan)")})
    samples: int = field(default=32, metadata={"min": 0, "help": (
        "partition schemes sampled from the trained agent (each with its placements) besides the best plan its "
        "training found (kept in the checkpoint, used on the instance it was found on) and the trivial plans "
        "(data parallelism, equal-compute splits); the best scored of all is returned")})


def training_budget(opts: DrlppOptions) -> Budget | None:
    """The training's budget (None: no training, only samples from the checkpoint)."""
    if opts.checkpoint and opts.evaluations is None and opts.budget is None:
        return None
    evaluations = opts.evaluations if opts.evaluations is not None or opts.budget is not None else DEFAULT_EVALUATIONS
    return Budget(opts.budget, evaluations)


def _estimate_s(graph: Graph, cluster: Cluster, options: PlanOptions) -> float | None:
    """Seconds of training, for progress bars: the cap, else the evaluations at the expected rate."""
    budget = training_budget(options.settings_of(DrlppOptions))
    if budget is None:
        return None
    return budget.seconds if budget.evaluations is None else budget.evaluations / EVALUATIONS_PER_S


@register("drl-pp", "DRL-PP: PPO agent (GCN encoder, recurrent DAG partitioner without branch compression, "
          "accelerator scheduler, schedule and replica mode); trains on the spot or plans with -O checkpoint=",
          "chosen: gpipe, 1f1b, zb-h1 or spp-pe",
          options=DrlppOptions, estimate=_estimate_s, in_best=False)
def plan_drlpp(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Train (or load) the agent, then sample plans from it; the best scored plan seen,
    training included."""
    from .run import plan_with_agent

    opts = options.settings_of(DrlppOptions)
    return plan_with_agent(graph, cluster, options, opts.checkpoint, training_budget(opts), opts.seed, opts.samples,
                           opts.replicas)
