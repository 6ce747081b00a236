"""Tests that catch a broken learning planner, each fast: PPO's clipped objective against a
hand computation (a lost clip, ``min`` turned ``max``), one PPO update moving probability
towards what scored above the baseline (the advantage's sign), DRL-PP's reward against the
simulator's iteration time (the reward's sign), and the shipped Auto-MAP checkpoint against
random weights and an equal-compute rule on fixed instances (a checkpoint that learned
nothing)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeplan.cluster import load_cluster
from pipeplan.graph import Graph
from pipeplan.learn.scoring import SYNCHRONOUS, Scorer
from pipeplan.planners.drlpp.ppo import (Config, Instance, _clipped, action_logp, new_agent, ppo_update, replay,
                                         sample_schemes)
from pipeplan.sim import simulate


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny networks: one intra-op thread (extra threads only contend on a shared machine, several
    times the CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_clipped_objective_is_ppos():
    """L = -mean(min(r A, clip(r, 1-e, 1+e) A)), r = exp(new - old) (Schulman et al. 2017,
    Eq. 7), worked by hand for e = 0.2: r = 1.5 with A = 2 is clipped to 1.2 (2.4, not 3);
    r = 0.5 with A = -1 is clipped to 0.8 (-0.8, not -0.5); r = 1.1 with A = 1 is inside the
    clip (1.1); r = 0.5 with A = 3 takes the unclipped, smaller 1.5."""
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.5], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0, 1.0, 3.0], dtype=torch.float64)
    old = torch.zeros(4, dtype=torch.float64)
    loss = _clipped(torch.log(ratios), old, adv, 0.2)
    assert float(loss) == pytest.approx(-(2.4 - 0.8 + 1.1 + 1.5) / 4, rel=1e-12)


def _instance(executions=None) -> tuple[Instance, Graph]:
    graph = Graph.chain("six", fwd=[1.0, 3.0, 2.0, 1.0, 4.0, 1.0], bwd=[2.0, 6.0, 4.0, 2.0, 8.0, 2.0],
                        params=[1e6] * 6, act=[3e6, 1e6, 2e6, 5e6, 1e6, 1e6])
    cluster = load_cluster("hier:servers=1,gpus=4,intra=10Gbps,inter=10Gbps")
    return Instance(graph, cluster, Scorer(graph, cluster, 4, "1f1b", executions=executions)), graph


def test_one_update_moves_probability_towards_what_scored_above_the_baseline():
    """Rewards set by hand (one scheme's placements +1, every other's -1, baseline 0): one
    PPO update raises the advantage-weighted log-probability of what was sampled,
    sum A log pi over Algorithm 1's steps (each with its scheme's advantage) and over the
    placements with their executions: the direction PPO ascends, which a flipped advantage
    would descend."""
    inst, _ = _instance(SYNCHRONOUS)
    agent = new_agent(Config(epochs=1, learning_rate=1e-2, entropy_coef=0.0, temperature=-2.0, seed=3), 4)
    schemes = sample_schemes(agent, inst, 4, torch.Generator().manual_seed(0))
    for i, s in enumerate(schemes):
        s.rewards = [1.0 if i == 0 else -1.0] * len(s.placements)
        s.valid = [True] * len(s.placements)
    adv = torch.tensor([s.reward for s in schemes], dtype=torch.float64)

    def weighted_logp() -> float:
        with torch.no_grad():
            h = agent.encoder(inst.x, inst.adj)
            steps, _, owner = replay(agent, h, [s.trajectory for s in schemes])
            places = [action_logp(agent, h, inst, s)[0].sum() for s in schemes]
        return float((adv[owner] * steps.double()).sum() + (adv * torch.stack(places).double()).sum())

    before = weighted_logp()
    ppo_update(agent, torch.optim.Adam(agent.parameters(), lr=agent.cfg.learning_rate), inst, schemes)
    assert weighted_logp() > before


def test_drl_pps_reward_is_minus_the_log_of_the_simulated_iteration():
    """Eq. 2: r = -ln(iteration time), the iteration time from the simulator run on the
    candidate's plan (not the batched evaluator the scorer uses): faster plans score higher."""
    inst, graph = _instance()
    rng = np.random.default_rng(0)
    parts = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
    devices = np.array([rng.permutation([0, 0, 1, 1]) for _ in parts])
    scores = inst.scorer.score(parts, devices)
    sims = [simulate(inst.scorer.plan(p, d)).iteration_s for p, d in zip(parts, devices)]
    assert np.allclose(scores.reward, [-math.log(t) for t in sims], rtol=1e-9)
    assert list(np.argsort(-scores.reward)) == list(np.argsort(sims))


# -- the shipped Auto-MAP checkpoint ------------------------------------------------------------

def test_the_shipped_checkpoint_beats_random_weights_and_the_equal_compute_rule():
    """On 12 fixed instances (zoo models and generated arrays, 2-32 devices), at the
    planner's default beam: the geometric mean of the shipped agent's iteration over the rule's
    is below 1, and random weights of the same network are far worse than the agent."""
    from pipeplan.learn.dqn import q_network
    from pipeplan.planners.automap import InferOptions
    from pipeplan.planners.automap.infer import POINTS, InferEnv, beam, config, load_agent
    from pipeplan.planners.automap.training_data import generated, zoo_instance
    from pipeplan.planners.automap.policy import torch_policy

    torch.manual_seed(0)
    shipped, random = load_agent(), torch_policy(q_network(InferEnv.OBS, POINTS, config()), config().gamma)
    width, ours, theirs, rule = InferOptions.beam, [], [], []
    for seed in range(12):
        rng = np.random.default_rng(1000 + seed)
        inst = generated(rng) if seed % 2 else zoo_instance(rng)
        ours.append(beam(shipped, InferEnv(), inst, width).value)
        theirs.append(beam(random, InferEnv(), inst, width).value)
        rule.append(inst.equal_compute())
    ours, theirs, rule = map(np.array, (ours, theirs, rule))
    assert np.exp(np.mean(np.log(ours / rule))) < 1.0
    assert np.exp(np.mean(np.log(theirs / ours))) > 1.5
