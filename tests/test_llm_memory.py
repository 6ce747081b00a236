"""A plan's memory against what a GPU can give it: 80 GiB less the reserve for the CUDA context
(0.75 GiB), NCCL's buffers (1.25 GiB) and the allocator's fragmentation (3%), or less what
--memory-reserve says. No recommended plan above it."""

from __future__ import annotations

import json

import pytest

from pipeplan.cli import main

GiB = 2**30
USABLE_80 = (80 - 0.75 - 1.25 - 0.03 * 80) * GiB


def _plan(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("planner", ["megatron", "joint"])
@pytest.mark.parametrize("model, cluster, batch", [("zoo:llama3-8b", "dgx-h100x1", "32"),
                                                   ("zoo:llama3-70b?layers=16", "dgx-a100x2", "64")])
def test_no_recommended_plan_is_above_the_usable_memory(planner, model, cluster, batch, capsys):
    out = _plan(capsys, "--model", model, "--cluster", cluster, "--global-batch", batch, "--planner", planner)
    devices = out["prediction"]["devices"]
    assert not out["prediction"]["over_memory"]
    assert all(d["memory_limit_bytes"] == pytest.approx(USABLE_80, rel=1e-12) for d in devices)
    assert max(d["memory_bytes"] for d in devices) <= USABLE_80


def test_a_larger_reserve_changes_the_plan_and_is_kept(capsys):
    argv = ["--model", "zoo:llama3-8b", "--cluster", "dgx-h100x1", "--global-batch", "32", "--planner", "joint"]
    base = _plan(capsys, *argv)
    tight = _plan(capsys, *argv, "--memory-reserve", "40GiB")
    assert all(d["memory_limit_bytes"] == 40 * GiB for d in tight["prediction"]["devices"])
    assert max(d["memory_bytes"] for d in tight["prediction"]["devices"]) <= 40 * GiB
    assert max(d["memory_bytes"] for d in base["prediction"]["devices"]) > 40 * GiB
    assert tight["parallelism"] != base["parallelism"]


def test_a_reserve_at_or_above_the_memory_is_one_line(capsys):
    assert main(["plan", "--model", "zoo:llama3-8b", "--cluster", "dgx-h100x1", "--global-batch", "32",
                 "--memory-reserve", "80GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "reserve" in err and len(err.splitlines()) == 1
