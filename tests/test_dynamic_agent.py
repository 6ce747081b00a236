"""DynPartition's SCHEDULERENV (dynamic/env.py) and DQN agent (dynamic/agent.py): the
observation by hand, gymnasium's checker, the in-order action mapping, the rewards, and the
agent learning an obvious placement (one device 10x faster, free transfers) against random
placement and the all-on-the-fast-device oracle; checkpoints and seeding."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from pipeplan.dynamic import simulator
from pipeplan.dynamic.agent import Agent, Config, evaluate, train, trained_on
from pipeplan.dynamic.simulator import GPU_A100, DeviceSpec, Machine
from pipeplan.dynamic.env import (EMBED_DIM, MAX_NODES, SchedulerEnv, action_of, encode, features, node_mask,
                                  placement_of)
from pipeplan.dynamic.executor import Executor
from pipeplan.dynamic.nets import build_net
from pipeplan.dynamic.trees import Tree, binary_parse_tree, sample_trees
from pipeplan.errors import PipeplanError
from pipeplan.learn.harness import Budget

#: node 0..4 in post-order: leaves 0 and 1 under 2, leaf 3, root 4 over (2, 3)
FIVE = Tree(((), (), (0, 1), (), (2, 3)), (5, 6, -1, 7, -1))
#: leaves 0, 1 under root 2; in-order: 0, 2, 1
THREE = Tree(((), (), (0, 1)), (1, 2, -1))
WIDTH = 32  # a small TreeLSTM: cheap profiles


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fast_machine() -> Machine:
    """Device 0 ("cpu") 10x slower than device 1 at everything; transfers free."""
    fast = DeviceSpec("fast", **GPU_A100)
    slow = DeviceSpec("slow", fast.op_s * 10, fast.flop_rate / 10, fast.element_rate / 10)
    return Machine([slow, fast], np.zeros((2, 2)), np.full((2, 2), np.inf))


def sim_env(normalized: bool = False, trees=0, count: int = 100) -> SchedulerEnv:
    return SchedulerEnv("treelstm", WIDTH, trees, 2, simulate=fast_machine(), normalized=normalized,
                        tree_count=count)


# -- the observation ---------------------------------------------------------------------------

def sinusoid(p: int) -> np.ndarray:
    return np.array([math.sin(p / 10000 ** (2 * (d // 2) / EMBED_DIM)) if d % 2 == 0 else
                     math.cos(p / 10000 ** (2 * (d // 2) / EMBED_DIM)) for d in range(EMBED_DIM)])


def test_encode_by_hand():
    assert FIVE.inorder == (0, 2, 1, 4, 3)
    # per in-order row: position + 1, depth, parent's in-order position + 1 (root 0), is_leaf
    expected = [(1, 2, 2, 1),   # node 0, parent 2 at position 1
                (2, 1, 4, 0),   # node 2, parent 4 at position 3
                (3, 2, 2, 1),   # node 1
                (4, 0, 0, 0),   # node 4, the root
                (5, 1, 4, 1)]   # node 3
    assert features(FIVE).tolist() == [list(r) for r in expected]
    obs = encode(FIVE)
    assert obs.shape == (MAX_NODES, EMBED_DIM) and obs.dtype == np.float32
    for k, row in enumerate(expected):
        np.testing.assert_allclose(obs[k], np.mean([sinusoid(p) for p in row], axis=0), atol=1e-6)
    assert not obs[5:].any()  # padding rows are zero
    assert node_mask(FIVE).tolist() == [True] * 5 + [False] * (MAX_NODES - 5)


def test_large_trees_are_dropped():
    big = binary_parse_tree(70, np.random.default_rng(0))  # 139 nodes
    assert big.n > MAX_NODES
    env = sim_env(trees=[big, FIVE])
    assert env.trees == [FIVE]
    with pytest.raises(PipeplanError):
        encode(big)
    with pytest.raises(PipeplanError):
        sim_env(trees=[big])


# -- the environment ---------------------------------------------------------------------------

@pytest.mark.parametrize("normalized", [False, True])
def test_check_env_passes(normalized):
    env = sim_env(normalized, count=20)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*spec.*")  # not made by gymnasium.make
        check_env(env)
    obs, info = env.reset(seed=3)
    assert obs in env.observation_space and info["mask"].sum() == info["nodes"] == env.trees[info["tree"]].n
    assert env.action_space.nvec.tolist() == [2] * MAX_NODES


def test_action_is_in_order_by_hand():
    env = sim_env(trees=[THREE])
    env.reset(seed=0)
    action = np.zeros(MAX_NODES, dtype=np.int64)
    action[:3] = [1, 0, 1]   # in-order: node 0 -> 1, node 2 (the root) -> 0, node 1 -> 1
    action[3:] = 1           # beyond the tree: ignored
    _, reward, terminated, truncated, info = env.step(action)
    assert info["placement"] == [1, 1, 0] == placement_of(THREE, action)
    assert action_of(THREE, [1, 1, 0])[:3].tolist() == [1, 0, 1]
    assert terminated and not truncated and info["tree"] == 0
    prof = simulator.profile(THREE, "treelstm", WIDTH)
    assert reward == -1e3 * simulator.simulate(prof, [1, 1, 0], fast_machine()) == -info["ms"]
    with pytest.raises(RuntimeError):  # one step per episode
        env.step(action)
    env.reset()
    with pytest.raises(ValueError):
        env.step(np.full(MAX_NODES, 2))


def test_normalized_all_cpu_is_minus_one():
    env = sim_env(normalized=True, count=10)
    for i in range(len(env.trees)):
        env.reset(options={"tree": i})
        _, reward, *_, info = env.step(np.zeros(MAX_NODES, dtype=np.int64))
        assert reward == -1.0 and info["cpu_ms"] == info["ms"]
    env.reset(options={"tree": 0})
    _, reward, *_ = env.step(np.ones(MAX_NODES, dtype=np.int64))
    assert -1.0 < reward < -0.05  # ~ -1/10: everything on the 10x faster device


def test_measured_reward_runs_the_tree():
    trees = sample_trees("mathfunc", 3, seed=1)
    ex = Executor(build_net("mathfunc", 4), ["cpu", "cpu:1"], mode="sequential")
    env = SchedulerEnv("mathfunc", 4, trees, 2, measure=ex, repeats=2)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(env.action_space.sample())
    assert reward == -info["ms"] < 0
    with pytest.raises(PipeplanError):  # device count must match the executor's
        SchedulerEnv("mathfunc", 4, trees, 3, measure=ex)


# -- the agent ---------------------------------------------------------------------------------

EPISODES = 600


@pytest.fixture(scope="module")
def trained():
    env = sim_env()
    cfg = Config(episodes=EPISODES, eval_every=200, eval_trees=16, seed=0)
    threads = torch.get_num_threads()  # set up before the function-scoped one_torch_thread
    torch.set_num_threads(1)
    try:
        return env, train(env, cfg, Budget(seconds=120))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_dqn_learns_the_fast_device(trained):
    env, res = trained
    assert res.episodes == EPISODES == len(res.rewards) == len(res.curve.points)
    assert [e for e, _ in res.evals] == [0, 200, 400, 600]
    placements = res.agent.policy(res.held_out)
    assert np.mean(np.concatenate(placements)) > 0.7  # most nodes on device 1
    rng = np.random.default_rng(0)
    greedy = np.mean([env.forward_ms(t, p) for t, p in zip(res.held_out, placements)])
    random = np.mean([env.forward_ms(t, rng.integers(2, size=t.n)) for t in res.held_out])
    # the oracle by hand: everything on the fast device, one part after another
    fast = fast_machine().devices[1]
    oracle = np.mean([1e3 * sum(fast.seconds(*row) for row in np.vstack([p.state, p.output]))
                      for p in (simulator.profile(t, "treelstm", WIDTH) for t in res.held_out)])
    assert oracle == pytest.approx(np.mean([env.forward_ms(t, [1] * t.n) for t in res.held_out]))
    assert greedy < 0.5 * random and greedy < 2.5 * oracle
    assert res.evals[-1][1] == pytest.approx(-greedy) and res.evals[-1][1] > res.evals[0][1]
    assert np.mean(res.rewards[-100:]) > np.mean(res.rewards[:100])


def test_checkpoint_round_trip(trained, tmp_path):
    env, res = trained
    path = res.agent.save(str(tmp_path / "dp.pt"), trained_on(env))
    again = Agent.load(path)
    assert again.config == res.agent.config and again.devices == 2
    assert again.policy(res.held_out) == res.agent.policy(res.held_out)
    assert evaluate(again, env, res.held_out) == evaluate(res.agent, env, res.held_out)
    torch.save({"agent": "drlpp"}, tmp_path / "other.pt")
    with pytest.raises(PipeplanError):
        Agent.load(str(tmp_path / "other.pt"))


def test_seed_repeats_and_budget_stops():
    cfg = Config(episodes=80, eval_every=40, eval_trees=4, seed=5)
    a, b = (train(sim_env(count=20), cfg, Budget(seconds=60)) for _ in range(2))
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert a.evals == b.evals
    for x, y in zip(a.agent.q.state_dict().values(), b.agent.q.state_dict().values()):
        assert torch.equal(x, y)
    c = train(sim_env(count=20), Config(episodes=80, eval_every=0, seed=6), Budget(seconds=60))
    assert not np.array_equal(a.rewards, c.rewards) and c.evals == []
    seen = []
    d = train(sim_env(count=20), Config(episodes=1000, eval_every=0), Budget(evaluations=25),
              progress=lambda point, frac: seen.append((point.step, frac)))
    assert d.episodes == 25 and seen[-1] == (25, 1.0)


@pytest.mark.parametrize("held_out_by", ["the caller", "the agent"])
def test_learning_curve_figure_has_no_empty_axes(held_out_by):
    """``dynamic train`` evaluates on the bench's held-out trees (``eval_fn``); either way the
    figure's every panel draws data (the best held-out mean is recorded)."""
    env = sim_env(count=20)
    held = sample_trees("treelstm", 4, 99)
    eval_fn = (lambda agent: evaluate(agent, env, held)) if held_out_by == "the caller" else None
    res = train(env, Config(episodes=30, eval_every=10, eval_trees=4), Budget(evaluations=30), eval_fn=eval_fn)
    best = [p.best_iteration_s for p in res.curve.points]
    assert np.isfinite(best).all() and best[-1] == min(best)
    fig = res.curve.figure("t")
    assert len(fig.axes) == 2 and all(ax.has_data() for ax in fig.axes)


def test_curve_without_best_times_draws_one_panel():
    from pipeplan.learn.harness import Curve, Point

    curve = Curve()
    curve.add(Point(1, 0.1, 1, -1.0, -2.0, float("nan")))
    fig = curve.figure("t")
    assert len(fig.axes) == 1 and fig.axes[0].has_data()
