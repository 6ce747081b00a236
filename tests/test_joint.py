"""The ``joint`` planner (planners/joint/): against the exhaustive ``exact`` on random small
instances, its min-max partition against brute force, its symmetric search on a cluster
too large for device-by-device moves against the baselines run on their own, its budget,
its chunked variants and its command line."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from pipeplan.cli import main
from pipeplan.cluster import Cluster, Device, load_cluster
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, load_graph
from pipeplan.planners import PlanOptions, planner_settings, run_planner
from pipeplan.planners.joint import search_schedules
from pipeplan.planners.joint.chunked import chunked
from pipeplan.planners.joint.symmetric import depths, min_max_partition

EXACT_SPACE = (("schedules", "gpipe,1f1b,spp-pe"),)


def small_instance(rng: np.random.Generator) -> tuple[Graph, Cluster, int]:
    """A chain of 3-6 layers on 2-4 devices in 1-2 servers, uneven links, latency, speeds,
    sometimes tight memory."""
    layers, v = int(rng.integers(3, 7)), int(rng.integers(2, 5))
    f = rng.uniform(2e-3, 20e-3, layers)
    g = Graph.chain("rand", f, f * rng.uniform(1.5, 2.5, layers), params=rng.uniform(0, 60e6, layers),
                    act=rng.uniform(1e6, 80e6, layers))
    servers = np.sort(rng.integers(0, 2, v))
    same = servers[:, None] == servers[None, :]
    bw = np.where(same, rng.uniform(8e9, 25e9, (v, v)), rng.uniform(0.6e9, 5e9, (v, v)))
    lat = np.where(same, 0.0, float(rng.choice([0.0, 1e-3, 2e-2])))
    memory = float(rng.choice([64e9, 1.2e9]))
    devs = [Device(f"d{i}", speed=float(rng.uniform(0.5, 1.5)), server=f"s{servers[i]}", memory=memory)
            for i in range(v)]
    return g, Cluster("rand", devs, np.minimum(bw, bw.T), lat), int(rng.integers(2, 7))


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.slow) if s in (0, 4) else s for s in range(6)])
def test_joint_reaches_the_exact_optimum_on_small_instances(seed):
    """At the exhaustive optimum over the same space, and never below it (both are
    simulated by the same simulator: below would mean exact missed a plan); both say
    complete, as they searched the whole space."""
    g, c, m = small_instance(np.random.default_rng(100 + seed))
    ex, ex_r = run_planner("exact", g, c, PlanOptions(microbatches=m))
    jo, jo_r = run_planner("joint", g, c, PlanOptions(microbatches=m, settings=planner_settings(["joint"], EXACT_SPACE)))
    assert ex.search_complete and jo.search_complete
    assert jo_r.over_memory == ex_r.over_memory
    assert jo_r.iteration_s == pytest.approx(ex_r.iteration_s, rel=1e-9)


def test_min_max_partition_equals_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(40):
        n, p = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        if p > n:
            continue
        work = np.concatenate(([0.0], np.cumsum(rng.uniform(0, 1, n))))
        cut = np.concatenate((rng.uniform(0, 0.5, n), [0.0]))

        def worst(bounds):
            return max(work[b] - work[a] + cut[b] for a, b in zip(bounds[:-1], bounds[1:]))

        best = min(worst((0, *cuts, n)) for cuts in itertools.combinations(range(1, n), p - 1))
        got = min_max_partition(work, cut, p)
        assert len(got) == p + 1 and got[0] == 0 and got[-1] == n and all(np.diff(got) > 0)
        assert worst(got) == pytest.approx(best)


def test_depths_stay_within_layers_and_devices():
    assert depths(96, 1024) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96]
    assert depths(5, 4) == [1, 2, 3, 4]


def test_large_cluster_symmetric_search_beats_the_baselines_run_on_their_own():
    """72 devices (9 servers x 8): the symmetric search; megatron (not one of its seeds on
    a large cluster) and dp are each run on their own."""
    g, c = load_graph("zoo:bert-large?layers=12"), load_cluster("hier:servers=9,gpus=8,intra=300GB/s,inter=100Gbps")
    opts = PlanOptions(microbatches=16)
    jo, jo_r = run_planner("joint", g, c, replace_extra(opts, ("budget", "30")))
    facts = jo.extra["joint"]
    assert "layout" in facts and facts["simulations"] >= 1 and "megatron" not in facts["seeds"]
    for name in ("megatron", "dp"):
        other, other_r = run_planner(name, g, c, opts)
        assert not jo_r.over_memory and jo_r.iteration_s <= other_r.iteration_s * (1 + 1e-9), name


def replace_extra(opts: PlanOptions, *pairs: tuple[str, str]) -> PlanOptions:
    return PlanOptions(microbatches=opts.microbatches, settings=planner_settings(["joint"], pairs))


def test_complete_only_when_the_exhaustive_phase_searched_everything():
    """A small instance is searched whole (complete); the same with too few evaluations, or
    an instance beyond the exhaustive phase's limits however long it runs, is not, and the
    plan says what was left out."""
    g, c, m = small_instance(np.random.default_rng(1))
    plan, _ = run_planner("joint", g, c, PlanOptions(microbatches=m))
    assert plan.extra["joint"]["complete"] is True and plan.search_complete
    assert "schedule (1f1b, gpipe, spp-pe, zb-h1)" in plan.extra["joint"]["complete_space"]
    short, _ = run_planner("joint", g, c, PlanOptions(microbatches=m, settings=planner_settings(["joint"], [("evaluations", "3")])))
    assert not short.search_complete and "evaluations ran out" in short.extra["joint"]["incomplete"]
    big, _ = run_planner("joint", load_graph("zoo:bert-large"), load_cluster("v100x4"),
                         PlanOptions(microbatches=8, settings=planner_settings(["joint"], [("evaluations", "500")])))
    assert not big.search_complete and "exhaustive phase skipped" in big.extra["joint"]["incomplete"]


@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_wall_clock_cap_stops_the_search_and_says_so():
    g, c = load_graph("zoo:bert-large"), load_cluster("spp-sim")
    plan, _ = run_planner("joint", g, c, PlanOptions(microbatches=8, settings=planner_settings(["joint"], [("budget", "0.5")])))
    assert plan.extra["joint"]["complete"] is False and not plan.search_complete
    assert plan.extra["joint"]["local_converged"] is False


def test_chunked_variants_place_chunks_as_their_schedules_run_them():
    g, c = load_graph("zoo:bert-large"), load_cluster("1080ti-4x2")
    base, _ = run_planner("megatron", g, c, PlanOptions(microbatches=8, schedule="1f1b"))
    groups = [tuple(s.devices) for s in base.stages]
    p = len(groups)
    loop = chunked(base, "interleaved-1f1b", 3)
    assert [tuple(s.devices) for s in loop.stages] == [groups[j % p] for j in range(3 * p)]
    vee = chunked(base, "zb-v", 2)
    assert [tuple(s.devices) for s in vee.stages] == groups + groups[::-1]
    assert sorted(n for s in vee.stages for n in s.nodes) == sorted(g.ids)


def test_schedules_option():
    single, chunks = search_schedules("auto")
    assert "1f1b" in single and "zb-h1" in single and set(chunks) == {"interleaved-1f1b", "zb-v"}
    assert search_schedules("gpipe,zb-v") == (("gpipe",), ("zb-v",))
    for bad in ("zb-v", "1f1b,async-1f1b", "nope"):
        with pytest.raises(PipeplanError, match="option schedules="):
            search_schedules(bad)


@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_cli_plan_and_compare_with_budget(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "zoo:bert-large", "--cluster", "v100x4", "--planner", "joint",
                 "--microbatches", "8", "-O", "budget=3", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["planner"] == "joint" and plan["joint"]["seconds"] <= 30
    capsys.readouterr()
    assert main(["compare", "--model", "zoo:bert-large", "--cluster", "v100x4", "--planners", "joint,megatron",
                 "--microbatches", "8", "-O", "joint.budget=3", "--json"]) == 0
    rows = {r["planner"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows["joint"]["iteration_s"] <= rows["megatron"]["iteration_s"] * (1 + 1e-9)


@pytest.mark.parametrize("option,fragment", [
    ("budget=0", "option budget='0': expected a duration > 0 and <= 30 days"),
    ("budget=soon", "option budget='soon': expected a duration > 0"),
    ("schedules=zb-v", "option schedules='zb-v'"),
])
def test_cli_bad_joint_options_one_line_exit_2(capsys, tmp_path, option, fragment):
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "zoo:bert-large", "--cluster", "v100x4", "--planner", "joint",
                 "-O", option, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err and not out.exists()


def test_interchangeable_devices_make_one_candidate():
    from pipeplan.cluster.symmetry import device_classes
    from pipeplan.planners.joint.candidate import canonical, make

    c = load_cluster("1080ti-4x2")  # 4 servers x 2: devices of a server are interchangeable, not across
    classes = device_classes(c)
    a = make(0, (0, 3, 6), [[0, 2], [4]])
    b = make(0, (0, 3, 6), [[1, 3], [5]])  # the other device of each server
    assert canonical(a, classes) == canonical(b, classes)
    other = make(0, (0, 3, 6), [[0, 2], [6]])  # a different server: links differ
    assert canonical(other, classes) != canonical(a, classes)
    rr = make(0, (0, 3, 6), [[1, 3], [5]], replicas="round-robin")
    assert canonical(rr, classes) == rr


def test_compare_hands_joint_the_others_plans_and_keeps_them_intact():
    """In a compare joint runs last and starts from the plans the others just made (not
    planning them again); the others' rows are left as they were."""
    from pipeplan.planners import compare

    g, c = load_graph("zoo:bert-large"), load_cluster("v100x4")
    rows = compare(g, c, ["joint", "spp", "dp"], PlanOptions(microbatches=8, settings=planner_settings(["joint", "spp", "dp"], [("joint.budget", "3")])))
    by = {r.planner: r for r in rows}
    assert {r.plan.planner for r in rows} == {"joint", "spp", "dp"} and by["spp"].plan.planner == "spp"
    facts = by["joint"].plan.extra["joint"]
    assert facts["seeds"]["spp"] == pytest.approx(by["spp"].iteration_s)
    assert set(facts["seeds"]) >= {"spp", "dp"} and "joint" not in by["spp"].plan.extra
    assert by["joint"].iteration_s <= min(by["spp"].iteration_s, by["dp"].iteration_s) * (1 + 1e-9)


def test_seed_plans_take_known_plans_for_the_same_inputs_only():
    from pipeplan.budget import Budget
    from pipeplan.planners.joint.seeds import seed_plans

    g, c = load_graph("zoo:bert-large"), load_cluster("v100x4")
    opts = PlanOptions(microbatches=8)
    spp = run_planner("spp", g, c, opts)
    budget = Budget(evaluations=100)
    got = seed_plans(g, c, PlanOptions(microbatches=8, known_plans={"spp": spp}), budget, ("spp",))
    assert got["spp"][0] is spp[0] and got["spp"][1] is spp[1]
    other = seed_plans(g, c, PlanOptions(microbatches=4, known_plans={"spp": spp}), budget, ("spp",))
    assert other["spp"][0] is not spp[0] and other["spp"][0].microbatches == 4


@pytest.mark.parametrize("model", ["bert-large", "bert-48", "xlnet-large", "t5-base", "transformer"])
def test_zoo_transformers_take_96_layers(model):
    g = load_graph(f"zoo:{model}?layers=96")
    blocks = [d for d in g.desc if d]
    assert len(g) >= 96 and len(set(g.ids)) == len(g) and blocks


@pytest.mark.slow
def test_hier_clusters_are_dense_up_to_4096_devices_held_by_server_beyond_and_refused_over_65536():
    from pipeplan.cluster.links import ServerLinks

    c = load_cluster("hier:servers=512,gpus=8,intra=300GB/s,inter=200Gbps")
    assert len(c) == 4096 and isinstance(c.bandwidth, np.ndarray) and c.bandwidth.shape == (4096, 4096)
    big = load_cluster("hier:servers=513,gpus=8,intra=300GB/s,inter=200Gbps")
    assert isinstance(big.bandwidth, ServerLinks) and big.bandwidth.shape == (4104, 4104)
    with pytest.raises(PipeplanError, match="at most 65,536"):
        load_cluster("hier:servers=8193,gpus=8,intra=300GB/s,inter=200Gbps")
