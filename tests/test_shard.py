"""Auto-MAP's operator partitioning and auto data parallelism (``pipeplan shard``): the
patterns of the paper's Tables 3, 4 and 6, the DQN against the exact integer program, the
CLI's interface and its bad inputs."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
import torch
from torch import nn

from pipeplan.cli import main
from pipeplan.errors import PipeplanError
from pipeplan.sharding.program import export_module
from pipeplan.sharding import shard as shard_module
from pipeplan.sharding.shard import ShardRequest, shard

pytest.importorskip("transformers")

#: Table 3 in PyTorch's layout (a Linear weight is [out, in]; the paper's TF kernels are [in, out])
T5_TABLE3 = {r"SelfAttention\.[qkv]\.weight|EncDecAttention\.[qkv]\.weight|wi\.weight|shared\.weight": 0,
             r"(SelfAttention|EncDecAttention)\.o\.weight|wo\.weight": 1,
             r"layer_norm\.weight": None}


def assert_table3(params: list[dict]) -> None:
    for pattern, dim in T5_TABLE3.items():
        hits = [p for p in params if re.search(pattern, p["name"])]
        assert hits, pattern
        wrong = [(p["name"], p["partition_dim"]) for p in hits if p["partition_dim"] != dim]
        assert not wrong, wrong


def by_name(out: dict) -> dict[str, int | None]:
    return {p["name"]: p["partition_dim"] for p in out["parameters"] + out["inputs"]}


#: T5-tiny's examples large enough that compute, not collectives' latency, decides the plan (at
#: the default 8 x 32, everything replicated is predicted fastest)
T5_EXAMPLES = {"batch": 64, "seq": 128}


@pytest.fixture(scope="module")
def t5_milp() -> dict:
    return shard(ShardRequest("t5-tiny", 2, method="milp", **T5_EXAMPLES))


@pytest.mark.slow
def test_cost_optimum_of_t5_is_table3(t5_milp):
    assert_table3(t5_milp["parameters"])
    assert t5_milp["milp"]["optimal"]
    assert t5_milp["predicted"]["step_s"] < t5_milp["replicated"]["step_s"]
    assert all(p["partition_dim"] is None for p in t5_milp["inputs"])  # OPP: the data is not split


@pytest.mark.slow
def test_the_papers_reward_prefers_more_partitions_than_table3(t5_milp):
    """+0.4 a partitioned dimension: cutting the hidden dimension everywhere (layer norms
    included) scores higher than Table 3 and is predicted slower (docs/opp.md)."""
    paper = shard(ShardRequest("t5-tiny", 2, method="milp", reward="paper", **T5_EXAMPLES))
    assert paper["paper_score"] > t5_milp["paper_score"]
    norms = [p["partition_dim"] for p in paper["parameters"] if "layer_norm" in p["name"]]
    assert all(d == 0 for d in norms)
    assert paper["predicted"]["step_s"] > t5_milp["predicted"]["step_s"]


@pytest.mark.slow
def test_dqn_finds_table3_on_t5(t5_milp):
    # a budget of episodes, not seconds: the same search on a loaded machine. Within 100 (the
    # fine-tune from episode ~60 on) seeds 0-4 all meet Table 3, as they do within 50; with the
    # paper's reward or a negated cost reward it ends on plans predicted ~40 % slower. Seed 0: the
    # export of t5_milp (cached per spec and sizes) is this one's too.
    out = shard(ShardRequest("t5-tiny", 2, method="dqn", episodes=100, seed=0, **T5_EXAMPLES))
    assert_table3(out["parameters"])
    assert out["predicted"]["step_s"] == pytest.approx(t5_milp["predicted"]["step_s"])


#: two devices over 10 Gbps: cutting VGG-19-tiny's variables costs more than it saves
SLOW_PAIR = "hier:servers=1,gpus=2,intra=10Gbps"


@pytest.mark.slow
def test_a_plan_predicted_slower_than_replicated_is_not_returned(monkeypatch):
    """With the cost reward, a search whose best plan is predicted slower than everything
    replicated (here: the paper's objective standing in for a poor search) returns everything
    replicated, and says what the search found."""
    paper_milp = shard_module._milp
    monkeypatch.setattr(shard_module, "_milp",
                        lambda problem, req: paper_milp(problem, dataclasses.replace(req, reward="paper")))
    out = shard(ShardRequest("vgg19-tiny", 2, cluster=SLOW_PAIR, method="milp"))
    assert out["returned"] == "replicated" and out["replicated_better"]
    assert all(d is None for d in by_name(out).values())
    assert out["predicted"] == out["replicated"]
    assert out["searched"]["step_s"] > out["replicated"]["step_s"]


def test_the_papers_reward_warns_when_replicated_is_better(capsys):
    assert main(["shard", "--model", "vgg19-tiny", "--devices", "2", "--cluster", SLOW_PAIR, "--method", "milp",
                 "--reward", "paper"]) == 0
    out = capsys.readouterr().out
    assert "warning: everything replicated is predicted better than this plan" in out
    assert "partitioned on dim" in out  # the paper's plan is still the one shown


def test_run_runs_the_plan_shown(monkeypatch, capsys):
    """``--run`` plans on the same cluster as without it, and runs the plan printed."""
    from pipeplan.sharding import tensor_parallel

    argv = ["shard", "--model", "vgg19-tiny", "--devices", "2", "--method", "milp", "--json"]
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    ran = {}

    def fake_run(spec, placements, inputs, workers, **kw):
        ran.update(placements=placements, inputs=inputs, workers=workers)
        return {"measured_s": 1.0, "max_rel_diff": None, "workers": workers, "check": {"verdict": "not checked"}}

    monkeypatch.setattr(tensor_parallel, "run_sharded", fake_run)
    assert main([*argv, "--run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"] == shown["cluster"] == "automap-c"
    assert out["parameters"] == shown["parameters"] and out["inputs"] == shown["inputs"]
    assert ran["placements"] == {p["name"]: p["partition_dim"] for p in shown["parameters"]}
    assert ran["inputs"] == {p["name"]: p["partition_dim"] for p in shown["inputs"]} and ran["workers"] == 2


#: GPT-2-tiny's examples large enough that compute, not collectives' latency, decides the plan
GPT2_EXAMPLES = {"batch": 32, "seq": 128}


@pytest.fixture(scope="module")
def gpt2_milp() -> dict:
    return shard(ShardRequest("gpt2-tiny", 2, method="milp", **GPT2_EXAMPLES))


@pytest.mark.slow
def test_gpt2s_fused_qkv_is_cut_by_heads(gpt2_milp):
    """Each layer's c_attn (q | k | v in one [in, out] weight) cut block by block along its
    output columns, Megatron's pattern for the attention: c_proj by rows."""
    params = {p["name"]: p for p in gpt2_milp["parameters"]}
    assert gpt2_milp["returned"] == "searched"
    for layer in (0, 1):
        attn = f"transformer.h.{layer}.attn."
        assert (params[attn + "c_attn.weight"]["partition_dim"], params[attn + "c_attn.weight"]["strided"]) == (1, True)
        assert (params[attn + "c_attn.bias"]["partition_dim"], params[attn + "c_attn.bias"]["strided"]) == (0, True)
        assert (params[attn + "c_proj.weight"]["partition_dim"], params[attn + "c_proj.weight"]["strided"]) == (0, False)
    assert not [n for n, p in params.items() if p["strided"] and "c_attn" not in n]  # plain cuts where they tie


@pytest.mark.slow
def test_dqn_cuts_gpt2s_fused_qkv_as_the_milp_does(gpt2_milp):
    out = shard(ShardRequest("gpt2-tiny", 2, method="dqn", episodes=40, **GPT2_EXAMPLES))
    cut = {p["name"]: (p["partition_dim"], p["strided"]) for p in out["parameters"] if "c_attn" in p["name"]}
    assert set(cut.values()) == {(1, True), (0, True)}
    assert out["predicted"]["step_s"] == pytest.approx(gpt2_milp["predicted"]["step_s"], rel=0.05)


def test_run_refuses_a_strided_plan_in_one_line(gpt2_milp, monkeypatch, capfd):
    """The runtime has no placement for a block-by-block cut yet: ``--run`` says so and runs nothing."""
    from pipeplan.sharding import tensor_parallel

    monkeypatch.setattr(shard_module, "shard", lambda req: gpt2_milp)
    monkeypatch.setattr(tensor_parallel, "run_sharded", lambda *a, **kw: pytest.fail("ran a strided plan"))
    assert main(["shard", "--model", "gpt2-tiny", "--devices", "2", "--method", "milp", "--run", "--json"]) == 2
    out, err = capfd.readouterr()
    assert not out and len(err.strip().splitlines()) == 1
    assert "transformer.h.0.attn.c_attn.weight is cut strided" in err and "not runnable yet" in err


#: what the integer program returns for VGG-19 on automap-b (24 devices, --hybrid, batch 32), in
#: PyTorch's [out, in] layout; the paper's Table 4 differs in fc2.weight (1: by input features),
#: predictions.weight (0: by classes) and predictions.bias (0) (docs/opp.md explains each)
VGG19_HYBRID_PLAN = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 0, "fc2.bias": 0, "predictions.weight": 1,
                     "predictions.bias": None}


@pytest.mark.slow
def test_vgg19_on_three_servers_is_table4_but_three_variables():
    """Convolutions replicated (data parallel: the batch split), the classifier partitioned:
    Table 4's pattern, with 3 of its 6 classifier variables cut differently."""
    out = shard(ShardRequest("vgg19", 24, cluster="automap-b", method="milp", hybrid=True, batch=32))
    dims = by_name(out)
    assert (dims["features"], dims["labels"]) == (0, None)
    convs = [d for n, d in dims.items() if "conv" in n]
    assert len(convs) == 32 and all(d is None for d in convs)
    assert {n: dims[n] for n in VGG19_HYBRID_PLAN} == VGG19_HYBRID_PLAN


@pytest.mark.parametrize("model, split", [
    pytest.param("t5-tiny", ("input_ids", "decoder_input_ids", "labels"), marks=pytest.mark.slow),
    ("vgg19-tiny", ("features", "labels"))])
@pytest.mark.slow
def test_adp_finds_the_batch_dimensions(model, split):
    # 50 episodes, not seconds (a few candidate dimensions: seeds 0-3 find them within 10); T5 at
    # the sizes of t5_milp, whose export it reuses
    sizes = T5_EXAMPLES if model == "t5-tiny" else {}
    out = shard(ShardRequest(model, 2, adp=True, reward="paper", episodes=50, **sizes))
    assert {p["name"]: p["partition_dim"] for p in out["inputs"]} == {n: 0 for n in split}
    assert all(p["partition_dim"] is None for p in out["parameters"])


@pytest.mark.slow  # a whole command run of seconds: in make test, not in the quick set
def test_cli_json_interface(capsys):
    assert main(["shard", "--model", "t5-tiny", "--devices", "2", "--method", "milp", "--batch", "64", "--seq", "128",
                 "--json"]) == 0  # the sizes of t5_milp: its export is reused
    out = json.loads(capsys.readouterr().out)
    assert {"parameters", "inputs", "search_s", "predicted"} <= set(out)
    p = out["parameters"][0]
    assert set(p) == {"name", "shape", "partition_dim", "strided"} and p["name"] == "shared.weight"


@pytest.mark.parametrize("argv, message", [
    (["--model", "nope", "--devices", "2"], "unknown shard model 'nope'"),
    (["--model", "t5-tiny", "--devices", "1"], "--devices must be >= 2"),
    (["--model", "t5-tiny", "--devices", "64"], "has only 32 devices"),
    (["--model", "t5-tiny", "--devices", "2", "--hybrid", "--reward", "paper"], "--hybrid needs --reward cost"),
    (["--model", "t5-tiny", "--devices", "2", "--check"], "--workers and --check go with --run"),
    (["--model", "t5-tiny", "--devices", "2", "--budget", "soon"], "--budget"),
    (["--model", "test_shard:mismatched", "--devices", "2"], "torch.export failed (RuntimeError: a and b"),
    (["--model", "test_shard:data_dependent", "--devices", "2"], "a tensor whose shape depends on the data"),
])
def test_cli_bad_inputs(argv, message, capfd):
    assert main(["shard", *argv]) == 2
    out, err = capfd.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and not out  # no stack trace of torch's


def mismatched() -> tuple[nn.Module, torch.Tensor]:
    """A model whose input does not fit its first layer (``test_shard:mismatched``)."""
    return nn.Sequential(nn.Linear(5, 4)), torch.randn(2, 4)


def test_a_failed_export_logs_no_stack_trace():
    """torch's fake tensors log a failing op's stack trace as an error before the exception;
    the one-line error says enough."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch._subclasses.fake_tensor")  # its own handler; it does not propagate
    logger.addHandler(handler)
    model, x = mismatched()
    try:
        with pytest.raises(PipeplanError, match="torch.export failed"):
            export_module(model, (x,), "mismatched")
    finally:
        logger.removeHandler(handler)
    assert not records


class _Positives(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[y > 0].sum()


def data_dependent() -> tuple[nn.Module, torch.Tensor]:
    """A model whose values' shape depends on the data (``test_shard:data_dependent``)."""
    return _Positives(), torch.randn(2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("model, cut", [
    ("bert-tiny", {"bert.embeddings.word_embeddings.weight", "bert.encoder.layer.0.attention.output.dense.weight"}),
    ("t5-tiny", {"shared.weight", "encoder.block.0.layer.1.DenseReluDense.wo.weight"}),
])
def test_a_cut_transformer_runs_the_collectives_it_is_priced_with(model, cut, capsys):
    """BERT- and T5-tiny cut over 2 gloo workers (vocabulary-cut embeddings and classifier,
    Megatron's attention, T5's MLP too; T5's plan is Table 3, its embedding tied to the LM head
    sharded once): the run trains as one process does and DTensor runs exactly the collectives
    ``sharding.cost`` priced (docs/opp.md)."""
    code = main(["shard", "--model", model, "--devices", "2", "--method", "milp", "--batch", "64", "--seq",
                 "128", "--run", "--check", "--steps", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["run"]["check"]["verdict"] == "ok" and out["run"]["check"]["collectives"] == "same"
    assert out["run"]["collectives"] == out["predicted"]["by_phase"]
    assert out["predicted"]["by_phase"]["forward"]["all_reduce"] > 0
    assert {p["name"] for p in out["parameters"] if p["partition_dim"] is not None} >= cut
    assert out["max_rel_diff"] < 1e-5 and out["measured_s"] > 0 and out["predicted_s"] > 0
    if model == "t5-tiny":
        assert_table3(out["parameters"])


def test_searches_are_budgeted_in_episodes_and_nodes_by_default():
    """The DQN's and the integer program's budgets are counts (the same plan on any machine),
    the defaults the command line names; wall seconds only when asked."""
    from pipeplan.cli import build_parser
    from pipeplan.sharding.shard import DEFAULT_EPISODES, DEFAULT_NODES, ShardRequest

    req = ShardRequest("t5-tiny", 2)
    assert (req.episodes, req.nodes, req.budget_s) == (DEFAULT_EPISODES, DEFAULT_NODES, None)
    shard_parser = build_parser()._subparsers._group_actions[0].choices["shard"]
    helps = {a.dest: a.help for a in shard_parser._actions}
    assert f"default {DEFAULT_EPISODES}" in helps["episodes"] and f"default {DEFAULT_NODES}" in helps["nodes"]
    with pytest.raises(PipeplanError, match="--budget"):
        ShardRequest("t5-tiny", 2, budget_s=float("nan")).check()
