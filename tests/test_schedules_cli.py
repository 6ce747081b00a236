"""The new schedules at the command line: `plan --schedule` and `simulate --schedule` take
them, a plan of the wrong shape is one line (exit 2), and a split backward on a graph that
does not measure it (a PipeDream profile) states the assumption."""

from __future__ import annotations

import json
import warnings

import pytest

from pipeplan.cli import main
from pipeplan.graph import Graph, save_graph

from test_cli import assert_one_line_error, in_process


def run(capsys, *argv: str):
    """``pipeplan ARGV`` in this process (``test_cli.in_process``; test_cli runs one in a child
    process of its own), Python warnings raised as errors: in a process of its own a warning
    would be one more line on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return in_process(capsys, *argv)


def _plan(tmp_path, capsys, *extra: str) -> dict:
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "zoo:bert-large", "--cluster", "v100x4", "--microbatches", "8",
                 "--out", str(out), "--json", *extra]) == 0
    captured = capsys.readouterr()
    assert "note:" not in captured.err  # the zoo estimates the split
    return json.loads(captured.out)


@pytest.mark.parametrize("schedule,chunked", [("interleaved-1f1b", True), ("zb-v", True), ("zb-h1", False)])
def test_plan_and_simulate_take_the_new_schedules(tmp_path, capsys, schedule, chunked):
    plan = _plan(tmp_path, capsys, "--planner", "megatron", "--schedule", schedule)
    assert plan["schedule"] == schedule
    devices = [tuple(s["devices"]) for s in plan["stages"]]
    assert (len(set(devices)) < len(devices)) == chunked
    assert main(["simulate", str(tmp_path / "p.json"), "--json", "--gantt", str(tmp_path / "g.png")]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_s"] == pytest.approx(plan["iteration_s"])
    assert any("stages" in d for d in sim["devices"]) == chunked


def test_simulate_under_zero_bubble_and_refuse_interleaving_a_plan_without_chunks(tmp_path, capsys):
    one_f_one_b = _plan(tmp_path, capsys, "--planner", "gpipe", "--schedule", "1f1b")
    assert main(["simulate", str(tmp_path / "p.json"), "--schedule", "zb-h1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_s"] < one_f_one_b["iteration_s"]
    assert_one_line_error(run(capsys, "simulate", str(tmp_path / "p.json"), "--schedule", "interleaved-1f1b"),
                          "needs several stages per device")
    assert_one_line_error(run(capsys, "plan", "--model", "zoo:bert-large", "--cluster", "v100x4", "--planner", "spp",
                              "--schedule", "zb-v"), "needs several stages per device")


def test_a_graph_without_a_split_says_what_is_assumed(tmp_path, capsys):
    g = Graph.chain("nosplit", [1e-3] * 4, [2e-3] * 4, act=[1e6] * 4, meta={"source": "pipedream"})
    path = tmp_path / "g.json"
    save_graph(g, path)
    base = ["plan", "--model", str(path), "--cluster", "v100x4", "--planner", "gpipe", "--microbatches", "4"]
    proc = run(capsys, *base, "--schedule", "zb-h1")
    assert proc.returncode == 0
    notes = [line for line in proc.stderr.splitlines() if "note:" in line]
    assert len(notes) == 1 and "assumes the input gradient takes 50% of each backward" in notes[0]
    assert "(pipedream)" in notes[0]
    assert "note:" not in run(capsys, *base, "--schedule", "1f1b").stderr
