"""Clusters beyond 4,096 GPUs (links held by server, cluster/links.py) and identical
data-parallel replicas simulated as two (sim/replicas.py): the same answers as the dense
matrices and the full simulation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeplan.cluster import load_cluster
from pipeplan.cluster.build import cluster_from_full_dict, cluster_to_dict, server_links
from pipeplan.cluster.links import ServerLinks
from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph
from pipeplan.llm.parallelism import Parallelism
from pipeplan.planners import llm3d
from pipeplan.sim import simulate
import pipeplan.sim.tensor_groups as tensor_groups


def test_links_held_by_server_index_as_the_dense_matrix():
    server_of = np.repeat(np.arange(5), 3)
    held = ServerLinks(server_of, 300.0, 25.0, np.inf)
    same = server_of[:, None] == server_of[None, :]
    dense = np.where(same, 300.0, 25.0)
    np.fill_diagonal(dense, np.inf)
    a, b = np.array([0, 4, 14, 2]), np.array([1, 0, 13])
    assert np.array_equal(held[np.ix_(a, b)], dense[np.ix_(a, b)])
    assert held[3, 4] == dense[3, 4] and held[3, 9] == dense[3, 9] and held[7, 7] == np.inf
    assert np.array_equal(held[a, a], dense[a, a]) and np.array_equal(held[2:6, 1], dense[2:6, 1])
    assert np.array_equal(np.asarray(held), dense)


def test_a_16384_gpu_cluster_is_held_by_server_and_round_trips_through_a_plan_file():
    c = load_cluster("dgx-h100x2048")
    assert len(c) == 16384 and isinstance(c.bandwidth, ServerLinks)
    assert c.bandwidth[0, 7] == 450e9 and c.bandwidth[0, 8] == 50e9 and c.latency[0, 8] == 6e-6
    d = json.loads(json.dumps(cluster_to_dict(c)))
    assert d["links_by_server"] == {"bandwidth": [450e9, 50e9], "latency": [3e-6, 6e-6]}
    assert cluster_from_full_dict(d) == c
    small = load_cluster("dgx-h100x2")  # the same form read back dense below the limit
    d = cluster_to_dict(small)
    d.pop("server_links")
    d["links_by_server"] = {"bandwidth": [450e9, 50e9], "latency": [3e-6, 6e-6]}
    assert cluster_from_full_dict(d) == small
    bw, lat = server_links(2, 8, (450e9, 50e9), (3e-6, 6e-6))
    off = ~np.eye(16, dtype=bool)
    assert np.array_equal(bw[off], small.bandwidth[off]) and np.array_equal(lat[off], small.latency[off])


@pytest.mark.parametrize("links, words", [
    ({"bandwidth": [1.0], "latency": [0, 0]}, "bandwidth must be"),
    ({"bandwidth": [1.0, "x"], "latency": [0, 0]}, "bandwidth must be"),
    ({"bandwidth": [1.0, 1.0], "latency": [0, -1]}, "negative"),
    ({"bandwidth": [1.0, 1.0]}, "latency must be"),
])
def test_bad_links_by_server_are_one_line(links, words):
    d = cluster_to_dict(load_cluster("dgx-h100x2"))
    d.pop("server_links")
    d["links_by_server"] = links
    with pytest.raises(PipeplanError, match=words):
        cluster_from_full_dict(d)


def test_a_planner_that_needs_every_link_says_so_in_one_line(capsys):
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:vgg16", "--cluster", "hier:servers=520,gpus=8,intra=100Gbps,inter=10Gbps",
                 "--planner", "pipedream"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds them by server" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("cfg", [Parallelism(2, 4, 8, (4,) * 4, zero=1, sp=True),
                                 Parallelism(4, 2, 8, (4,) * 4, 2, microbatch=2, recompute="selective", sp=True,
                                             schedule="interleaved-1f1b"),
                                 Parallelism(1, 4, 16, (4,) * 4, recompute="full", zero=1, schedule="zb-h1")])
def test_two_replicas_simulate_what_all_of_them_do(cfg, monkeypatch):
    """Against the full simulation of every replica: the iteration, per-GPU memory and bubble."""
    g, c = load_graph("zoo:gpt?hidden=2048&layers=16&heads=16"), load_cluster("dgx-a100x8")
    plan = llm3d.plan_of(g, c, cfg, 256)
    two = simulate(plan, timeline=False)
    assert two.extra["replicas_simulated"] == {"simulated": 2, "of": cfg.dp}
    monkeypatch.setattr(tensor_groups, "symmetric_count", lambda *a: None)
    full = simulate(plan, timeline=False)
    assert "replicas_simulated" not in full.extra and full.num_tasks > two.num_tasks
    assert two.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    assert two.memory_bytes.max() == pytest.approx(full.memory_bytes.max(), rel=1e-12)
    assert two.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-9)
    assert set(two.device_of()) == set(full.device_of()) == set(c.names)


def test_replicas_on_unequal_links_are_simulated_in_full():
    """Replica 1's pipeline crosses servers where replica 0's does not: no shortcut."""
    g, c = load_graph("zoo:gpt?hidden=2048&layers=16&heads=16"), load_cluster("dgx-a100x2")
    cfg = Parallelism(2, 2, 4, (8, 8), zero=1, sp=True)  # position 0: GPUs 0-7, position 1: 8-15
    plan = llm3d.plan_of(g, c, cfg, 64)
    assert "replicas_simulated" in simulate(plan, timeline=False).extra  # every chain crosses the servers
    stages = plan.stages
    stages[1].devices = stages[1].devices[2:4] + stages[1].devices[:2] + stages[1].devices[4:]
    uneven = c.names[:6] + c.names[8:10]  # replica 3 of position 0 on the second server
    stages[0].devices = uneven
    stages[1].devices = c.names[6:8] + c.names[10:16]
    from pipeplan.plan import Plan

    mixed = Plan(plan.graph, c, stages, plan.microbatches, schedule=plan.schedule, replicas="round-robin", zero=1,
                 sequence_parallel=True)
    assert "replicas_simulated" not in simulate(mixed, timeline=False).extra


@pytest.mark.slow
def test_a_405b_model_plans_on_16384_h100s(capsys):
    """The issue's scale: a TP x PP x DP plan of Llama 3 405B on 2,048 DGX H100 servers that
    fits in memory (benchmarks/llm_scale.py times it)."""
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:llama3-405b", "--cluster", "dgx-h100x2048", "--global-batch", "2048",
                 "--planner", "joint", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = out["parallelism"]
    assert p["tp"] * p["cp"] * p["pp"] * p["dp"] == 16384 and not out["prediction"]["over_memory"]
    assert 0 < out["prediction"]["mfu"] < 1
