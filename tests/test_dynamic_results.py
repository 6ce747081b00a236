"""The DynPartition issue's must-shows, checked on the committed benchmark results
(``make bench`` regenerates them): learning curves of both networks, real and simulated,
over at least 5 seeds with every baseline; a regime where the learned placement beats every
static placement, with its gaps to HEFT and to the exact optimum; the stream's throughput
and latencies per policy; the paper's Figs. 7-11."""

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "dynpartition"


def load(name: str) -> dict:
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{path} not written yet (python benchmarks/dynpartition/{name.split('.')[0]}.py)")
    return json.loads(path.read_text())


def statics(case: dict) -> list[float]:
    return [v for k, v in case["baselines"].items() if (k == "cpu" or k.startswith("all on")) and v is not None]


def test_learning_curves_for_both_networks_real_and_simulated_over_5_seeds():
    cases = load("learning.json")["cases"]
    kinds = {(c["setup"]["net"], "simulated" in c["setup"]) for c in cases}
    assert kinds == {("treelstm", True), ("treelstm", False), ("mathfunc", True), ("mathfunc", False)}
    for c in cases:
        assert len(c["runs"]) >= 5 and all(len(r["rewards"]) == c["episodes"] for r in c["runs"])
        assert {"cpu", "random", "heft"} <= set(c["baselines"])
        assert (RESULTS / f"learning-{c['label']}.png").exists()
        if "simulated" in c["setup"]:
            assert c["baselines"]["gpu"] is not None and c["optimal_subset"]


def test_a_regime_where_the_learned_placement_beats_every_static_one():
    cases = load("learning.json")["cases"]
    wins = [c for c in cases if max(r["policy_ms"] for r in c["runs"]) < min(statics(c))]
    assert wins, "no case where every seed's DQN beats every static placement"
    for c in wins:  # the gaps to HEFT and to the optimum are there to read
        assert c["baselines"]["heft"] > 0
        if c["optimal_subset"]:
            sub = c["optimal_subset"]
            assert sub["optimal_ms"] <= sub["heft_ms"] + 1e-9
            assert all(r["optimal_subset_policy_ms"] >= sub["optimal_ms"] - 1e-9 for r in c["runs"]
                       if "simulated" in c["setup"])


def test_stream_reports_throughput_and_latency_per_policy():
    rows = load("stream.json")["rows"]
    policies = {r["policy"] for r in rows}
    assert {"dqn", "heft per tree", "all on cpu", "shortest queue (whole trees)"} <= policies
    assert any(r["case"].startswith("real") for r in rows) and any(r["case"].startswith("simulated") for r in rows)
    for r in rows:
        assert r["throughput_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]


def test_the_papers_figures_7_to_11_and_the_simulator_against_the_executor():
    out = load("figures.json")
    assert out["fig7"] and out["fig8"] and out["fig9"] and out["splits"]
    assert {r["where"] for r in out["splits"]} == {"real", "simulated"}
    assert {(r["net"], r["width"]) for r in out["accuracy"]} == {(r["net"], r["width"]) for r in out["fig8"]}
