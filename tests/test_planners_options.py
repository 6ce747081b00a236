"""Typed planner options (-O KEY=VALUE): parsing, one-line errors, the planners listing,
and the options of the baselines (dp's replica modes, GPipe's re-materialization)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from pipeplan.cli import main
from pipeplan.cluster import Cluster, Device, hierarchical
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, load_graph
from pipeplan.plan import Plan, Stage
from pipeplan.planners import REGISTRY, PlanOptions, planner_settings, run_planner
from pipeplan.planners.options import parse_options
from pipeplan.planners.base import register
from pipeplan.sim import simulate


@dataclass(frozen=True)
class Knobs:
    flag: bool = field(default=False, metadata={"help": "a switch"})
    count: int = field(default=3, metadata={"help": "how many"})
    rate: float | None = field(default=None, metadata={"help": "how fast"})
    mode: str = field(default="a", metadata={"help": "which", "choices": ("a", "b")})


def parse(*pairs: str) -> Knobs:
    return parse_options(Knobs, [tuple(p.split("=", 1)) for p in pairs], "toy")


def test_values_parse_into_their_types():
    assert parse() == Knobs()
    assert parse("flag=yes", "count=7", "rate=2.5", "mode=b") == Knobs(True, 7, 2.5, "b")
    assert parse("flag=0", "rate=none", "count=4") == Knobs(False, 4, None, "a")
    for twice in (("count=1", "count=4"), ("count=1", "toy.count=1")):  # never silently the last
        with pytest.raises(PipeplanError, match="option 'count' is given twice"):
            parse(*twice)
    assert parse("flag=TRUE").flag is True and parse("flag=off").flag is False


@pytest.mark.parametrize("pair,message", [
    ("speed=1", "planner 'toy' has no option 'speed' (its options: flag, count, rate, mode)"),
    ("count=2.5", "planner 'toy': option count='2.5': expected an integer"),
    ("rate=fast", "planner 'toy': option rate='fast': expected a number"),
    ("rate=nan", "planner 'toy': option rate='nan': expected a number"),
    ("flag=maybe", "planner 'toy': option flag='maybe': expected true or false"),
    ("mode=c", "planner 'toy': option mode='c': expected one of a, b"),
    ("count=none", "planner 'toy': option count='none': expected an integer"),
])
def test_bad_keys_and_values(pair, message):
    with pytest.raises(PipeplanError) as err:
        parse(pair)
    assert str(err.value) == message


def test_unsupported_option_types_fail_at_registration():
    @dataclass(frozen=True)
    class Listy:
        items: tuple = ()

    @dataclass(frozen=True)
    class Required:
        count: int

    with pytest.raises(TypeError, match="use bool, int, float, str"):
        register("listy", "-", "1f1b", options=Listy)
    with pytest.raises(TypeError, match="'count' of Required: needs a default"):
        register("required", "-", "1f1b", options=Required)
    assert "listy" not in REGISTRY and "required" not in REGISTRY


def test_budgets_read_durations_as_every_budget_does():
    from pipeplan.planners.joint import JointOptions

    for text, seconds in (("2m", 120.0), ("90s", 90.0), ("1h", 3600.0), ("0.5", 0.5)):
        assert planner_settings(["joint"], [("budget", text)]) == (JointOptions(budget=seconds),)


def test_each_planner_reads_only_its_own_settings():
    """``compare``'s one PlanOptions carries every planner's typed options; an unprefixed key
    reaches every planner that declares it, and a planner never sees another's."""
    from pipeplan.planners.exact import ExactOptions
    from pipeplan.planners.joint import JointOptions
    from pipeplan.planners.spp import SppOptions

    opts = PlanOptions(settings=planner_settings(["exact", "joint", "spp"], [("budget", "7"), ("spp.stages", "2")]))
    assert opts.settings_of(ExactOptions).budget == 7.0 and opts.settings_of(JointOptions).budget == 7.0
    assert opts.settings_of(SppOptions).stages == 2
    assert PlanOptions().settings_of(SppOptions) == SppOptions()  # absent: the defaults


def test_options_are_parsed_once_per_command(monkeypatch, capsys):
    """The -O text is parsed at the edge, once per planner, however many planners read it."""
    from pipeplan.planners import base

    calls = []
    real = base.parse_options
    monkeypatch.setattr(base, "parse_options", lambda *a: calls.append(a[2]) or real(*a))
    argv = ["compare", "--model", "zoo:alexnet", "--cluster", "v100x4", "--microbatches", "4",
            "--planners", "dp,spp,joint", "-O", "joint.evaluations=50"]
    assert main(argv) == 0
    capsys.readouterr()
    assert sorted(calls) == ["dp", "joint", "spp"]


def cli_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize("argv,fragment", [
    (["plan", "--planner", "dp", "-O", "replicas=sideways"],
     "planner 'dp': option replicas='sideways': expected one of split, round-robin, auto"),
    (["plan", "--planner", "dp", "-O", "straight=1"], "planner 'dp' has no option 'straight' (its options: replicas)"),
    (["plan", "--planner", "hetpipe", "-O", "depth=2"], "planner 'hetpipe' has no option 'depth' (it takes none)"),
    (["plan", "--planner", "gpipe", "-O", "recompute=perhaps"], "option recompute='perhaps': expected true or false"),
    (["plan", "-O", "nonsense=1"], "planner option 'nonsense' is not an option of any compared planner"),
    (["compare", "--planners", "gpipe,spp", "-O", "replicas=split"], "(their options: gpipe: recompute; spp: stages)"),
    (["compare", "--planners", "dp,gpipe", "-O", "replicas=x"], "option replicas='x': expected one of"),
    (["plan", "--planner", "dp", "-O", "replicas"], "-O/--planner-option: expected KEY=VALUE, got 'replicas'"),
])
def test_cli_bad_options_one_line_exit_2(capsys, tmp_path, argv, fragment):
    out = tmp_path / "p.json"
    extra = ["--out", str(out)] if argv[0] == "plan" else []
    err = cli_error(capsys, *argv, "--model", "zoo:alexnet", "--cluster", "v100x4", "--microbatches", "4", *extra)
    assert fragment in err
    assert not out.exists()


def test_compare_gives_each_planner_its_own_options(capsys):
    assert main(["compare", "--model", "zoo:alexnet", "--cluster", "v100x4", "--microbatches", "4",
                 "--planners", "dp,gpipe", "-O", "replicas=split", "-O", "recompute=false", "--json"]) == 0
    rows = {r["planner"]: r["plan"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows["dp"]["replicas"] == "split" and "recompute" not in rows["gpipe"]


def test_planners_listing(capsys):
    assert main(["planners", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)["planners"]}
    assert {"dp", "gpipe", "pipedream", "hetpipe", "spp", "exact", "resalloc"} <= set(listed)
    assert listed["dp"]["default_schedule"] == "1f1b" and listed["gpipe"]["default_schedule"] == "gpipe"
    assert listed["dp"]["options"] == [{"name": "replicas", "type": "str", "default": "auto",
                                        "help": listed["dp"]["options"][0]["help"],
                                        "choices": ["split", "round-robin", "auto"]}]
    assert [(o["name"], o["type"], o["default"]) for o in listed["resalloc"]["options"]] == [
        ("beta", "float | None", None), ("depth", "int | None", None)]
    assert all(p["description"] and all(o["help"] for o in p["options"]) for p in listed.values())
    assert main(["planners"]) == 0
    text = capsys.readouterr().out
    assert "replicas" in text and "fb-parallel" in text


# -- the baselines' options ----------------------------------------------------------------------

def unequal_pair() -> tuple[Graph, Cluster]:
    """Two devices, one twice as fast: whole microbatches in turn leave the fast one idle
    half the time, splitting each microbatch by speed does not."""
    devs = [Device("fast", speed=2.0, memory=64e9), Device("slow", speed=1.0, memory=64e9)]
    bw = np.full((2, 2), 1e12)
    return Graph.chain("c", [1.0, 1.0], [2.0, 2.0], params=[1e3, 1e3], act=[1e3, 1e3]), Cluster("pair", devs, bw, np.zeros((2, 2)))


def test_dp_replicas_modes_and_auto_takes_the_faster():
    g, c = unequal_pair()
    times = {}
    for mode in ("split", "round-robin"):
        plan, result = run_planner("dp", g, c, PlanOptions(microbatches=2, settings=planner_settings(["dp"], [("replicas", mode)])))
        assert plan.replicas == mode and [s.devices for s in plan.stages] == [["fast", "slow"]]
        manual = Plan(g, c, [Stage(list(g.ids), ["fast", "slow"])], 2, schedule="1f1b", replicas=mode)
        times[mode] = simulate(manual).iteration_s
        assert result.iteration_s == pytest.approx(times[mode])
    # closed form, compute only: split runs 2 x 6 s of work at speeds 2+1 -> 4 s; round-robin
    # gives each device one microbatch of 6 s: the slow one takes 6 s
    assert times["split"] == pytest.approx(4.0, rel=1e-3) and times["round-robin"] == pytest.approx(6.0, rel=1e-3)
    auto, _ = run_planner("dp", g, c, PlanOptions(microbatches=2))
    assert auto.replicas == "split"


def test_dp_auto_takes_the_mode_that_fits():
    """Two equal devices, M = 2: round-robin runs a whole microbatch per device (8e9 bytes
    kept + an 8e9 gradient pair), no slower than splitting each microbatch in halves, but only
    the halves fit in 12e9 bytes."""
    devs = [Device(f"d{i}", speed=1.0, memory=12e9) for i in range(2)]
    c = Cluster("pair", devs, np.full((2, 2), 1e12), np.zeros((2, 2)))
    g = Graph.chain("c", [1.0, 1.0], [2.0, 2.0], params=[1e3, 1e3], act=[4e9, 4e9])
    whole, halves = (simulate(Plan(g, c, [Stage(list(g.ids), c.names)], 2, schedule="1f1b", replicas=m))
                     for m in ("round-robin", "split"))
    assert whole.over_memory and not halves.over_memory and whole.iteration_s <= halves.iteration_s
    auto, result = run_planner("dp", g, c, PlanOptions(microbatches=2))
    assert auto.replicas == "split" and not result.over_memory


def test_gpipe_rematerializes_unless_told_not_to():
    g = load_graph("zoo:alexnet")
    c = hierarchical("h", 1, 4, 1e10, 1e10)
    plan, _ = run_planner("gpipe", g, c, PlanOptions(microbatches=4))
    assert plan.recompute == [True] * plan.num_stages and plan.schedule == "gpipe"
    keep, _ = run_planner("gpipe", g, c, PlanOptions(microbatches=4, settings=planner_settings(["gpipe"], [("recompute", "false")])))
    assert keep.recompute is None and [s.nodes for s in keep.stages] == [s.nodes for s in plan.stages]


def test_spp_stage_count_option():
    """-O stages=2 on 3 devices: PRM uses every device, so the two stages are uneven; a count
    beyond min(layers, devices) is a user error."""
    g = load_graph("zoo:alexnet")
    c = hierarchical("h", 1, 3, 1e10, 1e10)
    plan, _ = run_planner("spp", g, c, PlanOptions(microbatches=4, settings=planner_settings(["spp"], [("stages", "2")])))
    assert len(plan.stages) == 2 and sorted(len(s.devices) for s in plan.stages) == [1, 2]
    assert [e["stages"] for e in plan.extra["per_stage_count"]] == [2]
    with pytest.raises(PipeplanError, match="stages=9: expected 1 to 3"):
        run_planner("spp", g, c, PlanOptions(microbatches=4, settings=planner_settings(["spp"], [("stages", "9")])))


def test_the_table_of_planner_modules_is_what_the_modules_register():
    """``base.MODULES`` (each planner imported on demand) names every registered planner and
    the module that registers it."""
    from pipeplan.planners.base import MODULES, load_all

    registry = load_all()
    assert set(MODULES) == set(registry)
    for name, module in MODULES.items():
        assert registry[name].fn.__module__.removeprefix("pipeplan.planners.").split(".")[0] == module, name
