"""The search baselines (pipeplan.learn.search): random search and simulated annealing over
the learning planners' action space, checked against an exhaustive oracle."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from pipeplan.cluster import load_cluster
from pipeplan.graph import Graph, load_graph
from pipeplan.learn.harness import Budget
from pipeplan.learn.partition import Ancestors, PartitionState
from pipeplan.learn.scoring import Scorer
from pipeplan.learn.search import SearchResult, _Space, _Walk, random_search, simulated_annealing
from pipeplan.sim import simulate

from conftest import PROFILES, profile_path
from randomplans import random_graph

SEARCHES = [random_search, simulated_annealing]


def annealing_one_at_a_time(*args, **kw) -> SearchResult:
    """Annealing from one random plan, one neighbour per batch: the optimum must be reached by moves."""
    return simulated_annealing(*args, neighbours=1, **kw)


HIER2 = "hier:servers=1,gpus=2,intra=128Gbps,inter=50Gbps"
HIER3 = "hier:servers=1,gpus=3,intra=128Gbps,inter=50Gbps"


def chain4() -> Graph:
    return Graph.chain("chain4", fwd=[1e-3, 3e-3, 2e-3, 1e-3], bwd=[2e-3, 6e-3, 4e-3, 2e-3],
                       params=[4e8, 1e8, 2e8, 8e8], act=[4e6, 2e6, 1e6, 1e5])


def diamond() -> Graph:
    """0 -> {1, 2} -> 3 -> 4: a branch, so partitions need not be contiguous in node order."""
    return Graph(name="diamond", ids=[f"n{u}" for u in range(5)], fwd=[1e-3, 2e-3, 3e-3, 2e-3, 1e-3],
                 bwd=[2e-3, 4e-3, 6e-3, 4e-3, 2e-3], params=[1e6] * 5, act=[2e6, 1e6, 1e6, 2e6, 1e5],
                 flops=[float("nan")] * 5, desc=[""] * 5, edges=[(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)])


def all_plans(graph: Graph, devices: int) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every complete plan, by depth-first search over PartitionState's valid actions."""
    anc, plans = Ancestors(graph), set()

    def dfs(prefix: list[int]) -> None:
        state = PartitionState(graph, devices, anc)
        for a in prefix:
            state.step(a)
        if state.done:
            plans.add((tuple(state.part.tolist()), tuple(state.device_part.tolist())))
            return
        for a in np.flatnonzero(state.mask()):
            dfs(prefix + [int(a)])

    dfs([])
    return plans


def check_valid(graph: Graph, devices: int, res: SearchResult) -> None:
    part, dp = res.part, res.device_part
    assert part.shape == (len(graph),) and dp.shape == (devices,)
    k = int(part.max()) + 1
    assert part.min() >= 0 and set(part.tolist()) == set(range(k))  # every node in one partition
    assert all(part[u] <= part[v] for u, v in graph.edges)  # edges never go backward
    assert set(dp.tolist()) == set(range(k))  # every partition has a device


@functools.lru_cache(maxsize=None)
def oracle(make, spec: str, devices: int) -> dict:
    """Every plan's iteration time by ``simulate`` (not by the batched scorer)."""
    graph, cluster = make(), load_cluster(spec)
    scorer = Scorer(graph, cluster, 4, "1f1b")
    return {p: simulate(scorer.plan(np.array(p[0]), np.array(p[1])), timeline=False).iteration_s
            for p in all_plans(graph, devices)}


@pytest.mark.parametrize("make, spec, devices", [(chain4, HIER2, 2), (diamond, HIER3, 3)])
@pytest.mark.parametrize("search, evaluations", [(random_search, 300), (simulated_annealing, 300),
                                                 (annealing_one_at_a_time, 100)])
def test_finds_the_exhaustive_optimum(search, evaluations, make, spec, devices):
    graph, cluster = make(), load_cluster(spec)
    times = oracle(make, spec, devices)
    best = min(times.values())
    res = search(Scorer(graph, cluster, 4, "1f1b"), graph, devices, Budget(evaluations=evaluations),
                 np.random.default_rng(1))
    check_valid(graph, devices, res)
    assert res.iteration_s == pytest.approx(best, rel=1e-9)
    assert times[(tuple(res.part.tolist()), tuple(res.device_part.tolist()))] == pytest.approx(best, rel=1e-9)
    assert res.evaluations == evaluations and res.fits


def test_oracle_space_is_not_trivial():
    assert len(oracle(chain4, HIER2, 2)) == 7  # one replicated partition, or 3 cuts x 2 placements
    assert len(oracle(diamond, HIER3, 3)) > 40
    for key in [(chain4, HIER2, 2), (diamond, HIER3, 3)]:  # the optimum is a pipeline, not data parallelism
        times = oracle(*key)
        assert max(min(times, key=times.get)[0]) > 0


@pytest.mark.parametrize("seed", range(4))
def test_fast_walk_matches_partition_state(seed):
    """_Walk offers exactly PartitionState's valid actions and ends in the same plan."""
    rng = np.random.default_rng(seed)
    for graph, devices in [(random_graph(rng, 12), 4), (diamond(), 3), (chain4(), 1), (random_graph(rng, 7), 8)]:
        anc = Ancestors(graph)
        space = _Space(graph, devices, anc)
        for _ in range(20):
            state, walk = PartitionState(graph, devices, anc), _Walk(space)
            while not state.done:
                valid = walk.valid()
                assert valid == np.flatnonzero(state.mask()).tolist()
                assert not walk.done
                a = valid[int(rng.integers(len(valid)))]
                state.step(a)
                walk.apply(a)
            assert walk.done and walk.valid() == []
            assert walk.part == state.part.tolist() and walk.device_part == state.device_part.tolist()


def test_random_step_is_uniform_over_valid_actions():
    walk = _Walk(_Space(diamond(), 3))
    walk.apply(0)  # candidates 1 and 2, and the cut
    valid = walk.valid()
    taken = []
    for u in (0.1, 0.5, 0.9):
        w = _Walk(walk.s)
        w.apply(0)
        w.random_step(u)
        taken.append(w.actions[-1])
        assert w.choices == [3]
    assert taken == valid


@pytest.fixture(scope="module")
def vgg16():
    profile_path("vgg16")
    graph, cluster = load_graph(str(PROFILES / "vgg16")), load_cluster("drlpp-4gpu")
    return graph, cluster, Ancestors(graph)


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("evaluations", [1, 100, 130])
def test_evaluation_budget(search, evaluations, vgg16):
    graph, cluster, anc = vgg16
    scorer = Scorer(graph, cluster, 4, "async-1f1b")
    res = search(scorer, graph, len(cluster), Budget(evaluations=evaluations), np.random.default_rng(0),
                 ancestors=anc)
    assert res.evaluations == scorer.evaluations == evaluations  # the last batch is trimmed
    assert res.curve[-1][0] == evaluations and len(res.curve) >= 1
    check_valid(graph, len(cluster), res)


@pytest.mark.parametrize("search", SEARCHES)
def test_seconds_budget(search, vgg16):
    graph, cluster, anc = vgg16
    scorer = Scorer(graph, cluster, 4, "async-1f1b")
    scorer.score(np.zeros((1, len(graph)), dtype=np.int64), np.zeros((1, len(cluster)), dtype=np.int64))  # warm
    budget = Budget(seconds=0.3)
    res = search(scorer, graph, len(cluster), budget, np.random.default_rng(0), ancestors=anc)
    # it stopped on the seconds (no evaluation cap was set), after the batch that crossed them:
    # no upper bound on the wall clock, which a loaded machine stretches
    assert budget.elapsed >= 0.3 and budget.why_stopped(res.evaluations) is not None
    assert res.evaluations > 64
    assert res.curve[-1][2] == res.iteration_s  # (the best by reward: its time may rise if it was over memory)
    evals = [c[0] for c in res.curve]
    assert evals == sorted(evals) and evals[-1] == scorer.evaluations
    check_valid(graph, len(cluster), res)


@pytest.mark.parametrize("search", SEARCHES)
def test_seeded(search, vgg16):
    graph, cluster, anc = vgg16
    out = []
    for seed in (5, 5, 6):
        scorer = Scorer(graph, cluster, 4, "async-1f1b")
        res = search(scorer, graph, len(cluster), Budget(evaluations=200), np.random.default_rng(seed),
                     ancestors=anc)
        out.append((res.reward, res.part.tolist(), res.device_part.tolist(), [c[::2] for c in res.curve]))
    assert out[0] == out[1]
    assert out[0] != out[2]


def test_one_device():
    graph, cluster = chain4(), load_cluster("hier:servers=1,gpus=1,intra=128Gbps,inter=50Gbps")
    for search in SEARCHES:
        res = search(Scorer(graph, cluster, 2, "1f1b"), graph, 1, Budget(evaluations=10), np.random.default_rng(0))
        assert res.part.tolist() == [0] * 4 and res.device_part.tolist() == [0] and res.evaluations == 10


def test_bad_arguments():
    graph, cluster = chain4(), load_cluster(HIER2)
    scorer = Scorer(graph, cluster, 2, "1f1b")
    with pytest.raises(ValueError):
        random_search(scorer, graph, 2, Budget(evaluations=5), np.random.default_rng(0), batch=0)
    with pytest.raises(ValueError):
        simulated_annealing(scorer, graph, 2, Budget(evaluations=5), np.random.default_rng(0), neighbours=0)
    with pytest.raises(ValueError):
        simulated_annealing(scorer, graph, 2, Budget(evaluations=5), np.random.default_rng(0), t1=0.0)
