"""SPP: PRM against brute force, PE against Lemma 1, RDO, the planner's JSON."""

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.cli import main
from pipeplan.cluster import Cluster, Device, hierarchical
from pipeplan.sim.formulas import allreduce_time, state_bytes, transfer_time
from pipeplan.graph import Graph, linearize
from pipeplan.plan import Plan, Stage
from pipeplan.planners.spp.bounds import lemma1
from pipeplan.planners.spp.prm import prm
from pipeplan.planners.spp.rdo import device_order
from pipeplan.schedule import make_schedule
from pipeplan.sim import simulate


def random_cluster(rng, v: int, uneven_speed: bool = True) -> Cluster:
    bw = rng.uniform(1e8, 2e9, (v, v))
    bw = np.minimum(bw, bw.T) if rng.random() < 0.5 else bw
    lat = rng.uniform(0, 1e-4, (v, v)) * (rng.random() < 0.5)
    speeds = rng.uniform(0.5, 2, v) if uneven_speed else np.ones(v)
    mem = rng.uniform(1e8, 1e9, v) if rng.random() < 0.3 else np.full(v, 1e12)
    return Cluster("r", [Device(f"d{i}", speed=float(s), memory=float(m)) for i, (s, m) in enumerate(zip(speeds, mem))],
                   bw, lat)


def brute_w(g: Graph, c: Cluster, order: list[int], m: int, xi: int) -> float:
    """min over interval partitions into xi stages and replica counts (all devices, in
    order) of SPP's objective: the largest stage or channel load."""
    lin = linearize(g)
    n, v = lin.n, len(order)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), xi - 1):
        lb = [0, *cuts, n]
        for reps in itertools.product(range(1, v + 1), repeat=xi):
            if sum(reps) != v:
                continue
            db = np.concatenate(([0], np.cumsum(reps)))
            groups = [[order[k] for k in range(db[s], db[s + 1])] for s in range(xi)]
            worst = 0.0
            for s in range(xi):
                comp = (lin.fwd_cum[lb[s + 1]] - lin.fwd_cum[lb[s]]) + (lin.bwd_cum[lb[s + 1]] - lin.bwd_cum[lb[s]])
                par = lin.params_cum[lb[s + 1]] - lin.params_cum[lb[s]]
                if state_bytes(par) > min(c.memory[d] for d in groups[s]):
                    worst = math.inf
                    break
                worst = max(worst, m * comp / (len(groups[s]) * min(c.speed[d] for d in groups[s]))
                            + allreduce_time(c, groups[s], par))
                if s + 1 < xi:
                    d = lin.cut_bytes[lb[s + 1]]
                    worst = max(worst, m * (transfer_time(c, groups[s], groups[s + 1], d)
                                            + transfer_time(c, groups[s + 1], groups[s], d)))
            best = min(best, worst)
    return best


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_prm_is_optimal_for_w(layers, v, m, seed):
    rng = np.random.default_rng(seed)
    g = Graph.chain("c", rng.uniform(0.01, 1, layers), rng.uniform(0.01, 2, layers),
                    params=rng.uniform(0, 4e7, layers), act=rng.uniform(0, 5e8, layers))
    c = random_cluster(rng, v)
    order = list(rng.permutation(v))
    res = prm(linearize(g), c, order, m)
    for xi in range(1, min(layers, v) + 1):
        expected = brute_w(g, c, order, m, xi)
        got = res.w[xi - 1]
        if math.isinf(expected):
            assert math.isinf(got)
            continue
        assert got == pytest.approx(expected, rel=1e-9)
        parts = res.stages[xi - 1]
        assert len(parts) == xi and parts[0][0] == 0 and parts[-1][1] == layers
        assert parts[0][2] == 0 and parts[-1][3] == v
        assert all(a[1] == b[0] and a[3] == b[2] for a, b in zip(parts, parts[1:]))


@st.composite
def split_plans(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layers = draw(st.integers(1, 8))
    v = draw(st.integers(1, 6))
    g = Graph.chain("c", rng.uniform(0, 1, layers), rng.uniform(0, 2, layers),
                    params=rng.uniform(0, 1e8, layers), act=rng.uniform(0, 1e9, layers))
    c = random_cluster(rng, v, uneven_speed=draw(st.booleans()))
    s_count = draw(st.integers(1, min(layers, v)))
    cuts = sorted(rng.choice(np.arange(1, layers), s_count - 1, replace=False)) if s_count > 1 else []
    lb = [0, *map(int, cuts), layers]
    counts = [1] * s_count
    for _ in range(int(rng.integers(0, v - s_count + 1))):
        counts[int(rng.integers(0, s_count))] += 1
    perm = list(rng.permutation(v))
    stages, d = [], 0
    for s in range(s_count):
        stages.append(Stage(g.ids[lb[s]:lb[s + 1]], [c.devices[k].name for k in perm[d:d + counts[s]]]))
        d += counts[s]
    return Plan(g, c, stages, draw(st.integers(1, 12)), schedule="spp-pe", replicas="split")


@settings(max_examples=200, deadline=None)
@given(split_plans())
def test_pe_never_exceeds_lemma1(plan):
    r = simulate(plan)
    assert r.iteration_s <= lemma1(plan) * (1 + 1e-9) + 1e-12


def test_pe_order_is_a_wavefront():
    s = make_schedule("spp-pe", [[0], [1]], 3)
    # stage 0 (of 2): F at pass m, B at pass m+4 -> 5 forwards before the first backward
    assert s.programs[0].actions() == ["F0", "F1", "F2", "B0", "B1", "B2"]
    assert s.programs[1].actions() == ["F0", "B0", "F1", "B1", "F2", "B2"]
    long = make_schedule("spp-pe", [[0], [1]], 8)
    assert long.programs[0].actions()[:7] == ["F0", "F1", "F2", "F3", "F4", "B0", "F5"]


def test_rdo_keeps_servers_together():
    c = hierarchical("h", 4, 4, 128e9 / 8, 10e9 / 8)
    order = device_order(c)
    assert sorted(order) == list(range(16))
    servers = [d // 4 for d in order]
    assert all(servers[k] == servers[k + 1] or servers[k + 1] not in servers[:k + 1] for k in range(15))
    assert len({tuple(sorted(order[k:k + 4])) for k in range(0, 16, 4)}) == 4
    assert all(len({d // 4 for d in order[k:k + 4]}) == 1 for k in range(0, 16, 4))


def test_spp_plan_json_has_bounds(capsys):
    assert main(["plan", "--model", "zoo:bert-large", "--cluster", "v100x4", "--planner", "spp",
                 "--microbatches", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    b = d["bounds"]
    assert d["schedule"] == "spp-pe" and d["replicas"] == "split"
    assert d["prediction"]["lower_bound_s"] <= d["iteration_s"] <= b["lemma1_s"] * (1 + 1e-9)
    thm = b["spp_theorem1"]  # v100x4 has no latency: Theorem 1 applies
    assert thm["ratio"] >= 2 and thm["lower_s"] == pytest.approx(d["iteration_s"] / thm["ratio"])


def test_theorem1_is_reported_only_where_its_assumptions_hold():
    """With 20 ms links Theorem 1's ratio would claim a bound that a plan beats: not reported."""
    from pipeplan.cluster import hierarchical
    from pipeplan.graph import load_graph
    from pipeplan.planners import PlanOptions, get_planner

    g = load_graph("zoo:bert-large")
    c = hierarchical("slow", 2, 2, 1e10, 1e9, latency=0.02)
    plan = get_planner("spp").fn(g, c, PlanOptions(microbatches=8))
    assert plan.extra["bounds"]["spp_theorem1"] == {"not_applicable": "links have latency"}


def test_theorem1_does_not_divide_by_a_missing_link():
    """A pair of devices with zero bandwidth (no link): SPP plans around it and Theorem 1,
    whose ratio has 1/b_min, is not reported."""
    from pipeplan.graph import load_graph
    from pipeplan.planners import PlanOptions, get_planner

    bw = np.full((3, 3), 1e9)
    bw[0, 2] = bw[2, 0] = 0.0
    c = Cluster("gap", [Device(f"d{i}") for i in range(3)], bw, np.zeros((3, 3)))
    plan = get_planner("spp").fn(load_graph("zoo:alexnet"), c, PlanOptions(microbatches=4))
    assert plan.extra["bounds"]["spp_theorem1"] == {"not_applicable": "some devices are not linked (zero bandwidth)"}

