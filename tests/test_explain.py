"""``pipeplan explain``: the bottleneck device's iteration split into terms that add up to it,
against closed forms (a uniform pipeline's bubble, one tensor-parallel group's passes), and two
plans' difference term by term."""

from __future__ import annotations

import json

import pytest

from pipeplan.cli import main
from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.llm.parallelism import Parallelism
from pipeplan.planners import llm3d
from pipeplan.sim import simulate
from pipeplan.sim.explain import TERMS, difference, explain

from helpers import chain_plan, one_server, uniform_chain

GPT = "zoo:gpt?hidden=1024&layers=8&heads=16&seq=512&vocab=8192"


def test_a_uniform_1f1b_pipeline_idles_p_minus_1_rounds():
    """4 stages of f = 1, b = 2 s, 8 microbatches, free transfers: (M + p - 1)(f + b) = 33 s an
    iteration; each device computes 8 + 16 s and idles (p - 1)(f + b) = 9 s."""
    g = uniform_chain(4, 1.0, 2.0)
    plan = chain_plan(g, one_server(4), [0, 1, 2, 3, 4], [1, 1, 1, 1], 8, "1f1b")
    e = explain(plan)
    assert e["iteration_s"] == pytest.approx(33.0)
    t = e["terms"]
    assert (t["forward"], t["backward"], t["bubble"]) == pytest.approx((8.0, 16.0, 9.0))
    assert sum(t.values()) == pytest.approx(e["iteration_s"], abs=1e-12) and set(t) == set(TERMS)


def test_one_tensor_parallel_group_splits_its_passes_into_compute_and_collectives():
    """One stage on TP 8, one replica: no bubble, no data-parallel reduction; forward + backward +
    recomputation + TP collectives + optimizer step = the iteration, and selective recomputation
    shows as recomputation."""
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    for rc in ("none", "selective"):
        plan = llm3d.plan_of(g, c, Parallelism(8, 1, 1, (8,), recompute=rc, sp=True), 8)
        e = explain(plan)
        t = e["terms"]
        assert t["bubble"] == pytest.approx(0.0, abs=1e-12) and t["dp_comm"] == 0 and t["pipeline_sends"] == 0
        assert t["tp_comm"] > 0 and t["optimizer"] > 0 and (t["recompute"] > 0) == (rc == "selective")
        assert sum(t.values()) == pytest.approx(simulate(plan, timeline=False).iteration_s, rel=1e-12)


def test_full_recomputation_against_none_is_read_off_the_difference():
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    a = explain(llm3d.plan_of(g, c, Parallelism(2, 2, 2, (4, 4), recompute="full", sp=True, zero=1,
                                                 overlap_grad_reduce=True), 16))
    b = explain(llm3d.plan_of(g, c, Parallelism(2, 2, 2, (4, 4), sp=True, zero=1, overlap_grad_reduce=True), 16))
    d = difference(a, b)
    assert d["iteration_saved_s"] == pytest.approx(a["iteration_s"] - b["iteration_s"])
    assert sum(d["saved_s"].values()) == pytest.approx(d["iteration_saved_s"], rel=1e-9)
    assert d["saved_s"]["recompute"] == pytest.approx(a["terms"]["recompute"]) and d["speedup"] > 1
    assert max(d["saved_s"], key=d["saved_s"].get) == "recompute"


def test_the_cli_prints_terms_and_their_difference_as_json(tmp_path, capsys):
    paths = []
    for rc in ("full", "none"):
        paths.append(str(tmp_path / f"{rc}.json"))
        assert main(["plan", "--model", GPT, "--cluster", "dgx-h100x1", "--global-batch", "16", "--planner",
                     "megatron", "-O", "tp=2", "-O", "pp=2", "-O", f"recompute={rc}", "--out", paths[-1]]) == 0
    capsys.readouterr()
    assert main(["explain", *paths, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for p in out["plans"]:
        assert sum(p["terms"].values()) == pytest.approx(p["iteration_s"], rel=1e-9)
    assert out["difference"]["saved_s"]["recompute"] > 0
    assert main(["explain", paths[0]]) == 0
    assert "recomputation" in capsys.readouterr().out
