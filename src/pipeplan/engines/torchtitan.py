"""A decoder LLM's plan as torchtitan's configuration (docs/engines.md).

torchtitan 0.2.2 is the last release that reads a TOML file (``--job.config_file``); its main
branch (0.3) takes a registered Python config function instead. The export writes both, with
the field names of each version (tests/fixtures/torchtitan_config.json):

- ``torchtitan.toml`` (0.2.2): ``[parallelism]`` (degrees, schedule, microbatch size, the
  modules of each model part), ``[training]`` (local and global batch, sequence length),
  ``[activation_checkpoint]`` (none, selective by op, or full), and ``[model]``: the
  torchtitan Llama 3 flavor of the model's dimensions (a model of no flavor is refused in one
  line: torchtitan would train its debug model instead);
- ``pipeplan_torchtitan.py`` (0.3, torchtitan's Python configs: ``--module M --config F``; no
  release is tagged 0.3 yet, the fixture records the commit): one config function, ``plan``,
  that starts from the flavor's registered config and sets the same values under 0.3's names
  (tokens per microbatch and per step, pipeline microbatches, ``lm_head``). It sets the model
  without converters: 0.3's 405B config converts linear layers to float8, the plan is bf16
  (the command line cannot undo a converter, hence a module);
- ``launch.sh`` (0.2.2) and ``launch-0.3.sh`` (0.3, the module's folder on ``PYTHONPATH``):
  torchrun on every node with the config by its absolute path;
- ``pp_schedule.csv`` when the plan's schedule has no name in ``torch.distributed.pipelining``
  (zero-bubble H1, SPP's order): each pipeline rank's compute actions from pipeplan's schedule
  IR (``0F0``, ``1B2``, ``0I0``, ``0W0``; an empty cell is idle), one row a rank, which
  torch's ``_PipelineScheduleRuntime`` loads and completes with the sends and receives.

Data parallelism: DDP replicas (``data_parallel_replicate_degree``), or with ZeRO-1 FSDP
(``data_parallel_shard_degree``), which shards weights and gradients too: more all-gathers
than the plan priced (docs/engines.md). What torchtitan cannot run (asynchronous or
side-by-side schedules, a TP group across servers, ...) is refused with the nearest plan's cost.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PipeplanError
from ..llm.spec import PRESETS, DecoderSpec, decoder_of
from ..plan import Plan
from ..schedule import Kind, make_schedule
from .shape import common_why_not, nodes_of, placement_of, require, shape

#: pipeplan's schedules by the names ``torch.distributed.pipelining.get_schedule_class`` takes
NAMED = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-1f1b": "Interleaved1F1B", "zb-v": "ZBVZeroBubble"}
#: the schedule class whose stage placement a CSV of each placement needs (torchtitan builds the
#: stages of a rank by it: one a rank, in a loop, or a V of two)
CSV_CLASS = {"single": "PipelineScheduleSingle", "loop": "PipelineScheduleMulti", "v": "ZBVZeroBubble"}
#: torchtitan's Llama 3 flavors (its ``llama3_args``) by the pipeplan preset of the same
#: dimensions (tests/fixtures/torchtitan_flavors.json, read from its source, checks them)
FLAVORS = {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}
#: torchtitan 0.3's registered config of each flavor (``--module llama3 --config NAME``), and the
#: one an export starts from: 405B's converts linear layers to float8, which a bf16 plan is not
#: (tests/fixtures/torchtitan_config.json records each config's flavor and converters)
REGISTERED = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}
BASE_CONFIG = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_70b"}
#: what a flavor fixes: every dimension but the sequence length (the training's seq_len)
_BUILT_FROM = ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "gated", "tied", "norm", "bias", "qkv_bias",
               "positions", "rope_base", "norm_eps")
LETTER = {int(Kind.F): "F", int(Kind.B): "B", int(Kind.I): "I", int(Kind.W): "W"}


def flavor_of(spec: DecoderSpec) -> str | None:
    """The torchtitan Llama 3 flavor that builds ``spec`` (None: none does)."""
    dims = lambda d: tuple(getattr(d, k) for k in _BUILT_FROM)  # noqa: E731
    return next((f for f, preset in FLAVORS.items() if dims(PRESETS[preset]) == dims(spec)), None)


def _flavor(plan: Plan) -> str:
    """The flavor, or one line on why torchtitan cannot build the model the plan costed (it
    would fall back to its debug model: the run would not be the plan)."""
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    flavor = flavor_of(spec)
    if flavor is None:
        raise PipeplanError(f"torchtitan: model {spec.name!r} (hidden {spec.hidden}, {spec.layers} layers, {spec.heads} "
                            f"heads, {spec.kv_heads} key/value heads, ffn {spec.ffn}, vocab {spec.vocab}) is none of "
                            f"torchtitan's Llama 3 flavors ({', '.join(FLAVORS)}); register a flavor of these "
                            "dimensions in torchtitan, or export to megatron")
    return flavor


def _cp(plan: Plan) -> int:
    return plan.parallelism.cp if plan.parallelism is not None else 1


def _group_leads(plan: Plan) -> list[list[int]]:
    """Each stage's replicas (TP x CP GPUs) by their first GPU: the replicas the schedule runs."""
    return [devs[::st.tp * _cp(plan)] for st, devs in zip(plan.stages, plan.stage_devices())]


def _why_not(plan: Plan) -> str | None:
    why = common_why_not(plan, ("single", "loop", "v"))
    if why is not None:
        return why
    sched = make_schedule(plan.schedule, _group_leads(plan), plan.microbatches, plan.replicas)
    if sched.steady_state is not None or sched.lanes:
        return f"schedule {plan.schedule} (torch's pipelining runs synchronous schedules, one action at a time)"
    return None


def module_fqns(plan: Plan, head: str) -> list[list[str]]:
    """The modules of each model part as torchtitan names them (``head``: ``output`` in
    0.2.2, ``lm_head`` in 0.3.0)."""
    names = {"embed": ["tok_embeddings"], "head": ["norm", head]}
    return [[m for n in st.nodes for m in names.get(n, [f"layers.{n[len('layer'):]}"])] for st in plan.stages]


def schedule_csv(plan: Plan) -> str:
    """Each pipeline rank's compute actions (module docstring): the programs of replica 0's
    first rank at every position, microbatches numbered as that replica sees them."""
    tp, pp, dp, vpp = shape(plan)
    sched = make_schedule(plan.schedule, _group_leads(plan), plan.microbatches, plan.replicas)
    program = dict(zip(sched.devices, sched.programs))
    step = dp if plan.replicas == "round-robin" else 1
    rows, seen = [], set()
    for devs in _group_leads(plan):
        first = devs[0]
        if first in seen:
            continue
        seen.add(first)
        p = program[first]
        rows.append(",".join(f"{s}{LETTER[k]}{m // step}" for k, s, m in zip(p.kinds.tolist(), p.stages.tolist(),
                                                                          p.micro.tolist()) if k in LETTER))
    return "\n".join(rows) + "\n"


def _batch(plan: Plan) -> dict[str, int]:
    """What both versions say of the batch: sequences of a microbatch on one data-parallel
    rank, that rank's microbatches, the global batch in sequences, the sequence length."""
    tp, pp, dp, vpp = shape(plan)
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    b = int(plan.graph.meta.get("microbatch", 1))
    micro = b // dp if plan.replicas == "split" else b
    per_rank = plan.microbatches // (dp if plan.replicas == "round-robin" else 1)
    return {"micro": micro, "microbatches": per_rank, "global": b * plan.microbatches, "seq": spec.seq}


def _parallelism(plan: Plan, head: str, csv: str | None) -> dict:
    """The ``[parallelism]`` settings both versions name alike."""
    tp, pp, dp, vpp = shape(plan)
    out = {"tensor_parallel_degree": tp, "pipeline_parallel_degree": pp,
           "data_parallel_replicate_degree": 1 if plan.zero else dp,
           "data_parallel_shard_degree": dp if plan.zero else 1,
           "pipeline_parallel_schedule": CSV_CLASS[placement_of(plan)] if csv else NAMED[plan.schedule],
           "module_fqns_per_model_part": module_fqns(plan, head)}
    if _cp(plan) > 1:
        out["context_parallel_degree"] = _cp(plan)
    if csv:
        out["pipeline_parallel_schedule_csv"] = csv
    return out


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def toml_text(plan: Plan, csv: str | None) -> str:
    """torchtitan 0.2.2's TOML (module docstring)."""
    n = _batch(plan)
    tables = {"parallelism": {**_parallelism(plan, "output", csv), "pipeline_parallel_microbatch_size": n["micro"]},
              "training": {"local_batch_size": n["micro"] * n["microbatches"], "global_batch_size": n["global"],
                           "seq_len": n["seq"]}}
    mode = plan.recompute_mode(0)
    lines = ["# written by pipeplan export-plan for torchtitan 0.2.2 (--job.config_file); torchtitan 0.3: "
             "pipeplan_torchtitan.py", "[model]", 'name = "llama3"', f'flavor = "{_flavor(plan)}"',
             "converters = []  # the plan is costed in bf16: no float8", ""]
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        lines.append("")
    lines += ["[activation_checkpoint]", f'mode = "{mode}"']
    if mode == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"


def module_text(plan: Plan, csv: str | None) -> str:
    """torchtitan 0.3's config (module docstring): a module of one config function, ``plan``,
    that starts from the flavor's registered config (a converter-free one where the registry's
    converts to float8) and sets what the plan decides."""
    flavor = _flavor(plan)
    tp, pp, dp, vpp = shape(plan)
    n = _batch(plan)
    settings = {"parallelism": {**_parallelism(plan, "lm_head", csv),
                                "enable_sequence_parallel": bool(plan.sequence_parallel),
                                "num_pp_microbatches": n["microbatches"] if pp > 1 else 1},
                "training": {"num_tokens_per_microbatch_per_dp_rank": n["micro"] * n["seq"],
                             "num_tokens_per_train_step": n["global"] * n["seq"], "max_context_length": n["seq"],
                             **({"disable_cuda_graphs": True} if pp > 1 else {})}}
    ac = {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}[plan.recompute_mode(0)]
    base = BASE_CONFIG[flavor]
    lines = [f'"""torchtitan 0.3 config of a pipeplan plan ({plan.planner}, {plan.schedule}): {plan.graph.name} on '
             f'{plan.cluster.name}. Written by pipeplan export-plan; run with launch-0.3.sh."""', "",
             "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401",
             "from torchtitan.models.llama3 import config_registry, model_registry", "", "",
             "def plan():",
             f"    config = config_registry.{base}()  # what the plan leaves open: optimizer, data, checkpoints",
             f'    config.model_spec = model_registry("{flavor}")  # no converters: the plan is costed in bf16']
    if base != REGISTERED[flavor]:
        lines.append(f"    # not {REGISTERED[flavor]}(): it converts linear layers to float8 (torchao, SM89+)")
        lines.append(f'    config.hf_assets_path = "./assets/hf/Llama-3.1-{flavor}"  # placeholder: your tokenizer')
    for name, table in settings.items():
        lines += [f"    config.{name}.{k} = {v!r}" for k, v in table.items()]
    lines += [f"    config.activation_checkpoint = {ac}", "    return config", ""]
    return "\n".join(lines)


def launch_text(plan: Plan, folder: Path, version: str) -> str:
    """A ``run_train.sh``-style launch on the plan's servers: torchrun on every node, the
    config by its absolute path (torchtitan resolves paths from its own working directory,
    its checkout); ``version`` 0.2.2 (the TOML) or 0.3 (the config module, on PYTHONPATH)."""
    gpus = len(plan.cluster)
    nodes, per_node = nodes_of(plan)
    if version == "0.3":
        where = ("# the data and tokenizer: config.dataloader and config.hf_assets_path (placeholders: the "
                 "registered config's), set in pipeplan_torchtitan.py")
        env = [f'PYTHONPATH="{folder}${{PYTHONPATH:+:$PYTHONPATH}}" \\']
        run = '    -m torchtitan.train --module pipeplan_torchtitan --config plan "$@"'
    else:
        where = ("# the data and tokenizer: the config's [training] dataset and [model] hf_assets_path (placeholders: "
                 "torchtitan's defaults)")
        env = []
        run = f'    -m torchtitan.train --job.config_file "{folder / "torchtitan.toml"}" "$@"'
    return "\n".join([
        "#!/bin/sh",
        f"# written by pipeplan export-plan: torchtitan {version} on {nodes} node(s) x {per_node} GPUs = {gpus} "
        "ranks, as planned; run it on every node, from torchtitan's checkout",
        "# set: MASTER_ADDR (the first node's address), NODE_RANK (0 .. nodes - 1)", where, *env,
        'PYTORCH_ALLOC_CONF="expandable_segments:True" \\',
        f"torchrun --nnodes={nodes} --nproc_per_node={per_node} --node_rank=${{NODE_RANK:?set NODE_RANK}} \\",
        '    --rdzv_backend c10d --rdzv_endpoint="${MASTER_ADDR:?set MASTER_ADDR}:29500" \\', run, ""])


def export_schedule(plan: Plan) -> dict[str, str]:
    """The plan's schedule as torch.distributed.pipelining's CSV alone (``schedule_csv``), for
    ``pipeplan run --schedule-csv`` or a job of your own: any model torch's pipelining runs
    this plan for (no torchtitan flavor needed)."""
    require("torch pipelining", "torch.distributed.pipelining", plan, _why_not)
    return {"pp_schedule.csv": schedule_csv(plan)}


def export(plan: Plan, folder: str | Path = ".") -> dict[str, str]:
    """File name -> text of the configuration written to ``folder`` (module docstring; the
    schedule CSV and the launch name their files by absolute path); a PipeplanError naming what
    torchtitan cannot run and the nearest plan's cost."""
    require("torchtitan", "torchtitan", plan, _why_not)
    _flavor(plan)
    where = Path(os.path.abspath(folder))
    csv = str(where / "pp_schedule.csv") if plan.schedule not in NAMED else None
    files = {"torchtitan.toml": toml_text(plan, csv), "launch.sh": launch_text(plan, where, "0.2.2"),
             "pipeplan_torchtitan.py": module_text(plan, csv), "launch-0.3.sh": launch_text(plan, where, "0.3")}
    if csv:
        files["pp_schedule.csv"] = schedule_csv(plan)
    return files
