"""One-time set-up (the simulator's numba kernels, compiled or loaded from numba's on-disk
cache) happens before a planner's search timer starts and is reported apart from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeplan.cli import main
from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions
from pipeplan.planners import base
from pipeplan.sim import engine
from pipeplan.sim.batch import BatchEvaluator

from randomplans import random_candidates


def kernels() -> tuple:
    """The simulator's kernels as this process runs them: after ``warm_up`` numba's compiled
    dispatchers (it replaces the module's Python functions with them)."""
    return (engine._run, engine._run_rows, engine._workspace)


def test_setup_runs_before_the_search_timer_and_is_recorded(monkeypatch, capsys):
    events: list[str] = []
    clock = time.perf_counter
    monkeypatch.setattr(base, "warm_up", lambda: events.append("set-up") or 0.25)
    monkeypatch.setattr(base.time, "perf_counter", lambda: events.append("clock") or clock())
    plan, _ = base.run_planner("gpipe", load_graph("zoo:alexnet"), load_cluster("v100x4"), PlanOptions(microbatches=4))
    assert events[:2] == ["set-up", "clock"] and plan.setup_s == 0.25
    assert plan.to_dict()["setup_s"] == 0.25


def test_a_warm_process_compiles_and_loads_nothing_during_a_search(capsys):
    """After ``warm_up`` every kernel signature the planners use exists: a search neither
    compiles nor loads code (the set-up it would otherwise be charged for)."""
    engine.warm_up()
    assert engine.warm_up() == 0.0
    before = [list(k.signatures) for k in kernels()]
    g, c = load_graph("zoo:alexnet"), load_cluster("v100x4")
    for name in ("dp", "gpipe", "spp", "pipedream"):
        plan, _ = base.run_planner(name, g, c, PlanOptions(microbatches=4))
        assert plan.setup_s == 0.0
    son, dst = random_candidates(np.random.default_rng(0), g, c, 2, 8)
    assert BatchEvaluator(g, c, 2, 4, "1f1b").evaluate(son, dst).feasible.any()  # the batched kernel
    assert [list(k.signatures) for k in kernels()] == before
    assert main(["compare", "--model", "zoo:alexnet", "--cluster", "v100x4", "--planners", "dp,gpipe",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert all(r["plan"]["setup_s"] == 0.0 for r in rows)


@pytest.mark.slow
def test_compiled_kernels_are_reused_by_a_fresh_process(tmp_path):
    """The first process compiles into numba's cache directory; a second loads from it
    (cache hits, no misses) instead of compiling."""
    code = ("import json; from pipeplan.sim import engine; engine.warm_up(); "
            "print(json.dumps([[sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values())] "
            "for k in (engine._run, engine._run_rows, engine._workspace)]))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(Path(engine.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True, timeout=600).stdout) for _ in range(2)]
    assert all(miss >= 1 for _, miss in runs[0])  # compiled and written
    assert any(tmp_path.rglob("*.nbi"))
    assert all(hit >= 1 and miss == 0 for hit, miss in runs[1])  # loaded, not compiled
