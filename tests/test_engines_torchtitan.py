"""``pipeplan export-plan --to torchtitan``: the TOML torchtitan 0.2.2 reads and the overrides
0.3.0 takes, every key checked against torchtitan's own config dataclasses
(tests/fixtures/torchtitan_config.json, read from both releases), and the schedule CSV checked
by torch's own pipelining code: parsed action by action, validated and completed with sends
and receives without a deadlock."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest
from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule

from pipeplan.cli import main
from pipeplan.cluster import load_cluster
from pipeplan.engines import torchtitan
from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph
from pipeplan.plan import Plan
from pipeplan.llm.parallelism import Parallelism
from pipeplan.planners import llm3d

from helpers import layout_stages as megatron_stages

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "torchtitan_config.json").read_text())
FLAVORED = "zoo:llama3-8b?seq=512"  # a model torchtitan has (its 8B flavor), short sequences


def _plan(schedule: str, vpp: int = 1, model: str = FLAVORED, zero: int = 0) -> Plan:
    g, c = load_graph(model), load_cluster("dgx-h100x2")
    spec = llm3d.spec_of(g)
    stages = megatron_stages(c.names, spec.layers, 2, 4, 2, vpp)
    if schedule == "zb-v":  # a V: chunk j on position min(j, 2p - 1 - j)
        for j, st in enumerate(stages):
            st.devices = stages[min(j, 7 - j)].devices if j < 4 else stages[7 - j].devices
    return Plan(g, c, stages, 16, schedule=schedule, replicas="round-robin", zero=zero, sequence_parallel=True)


def _check_keys(files: dict[str, str]):
    toml = tomllib.loads(files["torchtitan.toml"])
    old = SCHEMA["0.2.2"]
    assert set(toml) <= set(old["tables"])
    for table, keys in toml.items():
        assert set(keys) <= set(old[table]), (table, sorted(set(keys) - set(old[table])))
    return toml


class _Fields:
    """A torchtitan config dataclass as the fixture declares it: setting a field it lacks raises."""

    def __init__(self, fields: list[str], **values):
        object.__setattr__(self, "_fields", set(fields))
        for k, v in values.items():
            setattr(self, k, v)

    def __setattr__(self, key, value):
        if key not in self._fields:
            raise AttributeError(f"torchtitan has no field {key!r} here")
        object.__setattr__(self, key, value)


def run_03_config(text: str) -> tuple[_Fields, list[str]]:
    """Run the exported 0.3 module against a torchtitan made from the fixture (0.3's field names,
    configs, their flavors and converters: tests/fixtures/torchtitan_config.py): a registered
    config that converts to float8 raises, as it does without torchao on SM89+. The config
    ``plan()`` returns, and the registered configs it called."""
    import sys
    import types

    new, called = SCHEMA["0.3"], []
    ac_mod = types.ModuleType("torchtitan.distributed.activation_checkpoint")
    for mode, cls in (("full", "FullAC"), ("selective", "SelectiveAC")):
        setattr(ac_mod, cls, types.SimpleNamespace(Config=lambda m=mode, **kw: (m, _Fields(
            new["activation_checkpoint"][m], **kw))))
    registry = types.ModuleType("torchtitan.models.llama3.config_registry")

    def registered(name):
        def make():
            called.append(name)
            if new["converters"][name]:
                raise RuntimeError(f"{name}: {new['converters'][name]} need torchao on SM89+")
            return _Fields(["model_spec", "hf_assets_path", "parallelism", "training", "activation_checkpoint",
                            "dataloader", "optimizer"], parallelism=_Fields(new["parallelism"]),
                           training=_Fields(new["training"]), model_spec=("registered", new["flavors"][name]))
        return make

    for name in new["configs"]:
        setattr(registry, name, registered(name))
    llama3 = types.ModuleType("torchtitan.models.llama3")
    llama3.config_registry = registry
    llama3.model_registry = lambda flavor, converters=None: (flavor, converters or [])
    mods = {"torchtitan": types.ModuleType("torchtitan"), "torchtitan.distributed": types.ModuleType("x"),
            "torchtitan.distributed.activation_checkpoint": ac_mod, "torchtitan.models": types.ModuleType("y"),
            "torchtitan.models.llama3": llama3, "torchtitan.models.llama3.config_registry": registry}
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        scope: dict = {}
        exec(compile(text, "pipeplan_torchtitan.py", "exec"), scope)
        return scope["plan"](), called
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_a_3d_plan_is_torchtitans_configuration():
    g, c = load_graph("zoo:llama3-8b"), load_cluster("dgx-h100x4")
    par = Parallelism(4, 2, 4, (8, 8, 8, 8), 2, microbatch=2, recompute="selective", zero=1, sp=True,
                      overlap_grad_reduce=True, schedule="interleaved-1f1b")
    plan = llm3d.plan_of(g, c, par, 64)
    files = torchtitan.export(plan)
    assert set(files) == {"torchtitan.toml", "launch.sh", "pipeplan_torchtitan.py", "launch-0.3.sh"}
    toml = _check_keys(files)
    p = toml["parallelism"]
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["data_parallel_shard_degree"],
            p["data_parallel_replicate_degree"]) == (4, 2, 4, 1)
    assert p["pipeline_parallel_schedule"] == "Interleaved1F1B" and p["pipeline_parallel_microbatch_size"] == 2
    parts = p["module_fqns_per_model_part"]
    assert len(parts) == 4 and parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert sum(len(x) for x in parts) == 32 + 3
    assert toml["training"] == {"local_batch_size": 16, "global_batch_size": 64, "seq_len": 8192}
    assert toml["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert toml["model"] == {"name": "llama3", "flavor": "8B", "converters": []}
    config, called = run_03_config(files["pipeplan_torchtitan.py"])
    assert called == ["llama3_8b"] and config.model_spec == ("8B", [])
    q, t = config.parallelism, config.training
    assert (q.tensor_parallel_degree, q.pipeline_parallel_degree, q.data_parallel_shard_degree,
            q.data_parallel_replicate_degree, q.enable_sequence_parallel) == (4, 2, 4, 1, True)
    assert q.pipeline_parallel_schedule == "Interleaved1F1B" and q.num_pp_microbatches == 8
    assert q.module_fqns_per_model_part[-1][-2:] == ["norm", "lm_head"] and q.module_fqns_per_model_part[1:-1] \
        == parts[1:-1]
    # 64 sequences of 8,192 tokens a step; 2 a microbatch, 8 microbatches on each of 4 ranks
    assert (t.num_tokens_per_microbatch_per_dp_rank, t.num_tokens_per_train_step, t.max_context_length) == (
        2 * 8192, 64 * 8192, 8192) and t.disable_cuda_graphs
    assert config.activation_checkpoint[0] == "selective"


def test_a_context_parallel_plan_says_its_degree_to_both_versions():
    """TP 2 x CP 2 x PP 2 x DP 2 on 16 GPUs: both versions' ``context_parallel_degree`` (a field
    of each release's parallelism config, the fixture), data parallelism over the 2 replicas, and
    the schedule's replicas the TP x CP groups (one CSV row a position, not a CP rank)."""
    g, c = load_graph("zoo:llama3-8b"), load_cluster("dgx-h100x2")
    par = Parallelism(2, 2, 2, (16, 16), cp=2, microbatch=1, sp=True, zero=1, overlap_grad_reduce=True,
                      schedule="zb-h1")
    files = torchtitan.export(llm3d.plan_of(g, c, par, 16))
    p = _check_keys(files)["parallelism"]
    assert (p["context_parallel_degree"], p["tensor_parallel_degree"], p["data_parallel_shard_degree"],
            p["pipeline_parallel_degree"]) == (2, 2, 2, 2)
    assert len(files["pp_schedule.csv"].strip().splitlines()) == 2
    config, _ = run_03_config(files["pipeplan_torchtitan.py"])
    assert (config.parallelism.context_parallel_degree, config.parallelism.data_parallel_shard_degree) == (2, 2)


@pytest.mark.parametrize("schedule", ["zb-h1", "spp-pe"])
def test_a_schedule_torch_cannot_name_goes_as_a_csv_that_torchs_runtime_accepts(schedule):
    plan = _plan(schedule)
    files = torchtitan.export(plan)
    toml = _check_keys(files)
    p = toml["parallelism"]
    assert p["pipeline_parallel_schedule_csv"] == str(Path("pp_schedule.csv").resolve())  # beside the config
    assert p["pipeline_parallel_schedule"] == "PipelineScheduleSingle"
    rows = files["pp_schedule.csv"].splitlines()
    actions = {rank: [_Action.from_str(a) for a in row.split(",")] for rank, row in enumerate(rows)}
    n_micro = toml["training"]["local_batch_size"] // p["pipeline_parallel_microbatch_size"]
    stage_of = _validate_schedule(actions, 4, 4, n_micro)  # torch's own checks
    assert stage_of == {0: 0, 1: 1, 2: 2, 3: 3}
    if schedule == "zb-h1":
        assert any(a is not None and a.computation_type.name == "BACKWARD_WEIGHT" for a in actions[0])
    computed = sum(len(v) for v in actions.values())
    full = _add_send_recv({r: list(v) for r, v in actions.items()}, lambda s: stage_of[s], 4)  # raises on a deadlock
    assert sum(len(v) for v in full.values()) > computed


def test_named_schedules_write_no_csv():
    for schedule, vpp, name in (("1f1b", 1, "1F1B"), ("gpipe", 1, "GPipe"), ("interleaved-1f1b", 2, "Interleaved1F1B")):
        files = torchtitan.export(_plan(schedule, vpp))
        assert "pp_schedule.csv" not in files
        assert _check_keys(files)["parallelism"]["pipeline_parallel_schedule"] == name


def test_what_torchtitan_cannot_run_is_one_line_with_the_nearest_plans_cost():
    plan = _plan("1f1b")
    plan.stages[1].tp = 1
    plan.stages[1].devices = plan.stages[1].devices[:4]
    with pytest.raises(PipeplanError) as e:
        torchtitan.export(Plan(plan.graph, plan.cluster, plan.stages, 16, replicas="round-robin"))
    text = str(e.value)
    assert text.startswith("torchtitan cannot express this plan") and "predicted at" in text and "\n" not in text
    with pytest.raises(PipeplanError, match="synchronous schedules"):
        torchtitan.export(_plan("async-1f1b"))


def test_the_cli_writes_the_folder_or_nothing(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", FLAVORED, "--cluster", "dgx-h100x1", "--global-batch", "16", "--planner", "megatron",
                 "-O", "tp=2", "-O", "pp=2", "--schedule", "1f1b", "--out", str(plan)]) == 0
    out = tmp_path / "tt"
    assert main(["export-plan", str(plan), "--to", "torchtitan", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["launch-0.3.sh", "launch.sh", "pipeplan_torchtitan.py",
                                                     "torchtitan.toml"]
    launch = (out / "launch.sh").read_text()
    assert subprocess.run(["sh", "-n", str(out / "launch.sh")]).returncode == 0  # the shell parses it
    assert "--nnodes=1 --nproc_per_node=8" in launch and f'--job.config_file "{out.resolve() / "torchtitan.toml"}"' in launch
    capsys.readouterr()
    assert main(["export-plan", str(plan), "--to", "torchtitan"]) == 2
    assert "give --out DIR" in capsys.readouterr().err
    (tmp_path / "realdir").mkdir()
    (tmp_path / "linkdir").symlink_to(tmp_path / "realdir", target_is_directory=True)
    assert main(["export-plan", str(plan), "--to", "torchtitan", "--out", str(tmp_path / "linkdir")]) == 2
    assert "is a symbolic link" in capsys.readouterr().err and not any((tmp_path / "realdir").iterdir())
    assert main(["plan", "--model", FLAVORED, "--cluster", "dgx-h100x1", "--global-batch", "16", "--planner", "gpipe",
                 "--schedule", "fb-parallel", "--out", str(plan)]) in (0, 2)
    bad = tmp_path / "bad"
    if plan.exists():
        capsys.readouterr()
        code = main(["export-plan", str(plan), "--to", "torchtitan", "--out", str(bad)])
        assert code in (0, 2) and (code == 0 or not bad.exists())


@pytest.mark.parametrize("schedule, vpp", [("zb-h1", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_the_csv_is_the_action_list_pipeplans_own_runtime_runs(schedule, vpp):
    """The runtime (runtime/pipelined.py) drives torch's _PipelineScheduleRuntime with
    runtime/translate.py's action lists, and its runs are checked against one process; the
    exported CSV holds the same actions for a replica's pipeline."""
    from pipeplan.runtime.translate import pipeline_orders
    from pipeplan.schedule import make_schedule

    g, c = load_graph(FLAVORED), load_cluster("dgx-h100x1")
    plan = Plan(g, c, megatron_stages(c.names, 32, 1, 4, 2, vpp), 8, schedule=schedule, replicas="round-robin")
    rows = torchtitan.schedule_csv(plan).splitlines()
    ours = {rank: [_Action.from_str(a) for a in row.split(",")] for rank, row in enumerate(rows)}
    runtime = pipeline_orders(make_schedule(schedule, plan.stage_devices(), 8, "round-robin"),
                              plan.stage_devices(), "round-robin")[0]
    assert ours == runtime


@pytest.mark.slow
def test_torchs_runtime_loads_the_exported_csv_and_trains_as_one_process(tmp_path, capsys):
    """``pipeplan run --schedule-csv``: torch's ``_PipelineScheduleRuntime._load_csv`` reads the
    exported file on 4 gloo processes (2 pipelines of 2 stages, zero-bubble H1) and the
    trained weights equal one process's."""
    from test_runtime import plan_for

    plan = plan_for("zb-h1", "round-robin", 2, 4, m=8)
    plan.save(tmp_path / "plan.json")
    (tmp_path / "s.csv").write_text(torchtitan.schedule_csv(plan))
    code = main(["run", str(tmp_path / "plan.json"), "--model", "example:mlp", "--steps", "2", "--schedule-csv",
                 str(tmp_path / "s.csv"), "--check", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["check"]["verdict"] == "pass"


def test_a_csv_torch_refuses_is_one_line_before_any_process_starts(tmp_path, capsys):
    from test_runtime import plan_for

    plan = plan_for("zb-h1", "round-robin", 2, 4, m=8)
    plan.save(tmp_path / "plan.json")
    rows = torchtitan.schedule_csv(plan).splitlines()
    for name, text, words in (("one-row", rows[0] + "\n", "incorrect number of ranks"),
                              ("missing", rows[0].rsplit(",", 2)[0] + "\n" + rows[1] + "\n", "microbatches"),
                              ("junk", "0X0\n1F0\n", "Invalid action string")):
        (tmp_path / f"{name}.csv").write_text(text)
        assert main(["run", str(tmp_path / "plan.json"), "--model", "example:mlp", "--schedule-csv",
                     str(tmp_path / f"{name}.csv")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "torch's pipelining refuses it" in err[0] and words in err[0], err


LLAMA = ("hf:llama?hidden_size=64&num_hidden_layers=4&num_attention_heads=4&num_key_value_heads=2"
         "&intermediate_size=128&vocab_size=512&seq=32&microbatch=2")


def test_a_plan_for_another_decoder_is_refused_before_any_process_starts(tmp_path, capsys):
    g, c = load_graph(LLAMA), load_cluster("hier:servers=1,gpus=2,intra=128Gbps,inter=50Gbps,kind=H100-SXM")
    plan = Plan(g, c, megatron_stages(c.names, 4, 1, 2, 1, 1), 4)
    plan.save(tmp_path / "plan.json")
    other = LLAMA.replace("vocab_size=512", "vocab_size=500")
    assert main(["run", str(tmp_path / "plan.json"), "--model", other]) == 2
    err = capsys.readouterr().err
    assert "the plan's model has vocab 512, this one 500 (set vocab_size= in the spec)" in err
    assert err.count("\n") == 1


FLAVORS_FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "torchtitan_flavors.json").read_text())


@pytest.mark.parametrize("flavor", list(torchtitan.FLAVORS))
def test_each_flavor_pipeplan_names_has_torchtitans_own_dimensions(flavor):
    """The preset exported as a flavor is what torchtitan builds for it: its llama3_args read
    from its source (tests/fixtures/torchtitan_flavors.py, the tag's commit recorded)."""
    from pipeplan.llm.spec import PRESETS

    theirs = FLAVORS_FIXTURE["llama3"][flavor]
    ours = PRESETS[torchtitan.FLAVORS[flavor]]
    assert (ours.hidden, ours.layers, ours.heads, ours.kv_heads, ours.ffn, ours.vocab, ours.rope_base, ours.norm_eps) == \
        (theirs["dim"], theirs["n_layers"], theirs["n_heads"], theirs["n_kv_heads"], theirs["ffn"], theirs["vocab_size"],
         theirs["rope_theta"], theirs["norm_eps"])
    assert torchtitan.flavor_of(ours) == flavor


@pytest.mark.parametrize("model", ["zoo:gpt3-175b", "zoo:llama3-8b?layers=8",
                                   "hf:llama?hidden_size=4096&num_hidden_layers=32&num_attention_heads=32"
                                   "&num_key_value_heads=8&intermediate_size=14336&vocab_size=128256"])
def test_a_model_torchtitan_has_no_flavor_for_is_refused_in_one_line(model, tmp_path, capsys):
    """torchtitan would train its debug model (or fail) instead: refused, naming the dimensions
    (an hf: Llama 3 8B with RoPE base 10,000 is not torchtitan's 8B either)."""
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", model, "--cluster", "dgx-h100x2", "--global-batch", "16", "--planner", "megatron",
                 "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export-plan", str(plan), "--to", "torchtitan", "--out", str(tmp_path / "tt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none of torchtitan's Llama 3 flavors (8B, 70B, 405B)" in err
    assert not (tmp_path / "tt").exists()


def test_the_schedule_csv_resolves_from_the_launch_line(tmp_path):
    """torchtitan reads the CSV path from its own working directory (its checkout): the config
    names it by absolute path, beside the config, where export-plan writes it."""
    plan = _plan("zb-h1")
    files = torchtitan.export(plan, tmp_path / "tt")
    path = tomllib.loads(files["torchtitan.toml"])["parallelism"]["pipeline_parallel_schedule_csv"]
    assert Path(path).is_absolute() and Path(path) == (tmp_path / "tt").resolve() / "pp_schedule.csv"
    assert run_03_config(files["pipeplan_torchtitan.py"])[0].parallelism.pipeline_parallel_schedule_csv == path



def test_the_03_export_starts_from_a_registered_config_and_converts_nothing():
    """torchtitan 0.3's llama3_405b converts linear layers to float8 (the fixture records each
    registered config's converters): the bf16 plan's module never calls it, and sets the 405B
    model without converters; each flavor's registered config has that flavor."""
    new = SCHEMA["0.3"]
    for flavor, name in torchtitan.REGISTERED.items():
        assert new["flavors"][name] == flavor
        assert new["flavors"][torchtitan.BASE_CONFIG[flavor]] in torchtitan.FLAVORS
        assert new["converters"][torchtitan.BASE_CONFIG[flavor]] == []
    assert new["converters"]["llama3_405b"] == ["Float8LinearConverter"]
    g, c = load_graph("zoo:llama3-405b"), load_cluster("dgx-h100x2")
    plan = llm3d.plan_of(g, c, Parallelism(8, 2, 1, (63, 63), microbatch=1, recompute="full", sp=True), 8)
    files = torchtitan.export(plan)
    config, called = run_03_config(files["pipeplan_torchtitan.py"])
    assert called == ["llama3_70b"] and config.model_spec == ("405B", [])
    assert config.activation_checkpoint[0] == "full" and config.parallelism.num_pp_microbatches == 8
    assert tomllib.loads(files["torchtitan.toml"])["model"]["converters"] == []


def test_the_03_launch_puts_the_module_on_the_path(tmp_path):
    files = torchtitan.export(_plan("1f1b"), tmp_path / "tt")
    (tmp_path / "launch-0.3.sh").write_text(files["launch-0.3.sh"])
    assert subprocess.run(["sh", "-n", str(tmp_path / "launch-0.3.sh")]).returncode == 0
    launch = files["launch-0.3.sh"]
    assert f'PYTHONPATH="{(tmp_path / "tt").resolve()}' in launch
    assert "-m torchtitan.train --module pipeplan_torchtitan --config plan" in launch
    # torchtitan's --module takes a name it does not know as an importable module (manager.py)
    assert "pipeplan_torchtitan" not in SCHEMA["0.3"]["module_shorthands"]
