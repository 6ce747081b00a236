"""The schedule gains of benchmarks/schedules/gains.py, re-run at small size: the predicted
gain of zb-h1, interleaved-1f1b and zb-v over 1F1B on two of the zoo's transformers at
depths 2, 4 and 8 (``make bench`` runs all seven at M in {8, 32}). The measured part (CPU
runtime) checks itself before writing (``gains.check_measured``)."""

import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "schedules"
sys.path.insert(0, str(ROOT / "benchmarks" / "schedules"))
import gains  # noqa: E402

MODELS, DEPTHS, MICROBATCHES = ["bert-large", "transformer"], (2, 4, 8), (8,)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return gains.predicted(MODELS, DEPTHS, MICROBATCHES)


def test_every_model_depth_and_layout_is_covered(rows):
    for model in MODELS:
        layers = {r["layers"] for r in rows if r["model"] == model}
        assert len(layers) == 1
        for p in DEPTHS:
            got = [(r["schedule"], r["chunks"]) for r in rows if (r["model"], r["p"]) == (model, p)]
            assert got == gains.layouts(next(iter(layers)), p) and got[0] == ("1f1b", 1)
    assert {r["schedule"] for r in rows} == {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"}


def test_gains_are_the_ratio_to_1f1b_and_the_summary_is_theirs(rows):
    for r in rows:
        base = next(b for b in rows if (b["model"], b["p"], b["m"], b["schedule"]) == (r["model"], r["p"], r["m"], "1f1b"))
        assert r["gain"] == pytest.approx(base["iteration_s"] / r["iteration_s"] - 1)
    for label, s in gains.summary(rows).items():
        g = [r["gain"] for r in rows if r["label"] == label]
        assert (s["cases"], s["faster"]) == (len(g), sum(x > 0 for x in g))
        assert (s["median"], s["min"], s["max"]) == pytest.approx((statistics.median(g), min(g), max(g)))


def test_zero_bubble_h1_beats_1f1b_everywhere_on_the_same_stages(rows):
    """Its gain is the bubble alone: same stages, so the busiest device's work is 1F1B's; on
    a model whose stages keep the same bytes per microbatch it keeps 1F1B's peak memory; the
    deeper the pipeline, the more bubble to fill."""
    h1 = [r for r in rows if r["schedule"] == "zb-h1"]
    assert all(r["gain"] > 0 and abs(r["balance_gain"]) < 1e-9 for r in h1)
    assert all(r["memory_ratio"] == pytest.approx(1.0, abs=0.01) for r in h1 if r["model"] == "bert-large")
    for model in MODELS:
        by_depth = [r["gain"] for r in sorted(h1, key=lambda r: r["p"]) if r["model"] == model]
        assert by_depth == sorted(by_depth) and len(by_depth) == len(DEPTHS)


def test_interleaving_and_zb_v_beat_1f1b_on_every_case_they_can_lay_out(rows):
    summary = gains.summary(rows)
    for label in ("interleaved-1f1b (v=2)", "zb-v"):
        assert summary[label]["faster"] == summary[label]["cases"] >= 2


def _measured_rows(checks: str = "pass") -> dict:
    best = {"1f1b": 1.0, "zb-v": 0.8}
    pred = {"1f1b": 2.0, "zb-v": 1.5}
    return {"rows": [{"label": lab, "measured_s": [best[lab], best[lab] * 1.1], "best_s": best[lab],
                      "gain": best["1f1b"] / best[lab] - 1, "predicted_s": pred[lab],
                      "predicted_gain": pred["1f1b"] / pred[lab] - 1, "checks": [checks, "pass"],
                      "max_rel_diff": 1e-7} for lab in best]}


def test_the_benchmark_refuses_measured_runs_that_do_not_say_what_they_hold():
    """gains.py checks its measured runs before writing (the runs themselves are
    test_runtime_chunked's: each schedule trains as one process does)."""
    gains.check_measured(_measured_rows())
    with pytest.raises(SystemExit, match="1f1b: a check did not pass"):
        gains.check_measured(_measured_rows("fail"))
    rows = _measured_rows()
    rows["rows"][1]["gain"] = 0.5
    with pytest.raises(SystemExit, match="gain is not the ratio of best times"):
        gains.check_measured(rows)
