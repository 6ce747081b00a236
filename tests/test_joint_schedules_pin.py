"""``joint -O schedules=X`` returns a plan whose schedule is in X on every model family,
whatever the other planners' plans it starts from (issue: "nothing silently different from
what was asked"): the seed plans are filtered as the search is; on decoder LLMs a name outside
their schedules is one line, and other planners' plans stand only where they hold every pin.
The expected values are the pins themselves."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeplan.cli import main
from pipeplan.cluster import Cluster, Device
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.planners import PlanOptions, planner_settings, run_planner
from pipeplan.planners.llm3d import LLMOptions, Pins
from pipeplan.llm.parallelism import Parallelism


def _chain_on_slow_links() -> tuple[Graph, Cluster]:
    """Four layers on four devices whose links are slow: the seed planners' plans (spp's
    spp-pe, gpipe's, 1f1b's) are the ones to beat."""
    f = np.array([4e-3, 6e-3, 5e-3, 7e-3])
    g = Graph.chain("chain", f, 2 * f, params=np.full(4, 20e6), act=np.full(4, 30e6))
    devs = [Device(f"d{i}", speed=1.0, server=f"s{i // 2}", memory=64e9) for i in range(4)]
    bw = np.full((4, 4), 2e9)
    return g, Cluster("slow", devs, bw, np.zeros((4, 4)))


@pytest.mark.parametrize("schedules", ["gpipe", "1f1b", "zb-h1", "spp-pe", "gpipe,interleaved-1f1b"])
def test_joint_returns_only_the_schedules_asked_on_layer_graphs(schedules):
    g, c = _chain_on_slow_links()
    settings = planner_settings(["joint"], (("schedules", schedules), ("evaluations", "300")))
    plan, _ = run_planner("joint", g, c, PlanOptions(microbatches=4, settings=settings))
    assert plan.schedule in schedules.split(",")


def test_compare_hands_joint_no_seed_outside_its_schedules(capsys):
    argv = ["compare", "--model", "zoo:vgg16", "--cluster", "v100x4", "--planners", "gpipe,spp,joint",
            "-O", "joint.schedules=gpipe", "-O", "joint.evaluations=200", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    rows = {r["planner"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows["joint"]["plan"]["schedule"] == "gpipe" and rows["spp"]["plan"]["schedule"] == "spp-pe"


DECODER = ["plan", "--model", "zoo:gpt?hidden=1024&layers=8&heads=16&seq=512&vocab=8192", "--cluster", "dgx-a100x2",
           "--global-batch", "64", "--planner", "joint", "-O", "simulations=2", "--json"]


@pytest.mark.parametrize("schedules", ["1f1b", "zb-h1", "interleaved-1f1b", "1f1b,zb-h1"])
def test_joint_returns_only_the_schedules_asked_on_decoders(schedules, capsys):
    assert main([*DECODER, "-O", f"schedules={schedules}"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] in schedules.split(",")


@pytest.mark.parametrize("schedules, bad", [("gpipe", "gpipe"), ("bogus", "bogus"), ("1f1b,bogus", "bogus"),
                                            (",", "")])
def test_a_schedule_decoders_do_not_run_is_one_line(schedules, bad, capsys):
    assert main([*DECODER, "-O", f"schedules={schedules}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "schedules=" in err and bad in err and len(err.splitlines()) == 1


def test_another_planners_configuration_stands_only_where_it_holds_every_pin():
    par = Parallelism(2, 2, 4, (4, 4), 1, microbatch=2, recompute="none", schedule="1f1b")
    assert Pins().holds(par) and Pins(LLMOptions(tp=2, pp=2, layout="4,4")).holds(par)
    for pinned in (LLMOptions(tp=4), LLMOptions(recompute="full"), LLMOptions(layout="3,5"), LLMOptions(zero=1)):
        assert not Pins(pinned).holds(par)
    assert not Pins(schedules=("zb-h1",)).holds(par)


@pytest.mark.parametrize("schedule", ["gpipe", "zb-h1", "spp-pe"])
def test_schedule_flag_is_honored_by_joint_and_exact_on_layer_graphs(schedule):
    g, c = _chain_on_slow_links()
    for planner, extra in (("joint", (("evaluations", "300"),)), ("exact", ())):
        options = PlanOptions(microbatches=4, schedule=schedule, settings=planner_settings([planner], extra))
        plan, _ = run_planner(planner, g, c, options)
        assert plan.schedule == schedule, planner


def test_a_schedule_exact_does_not_search_or_joint_is_not_given_is_one_line():
    g, c = _chain_on_slow_links()
    with pytest.raises(PipeplanError, match="exact: --schedule interleaved-1f1b is not a schedule it searches"):
        run_planner("exact", g, c, PlanOptions(microbatches=4, schedule="interleaved-1f1b"))
    with pytest.raises(PipeplanError, match="--schedule 1f1b is not among -O schedules=gpipe"):
        run_planner("joint", g, c, PlanOptions(microbatches=4, schedule="1f1b",
                                               settings=planner_settings(["joint"], (("schedules", "gpipe"),))))


def test_a_planner_that_would_run_another_schedule_is_refused(monkeypatch):
    """The safety net behind every planner: a plan of another schedule than --schedule is an
    error, never returned."""
    from pipeplan.planners import base

    g, c = _chain_on_slow_links()
    info = base.get_planner("dp")
    monkeypatch.setitem(base.REGISTRY, "dp", replace(info, fn=lambda *a: replace(info.fn(*a), schedule="gpipe")))
    with pytest.raises(PipeplanError, match="does not plan for --schedule 1f1b here"):
        run_planner("dp", g, c, PlanOptions(microbatches=4, schedule="1f1b"))
