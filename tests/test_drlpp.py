"""DRL-PP (drl-pp.txt): the GCN layer against a hand computation, Algorithm 1's partitions on
random DAGs, the scheduler's column-wise softmax and invalid placements, the batched replay
against the sampled walk, and a short PPO run that reaches a brute-forced optimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.cluster import load_cluster
from pipeplan.graph import Graph
from pipeplan.learn.gcn import GConv, mean_adjacency
from pipeplan.learn.harness import Budget
from pipeplan.learn.partition import PartitionState
from pipeplan.learn.scoring import Scorer
from pipeplan.planners.drlpp.ppo import (Config, Instance, new_agent, placement_logits, replay,
                                         sample_schemes, train, walk)
from pipeplan.sim import simulate

TWO = "hier:servers=1,gpus=2,intra=10Gbps,inter=10Gbps"


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny networks: one intra-op thread (extra threads only contend on a shared machine), and
    the same PPO trajectories whatever thread count an earlier test in this process left."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_gconv_matches_a_hand_computation():
    """Path a - b - c; X = [[1,0],[0,1],[1,1]], Theta = [1,-3]^T, Theta' = [2,1]^T.
    X Theta = [1,-3,-2] -> ReLU [1,0,0]; X Theta' = [2,1,3], averaged over each node and its
    neighbours (self-loops): a (2+1)/2 = 1.5, b (2+1+3)/3 = 2, c (1+3)/2 = 2."""
    layer = GConv(2, 2)
    with torch.no_grad():
        layer.self_weight.weight.copy_(torch.tensor([[1.0, -3.0]]))
        layer.neighbour_weight.weight.copy_(torch.tensor([[2.0, 1.0]]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    adj = torch.tensor([[0.0, 1, 0], [1, 0, 1], [0, 1, 0]])
    out = layer(x, mean_adjacency(adj))
    assert torch.allclose(out, torch.tensor([[1.0, 1.5], [0.0, 2.0], [0.0, 2.0]]))


def _dag(n: int, edges: list[tuple[int, int]]) -> Graph:
    g = Graph.chain("dag", [1e-3] * n, [2e-3] * n, params=[1e6] * n, act=[1e5] * n)
    g = Graph(name="dag", ids=g.ids, fwd=g.fwd, bwd=g.bwd, params=g.params, act=g.act, flops=g.flops,
              desc=["Conv2d"] * n, edges=sorted(set(edges)))
    return g


@st.composite
def dags(draw):
    n = draw(st.integers(2, 10))
    pairs = [(u, v) for v in range(n) for u in range(v)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=2 * n)) if pairs else []
    return _dag(n, edges), draw(st.integers(1, 5)), draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None)
@given(dags())
def test_algorithm_1_emits_valid_partitions_and_replay_agrees(case):
    """Every node in exactly one partition, at most K = devices partitions, no edge from a
    later partition to an earlier one (the stage graph is acyclic); the batched replay gives
    the sampled walk's log-probabilities."""
    graph, devices, seed = case
    cluster = load_cluster(f"hier:servers=1,gpus={devices},intra=10Gbps,inter=10Gbps")
    agent = new_agent(Config(seed=seed % 7, temperature=0.0), devices)
    inst = Instance(graph, cluster, Scorer(graph, cluster, 2, "1f1b"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        h = agent.encoder(inst.x, inst.adj)
        trajs = []
        for _ in range(3):
            state = inst.state()
            traj, logp = walk(agent, h, state, gen)
            trajs.append((traj, logp))
            k = state.num_partitions
            assert (state.part >= 0).all() and 1 <= k <= devices
            assert sorted(np.unique(state.part)) == list(range(k))
            assert all(state.part[u] <= state.part[v] for u, v in graph.edges)
            assert sorted(u for o in traj.orders for u in o) == list(range(len(graph)))
        steps, _, owner = replay(agent, h, [t for t, _ in trajs])
    per_traj = np.zeros(3)
    np.add.at(per_traj, owner.numpy(), steps.numpy())
    assert per_traj == pytest.approx([lp for _, lp in trajs], abs=1e-5)  # float32 rounding: ~3e-7


def test_scheduler_softmax_is_per_accelerator_and_invalid_placements_are_penalized():
    """Fig. 4b: each accelerator's probabilities over partitions sum to 1; a placement that
    leaves a partition without an accelerator is scored with the penalty (§3.3)."""
    graph = _dag(6, [(i, i + 1) for i in range(5)])
    cluster = load_cluster("hier:servers=1,gpus=4,intra=10Gbps,inter=10Gbps")
    agent = new_agent(Config(temperature=-5.0, placements_per_scheme=8, resample_rounds=1), 4)  # many cuts
    inst = Instance(graph, cluster, Scorer(graph, cluster, 2, "1f1b"))
    part = np.array([0, 0, 1, 1, 2, 3])
    with torch.no_grad():
        logits = placement_logits(agent, agent.encoder(inst.x, inst.adj), part)
    assert logits.shape == (4, 4)
    assert torch.allclose(logits.exp().sum(dim=1), torch.ones(4))
    schemes = sample_schemes(agent, inst, 6, torch.Generator().manual_seed(0))
    seen_invalid = False
    for s in schemes:
        k = int(s.part.max()) + 1
        for p, ok, r in zip(s.placements, s.valid, s.rewards):
            assert ok == set(range(k)).issubset(set(p.tolist()))
            if not ok:
                seen_invalid = True
                assert r == inst.scorer.infeasible_reward
    assert seen_invalid


def _all_plans(graph: Graph, devices: int):
    """Every complete plan of the action space, by depth-first search."""
    out = []

    def dfs(actions):
        state = PartitionState(graph, devices)
        for a in actions:
            state.step(a)
        if state.done:
            out.append((state.part.copy(), state.device_part.copy()))
            return
        for a in np.flatnonzero(state.mask()):
            dfs(actions + [int(a)])
    dfs([])
    return out


@pytest.mark.slow
def test_a_short_ppo_run_reaches_the_brute_forced_optimum():
    """Six layers with heavy weights and light activations on two devices: data parallelism
    all-reduces ~100 MB, so the optimum is a two-stage pipeline cut in the middle, found by
    enumerating every plan and simulating it. After training, most sampled plans are it.
    (1,500 plans: seeds 0-5 all sample the optimum at >= 87 % then; a flipped advantage, 0 %.)"""
    graph = Graph.chain("six", [4e-3, 2e-3, 2e-3, 2e-3, 2e-3, 4e-3], [8e-3, 4e-3, 4e-3, 4e-3, 4e-3, 8e-3],
                        params=[2e7] * 6, act=[1e4] * 6)
    cluster = load_cluster(TWO)
    scorer = Scorer(graph, cluster, 4, "1f1b")
    times = [simulate(scorer.plan(p, d), timeline=False) for p, d in _all_plans(graph, 2)]
    optimum = min(r.iteration_s for r in times if not r.over_memory)
    agent = new_agent(Config(seed=0, schemes_per_update=8), 2)
    inst = Instance(graph, cluster, scorer)
    best, curve = train(agent, inst, Budget(evaluations=1500))
    assert best.iteration_s == pytest.approx(optimum, rel=1e-9)
    schemes = sample_schemes(agent, inst, 16, torch.Generator().manual_seed(1))
    found = [t for s in schemes for t, ok in zip(s.times, s.valid) if ok]
    assert np.mean(np.isclose(found, optimum, rtol=1e-9)) >= 0.75, (optimum, sorted(found)[:8])
    assert curve.points[-1].mean_reward > curve.points[0].mean_reward


def test_measured_training_optimizes_what_the_runner_measures():
    """DRL-PP §3.4 on measured rewards: with a runner (here the simulator's time made 20x
    slower for any plan that runs a partition on device 0 alone, a cost the simulator does not
    see), every reward is -ln of what the runner returned, each distinct plan is run once, and
    the best plan is the runner's best among those scored, not the simulator's."""
    from pipeplan.learn.harness import Budget
    from pipeplan.planners import PlanOptions
    from pipeplan.planners.drlpp.run import train_agent

    graph = _dag(6, [(i, i + 1) for i in range(5)])
    cluster = load_cluster("hier:servers=1,gpus=3,intra=10Gbps,inter=10Gbps")
    runs: list[float] = []

    def runner(plan) -> float:
        alone = any(st.devices == [cluster.names[0]] for st in plan.stages)
        runs.append(simulate(plan, timeline=False).iteration_s * (20.0 if alone else 1.0))
        return runs[-1]

    trained = train_agent(graph, cluster, PlanOptions(microbatches=4), Budget(evaluations=96), seed=1, runner=runner)
    info = trained.checkpoint["trained_on"]
    assert info["rewards"] == "measured" and info["runs"] == len(runs) <= info["evaluations"]
    assert trained.best.iteration_s == pytest.approx(min(runs), rel=1e-12)  # ties across executions
    assert not any(st.devices == [cluster.names[0]] for st in trained.plan.stages)
