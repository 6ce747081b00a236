"""DRL-PP as a planner and as ``pipeplan train drl-pp``: build the agent (new or from a
checkpoint), train it within a budget, sample plans, and return the best as a Plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...cluster import Cluster
from ...errors import PipeplanError
from ...graph import Graph
from ...learn.harness import (Budget, Curve, Progress, check_state, checkpoint, config_from, load_checkpoint,
                              trained_count)
from ...learn.scoring import Scorer
from ...plan import Plan
from ..base import PlanOptions
from ...learn.found import instance_key, record, recorded
from ...learn.scoring import executions
from .ppo import Agent, Best, Config, Instance, new_agent, offer_trivial, sample_best, train

AGENT = "drl-pp"


@dataclass
class Trained:
    """A training run: the agent, the instance it trained on (its scorer counts every
    evaluation), the best plan seen, its learning curve, and the checkpoint."""

    agent: Agent
    instance: Instance
    best: Best
    curve: Curve
    plan: Plan
    checkpoint: dict


def instance(graph: Graph, cluster: Cluster, options: PlanOptions, replicas: str | None = None,
             runner: Callable[[Plan], float] | None = None) -> Instance:
    """The training instance: plans scored by the simulator, or with ``runner`` (a plan's
    measured seconds per iteration, ``runtime.measure.plan_runner``) by running them, as
    DRL-PP §3.4 scores plans in the real environment (``learn.env.RuntimeScorer``: each
    distinct plan run once; the simulator still says which plans cannot run or fit); under
    the ``executions`` the options allow."""
    allowed = executions(options.schedule, replicas)
    schedule, mode = allowed[0]
    if runner is not None:
        from ...learn.env import RuntimeScorer

        return Instance(graph, cluster, RuntimeScorer(graph, cluster, options.microbatches, runner, schedule, mode,
                                                      options.optimizer, allowed))
    return Instance(graph, cluster, Scorer(graph, cluster, options.microbatches, schedule, mode, options.optimizer,
                                           allowed))


def load_agent(path: str, devices: int, seed: int) -> Agent:
    """The agent of a checkpoint, for a cluster of ``devices`` accelerators."""
    return _load(path, devices, seed)[0]


def _load(path: str, devices: int, seed: int) -> tuple[Agent, dict]:
    """The agent of a checkpoint and what it was trained on."""
    data = load_checkpoint(path, AGENT)
    cfg = config_from(Config, data["config"], path, seed=seed)
    trained = trained_count(data, "devices", path)
    if trained != devices:
        raise PipeplanError(f"checkpoint {path!r} was trained for {trained} accelerators; this cluster has "
                            f"{devices} (DRL-PP learns one embedding per accelerator, §3.3)")
    check_state(data["state"], lambda: Agent(cfg, devices), path)
    agent = Agent(cfg, devices)
    agent.load_state_dict(data["state"])
    return agent, data["trained_on"]


def train_agent(graph: Graph, cluster: Cluster, options: PlanOptions, budget: Budget, seed: int = 0,
                init: str | None = None, progress: Progress | None = None, command: str = "",
                replicas: str | None = None, runner: Callable[[Plan], float] | None = None) -> Trained:
    """Train DRL-PP on (graph, cluster) within ``budget``, from a checkpoint ``init`` or from
    scratch, on the simulator's rewards or, with ``runner``, on measured ones (``instance``);
    the result holds the checkpoint to save."""
    torch.set_num_threads(1)  # small networks: one thread is fastest, and runs are reproducible
    inst = instance(graph, cluster, options, replicas, runner)
    agent = load_agent(init, len(cluster), seed) if init else new_agent(Config(seed=seed), len(cluster))
    best, curve = train(agent, inst, budget, progress)
    plan = _plan(inst, best)
    trained_on = {"model": graph.name, "cluster": cluster.name, "devices": len(cluster),
                  "microbatches": options.microbatches, "executions": [list(e) for e in inst.scorer.executions],
                  "evaluations": inst.scorer.evaluations, "seconds": budget.elapsed,
                  "best_iteration_s": best.iteration_s, "from": init, "command": command,
                  "best": record(instance_key(graph, cluster, options.microbatches), best.part, best.device_part,
                                 inst.scorer.executions[best.execution], best.iteration_s),
                  "rewards": "measured" if runner is not None else "simulated",
                  **({"runs": inst.scorer.measured} if runner is not None else {})}
    return Trained(agent, inst, best, curve, plan, checkpoint(AGENT, agent.cfg, agent.state_dict(), trained_on))


def _plan(inst: Instance, best: Best) -> Plan:
    if best.part is None:
        raise PipeplanError(f"drl-pp: no valid placement sampled for {inst.graph.name!r} on {inst.cluster.name!r}")
    plan = inst.scorer.plan(best.part, best.device_part, best.execution)
    plan.planner = AGENT
    return plan


def plan_with_agent(graph: Graph, cluster: Cluster, options: PlanOptions, path: str | None,
                    budget: Budget | None, seed: int, samples: int, replicas: str | None = None) -> Plan:
    """The planner: train from scratch or fine-tune within ``budget``, or only sample from
    the checkpoint ``path`` (no budget); then ``samples`` schemes from the agent. The best
    scored plan seen wins; its ``extra`` says how it was found."""
    torch.set_num_threads(1)
    best, updates, trained_s, found = Best(), 0, 0.0, False
    if budget is not None:
        trained = train_agent(graph, cluster, options, budget, seed, path, replicas=replicas)
        agent, inst, best, updates = trained.agent, trained.instance, trained.best, len(trained.curve.points)
        trained_s = budget.elapsed
    else:
        (agent, trained_on), inst = _load(path, len(cluster), seed), instance(graph, cluster, options, replicas)
        offer_trivial(best, inst)
        found = _offer_recorded(best, inst, trained_on, options, path)
    best = sample_best(agent, inst, samples, best) if samples else best
    plan = _plan(inst, best)
    stopped = budget.why_stopped(inst.scorer.evaluations) if budget is not None else None
    plan.extra = {"drl-pp": {"checkpoint": path, "trained_s": trained_s, "updates": updates,
                             "checkpoint_best": found, "found": best.found,
                             "trivial": best.found if best.trivial else None,
                             "evaluations": inst.scorer.evaluations, "complete": False,
                             "incomplete": f"the best of a learned policy's samples{f' ({stopped})' if stopped else ''}"
                                           ", not an exhaustive search"}}
    return plan


def _offer_recorded(best: Best, inst: Instance, trained_on: dict, options: PlanOptions, path: str) -> bool:
    """The checkpoint's best plan, scored again, when it was found on this instance."""
    key = instance_key(inst.graph, inst.cluster, options.microbatches)
    got = recorded(trained_on, key, len(inst.graph), len(inst.cluster), inst.scorer.executions, path)
    if got is None:
        return False
    part, dev, e = got
    best.offer_plans(inst.scorer, part[None], dev[None], np.array([e]), ["the checkpoint's best"])
    return True
