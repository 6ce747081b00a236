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


def test_blocking_sends_cost_each_microbatch_its_send_and_explain_says_so():
    """Two stages on two servers joined by 100 Gb/s, 32 microbatches, 1F1B: Megatron's sends
    block, so each microbatch costs its stage its compute plus its send (s x b x h 16-bit values
    over the link, plus its latency): the iteration is at least M (stage + send), and explain
    puts the bottleneck's sends (all but at most the one no later work waits for) under pipeline
    sends."""
    g = load_graph(GPT + "&microbatch=1")
    c = load_cluster("hier:servers=2,gpus=1,intra=100Gbps,inter=100Gbps,kind=A100-80GB,latency=5us")
    plan = llm3d.plan_of(g, c, Parallelism(1, 2, 1, (4, 4)), 32)
    r = simulate(plan, timeline=False)
    send = 2 * 512 * 1 * 1024 / (100e9 / 8) + 5e-6
    stage = max(r.extra["stage_s_per_microbatch"])
    assert r.iteration_s >= 32 * (stage + send)
    e = explain(plan)
    assert 31 * send * (1 - 1e-9) <= e["terms"]["pipeline_sends"] <= 32 * send * (1 + 1e-9)  # all but at most one


def test_the_tensor_parallel_term_is_the_exposed_collectives_in_closed_form():
    """TP 8 with sequence parallelism on one DGX H100, 8 microbatches of one 512-token sequence:
    each collective of s x b x h 16-bit values takes c = 7/8 x bytes / (450 GB/s x 0.8) + 3
    steps x 3 us; a layer exposes its forward's 2 all-gathers and 2 reduce-scatters and its
    backward's 2 output-gradient all-gathers (the rest hides behind its GEMMs), the embedding
    and the head one each way: 8 x (6 L + 4) c."""
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    e = explain(llm3d.plan_of(g, c, Parallelism(8, 1, 1, (8,), sp=True), 8))
    coll = 7 / 8 * 2 * 512 * 1024 / (450e9 * 0.8) + 3 * 3e-6
    assert e["terms"]["tp_comm"] == pytest.approx(8 * (6 * 8 + 4) * coll, rel=1e-6)
