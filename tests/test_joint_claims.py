"""The joint planner's claims re-run small (``make bench`` runs them in full,
benchmarks/joint/): never beaten by an enumeration of its space while claiming complete,
never slower than any planner run on its own, seed planners chosen by the instance and not
by the clock, and the symmetric search on 1,024 GPUs (correctness, not time)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipeplan.budget import Budget
from pipeplan.cluster import Cluster, Device, cluster_to_dict, load_cluster
from pipeplan.graph import Graph, load_graph
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.base import REGISTRY, get_planner
from pipeplan.planners.joint import symmetric
from pipeplan.planners.joint.seeds import SEED_LIMIT_S, seed_plans

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "joint"))
from _bruteforce import brute_force  # noqa: E402
from _instances import tiny_instance  # noqa: E402
import never_slower  # noqa: E402
import optimality  # noqa: E402


@pytest.mark.slow
def test_no_planner_beaten_by_the_enumeration_while_claiming_complete():
    """benchmarks/joint/optimality.py on 4 instances of its own stream."""
    rng = np.random.default_rng(7)
    rows = [optimality.run_instance(*tiny_instance(rng)) for _ in range(4)]
    summary = optimality.summarize(rows)
    assert summary["failures"] == 0, summary
    assert all(summary[name]["claimed_complete"] == 4 for name, *_ in optimality.CHECKS), summary


@pytest.mark.slow
def test_never_slower_than_any_planner_run_on_its_own():
    """benchmarks/joint/never_slower.py on one case (11 layers on 8 devices: the exhaustive
    phase and the local search both run)."""
    case = never_slower.run_case("gnmt-4", "zoo:gnmt-4", "1080ti-4x2", 8)
    assert case["not_slower"] and case["joint_fits"], case


def test_seed_planners_are_chosen_by_the_instance_not_the_clock(monkeypatch):
    """A seed planner whose own estimate is long (here 40 s, more than half of any wall-clock
    budget joint had by default) still seeds the search when there is no cap; under a short
    cap it is skipped; beyond SEED_LIMIT_S it never runs."""
    g, c = load_graph("zoo:bert-large"), load_cluster("v100x4")
    opts = PlanOptions(microbatches=8)
    for seconds, cap, expected in ((40.0, None, True), (40.0, 10.0, False), (SEED_LIMIT_S + 1, None, False)):
        monkeypatch.setitem(REGISTRY, "spp", replace(get_planner("spp"), estimate=lambda *a, s=seconds: s))
        got = seed_plans(g, c, opts, Budget(cap, 100), ("spp",))
        assert ("spp" in got) is expected, (seconds, cap)


@pytest.mark.slow
def test_symmetric_search_on_1024_gpus_simulates_a_bounded_number_of_plans():
    g = load_graph("zoo:bert-large?layers=96")
    c = load_cluster("hier:servers=128,gpus=8,intra=300GB/s,inter=200Gbps")
    plan, result = run_planner("joint", g, c, PlanOptions(microbatches=32))
    facts = plan.extra["joint"]
    assert not facts["complete"] and "symmetric search" in facts["incomplete"] and not result.over_memory
    if facts["from"] == "search":
        bound = symmetric.SIMULATED * 2 + 8 + symmetric.MAX_REFINE * 2 * 2  # each run may repair memory once
        assert facts["simulations"] <= bound
    dp, dp_r = run_planner("dp", g, c, PlanOptions(microbatches=32))
    assert result.iteration_s < dp_r.iteration_s
    assert "server_links" in cluster_to_dict(c)  # the plan file stays small


def _held_out_instance():
    """Four layers on four devices (three in one server) where the fastest plan is zero-bubble
    H1 on a 1 + 3 split (found by a hostile search; the brute force below confirms it)."""
    g = Graph.chain("held-out", np.array([0.006471014, 0.005093166, 0.006149356, 0.017632108]), np.array([0.01039342, 0.011784536, 0.01479972, 0.040377463]), params=np.array([5220695, 15196849, 0, 5400144], dtype=float),
                    act=np.array([18324801, 35503680, 73282553, 53943632], dtype=float))
    devs = [Device(f"d{i}", speed=s, server=srv, memory=64e9) for i, (s, srv) in enumerate(zip([0.903229, 1.409705, 0.844848, 1.266855], ['s1', 's1', 's1', 's2']))]
    bw = np.array([[0.0, 11605000000.0, 16562000000.0, 2538000000.0], [11605000000.0, 0.0, 12688000000.0, 1979000000.0], [16562000000.0, 12688000000.0, 0.0, 3093000000.0], [2538000000.0, 1979000000.0, 3093000000.0, 0.0]])
    lat = np.array([[0.0, 8.87e-05, 9.72e-05, 0.0010732], [0.0001124, 0.0, 0.0001029, 0.0012521], [0.0001286, 5.26e-05, 0.0, 0.0007153], [0.0011138, 0.0014798, 0.0013575, 0.0]])
    return g, Cluster("held-out", devs, bw, lat)


@pytest.mark.slow  # the enumeration of 4 layers on 4 devices: seconds
def test_complete_means_no_zero_bubble_plan_is_faster():
    """joint's exhaustive phase bounds every schedule it searches by what holds for it: with a
    split backward (zero bubble) a device's last task may be a weight gradient nothing before
    it waits for, so the bound keeps the forward chain alone; the enumeration (sharing no code
    with the planners) is the oracle."""
    g, c = _held_out_instance()
    best = brute_force(g, c, 2, ("zb-h1",))  # the best zero-bubble plan; joint may only beat it
    plan, result = run_planner("joint", g, c, PlanOptions(microbatches=2))
    assert plan.search_complete
    assert result.iteration_s <= best["time"] * (1 + 1e-9)
