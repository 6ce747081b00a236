"""The gymnasium environments (learn/env.py): gymnasium's checker, masked random rollouts
against the simulator, a brute-force oracle, invalid actions, and the measured variant."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from conftest import profile_path
from pipeplan.cluster import Cluster, hierarchical, load_cluster
from pipeplan.graph import Graph, load_graph
from pipeplan.learn.env import MeasuredPartitionEnv, PartitionEnv, RuntimeScorer, plan_key
from pipeplan.plan import Plan, Stage
from pipeplan.sim import simulate


def rollout(env: gymnasium.Env, rng: np.random.Generator, seed: int | None = None) -> tuple[float, dict, list[int]]:
    """One episode of uniformly random valid actions; returns the final reward, info, actions."""
    base = env.unwrapped
    obs, _ = env.reset(seed=seed)
    actions = []
    for _ in range(2 * base.max_nodes + 2 * base.max_devices + 2):  # far more than any episode takes
        assert obs in base.observation_space
        mask = obs["action_mask"].astype(bool)
        assert (mask == base.action_masks()).all() and mask.any()
        assert not mask[base.nodes:base.max_nodes].any()  # padding: never valid
        assert not mask[base.max_nodes + 1 + base.devices:].any()
        a = int(rng.choice(np.flatnonzero(mask)))
        obs, reward, terminated, truncated, info = env.step(a)
        actions.append(a)
        assert not truncated
        if terminated:
            assert obs["phase"] == 2 and not obs["action_mask"].any()
            return reward, info, actions
        assert reward == 0.0 and info == {}
    raise AssertionError("the episode did not end")


# -- gymnasium's checker ---------------------------------------------------------------------

@pytest.mark.parametrize("pad", [None, (12, 6)])
def test_check_env_accepts_the_env(pad):
    kwargs = {} if pad is None else {"max_nodes": pad[0], "max_devices": pad[1]}
    env = gymnasium.make("pipeplan/Partition-v0", graph=load_graph("zoo:alexnet"), cluster=load_cluster("drlpp-4gpu"),
                         microbatches=4, **kwargs)
    check_env(env.unwrapped)
    base = env.unwrapped
    assert isinstance(base, PartitionEnv)
    assert base.action_space.n == base.max_nodes + 1 + base.max_devices
    assert base.observation_space["node_features"].shape[0] == base.max_nodes == (pad[0] if pad else 8)


def test_registration_is_idempotent():
    import pipeplan.learn.env as env_module

    env_module.register_envs()  # a second time: no error, no duplicate
    assert "pipeplan/Partition-v0" in gymnasium.registry
    assert gymnasium.spec("pipeplan/MeasuredPartition-v0").nondeterministic


# -- random masked rollouts against the simulator --------------------------------------------

def _graph(name: str) -> Graph:
    return load_graph(name) if name.startswith("zoo:") else load_graph(str(profile_path(name)))


@pytest.mark.parametrize("model,cluster,pad", [("zoo:alexnet", "drlpp-4gpu", 0), ("alexnet", "drlpp-4gpu", 0),
                                               ("gnmt", "1080ti-4x2", 0), ("alexnet", "v100x4", 5)])
def test_random_rollouts_build_valid_plans_scored_as_simulate(model, cluster, pad):
    g, c = _graph(model), load_cluster(cluster)
    env = gymnasium.make("pipeplan/Partition-v0", graph=g, cluster=c, microbatches=8,
                         max_nodes=len(g) + pad, max_devices=len(c) + pad // 2)
    scorer = env.unwrapped.scorer
    rng = np.random.default_rng(7)
    fitted = 0
    for episode in range(12):
        reward, info, _ = rollout(env, rng, seed=episode)
        part, device_part = info["part"], info["device_part"]
        k = info["num_partitions"]
        assert (part >= 0).all() and set(part.tolist()) == set(range(k)) and 1 <= k <= len(c)
        assert all(part[u] <= part[v] for u, v in g.edges)  # no edge runs back
        assert set(device_part.tolist()) == set(range(k))  # every partition has a device
        sim = simulate(scorer.plan(part, device_part), timeline=False)
        assert info["iteration_s"] == pytest.approx(sim.iteration_s, rel=1e-9)
        if info["fits"]:
            fitted += 1
            assert not sim.over_memory
            assert reward == pytest.approx(-math.log(sim.iteration_s), rel=1e-9)
        else:
            assert reward < -math.log(sim.iteration_s)  # the overflow penalty
    assert fitted > 0


def test_a_single_device_episode_is_just_the_placement():
    g = Graph.chain("c3", [1.0, 2.0, 1.0], [2.0, 4.0, 2.0])
    env = PartitionEnv(g, hierarchical("one", 1, 1, 1e9, 1e9), microbatches=2)
    obs, _ = env.reset()
    assert obs["phase"] == 1 and np.flatnonzero(obs["action_mask"]).tolist() == [env.max_nodes + 1]
    _, reward, terminated, _, info = env.step(env.max_nodes + 1)
    assert terminated and (info["part"] == 0).all() and info["device_part"].tolist() == [0]
    assert reward == pytest.approx(-math.log(simulate(env.plan(), timeline=False).iteration_s))


# -- a brute-force oracle ----------------------------------------------------------------------

def _every_episode(env: PartitionEnv) -> list[tuple[float, tuple]]:
    """(reward, plan key) at the end of every action sequence the masks allow."""
    done = []

    def walk(prefix: list[int]) -> None:
        env.reset()
        for a in prefix:
            _, reward, terminated, _, info = env.step(a)
        if prefix and terminated:
            done.append((reward, plan_key(env.plan())))
            return
        for a in np.flatnonzero(env.action_masks()):
            walk(prefix + [int(a)])

    walk([])
    return done


def _every_plan(g: Graph, c: Cluster, m: int) -> dict[tuple, float]:
    """-ln(simulated iteration time) of every contiguous split of the chain into at most
    len(c) stages, with every assignment of devices that gives each stage at least one."""
    out = {}
    for k in range(1, len(c) + 1):
        for cuts in itertools.combinations(range(1, len(g)), k - 1):
            bounds = (0, *cuts, len(g))
            for owner in itertools.product(range(k), repeat=len(c)):
                if set(owner) != set(range(k)):
                    continue
                stages = [Stage(g.ids[a:b], [c.names[d] for d in range(len(c)) if owner[d] == s])
                          for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
                plan = Plan(g, c, stages, m, schedule="1f1b", optimizer="adam", replicas="round-robin")
                sim = simulate(plan, timeline=False)
                assert not sim.over_memory
                out[plan_key(plan)] = -math.log(sim.iteration_s)
    return out


@pytest.mark.parametrize("devices", [2, 3])
def test_brute_force_best_episode_is_the_best_plan(devices):
    g = Graph.chain("tiny", fwd=[1e-3, 4e-3, 2e-3, 3e-3], bwd=[2e-3, 8e-3, 4e-3, 6e-3],
                    params=[4e6, 1e6, 2e7, 1e6], act=[4e6, 1e7, 2e5, 1e6])
    c = hierarchical("pair", 1, devices, 1e9, 1e9, speed=1.0)
    c = replace(c, devices=[replace(d, speed=1.0 + i) for i, d in enumerate(c.devices)])  # unequal devices
    env = PartitionEnv(g, c, microbatches=4, max_nodes=5, max_devices=devices + 1)
    episodes = _every_episode(env)
    oracle = _every_plan(g, c, 4)
    assert {key for _, key in episodes} == set(oracle)  # the env reaches exactly the valid plans
    for reward, key in episodes:
        assert reward == pytest.approx(oracle[key], rel=1e-9)
    assert max(r for r, _ in episodes) == pytest.approx(max(oracle.values()), rel=1e-9)


# -- invalid actions -----------------------------------------------------------------------------

def _env(**kwargs) -> PartitionEnv:
    return PartitionEnv(load_graph("zoo:alexnet"), load_cluster("drlpp-4gpu"), microbatches=4, max_nodes=10, **kwargs)


@pytest.mark.parametrize("action", [10, 3, 12, 10**6, -1, 2.5, "cut"])  # cut first, a non-candidate, padding, ...
def test_an_invalid_action_ends_the_episode_with_the_infeasible_reward(action):
    env = _env()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated
    assert reward == env.scorer.infeasible_reward and info["fits"] is False and info["iteration_s"] == math.inf
    assert info["invalid_action"] == action and obs["phase"] == 2 and not obs["action_mask"].any()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)
    env.reset()
    assert env.step(0)[2] is False  # a fresh episode


def test_invalid_action_raise_mode_refuses_and_keeps_the_state():
    env = _env(invalid_action="raise")
    env.reset()
    with pytest.raises(ValueError, match="not valid now"):
        env.step(env.max_nodes)  # cut before any node
    obs, *_ = env.step(0)
    assert obs["node_partition"][0] == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="invalid_action"):
        _env(invalid_action="ignore")
    with pytest.raises(ValueError, match="smaller than"):
        PartitionEnv(load_graph("zoo:alexnet"), load_cluster("drlpp-4gpu"), microbatches=4, max_nodes=4)


# -- the measured variant ------------------------------------------------------------------------

def test_runtime_scorer_caches_and_skips_what_cannot_run():
    g = Graph.chain("c4", [1e-3] * 4, [2e-3] * 4, params=[1e6] * 4, act=[1e5] * 4)
    calls = []

    def runner(plan: Plan) -> float:
        calls.append(plan_key(plan))
        return 0.01 * len(calls)

    scorer = RuntimeScorer(g, hierarchical("h", 1, 2, 1e9, 1e9), 4, runner)
    a = (np.array([0, 0, 1, 1]), np.array([0, 1]))
    b = (np.array([0, 0, 0, 1]), np.array([1, 0]))
    first = scorer.score(*a)
    assert first.reward[0] == pytest.approx(-math.log(0.01)) and first.fits[0]
    again = scorer.score(np.stack([a[0], b[0], a[0]]), np.stack([a[1], b[1], a[1]]))
    assert again.iteration_s.tolist() == [0.01, 0.02, 0.01]
    assert scorer.measured == 2 and len(calls) == 2 and scorer.evaluations == 4
    tight = RuntimeScorer(g, hierarchical("h", 1, 2, 1e9, 1e9, memory=1e5), 4, runner)
    over = tight.score(*a)  # over memory by the cost model: not run
    assert not over.fits[0] and over.reward[0] == tight.infeasible_reward and over.iteration_s[0] == math.inf
    assert tight.measured == 0 and len(calls) == 2


def test_measured_env_passes_the_checker_with_a_stand_in_runtime():
    g = Graph.chain("c4", [1e-3] * 4, [2e-3] * 4, params=[1e6] * 4, act=[1e5] * 4)
    c = hierarchical("h", 1, 2, 1e9, 1e9)
    scorer = RuntimeScorer(g, c, 4, lambda plan: 0.5)
    env = gymnasium.make("pipeplan/MeasuredPartition-v0", graph=None, cluster=c, microbatches=4,
                         scorer=scorer)
    check_env(env.unwrapped)
    reward, info, _ = rollout(env, np.random.default_rng(0))
    assert reward == pytest.approx(-math.log(0.5)) and info["iteration_s"] == 0.5


@pytest.mark.slow
def test_measured_env_runs_the_plan_once_per_distinct_plan():
    from pipeplan.runtime.measure import plan_runner
    from pipeplan.runtime.profiler import profile_model

    g = profile_model("example:mlp", warmup=1, reps=3)
    c = hierarchical("local", 1, 2, 1e9, 1e9)  # two CPU worker processes, as in test_runtime
    env = gymnasium.make("pipeplan/MeasuredPartition-v0", graph=g, cluster=c, microbatches=4,
                         runner=plan_runner("example:mlp", steps=2, warmup=1, timeout_s=120))
    base = env.unwrapped
    assert isinstance(base, MeasuredPartitionEnv)
    reward, info, actions = rollout(env, np.random.default_rng(3), seed=0)
    assert math.isfinite(reward) and info["fits"] and info["iteration_s"] > 0
    assert reward == pytest.approx(-math.log(info["iteration_s"]))
    assert base.scorer.measured == 1
    again = base.scorer.score(info["part"], info["device_part"])  # the same plan: from the cache
    assert again.reward[0] == reward and base.scorer.measured == 1 and base.scorer.evaluations == 2
    env.reset()
    for a in actions:  # the same episode again
        _, replayed, *_ = env.step(a)
    assert replayed == reward and base.scorer.measured == 1
