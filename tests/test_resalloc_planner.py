"""The resalloc planner on multi-resource clusters."""

import json

import pytest

from pipeplan.cli import main
from pipeplan.cluster import hierarchical, load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions, planner_settings, run_planner
from pipeplan.sim import simulate

from conftest import profile_path


def alexnet():
    return load_graph(str(profile_path("alexnet"))).scaled(time=1 / 8, act=1 / 8)


def test_plans_every_depth_and_allocation_helps():
    g = alexnet()
    for q in (1, 2, 4):
        c = hierarchical(f"l{q}", q, 1, 1e9 / 8, 1e9 / 8, kind="laptop-i7-gtx1650")
        opts = PlanOptions(microbatches=16, settings=planner_settings(["resalloc"], [("depth", str(q))]))
        with_lp, r_lp = run_planner("resalloc", g, c, opts)
        without, r_half = run_planner("resalloc", g, c, PlanOptions(microbatches=16,
                                                                    settings=planner_settings(["resalloc"], [("depth", str(q)), ("beta", "0.5")])))
        assert with_lp.schedule == "fb-parallel" and len(with_lp.allocation) == with_lp.num_stages
        assert all(set(a) == {"cpu", "gpu"} for a in with_lp.allocation)
        assert all(a == {"cpu": 0.5, "gpu": 0.5} for a in without.allocation)
        assert r_lp.iteration_s <= r_half.iteration_s * (1 + 1e-9)
        assert sorted(n for s in with_lp.stages for n in s.nodes) == sorted(g.ids)


@pytest.mark.slow
def test_chooses_a_depth_on_mobile_4(capsys):
    assert main(["plan", "--model", str(profile_path("alexnet")), "--cluster", "mobile-4", "--planner",
                 "resalloc", "--microbatches", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schedule"] == "fb-parallel" and d["resalloc"]["depth"] >= 1 and d["iteration_s"] > 0
    # joint's search budgeted small (its default 30,000 evaluations took ~90% of this test):
    # the planners compared by default stay the default ones
    assert main(["compare", "--model", "zoo:googlenet?microbatch=8", "--cluster", "mobile-4", "--json",
                 "-O", "joint.evaluations=500"]) == 0
    names = {r["planner"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert "resalloc" in names  # compared by default where devices have several resources


def test_heterogeneous_grouping():
    g = load_graph("zoo:googlenet?microbatch=8")
    c = load_cluster("mobile-hetero-8")
    plan, r = run_planner("resalloc", g, c, PlanOptions(microbatches=8, allow_over_memory=True,
                                                        settings=planner_settings(["resalloc"], [("depth", "4")])))
    groups = plan.extra["resalloc"]["groups"]
    assert len(groups) == 4 and sorted(d for grp in groups for d in grp) == sorted(c.names)
    assert simulate(plan).iteration_s == pytest.approx(r.iteration_s)


@pytest.mark.parametrize("opt,fragment", [("beta=1.5", "option beta='1.5': expected a number > 0 and < 1"), ("depth=9", "depth must be"),
                                          ("beta=x", "option beta='x': expected a number"),
                                          ("depth=2.5", "option depth='2.5': expected an integer"),
                                          ("alpha=1", "has no option 'alpha' (its options: beta, depth)")])
def test_bad_options(opt, fragment, capsys):
    assert main(["plan", "--model", "zoo:alexnet", "--cluster", "mobile-4", "--planner", "resalloc",
                 "-O", opt]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


SPLIT = """devices:
  - {name: a, memory: 16GiB, resources: [{name: cpu, fwd_speed: 1, bwd_speed: 1}]}
  - {name: b, memory: 16GiB, resources: [{name: gpu, fwd_speed: 4, bwd_speed: 4}]}
bandwidth: 1GB/s
"""


def test_a_depth_that_cannot_run_is_skipped(tmp_path, capsys):
    """Two workers {cpu} and {gpu}: Alg. 1 gives every worker the weakest one's resources,
    none, so depth 2 cannot run; depth 1 (one worker with both) can."""
    path = tmp_path / "split.yaml"
    path.write_text(SPLIT)
    argv = ["plan", "--model", "zoo:alexnet", "--cluster", str(path), "--planner", "resalloc", "-O", "beta=0.5"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["resalloc"]["depth"] == 1 and plan["stages"][0]["devices"] == ["a", "b"]
    assert main([*argv, "-O", "depth=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no pipeline depth can run" in err and "layer 0 cannot run" in err
