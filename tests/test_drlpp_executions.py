"""DRL-PP's full action space: the execution (schedule and replica mode) chosen with the plan,
by the agent and by the search baselines over the same space (issue: split replicas and
schedule choice). Oracles: the simulator run on each candidate's plan, and a runner that
pays for one execution only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeplan.cluster import load_cluster
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.learn.env import RuntimeScorer
from pipeplan.learn.harness import Budget
from pipeplan.learn.scoring import Scorer
from pipeplan.learn.search import random_search, simulated_annealing
from pipeplan.learn.scoring import SYNCHRONOUS, executions
from pipeplan.planners.drlpp.ppo import Config, Instance, new_agent, sample_schemes, train
from pipeplan.sim import simulate


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny networks: one intra-op thread (extra threads only contend on a shared machine, many
    times the CPU), and the same training whatever thread count an earlier test left."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _case() -> tuple[Graph, object]:
    graph = Graph.chain("six", fwd=[1.0, 3.0, 2.0, 1.0, 4.0, 1.0], bwd=[2.0, 6.0, 4.0, 2.0, 8.0, 2.0],
                        params=[1e6] * 6, act=[3e6, 1e6, 2e6, 5e6, 1e6, 1e6])
    return graph, load_cluster("hier:servers=2,gpus=2,intra=10Gbps,inter=1Gbps")


def test_each_execution_scores_as_the_simulator_runs_its_plan():
    graph, cluster = _case()
    scorer = Scorer(graph, cluster, 4, "1f1b", executions=SYNCHRONOUS)
    parts = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 1, 1, 2, 2, 2]])
    devices = np.array([[0, 0, 1, 1], [0, 0, 0, 0], [0, 1, 2, 2]])
    times = []
    for e, (schedule, replicas) in enumerate(SYNCHRONOUS):
        res = scorer.score(parts, devices, np.full(len(parts), e))
        for b in range(len(parts)):
            plan = scorer.plan(parts[b], devices[b], e)
            assert (plan.schedule, plan.replicas) == (schedule, replicas)
            assert res.iteration_s[b] == pytest.approx(simulate(plan, timeline=False).iteration_s, rel=1e-9)
        times.append(res.iteration_s)
    assert len({tuple(np.round(t, 12)) for t in times}) > 2  # the choice matters here
    mixed = scorer.score(parts, devices, np.array([0, 3, 5]))
    assert list(mixed.iteration_s) == [times[0][0], times[3][1], times[5][2]]


@pytest.mark.parametrize("search", [random_search, simulated_annealing])
def test_the_searches_choose_the_execution_too(search):
    graph, cluster = _case()
    scorer = Scorer(graph, cluster, 4, "1f1b", executions=SYNCHRONOUS)
    res = search(scorer, graph, len(cluster), Budget(evaluations=300), np.random.default_rng(0))
    plan = scorer.plan(res.part, res.device_part, res.execution)
    assert res.iteration_s == pytest.approx(simulate(plan, timeline=False).iteration_s, rel=1e-9)
    best_any = min(float(scorer.score(res.part, res.device_part, np.array([e])).iteration_s[0])
                   for e in range(len(SYNCHRONOUS)))
    assert res.iteration_s == pytest.approx(best_any, rel=1e-9)  # 300 plans: its plan's best execution


@pytest.mark.slow  # 400 plans scored: a few seconds
def test_the_agent_learns_the_execution_that_pays():
    """A runner makes every plan 5x slower unless it runs zb-h1 with split replicas: training
    raises the policy's share of that execution well above its untrained share."""
    graph, cluster = _case()
    favoured = SYNCHRONOUS.index(("zb-h1", "split"))

    def runner(plan) -> float:
        slow = 1.0 if (plan.schedule, plan.replicas) == SYNCHRONOUS[favoured] else 5.0
        return simulate(plan, timeline=False).iteration_s * slow

    inst = Instance(graph, cluster, RuntimeScorer(graph, cluster, 4, runner, executions=SYNCHRONOUS))
    agent = new_agent(Config(seed=0), len(cluster))

    def share() -> float:
        schemes = sample_schemes(agent, inst, 16, torch.Generator().manual_seed(1))
        return float(np.mean([e == favoured for s in schemes for e in s.executions]))

    before = share()
    best, _ = train(agent, inst, Budget(evaluations=400))
    assert best.execution == favoured
    assert share() > before + 0.25


def test_what_the_agent_may_choose():
    assert executions(None, None) == SYNCHRONOUS and ("async-1f1b", "split") not in SYNCHRONOUS
    assert executions("1f1b", None) == (("1f1b", "round-robin"), ("1f1b", "split"))
    assert executions("async-1f1b", "round-robin") == (("async-1f1b", "round-robin"),)
    assert executions(None, "split") == tuple(e for e in SYNCHRONOUS if e[1] == "split")
    with pytest.raises(PipeplanError, match="schedule 'zb-v' is not one it can choose"):
        executions("zb-v", None)
