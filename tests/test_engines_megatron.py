"""``pipeplan export-plan --to megatron``: a decoder LLM's plan as Megatron-LM's
``pretrain_gpt.py`` arguments, every name checked against Megatron's own argument list
(tests/fixtures/megatron_arguments.json, extracted from its source with the commit), and
what it cannot express refused with the nearest plan's cost."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from pipeplan.cli import main
from pipeplan.cluster import load_cluster
from pipeplan.engines import megatron, shape
from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph
from pipeplan.llm.layout import even
from pipeplan.llm.parallelism import Parallelism
from pipeplan.plan import Plan
from pipeplan.planners import llm3d
from pipeplan.sim import simulate

from helpers import layout_stages as megatron_stages

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "megatron_arguments.json").read_text())
KNOWN = set(FIXTURE["arguments"])
GPT = "zoo:gpt?hidden=1024&layers=12&heads=16&seq=512&vocab=8192"


def flags(args: list[str]) -> dict[str, str | None]:
    """Each option's value as bash hands it to Megatron (quotes removed)."""
    out = {}
    for a in args:
        name, _, value = a.partition(" ")
        out[name] = " ".join(shlex.split(value)) if value else None
    return out


def test_the_fixture_says_where_it_comes_from():
    assert FIXTURE["source"].startswith("NVIDIA/Megatron-LM") and len(FIXTURE["commit"]) == 40
    assert "--tensor-model-parallel-size" in KNOWN and len(KNOWN) > 300


@pytest.mark.parametrize("model", [GPT, "zoo:llama3-8b?layers=8"])
def test_every_argument_is_megatrons_and_says_what_the_plan_does(model):
    g, c = load_graph(model), load_cluster("dgx-h100x4")
    layers = llm3d.spec_of(g).layers
    cfg = Parallelism(4, 2, 4, even(layers, 2, 2), 2, microbatch=2, recompute="selective", zero=1, sp=True,
                      overlap_grad_reduce=True, schedule="interleaved-1f1b")
    plan = llm3d.plan_of(g, c, cfg, 64)
    f = flags(megatron.arguments(plan))
    assert set(f) <= KNOWN, sorted(set(f) - KNOWN)
    spec = llm3d.spec_of(g)
    assert f["--tensor-model-parallel-size"] == "4" and f["--pipeline-model-parallel-size"] == "2"
    assert f["--num-layers-per-virtual-pipeline-stage"] == str(spec.layers // 4)
    assert (f["--micro-batch-size"], f["--global-batch-size"]) == ("2", "64")
    assert f["--recompute-granularity"] == "selective" and "--recompute-method" not in f
    for switch in ("--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--bf16"):
        assert switch in f and f[switch] is None
    assert f["--num-layers"] == str(spec.layers) and f["--hidden-size"] == str(spec.hidden)
    assert ("--swiglu" in f) == spec.gated and ("--group-query-attention" in f) == (spec.kv_heads != spec.heads)


def test_uneven_first_and_last_stages_and_full_recomputation():
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    stages = megatron_stages(c.names, 12, 2, 4, 1, counts=[2, 3, 3, 4])
    plan = Plan(g, c, stages, 8, replicas="round-robin", recompute=[True] * 4)
    f = flags(megatron.arguments(plan))
    assert set(f) <= KNOWN
    assert (f["--decoder-first-pipeline-num-layers"], f["--decoder-last-pipeline-num-layers"]) == ("2", "4")
    assert (f["--recompute-granularity"], f["--recompute-method"], f["--recompute-num-layers"]) == \
        ("full", "uniform", "1")
    assert "--num-layers-per-virtual-pipeline-stage" not in f and "--sequence-parallel" not in f


def _refused(plan: Plan) -> str:
    with pytest.raises(PipeplanError) as e:
        megatron.arguments(plan)
    return str(e.value)


def test_any_other_layout_is_megatrons_layout_string():
    """Unequal middle stages (which Megatron's first/last flags cannot say) go as
    --pipeline-model-parallel-layout: E and L once, the chunks' layers in chunk order."""
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    plan = Plan(g, c, megatron_stages(c.names, 12, 2, 4, 1, counts=[3, 2, 4, 3]), 8, replicas="round-robin")
    f = flags(megatron.arguments(plan))
    assert f["--pipeline-model-parallel-layout"] == "Et*3|t*2|t*4|t*3L"
    assert "--decoder-first-pipeline-num-layers" not in f and set(f) <= KNOWN


@pytest.mark.parametrize("change, why", [
    (lambda p: replace(p, schedule="zb-h1"), "schedule zb-h1"),
    (lambda p: replace(p, recompute=[True, False, False, False]), "some stages recompute"),
])
def test_what_megatron_cannot_express_is_one_line_with_the_nearest_plans_cost(change, why):
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    base = Plan(g, c, megatron_stages(c.names, 12, 2, 4, 1), 8, replicas="round-robin")
    plan = change(base)
    text = _refused(plan)
    assert why in text and "\n" not in text
    near = shape.nearest(plan)
    assert f"predicted at {simulate(near, timeline=False).iteration_s:.4g} s" in text
    assert f"this plan at {simulate(plan, timeline=False).iteration_s:.4g} s" in text
    assert set(flags(megatron.arguments(near))) <= KNOWN  # the nearest plan is expressible


def test_different_tensor_parallel_degrees_and_models_that_are_not_decoders_are_refused():
    g, c = load_graph(GPT), load_cluster("dgx-h100x1")
    stages = megatron_stages(c.names, 12, 2, 4, 1)
    stages[1].tp = 1
    assert "different tensor-parallel degrees" in _refused(Plan(g, c, stages, 8, replicas="round-robin"))
    vgg = load_graph("zoo:vgg16")
    assert "has none (plan on a decoder" in _refused(Plan(vgg, c, [replace(stages[0], nodes=list(vgg.ids), tp=1)], 8))


def test_the_cli_prints_the_arguments_or_one_line(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--model", GPT, "--cluster", "dgx-h100x1", "--global-batch", "16", "--planner", "megatron",
                 "-O", "tp=2", "-O", "pp=2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["export-plan", str(out), "--to", "megatron"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("export CUDA_DEVICE_MAX_CONNECTIONS=1\npretrain_gpt.py \\\n") and "    --tensor-model-parallel-size 2 \\\n" in text
    assert main(["plan", "--model", GPT, "--cluster", "dgx-h100x1", "--global-batch", "16", "--planner", "gpipe",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["export-plan", str(out), "--to", "megatron"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipeplan: error: megatron cannot express this plan") and len(err.splitlines()) == 1


# -- Megatron-LM's own verdicts on pipeplan's exports (tests/fixtures/megatron_verdicts.json) -----
VERDICTS = json.loads((Path(__file__).parent / "fixtures" / "megatron_verdicts.json").read_text())
LLAMA405 = "zoo:llama3-405b"
#: The plans whose exports Megatron judged (tests/fixtures/pipeplan_cases.py adds them to the
#: cases): (model, cluster, global batch, parallelism)
EXPORTS = {
    # Llama 3 405B as its authors ran it: 7 + 8 x 14 + 7 layers, chunks of one layer (V = 8),
    # the embedding and the head alone in the first and last chunk (Dubey et al. 2024 §3.3.2)
    "llama405b_16k_v8": (LLAMA405, "dgx-h100x2048", 2048, dict(
        tp=8, pp=16, dp=128, layout=(0,) + (1,) * 126 + (0,), vpp=8, sp=True, zero=1, overlap_grad_reduce=True,
        schedule="interleaved-1f1b")),
    "llama405b_8k_v8": (LLAMA405, "dgx-h100x1024", 2048, dict(
        tp=8, pp=16, dp=64, layout=(0,) + (1,) * 126 + (0,), vpp=8, sp=True, zero=1, overlap_grad_reduce=True,
        schedule="interleaved-1f1b")),
    "llama405b_16k_v2": (LLAMA405, "dgx-h100x2048", 2048, dict(
        tp=8, pp=16, dp=128, layout=(3,) + (4,) * 30 + (3,), vpp=2, sp=True, zero=1, overlap_grad_reduce=True,
        schedule="interleaved-1f1b")),
    "gpt175b_first11_last13": ("zoo:gpt3-175b", "dgx-a100x8", 64, dict(
        tp=8, pp=8, dp=1, layout=(11,) + (12,) * 6 + (13,), recompute="full", sp=True)),
    "gqa_kv2_tp8": ("zoo:gpt?hidden=4096&layers=8&heads=32&kv_heads=2&seq=4096", "dgx-h100x1", 16, dict(
        tp=8, pp=1, dp=1, layout=(8,), recompute="selective", sp=True)),
    "llama8b_tp2_pp2": ("zoo:llama3-8b", "dgx-h100x1", 32, dict(tp=2, pp=2, dp=2, layout=(16, 16), sp=True, zero=1,
                                                                 overlap_grad_reduce=True, recompute="selective")),
    "llama70b_tp8_pp4_v5": ("zoo:llama3-70b", "dgx-h100x8", 128, dict(
        tp=8, pp=4, dp=2, layout=(4,) * 20, vpp=5, sp=True, zero=1, overlap_grad_reduce=True,
        schedule="interleaved-1f1b")),
    "interleaved_blocking_sends_bf16_grads": ("zoo:llama3-8b", "dgx-h100x4", 64, dict(
        tp=2, pp=4, dp=4, layout=(4,) * 8, vpp=2, overlap_p2p=False, zero=1, overlap_grad_reduce=True,
        grad_reduce="bf16", sp=True, schedule="interleaved-1f1b")),
}


def export_plan(name: str) -> Plan:
    model, cluster, batch, par = EXPORTS[name]
    return llm3d.plan_of(load_graph(model), load_cluster(cluster), Parallelism(**par), batch)


def export_argv(name: str) -> tuple[int, list[str]]:
    """(world size, the arguments as bash hands them to Megatron, one token a list entry) of an export."""
    plan = export_plan(name)
    argv = shlex.split(" ".join(megatron.arguments(plan)))
    return plan.parallelism.world, argv


@pytest.mark.parametrize("name", list(EXPORTS))
def test_megatron_accepted_what_pipeplan_exports(name):
    """The export is the argument list Megatron-LM's parse_args, validate_args, TransformerConfig
    and its layer build accepted (its verdict recorded with the commit; if the export changed,
    rerun tests/fixtures/pipeplan_cases.py and megatron_verdicts.py)."""
    case = next((c for c in VERDICTS["cases"] if c["name"] == f"pipeplan_{name}"), None)
    assert case is not None, f"no verdict for pipeplan_{name}: run tests/fixtures/pipeplan_cases.py, then " \
                             "megatron_verdicts.py"
    world, argv = export_argv(name)
    assert (case["world_size"], case["argv"]) == (world, argv), "the export changed since Megatron judged it"
    assert case["accepted"] and case["pretrain_accepted"], case["pretrain_error"]
    assert case["env"] == megatron.environment(export_plan(name)), "judged in another environment than exported"
    assert VERDICTS["commit"] == FIXTURE["commit"]


@pytest.mark.parametrize("name", [n for n, e in EXPORTS.items() if "llama" in e[0]])
def test_megatron_reads_llama3s_rope_base_and_norm_epsilon_from_the_export(name):
    """Megatron's parsed arguments (its verdict) have Llama 3's RoPE base 500,000 (Dubey et al.
    2024, Table 3) and RMSNorm epsilon 1e-5, as the model the plan costed."""
    case = next(c for c in VERDICTS["cases"] if c["name"] == f"pipeplan_{name}")
    assert case["derived"]["rotary_base"] == 500000 and case["derived"]["position_embedding_type"] == "rope"
    assert 1e-5 in (case["derived"]["norm_epsilon"], case["derived"]["layernorm_epsilon"])


def test_the_export_says_the_environment_megatron_asserts():
    """validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP > 1 before Blackwell: the
    printed export starts with it."""
    assert megatron.environment(export_plan("llama8b_tp2_pp2")) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron.environment(export_plan("llama405b_8k_v8")) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_llama3_405b_exports_megatrons_layout_and_megatron_builds_its_split():
    """Megatron's own layer build puts 7, 8 x 14, 7 layers on the 16 pipeline ranks."""
    case = next(c for c in VERDICTS["cases"] if c["name"] == "pipeplan_llama405b_16k_v8")
    f = flags(megatron.arguments(export_plan("llama405b_16k_v8")))
    assert f["--pipeline-model-parallel-layout"] == "E|(t|)*126L"
    assert case["build"]["rank_layers"] == [7] + [8] * 14 + [7]


@pytest.mark.parametrize("case, why", [
    ("p2p_interleaved_pp2_no_overlap", "PP > 2"),  # Megatron refuses: so does Parallelism
    ("gpt175b_first11_last13_layers_per_vstage", None),  # the export never pairs these flags
    ("gqa48h_g4_tp6", "neither split over nor replicate"),
])
def test_what_megatron_refuses_pipeplan_refuses_or_never_exports(case, why):
    verdict = next(c for c in VERDICTS["cases"] if c["name"] == case)
    assert not verdict["pretrain_accepted"]
    if case == "p2p_interleaved_pp2_no_overlap":
        with pytest.raises(PipeplanError, match=why):
            Parallelism(1, 2, 4, (2, 2, 2, 2), 2, overlap_p2p=False, schedule="interleaved-1f1b")
    elif case == "gqa48h_g4_tp6":
        from pipeplan.llm.spec import gpt

        with pytest.raises(PipeplanError, match=why):
            Parallelism(6, 1, 1, (4,)).check_model(gpt("g", 6144, 4, 48, kv_heads=4))
    else:
        for name in EXPORTS:
            f = flags(megatron.arguments(export_plan(name)))
            assert not ("--num-layers-per-virtual-pipeline-stage" in f and "--decoder-first-pipeline-num-layers" in f)


@pytest.mark.parametrize("launcher", megatron.LAUNCHERS)
def test_the_launch_script_runs_the_exported_arguments_on_the_plans_nodes(launcher, tmp_path, capsys):
    """export-plan --launch: bash parses it; it exports the environment Megatron asserts, starts
    torchrun with the plan's nodes and GPUs a node, passes exactly the arguments Megatron's
    parser judged (the fixture above), and stops before anything when the data is not given."""
    import os
    import subprocess

    plan = export_plan("llama70b_tp8_pp4_v5")  # 8 DGX H100 nodes
    plan.save(tmp_path / "p.json")
    assert main(["export-plan", str(tmp_path / "p.json"), "--to", "megatron", "--launch", launcher]) == 0
    script = capsys.readouterr().out
    (tmp_path / "run.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "run.sh")]).returncode == 0
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script and "--nnodes=8 --nproc-per-node=8" in script
    body = script.split("pretrain_gpt.py \\\n", 1)[1].split("    --data-path", 1)[0]
    assert [ln.strip().rstrip(" \\") for ln in body.splitlines()] == megatron.arguments(plan)
    if launcher == "slurm":
        assert "#SBATCH --nodes=8" in script and "srun torchrun" in script
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_PATH", "TOKENIZER_MODEL")}
    done = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "set DATA_PATH" in done.stderr


def test_launch_is_for_megatron_only(tmp_path, capsys):
    export_plan("llama8b_tp2_pp2").save(tmp_path / "p.json")
    assert main(["export-plan", str(tmp_path / "p.json"), "--to", "torchtitan", "--out", str(tmp_path / "t"),
                 "--launch", "slurm"]) == 2
    assert "--launch writes Megatron-LM's launch script" in capsys.readouterr().err
