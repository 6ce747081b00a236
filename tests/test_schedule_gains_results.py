"""The schedule target of issue 16, checked on the committed results of
benchmarks/schedules/gains.py (``make bench`` regenerates them): the predicted gain of zb-h1,
interleaved-1f1b and zb-v over 1F1B on the zoo's transformers at several depths and M in
{8, 32}, and the measured gain on the CPU runtime, each measured run checked against
one-process training."""

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "schedules"
sys.path.insert(0, str(ROOT / "benchmarks" / "schedules"))
import gains  # noqa: E402


@pytest.fixture(scope="module")
def data() -> dict:
    path = RESULTS / "gains.json"
    if not path.exists():
        pytest.skip(f"{path} not written yet (python benchmarks/schedules/gains.py)")
    return json.loads(path.read_text())


def test_every_model_depth_and_microbatch_count_is_covered(data):
    rows = data["predicted"]
    for model in gains.MODELS:
        layers = {r["layers"] for r in rows if r["model"] == model}
        assert len(layers) == 1
        for p in gains.DEPTHS:
            for m in gains.MICROBATCHES:
                got = [(r["schedule"], r["chunks"]) for r in rows if (r["model"], r["p"], r["m"]) == (model, p, m)]
                assert got == gains.layouts(next(iter(layers)), p)
    assert {r["schedule"] for r in rows} == {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"}


def test_gains_are_the_ratio_to_1f1b_and_the_summary_is_theirs(data):
    rows = data["predicted"]
    for r in rows:
        base = next(b for b in rows if (b["model"], b["p"], b["m"], b["schedule"]) == (r["model"], r["p"], r["m"], "1f1b"))
        assert r["gain"] == pytest.approx(base["iteration_s"] / r["iteration_s"] - 1)
    for label, s in data["summary"].items():
        g = [r["gain"] for r in rows if r["label"] == label]
        assert (s["cases"], s["faster"]) == (len(g), sum(x > 0 for x in g))
        assert (s["median"], s["min"], s["max"]) == pytest.approx((statistics.median(g), min(g), max(g)))


def test_zero_bubble_h1_beats_1f1b_everywhere_on_the_same_stages(data):
    """Its gain is the bubble alone: same stages, so the busiest device's work is 1F1B's; on
    models whose stages keep the same bytes per microbatch it keeps 1F1B's peak memory."""
    h1 = [r for r in data["predicted"] if r["schedule"] == "zb-h1"]
    assert all(r["gain"] > 0 and abs(r["balance_gain"]) < 1e-9 for r in h1)
    assert all(r["memory_ratio"] == pytest.approx(1.0, abs=0.01) for r in h1
               if r["model"] in ("bert-large", "bert-48", "xlnet-large"))
    deeper = {(r["model"], r["m"]): [] for r in h1}
    for r in sorted(h1, key=lambda r: r["p"]):
        deeper[(r["model"], r["m"])].append(r["gain"])
    assert all(g == sorted(g) for g in deeper.values())  # the deeper the pipeline, the more bubble to fill


def test_interleaving_and_zb_v_beat_1f1b_on_every_case_they_can_lay_out(data):
    for label in ("interleaved-1f1b (v=2)", "zb-v"):
        s = data["summary"][label]
        assert s["faster"] == s["cases"] >= 24


def test_measured_on_the_runtime_with_every_run_checked(data):
    meas = data["measured"]
    rows = {r["label"]: r for r in meas["rows"]}
    assert set(rows) == {"1f1b", "zb-h1", "interleaved-1f1b (v=2)", "interleaved-1f1b (v=4)", "zb-v"}
    assert meas["workers"] >= 2 and meas["runs"] >= 3
    for r in rows.values():
        assert len(r["measured_s"]) == meas["runs"] and min(r["measured_s"]) == r["best_s"] > 0
        assert r["gain"] == pytest.approx(rows["1f1b"]["best_s"] / r["best_s"] - 1)
        assert r["predicted_gain"] == pytest.approx(rows["1f1b"]["predicted_s"] / r["predicted_s"] - 1)
        assert set(r["checks"]) == {"pass"} and r["max_rel_diff"] <= 1e-5


def test_the_markdown_says_what_the_json_holds(data):
    text = (RESULTS / "gains.md").read_text()
    for label, s in data["summary"].items():
        assert f"| {label} | {s['cases']} | {s['faster']} | {s['median']:+.1%} |" in text
    for r in data["measured"]["rows"]:
        assert f"| {r['label']} | {r['stages']} |" in text and f"{r['gain']:+.1%}" in text
