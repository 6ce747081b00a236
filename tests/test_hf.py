"""Hugging Face models from a config (hf:ARCH?...): parsing, profiling, a pipelined run checked
against one-process training."""

import pytest

from pipeplan.cluster import hierarchical
from pipeplan.errors import PipeplanError
from pipeplan.plan import Plan, Stage
from pipeplan.runtime.hf import parse_spec

SPEC = "hf:gpt2?n_layer=2&n_embd=64&n_head=2&seq=16&microbatch=4"


def test_spec_parsing_and_its_errors():
    assert parse_spec("hf:bert?num_hidden_layers=3&hidden_size=64&seq=32") == (
        "bert", {"num_hidden_layers": 3, "hidden_size": 64}, 32, 8)
    with pytest.raises(PipeplanError, match="unknown Hugging Face architecture 't5'"):
        parse_spec("hf:t5?num_layers=2")
    assert parse_spec("hf:llama?max_position_embeddings=512")[2:] == (512, 1)  # the analytic graph's defaults
    with pytest.raises(PipeplanError, match="seq and microbatch must be positive integers"):
        parse_spec("hf:gpt2?seq=0")


@pytest.mark.slow
def test_unknown_setting_is_named():
    pytest.importorskip("transformers")
    from pipeplan.runtime.models import load_model

    with pytest.raises(PipeplanError, match="GPT2Config has no setting 'n_lyr'"):
        load_model("hf:gpt2?n_lyr=2")


@pytest.fixture(scope="module")
def profiled():
    """SPEC's profile (one for the two runs below: a profile builds and times the model)."""
    pytest.importorskip("transformers")
    from pipeplan.runtime.profiler import profile_model

    return profile_model(SPEC, warmup=0, reps=1)


@pytest.mark.slow
def test_gpt2_pipeline_runs_and_checks(profiled):
    """Profile -> a 2-stage 1F1B plan cut between the transformer blocks -> run on 2
    processes -> parameters equal one-process training."""
    from pipeplan.runtime.check import check_run
    from pipeplan.runtime.executor import RunConfig, run_plan

    g = profiled
    assert len(g) == 5  # embeddings, 2 blocks, final norm, head
    c = hierarchical("local", 1, 2, 1e9, 1e9)
    plan = Plan(g, c, [Stage(g.ids[:2], ["s0g0"]), Stage(g.ids[2:], ["s0g1"])], 4, schedule="1f1b")
    cfg = RunConfig(SPEC, steps=1, timeout_s=180)
    out = run_plan(plan, cfg)
    got = check_run(plan, SPEC, out.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                    threads=cfg.threads, microbatch=out.microbatch)
    assert got.verdict == "pass", got
    assert not [w for w in out.warnings if "input" in w]  # the model runs on the profile's input


@pytest.mark.slow
def test_run_on_another_input_than_the_profile_says_so(tmp_path, capsys, profiled):
    """The plan was profiled at seq=16; run on seq=32 it still runs, with one warning line
    saying its prediction is for the profile's input."""
    from pipeplan.cli import main

    g = profiled
    c = hierarchical("local", 1, 2, 1e9, 1e9)
    Plan(g, c, [Stage(g.ids[:2], ["s0g0"]), Stage(g.ids[2:], ["s0g1"])], 2, schedule="1f1b").save(tmp_path / "p.json")
    assert main(["run", str(tmp_path / "p.json"), "--model", SPEC.replace("seq=16", "seq=32"), "--steps", "1",
                 "--warmup", "0", "--json"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "input" in line]
    assert warned == ["warning: the model's input is 32 int64 per sample but the plan's profile measured 16 int64: "
                      "the prediction is for the profile's input (profile the model as it runs, then plan again)"]


def logits_of_lm():
    """A GPT-2 language model wrapped to return its logits: the wrapper's one layer returns a
    ``ModelOutput``, whose tensors backward hooks do not see."""
    import torch
    import transformers
    from torch import nn

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
            self.lm = transformers.GPT2LMHeadModel(cfg)

        def forward(self, ids):
            return self.lm(ids).logits

    return Wrapped(), torch.randint(0, 100, (2, 8))


def test_layer_returning_a_model_output_is_refused():
    """Its backward would be timed as the loss alone (about 100x too low): one line instead."""
    pytest.importorskip("transformers")
    from pipeplan.runtime.profiler import profile_model

    with pytest.raises(PipeplanError, match=r"layer 'lm' returns a CausalLMOutputWithCrossAttentions, not a tensor"):
        profile_model(f"{__name__}:logits_of_lm", warmup=0, reps=1)
