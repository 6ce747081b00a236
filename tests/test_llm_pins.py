"""Every -O value megatron and joint accept on a decoder LLM is in the plan they return, or the
command exits 2 with one line naming the pin (issue: "pins honored or refused"). The expected
values are the pins themselves; the plan's own ``parallelism`` is read back."""

from __future__ import annotations

import json

import pytest

from pipeplan.cli import main

MODEL = "zoo:gpt?hidden=1024&layers=8&heads=16&seq=512&vocab=8192"
BASE = ["plan", "--model", MODEL, "--cluster", "dgx-a100x2", "--global-batch", "64", "--json"]
#: (option, value, the parallelism field it sets, the value read back)
VALUES = [("tp", "1", "tp", 1), ("tp", "2", "tp", 2), ("tp", "4", "tp", 4), ("tp", "8", "tp", 8),
          ("pp", "1", "pp", 1), ("pp", "2", "pp", 2), ("pp", "4", "pp", 4), ("pp", "8", "pp", 8),
          ("vpp", "1", "vpp", 1), ("vpp", "2", "vpp", 2),
          ("microbatch", "1", "microbatch", 1), ("microbatch", "4", "microbatch", 4),
          ("recompute", "none", "recompute", "none"), ("recompute", "selective", "recompute", "selective"),
          ("recompute", "full", "recompute", "full"),
          ("zero", "0", "zero", 0), ("zero", "1", "zero", 1),
          ("sp", "true", "sp", True), ("sp", "false", "sp", False),
          ("overlap", "true", "overlap_grad_reduce", True), ("overlap", "false", "overlap_grad_reduce", False),
          ("grad_reduce", "fp32", "grad_reduce", "fp32"), ("grad_reduce", "bf16", "grad_reduce", "bf16"),
          ("overlap_p2p", "false", "overlap_p2p", False), ("overlap_p2p", "true", "overlap_p2p", True)]


def _plan(capsys, planner: str, *pins: str) -> dict:
    argv = [*BASE, "--planner", planner]
    for p in pins:
        argv += ["-O", p]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("planner", ["megatron", "joint"])
@pytest.mark.parametrize("key, text, field, want", VALUES)
def test_every_value_of_every_option_is_in_the_plan(planner, key, text, field, want, capsys):
    extra = ["simulations=2"] if planner == "joint" else []
    got = _plan(capsys, planner, f"{key}={text}", *extra)["parallelism"]
    assert got[field] == want


@pytest.mark.parametrize("planner", ["megatron", "joint"])
def test_pins_that_need_each_other_are_honored_together(planner, capsys):
    extra = ["simulations=2"] if planner == "joint" else []
    got = _plan(capsys, planner, "overlap_p2p=true", "vpp=2", "pp=2", "layout=3,5", *extra)
    p = got["parallelism"]
    assert p["overlap_p2p"] and p["vpp"] == 2 and p["pp"] == 2
    assert [sum(p["layout"][s::2]) for s in range(2)] == [3, 5]
    assert got["schedule"] == "interleaved-1f1b"


@pytest.mark.parametrize("planner", ["megatron", "joint"])
@pytest.mark.parametrize("pins, words", [
    (["tp=3"], "tp=3"), (["pp=3"], "pp=3"), (["tp=1", "sp=true"], "sp=true"),
    (["overlap_p2p=true", "vpp=1"], "overlap_p2p=true"), (["layout=3,5", "pp=4"], "layout=3,5"),
    (["overlap_p2p=false", "vpp=2", "pp=2"], "overlap_p2p=false"),
    (["layout=4,5"], "layout='4,5'"), (["recompute=some"], "recompute"),
])
def test_a_pin_that_cannot_hold_is_one_line_naming_it(planner, pins, words, capsys):
    argv = [*BASE, "--planner", planner]
    for p in pins:
        argv += ["-O", p]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_recompute_none_is_a_value_not_unset(capsys):
    """-O recompute=none on a model that fits without recomputation: the plan recomputes nothing."""
    got = _plan(capsys, "megatron", "recompute=none")
    assert got["parallelism"]["recompute"] == "none" and "recompute" not in got and not got.get("selective_recompute")


@pytest.mark.parametrize("key, text", [("evaluations", "100"), ("patience", "3"), ("seed", "1")])
def test_joint_refuses_graph_search_options_on_decoders(key, text, capsys):
    assert main([*BASE, "--planner", "joint", "-O", f"{key}={text}"]) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and "decoder" in err and len(err.splitlines()) == 1


def test_joint_honors_schedules_simulations_and_budget(capsys):
    got = _plan(capsys, "joint", "schedules=zb-h1", "simulations=3")
    assert got["schedule"] == "zb-h1" and len(got["joint"]["simulated"]) <= 4  # 3 and Megatron's rule
    got = _plan(capsys, "joint", "simulations=50", "budget=0.000001")
    assert got["joint"]["complete"] is False and "budget" in got["joint"]["incomplete"]
