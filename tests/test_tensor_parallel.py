"""Sharding plans run for real with DTensor (sharding/tensor_parallel.py): operator
partitioning and auto data parallelism on 2 gloo processes, checked against one process."""

import pytest
import torch

from pipeplan.errors import PipeplanError
from pipeplan.sharding.models import build
from pipeplan.sharding import tensor_parallel
from pipeplan.sharding.tensor_parallel import (ShardConfig, check_against_reference, max_rel_diff, reference_run,
                                              run_sharded, validate_placements)
from test_launch import fork_server_for_runs
from test_shard import VGG19_HYBRID_PLAN

#: Megatron's MLP: the first linear split by rows (its output features), the second by
#: columns (its input features); the all-reduce sits after the second
MEGATRON_MLP = {"0.weight": 0, "0.bias": 0, "2.weight": 1}

#: the paper's Table 4 in PyTorch's (out, in) weights: Keras' kernel dimension 1 is dimension 0 here
#: (the planner returns 3 of these 6 differently: ``test_shard.VGG19_HYBRID_PLAN``)
PAPER_TABLE4 = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": 0,
                "predictions.weight": 0, "predictions.bias": 0}


#: Megatron's MLP in GPT-2's Conv1D layout ([in, out] weights): c_fc by its outputs, c_proj by its inputs
GPT2_MLP = {f"transformer.h.{i}.mlp.{name}": dim for i in range(2)
            for name, dim in (("c_fc.weight", 1), ("c_fc.bias", 0), ("c_proj.weight", 0))}


@pytest.fixture(autouse=True)
def fork_server(request) -> None:
    """The fork server started as the executor's runs need it (``test_launch.fork_server_for_runs``)."""
    if request.node.get_closest_marker("slow"):  # the tests that spawn workers
        fork_server_for_runs()


def assert_ok(result: dict, workers: int = 2) -> None:
    assert result["check"]["verdict"] == "ok", result["check"]
    assert result["max_rel_diff"] < 1e-5 and result["workers"] == workers
    assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
    assert result["measured_s"] > 0 and len(result["per_step_s"]) == len(result["losses"])


@pytest.mark.slow
@pytest.mark.parametrize("plan", [PAPER_TABLE4, VGG19_HYBRID_PLAN], ids=["paper", "planner"])
def test_vgg19_fc_partitioned_convs_replicated_batch_split(plan):
    result = run_sharded("vgg19-tiny", plan, {"features": 0}, workers=2, steps=3)
    assert_ok(result)
    assert result["partitioned"] == sorted(n for n, d in plan.items() if d is not None)


@pytest.mark.slow
def test_batch_split_inputs():
    result = run_sharded("vgg19-tiny", {}, {"features": 0, "labels": 0}, workers=2, steps=3)
    assert_ok(result)
    assert result["split_inputs"] == ["features", "labels"] and result["partitioned"] == []


@pytest.mark.slow
def test_convolutions_cut_by_output_then_input_channels(workers=2):
    """DTensor's convolution rule assumes a replicated weight; the plan's channel cuts run
    through ``_ChannelParallelConv``: a batch-split input made whole, the first convolution
    cut by output channels, the second by input channels (a partial sum all-reduced)."""
    placements = {"0.weight": 0, "0.bias": 0, "2.weight": 1}
    result = run_sharded("tp_models:convnet", placements, {"input": 0}, workers=workers, steps=3)
    assert_ok(result, workers)
    assert result["partitioned"] == ["0.bias", "0.weight", "2.weight"] and result["split_inputs"] == ["input"]


@pytest.mark.slow
@pytest.mark.parametrize("spec, prefix", [("gpt2-tiny", ""), ("tp_models:gpt2_logits", "lm.")])
def test_hugging_face_gpt2_runs_under_dtensor(spec, prefix):
    """GPT-2's attention runs eager under DTensor (CPU's fused attention has no sharding
    strategy), the built-in model and a user's built with transformers' default attention."""
    pytest.importorskip("transformers")
    plan = {prefix + n: d for n, d in GPT2_MLP.items()}
    result = run_sharded(spec, plan, None, workers=2, steps=2, seq=16)
    assert_ok(result)
    assert result["partitioned"] == sorted(plan)


@pytest.mark.slow
def test_bert_batch_split_and_sharded_embedding():
    result = run_sharded("bert-tiny", {"bert.embeddings.word_embeddings.weight": 0},
                         {"input_ids": 0, "labels": 0}, workers=2, steps=2, seq=16)
    assert_ok(result)


@pytest.mark.slow
def test_replicas_that_drift_apart_are_a_mismatch():
    """runtime_models:rank_skewed adds each rank's number inside the model: its output layer,
    sharded, learns from different activations on each rank."""
    result = run_sharded("runtime_models:rank_skewed", {"4.weight": 0}, None, workers=2, steps=2)
    assert result["check"]["verdict"] == "mismatch"
    assert result["max_rel_diff"] > 1e-5 or result["check"]["replica_spread"] > 1e-5


@pytest.mark.slow
def priced_collectives(spec: str, placements: dict[str, int | None], devices: int = 2) -> dict:
    """The collectives ``sharding.cost`` prices for ``spec`` with its parameters cut as ``placements``
    (the others and the inputs replicated), built as ``pipeplan shard`` builds its problem."""
    from pipeplan.sharding.propagate import bit
    from pipeplan.sharding.rules import R, S
    from pipeplan.sharding.shard import ShardRequest, build_problem

    model, problem, _ = build_problem(ShardRequest(spec, devices, method="milp"))
    prog = problem.prop.prog
    fixed = {t.id: bit(R) for t in prog.tensors if t.kind in ("param", "input")}
    fixed.update({prog.by_source(n).id: bit(S(d)) for n, d in placements.items() if d is not None})
    dom, conflict = problem.prop.narrow(problem.start, fixed)
    assert conflict is None
    return problem.cost.evaluate(dom).by_phase


@pytest.mark.slow
def test_megatron_mlp_on_two_workers_runs_the_priced_collectives():
    """Megatron's MLP on 2 gloo workers trains as one process does and runs exactly the
    collectives ``sharding.cost`` prices: the all-reduce of fc2's partial output and nothing in
    the backward (fc2 runs as Megatron's row split, its replicated bias added after the
    all-reduce: ``_RowParallelLinear``)."""
    priced = priced_collectives("tp_models:mlp", MEGATRON_MLP)
    assert priced == {"forward": {"all_reduce": 1}, "backward": {}}
    result = run_sharded("tp_models:mlp", MEGATRON_MLP, None, workers=2, steps=3,
                         expected_collectives=priced)
    assert_ok(result)
    assert result["partitioned"] == ["0.bias", "0.weight", "2.weight"]
    assert result["losses"][-1] < result["losses"][0]  # it trains
    assert result["collectives"] == {"forward": {"all_reduce": 1}, "backward": {}}
    assert result["max_rel_diff"] < 1e-5
    assert (result["check"]["verdict"], result["check"]["collectives"]) == ("ok", "same")
    tensor_parallel._check_collectives(result, {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}})
    assert (result["check"]["verdict"], result["check"]["collectives"]) == ("mismatch", "differ")


def test_the_collectives_check_ignores_kinds_counted_zero():
    out = {"collectives": {"forward": {"all_reduce": 2}, "backward": {}}, "check": {"verdict": "ok"}}
    tensor_parallel._check_collectives(out, {"forward": {"all_reduce": 2, "all_gather": 0}})
    assert (out["check"]["verdict"], out["check"]["collectives"]) == ("ok", "same")
    tensor_parallel._check_collectives(out, {"forward": {"all_reduce": 2}, "backward": {"reduce_scatter": 1}})
    assert (out["check"]["verdict"], out["check"]["collectives"]) == ("mismatch", "differ")


@pytest.mark.slow
def test_without_check():
    """(One worker: what is tested is that nothing is compared.)"""
    result = run_sharded("tp_models:mlp", MEGATRON_MLP, None, workers=1, steps=2, check=False)
    assert result["check"]["verdict"] == "not checked" and result["max_rel_diff"] is None


@pytest.mark.parametrize("placements, inputs, words", [
    ({"fc9.weight": 0}, None, "has no parameter 'fc9.weight'"),
    ({"fc1.weight": 2}, None, "cannot be split along dimension 2"),
    ({"fc1.bias": -1}, None, "cannot be split along dimension -1"),
    ({}, {"images": 0}, "has no input 'images'"),
    ({}, {"labels": 1}, "input 'labels' of shape \\[8\\] cannot be split along dimension 1"),
])
def test_bad_placements_are_one_line_errors(placements, inputs, words):
    with pytest.raises(PipeplanError, match=words) as e:
        run_sharded("vgg19-tiny", placements, inputs, workers=2)
    assert "\n" not in str(e.value)


def test_bad_counts_and_models():
    with pytest.raises(PipeplanError, match="workers and steps"):
        run_sharded("vgg19-tiny", {}, None, workers=0)
    with pytest.raises(PipeplanError, match="unknown shard model"):
        run_sharded("vgg20", {}, None, workers=2)


def test_validate_fills_in_replicated():
    model = build("vgg19-tiny", meta=True)
    params, inputs = validate_placements(model, {"fc1.weight": 0}, {"features": 0})
    assert params["fc1.weight"] == 0 and params["fc1.bias"] is None and len(params) == 38
    assert inputs == {"features": 0, "labels": None}


def test_max_rel_diff():
    a = {"w": torch.tensor([1.0, 2.0]).numpy(), "b": torch.tensor([1e-14]).numpy()}
    b = {"w": torch.tensor([1.0, 2.002]).numpy(), "b": torch.tensor([2e-14]).numpy()}
    diff, where = max_rel_diff(a, b)
    assert where == "w" and diff == pytest.approx(0.002 / 2.002, rel=1e-4)  # "b" ~ 0: floored, not 50%


def test_the_check_tells_rounding_from_a_real_difference(monkeypatch):
    """In one process: float64 training rounded to float32 is "ok" (on the float64 basis once
    the float32 comparison is made too strict to pass); a 1e-4 change of a weight is not."""
    cfg = ShardConfig("tp_models:mlp", {}, {}, steps=3)
    losses64, params64, _ = reference_run(cfg, torch.float64)
    rounded = {n: p.astype("float32") for n, p in params64.items()}
    assert check_against_reference(cfg, losses64, rounded)["check"]["basis"] == "float32"
    monkeypatch.setattr(tensor_parallel, "TOLERANCE", 1e-12)
    check = check_against_reference(cfg, losses64, rounded)["check"]
    assert (check["verdict"], check["basis"]) == ("ok", "float64")
    bad = dict(rounded, **{"0.weight": rounded["0.weight"] * (1 + 1e-4)})
    check = check_against_reference(cfg, losses64, bad)["check"]
    assert (check["verdict"], check["float64"]["worst"]) == ("mismatch", "0.weight")


class _Ended:
    exitcode = 0


def test_the_root_failure_is_named_when_a_peers_error_arrives_first():
    """Rank 1 raises; rank 0's report that its connection dropped arrives first: rank 1's own
    error is the one named (the launcher's watch, in run_sharded's words)."""
    import queue

    from pipeplan.runtime.launch import Failed, LaunchFailed, watch

    results = queue.Queue()
    results.put(Failed(0, "RuntimeError: Connection closed by peer [127.0.0.1]:4242"))
    results.put(Failed(1, "RuntimeError: shape mismatch (at model.py:7)"))
    with pytest.raises(LaunchFailed) as e:
        watch([_Ended(), _Ended()], results, timeout_s=600)
    assert tensor_parallel._diagnose(e.value.failure) == ("run_sharded failed: rank 1 raised RuntimeError: "
                                                          "shape mismatch (at model.py:7)")
