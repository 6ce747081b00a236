"""Megatron-LM SC'21 Table 1 (benchmarks/published/megatron_sc21.yaml) re-run small: the
published configurations of the smaller rows predicted within the benchmark's targets, and
joint never slower than them (benchmarks/published/megatron_sc21.py runs every row)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "published"))
from _runs import joint, load_rows, pairs_in_order, predict  # noqa: E402

HEAD, ROWS = load_rows()


def test_the_data_file_cites_its_source_and_every_row_is_whole():
    assert "Narayanan et al. 2021" in HEAD["source"] and "Table 1" in HEAD["source"]
    assert "run_table_1.sh" in HEAD["source"]
    for r in ROWS:
        assert r.gpus % (r.tp * r.pp) == 0 and r.global_batch % (r.dp * r.microbatch) == 0
        assert r.layers % (r.pp * r.virtual_stages) == 0 and r.heads % r.tp == 0


def test_the_smaller_published_runs_are_predicted_within_the_targets():
    """The first five rows (32 to 512 GPUs): each within 20%, their median within 10%, and
    pairs more than 10% apart in the published order."""
    rows = ROWS[:5]
    pred = [predict(HEAD, r).extra["hw_tflops_per_gpu"] for r in rows]
    errors = [abs(p / r.tflops_per_gpu - 1) for p, r in zip(pred, rows)]
    assert max(errors) <= 0.20 and statistics.median(errors) <= 0.10
    good, total = pairs_in_order([r.tflops_per_gpu for r in rows], pred, 0.10)
    assert good == total


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 4])
def test_joint_is_never_slower_than_the_published_configuration(index):
    r = ROWS[index]
    published = predict(HEAD, r)
    cfg, res, _ = joint(HEAD, r, 4)
    assert res.iteration_s <= published.iteration_s and not res.over_memory
    assert cfg.tp <= HEAD["servers_of"] and r.heads % cfg.tp == 0 and r.global_batch % (cfg.dp * cfg.microbatch) == 0


@pytest.fixture(scope="module")
def validation_runs() -> dict:
    """The validation set's usable runs by id, read once a module (reading builds every row's
    model and cluster, ~2.5 s; the tests below only read them)."""
    from _validation import load

    return {r.id: r for r in load()[0]}


@pytest.mark.slow
@pytest.mark.parametrize("model, bound", [("175b", 4.0), ("530b", 4.0), ("1t", 4.0), ("22b", 6.0)])
def test_the_gain_of_sp_and_selective_recomputation_is_korthikantis(model, bound, validation_runs):
    """Korthikanti et al. 2022 Table 5 (validation only, never fitted on): full recomputation
    against sequence parallelism + selective recomputation on the same model, GPUs and batch.
    The predicted gain is within 4 points of the measured one (issue 40), 22B within 6 (its
    one-microbatch iteration carries about 60 ms of fixed costs the model does not price:
    docs/llm.md)."""
    from _validation import predict

    full, present = validation_runs[f"korthikanti_t5_{model}_full"], validation_runs[f"korthikanti_t5_{model}_present"]
    predicted = predict(full).iteration_s / predict(present).iteration_s - 1
    measured = full.published / present.published - 1
    assert abs(100 * (predicted - measured)) <= bound


@pytest.mark.slow
def test_joints_gpt3_175b_plan_is_within_two_points_of_the_best_published_mfu(validation_runs):
    """joint on GPT-3 175B, 384 A100s, batch 1536 (SC'21 Table 2's run): its predicted MFU is at
    most 2 points above Megatron-LM's best published for the model (53.0%, MegaScale's baseline)."""
    from pipeplan.planners import llm3d
    from pipeplan.sim import simulate

    run = validation_runs["sc21_t2_ptdp_175b_384"]
    spec = llm3d.spec_of(run.graph)
    base = (llm3d.rule_of_thumb(spec, run.cluster, run.global_batch, llm3d.Pins(), "adam"),)
    plan = llm3d.search(run.graph, run.cluster, run.global_batch, llm3d.Pins(), "adam", 8, False, base)
    r = simulate(plan, timeline=False)
    assert not r.over_memory and r.extra["mfu"] <= 0.530 + 0.02
