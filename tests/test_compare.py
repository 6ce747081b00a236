"""The library compare: a row per planner, memory verdicts checked against the simulator's
per-device memory, ``best`` against a brute-force pick, Infeasible candidates as error rows."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeplan.cli import main
from pipeplan.cluster import Cluster, Device, load_cluster
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph, load_graph
from pipeplan.planners import PlanOptions, planner_settings, best, compare, run_planner
from pipeplan.sim import simulate

GiB = 2**30
PLANNERS = ["dp", "gpipe", "spp", "hetpipe", "pipedream", "exact"]


@pytest.fixture(scope="module")
def tight():
    """BERT-large on 4 V100s cut to 4 GiB: data parallelism overflows, pipelines fit; 27
    layers are too many for ``exact``."""
    g, c = load_graph("zoo:bert-large"), load_cluster("v100x4").with_memory(4 * GiB)
    return g, c, compare(g, c, PLANNERS, PlanOptions(microbatches=4))


def test_a_row_per_planner_memory_from_the_simulator(tight):
    g, c, rows = tight
    assert sorted(r.planner for r in rows) == sorted(PLANNERS)
    errors = [r for r in rows if r.error is not None]
    assert [r.planner for r in errors] == ["exact"] and rows[-1] is errors[0]
    assert "instance too large" in errors[0].error and "\n" not in errors[0].error
    assert errors[0].to_dict() == {"planner": "exact", "error": errors[0].error}
    answered = [r for r in rows if r.error is None]
    assert any(not r.fits for r in answered) and any(r.fits for r in answered)
    for r in answered:
        sim = simulate(r.plan, timeline=False)  # independently of the row
        over = {d: m - c.memory[c.index[d]] for d, m in zip(sim.devices, sim.memory_bytes) if m > c.memory[c.index[d]]}
        assert r.memory_over_bytes == pytest.approx(over) and set(r.over_memory) == set(over)
        assert r.fits == (not over) and r.iteration_s == pytest.approx(sim.iteration_s)
        d = r.to_dict()
        assert d["memory_over_bytes"] == pytest.approx(over) and d["fits"] == r.fits
        assert d["plan"]["stages"] and d["search_s"] == r.plan.search_s >= 0
        if not r.fits:
            worst = max(over, key=over.get)
            assert d["memory"].startswith(worst) and "over by" in d["memory"]
    fit = [r.iteration_s for r in answered if r.fits]
    assert [r.iteration_s for r in answered[:len(fit)]] == sorted(fit)  # fitting first, fastest first


def test_speedup_counts_only_a_dp_plan_that_fits(tight):
    _, _, rows = tight
    dp = next(r for r in rows if r.planner == "dp")
    assert not dp.fits and all(r.speedup_vs_dp is None for r in rows)
    rows = compare(load_graph("zoo:alexnet"), load_cluster("v100x4"), ["dp", "gpipe"], PlanOptions(microbatches=4))
    dp = next(r for r in rows if r.planner == "dp")
    assert dp.fits and all(r.speedup_vs_dp == pytest.approx(dp.iteration_s / r.iteration_s) for r in rows)


def test_best_is_the_fastest_plan_that_fits(tight):
    g, c, _ = tight
    names = ["dp", "gpipe", "spp", "hetpipe"]
    chosen = best(g, c, PlanOptions(microbatches=4), names)
    alone = {n: simulate(run_planner(n, g, c, PlanOptions(microbatches=4))[0], timeline=False) for n in names}
    fitting = {n: r.iteration_s for n, r in alone.items() if not r.over_memory}
    assert chosen.fits and chosen.planner == min(fitting, key=fitting.get)
    assert chosen.iteration_s == pytest.approx(min(fitting.values()))


def test_when_nothing_fits_best_overflows_least_and_plan_warns(capsys):
    g, c = load_graph("zoo:bert-large"), load_cluster("v100x4").with_memory(64 * 2**20)
    rows = compare(g, c, ["dp", "gpipe", "spp", "hetpipe"], PlanOptions(microbatches=4))
    assert [r.error for r in rows] == [None] * 4  # every planner answers
    assert not any(r.fits for r in rows)
    ratio = {r.planner: float(np.max(simulate(r.plan, timeline=False).memory_bytes / (64 * 2**20))) for r in rows}
    chosen = best(g, c, PlanOptions(microbatches=4), ["dp", "gpipe", "spp", "hetpipe"])
    assert not chosen.fits and ratio[chosen.planner] == pytest.approx(min(ratio.values()))
    assert rows[0].planner == chosen.planner
    assert main(["plan", "--model", "zoo:bert-large", "--cluster", "v100x4", "--memory-limit", "64MiB",
                 "--microbatches", "4", "--planner", "gpipe", "--json"]) == 0  # every planner answers
    out = capsys.readouterr()
    assert json.loads(out.out)["prediction"]["over_memory"]
    assert out.err.count("\n") == 1 and "warning: the plan does not fit in memory" in out.err
    assert "one would with" in out.err  # and what would make it fit
    assert main(["compare", "--model", "zoo:bert-large", "--cluster", "v100x4", "--memory-limit", "64MiB",
                 "--microbatches", "4", "--planners", "gpipe,dp"]) == 2  # no planner has a plan that fits
    out = capsys.readouterr()
    assert "fits" in out.out and "no: " in out.out and "GiB" in out.out  # the table is still printed
    assert out.err.count("\n") == 1 and "no planner has a plan that fits" in out.err


def test_an_overflowing_plan_is_replaced_by_its_fastest_variant_that_fits():
    """GPipe told not to re-materialize overflows; run_planner answers with a variant that fits
    (recorded in the plan), and with ``allow_over_memory`` (what-if) keeps it, flagged."""
    g = load_graph("zoo:bert-large")
    base = load_cluster("v100x4")
    opts = PlanOptions(microbatches=8, settings=planner_settings(["gpipe"], [("recompute", "false")]))
    keep = simulate(run_planner("gpipe", g, base, opts)[0], timeline=False)
    rec = simulate(run_planner("gpipe", g, base, PlanOptions(microbatches=8))[0], timeline=False)
    limit = float((keep.memory_bytes.max() + rec.memory_bytes.max()) / 2)  # between the two
    c = base.with_memory(limit)
    plan, result = run_planner("gpipe", g, c, opts)
    assert not result.over_memory and "memory_variant" in plan.extra
    assert simulate(plan, timeline=False).iteration_s == pytest.approx(result.iteration_s)
    flagged, r = run_planner("gpipe", g, c, replace(opts, allow_over_memory=True))
    assert r.over_memory and flagged.recompute is None


def unlinked() -> Cluster:
    """Two devices with no link between them."""
    return Cluster("unlinked", [Device("a"), Device("b")], np.zeros((2, 2)), np.zeros((2, 2)))


def test_candidates_that_cannot_run_are_error_rows(capsys, tmp_path):
    g = Graph.chain("c", [1.0, 1.0], [2.0, 2.0], params=[1e3, 1e3], act=[1e3, 1e3])
    rows = compare(g, unlinked(), ["dp", "gpipe", "spp"], PlanOptions(microbatches=2))
    assert all(r.error and "zero bandwidth" in r.error and "\n" not in r.error for r in rows), rows
    with pytest.raises(PipeplanError, match="no planner could plan this"):
        best(g, unlinked(), PlanOptions(microbatches=2), ["dp", "gpipe", "spp"])
    path = tmp_path / "unlinked.yaml"
    path.write_text("devices: [{name: a}, {name: b}]\nbandwidth: 0\n")
    graph = tmp_path / "g.txt"
    graph.write_text("node1 -- L -- forward_compute_time=1, backward_compute_time=1, activation_size=10, parameter_size=10\n"
                     "node2 -- L -- forward_compute_time=1, backward_compute_time=1, activation_size=10, parameter_size=10\n"
                     "\tnode1 -- node2\n")
    assert main(["plan", "--model", str(graph), "--cluster", str(path), "--planner", "spp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zero bandwidth" in err


def test_compare_reports_each_planner_before_it_runs_with_its_estimate():
    """dp: no estimate (well under a second); spp: its size model; exact: its wall-clock cap."""
    from pipeplan.planners.spp import spp_seconds

    g, c = load_graph("zoo:alexnet"), load_cluster("v100x4")
    seen = []
    compare(g, c, ["dp", "spp", "exact"], PlanOptions(microbatches=4, settings=planner_settings(["dp", "spp", "exact"], [("exact.budget", "7")])), lambda *a: seen.append(a))
    assert seen == [("dp", 0, 3, None), ("spp", 1, 3, spp_seconds(len(g), len(c))), ("exact", 2, 3, 7.0)]
