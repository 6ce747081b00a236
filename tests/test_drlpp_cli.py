"""`pipeplan train drl-pp` on PipeDream's VGG-16 profile / drlpp-4gpu, then `plan --planner drl-pp
-O checkpoint=...` and `compare --planners dp,gpipe,pipedream,spp,drl-pp` with it (the
issue's flow, on a budget of evaluations), and the bad inputs around them."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from conftest import profile_path
from pipeplan.cli import main

pytestmark = pytest.mark.slow  # trains an agent (a few seconds)

MODEL, CLUSTER = "zoo:alexnet", "drlpp-4gpu"  # for the bad inputs


@pytest.fixture(scope="module")
def vgg16() -> str:
    return str(profile_path("vgg16").parent)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, vgg16):
    path = tmp_path_factory.mktemp("ck") / "ck.pt"
    assert main(["train", "drl-pp", "--model", vgg16, "--cluster", CLUSTER, "--microbatches", "4",
                 "--evaluations", "80", "--seed", "3", "--out", str(path), "--json"]) == 0  # a few updates
    return path


def test_train_writes_checkpoint_and_curve(checkpoint, capsys):
    data = torch.load(checkpoint, weights_only=True)
    assert data["agent"] == "drl-pp" and data["config"]["seed"] == 3 and data["pipeplan_version"]
    assert data["trained_on"]["devices"] == 4 and data["trained_on"]["evaluations"] >= 80
    assert "--evaluations 80" in data["trained_on"]["command"]
    rows = list(csv.DictReader(checkpoint.with_suffix(".csv").open()))
    assert len(rows) >= 2 and int(rows[-1]["evaluations"]) == data["trained_on"]["evaluations"]
    assert checkpoint.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_plan_and_compare_with_the_checkpoint(checkpoint, vgg16, capsys):
    capsys.readouterr()
    argv = ["--model", vgg16, "--cluster", CLUSTER, "--microbatches", "4"]
    assert main(["plan", *argv, "--planner", "drl-pp", "-O", f"checkpoint={checkpoint}", "-O", "samples=4",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["planner"] == "drl-pp" and plan["drl-pp"]["checkpoint"] == str(checkpoint)
    assert plan["replicas"] in ("round-robin", "split") and plan["schedule"] in ("gpipe", "1f1b", "zb-h1", "spp-pe")
    assert main(["plan", *argv, "--planner", "drl-pp", "-O", f"checkpoint={checkpoint}", "-O", "samples=2",
                 "-O", "replicas=split", "--schedule", "gpipe", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert (chosen["replicas"], chosen["schedule"]) == ("split", "gpipe")
    assert main(["plan", *argv, "--planner", "drl-pp", "-O", f"checkpoint={checkpoint}", "--schedule", "zb-v"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert main(["compare", *argv, "--planners", "dp,gpipe,pipedream,spp,drl-pp", "-O",
                 f"checkpoint={checkpoint}", "--json"]) == 0
    rows = {r["planner"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) == {"dp", "gpipe", "pipedream", "spp", "drl-pp"} and "error" not in rows["drl-pp"]


@pytest.mark.parametrize("argv, fragment", [
    (["train", "drl-pp", "--budget", "10x"], "as a duration"),
    (["train", "nosuch", "--budget", "1s"], "unknown learning planner"),
    (["train", "drl-pp", "--budget", "1s", "--out", "{tmp}/ck.json"], ".pt"),
    (["train", "drl-pp", "--budget", "1s", "-O", "samples=2"], "not of train"),
    (["plan", "--planner", "drl-pp", "-O", "checkpoint={tmp}/none.pt"], "no such file"),
    (["plan", "--planner", "drl-pp", "-O", "checkpoint={tmp}/bad.pt"], "not a pipeplan checkpoint"),
    (["plan", "--planner", "drl-pp", "-O", "budget=-1"], "budget"),
])
def test_bad_input_is_one_line(argv, fragment, tmp_path, capsys):
    (tmp_path / "bad.pt").write_text("{}")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--model", MODEL, "--cluster", CLUSTER]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_a_checkpoint_for_another_device_count_is_refused(checkpoint, capsys):
    assert main(["plan", "--model", MODEL, "--cluster", "1080ti-4x2", "--planner", "drl-pp",
                 "-O", f"checkpoint={checkpoint}"]) == 2
    assert "trained for 4 accelerators; this cluster has 8" in capsys.readouterr().err


@pytest.mark.parametrize("agent, argv", [("drl-pp", ["--model", "zoo:alexnet", "--cluster", CLUSTER]),
                                         ("automap-infer", [])])
def test_train_defaults_to_a_checkpoint_named_after_the_agent(agent, argv, tmp_path, monkeypatch, capsys):
    """``train drl-pp`` and ``train automap-infer`` never write the same default file: a
    directory in the default's place shows which file each would write (before any work)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{agent}.pt").mkdir()
    assert main(["train", agent, *argv, "--evaluations", "8"]) == 2
    assert capsys.readouterr().err == f"pipeplan: error: --out {agent}.pt: is a directory; name a file in it\n"


@pytest.mark.slow
def test_train_measured_runs_plans_for_real(tmp_path, capsys, monkeypatch):
    """``train drl-pp --measured``: the model spec profiled here, each distinct plan trained on
    worker processes, the checkpoint saying its rewards were measured and how many runs.

    PPO scores a whole batch before it looks at the budget (8 schemes x 4 placements: some 23
    distinct plans, each a run of worker processes), so the agent here samples batches of one
    scheme and 3 placements: the same command path, at most 3 runs."""
    from functools import partial

    from pipeplan.planners.drlpp import run as drlpp_run
    from pipeplan.planners.drlpp.ppo import Config

    monkeypatch.setattr(drlpp_run, "Config", partial(Config, schemes_per_update=1, placements_per_scheme=3))
    out = tmp_path / "m.pt"
    assert main(["train", "drl-pp", "--measured", "--model", "example:tiny", "--cluster",
                 "hier:servers=1,gpus=2,intra=10Gbps,inter=10Gbps", "--evaluations", "3", "--out", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rewards"] == "measured" and 1 <= summary["runs"] <= summary["evaluations"]
    assert out.is_file() and summary["best_iteration_s"] > 0
    data = torch.load(out, weights_only=True)
    assert data["config"]["schemes_per_update"] == 1  # the small batch above was the one trained
    assert data["trained_on"]["rewards"] == "measured" and data["trained_on"]["runs"] == summary["runs"]


def test_plan_with_the_checkpoint_returns_its_recorded_best_or_better(checkpoint, vgg16, capsys):
    """The checkpoint keeps the best plan its training scored; ``plan -O checkpoint=`` on the
    same model, cluster and microbatches returns it (scored again) or a better one, even
    sampling nothing; on other microbatches the record is not used."""
    recorded = torch.load(checkpoint, weights_only=True)["trained_on"]["best"]
    assert recorded["iteration_s"] > 0 and len(recorded["part"]) == 41 and len(recorded["device_part"]) == 4
    capsys.readouterr()
    argv = ["--model", vgg16, "--cluster", CLUSTER, "--planner", "drl-pp", "-O", f"checkpoint={checkpoint}",
            "-O", "samples=0", "--json"]
    assert main(["plan", *argv, "--microbatches", "4"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["drl-pp"]["checkpoint_best"] is True
    assert (plan["drl-pp"]["found"] == "the checkpoint's best") != bool(plan["drl-pp"]["trivial"])
    assert plan["iteration_s"] <= recorded["iteration_s"] * (1 + 1e-9)
    assert main(["plan", *argv, "--microbatches", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["drl-pp"]["checkpoint_best"] is False
