"""A decoder LLM's plan as Megatron-LM's ``pretrain_gpt.py`` arguments (docs/engines.md).

Megatron expresses a plan whose every stage has one tensor-parallel degree t and one number
of data-parallel replicas d, laid out as ``llm.layout.stages`` lays it out (tensor-parallel
groups of consecutive GPUs inside a server; chunk j on pipeline position j mod PP), with the
embedding in the first chunk and the LM head in the last, any layers per chunk (equal chunks,
the first and last stage apart, or its layout string: docs/megatron-rules.md), the schedule
1F1B (or interleaved 1F1B with chunks), one recomputation setting for every stage, the
gradient dtype and whether interleaved sends overlap. Anything else is refused with one line
naming why and what the nearest plan Megatron can run (the same shape in its layout, even
layers, its schedule, one recomputation setting) is predicted to cost, against the plan's own
prediction.
"""

from __future__ import annotations

import shlex

from ..llm.spec import DecoderSpec, decoder_of
from ..plan import Plan
from ..llm.parallelism import Parallelism
from .shape import common_why_not, nodes_of, layer_counts, parallelism_of, require, shape


def _why_not(plan: Plan) -> str | None:
    """The first thing Megatron cannot express, in words; None when it can express it all."""
    why = common_why_not(plan, ("single", "loop"))
    if why is not None:
        return why
    tp, pp, dp, vpp = shape(plan)
    if plan.schedule != ("1f1b" if vpp == 1 else "interleaved-1f1b"):
        return f"schedule {plan.schedule} (Megatron runs 1F1B, and interleaved 1F1B with model chunks)"
    per_replica = plan.microbatches // dp if plan.replicas == "round-robin" else plan.microbatches
    if vpp > 1 and per_replica % pp:
        return (f"with interleaving Megatron runs a multiple of PP = {pp} microbatches a replica, this plan "
                f"{per_replica}")
    if 0 in layer_counts(plan)[1:-1] or (plan.parallelism is None and 0 in layer_counts(plan)):
        return "a model chunk holds no layer (Megatron's layout allows only the embedding's or the head's alone)"
    return None


def view(plan: Plan) -> Parallelism:
    """What Megatron is told for ``plan`` (``shape.parallelism_of``); a PipeplanError naming what
    it cannot express and the nearest plan's predicted cost."""
    require("megatron", "Megatron-LM", plan, _why_not)
    return parallelism_of(plan)


def layout_string(counts: tuple[int, ...]) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for chunk layer ``counts`` in chunk order:
    ``E`` the embedding in the first chunk, ``L`` the loss in the last, ``t*n`` a chunk's
    layers, ``|`` between chunks, ``(t*n|)*k`` for k equal middle chunks in a row (its grammar:
    megatron/core/transformer/pipeline_parallel_layer_layout.py, docs/megatron-rules.md)."""
    def chunk(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    middle, k = [], 1
    inner = counts[1:-1]
    while k <= len(inner):
        run = 1
        while k - 1 + run < len(inner) and inner[k - 1 + run] == inner[k - 1]:
            run += 1
        middle.append(f"({chunk(inner[k - 1])}|)*{run}" if run >= 3 else f"{chunk(inner[k - 1])}|" * run)
        k += run
    return f"E{chunk(counts[0])}|" + "".join(middle) + f"{chunk(counts[-1])}L"


def layer_arguments(par: Parallelism) -> list[str]:
    """How the layers split: nothing (equal stages), layers per virtual stage (equal chunks),
    the first and last stage apart (one chunk a GPU, equal middle stages), else the layout."""
    counts, stages = par.layout, par.stage_layers()
    if len(set(counts)) == 1:
        return [f"--num-layers-per-virtual-pipeline-stage {counts[0]}"] if par.vpp > 1 else []
    if par.vpp == 1 and min(counts) > 0 and (par.pp == 2 or len(set(stages[1:-1])) == 1):
        middle = stages[1] if par.pp > 2 else None
        return ([f"--decoder-first-pipeline-num-layers {stages[0]}"] if stages[0] != middle else []) + \
            ([f"--decoder-last-pipeline-num-layers {stages[-1]}"] if stages[-1] != middle else [])
    return [f"--pipeline-model-parallel-layout {shlex.quote(layout_string(counts))}"]  # '|', '(' and '*' for bash


def model_arguments(spec: DecoderSpec) -> list[str]:
    """The model's dimensions as Megatron's arguments; the vocabulary is the tokenizer's
    (``--tokenizer-type``), so ``note`` says what the plan assumed."""
    args = [f"--num-layers {spec.layers}", f"--hidden-size {spec.hidden}", f"--ffn-hidden-size {spec.ffn}",
            f"--num-attention-heads {spec.heads}", f"--seq-length {spec.seq}",
            f"--max-position-embeddings {spec.seq}"]
    if spec.kv_heads != spec.heads:
        args += ["--group-query-attention", f"--num-query-groups {spec.kv_heads}"]
    args += attention_arguments(spec) + expert_arguments(spec)
    if spec.gated:
        args.append("--swiglu")
    if spec.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if spec.positions == "rope":
        args += ["--position-embedding-type rope", f"--rotary-base {round(spec.rope_base)}"]  # an int in Megatron
    args.append(f"--norm-epsilon {spec.norm_eps!r}")
    if not spec.tied:
        args.append("--untie-embeddings-and-output-weights")
    if not spec.bias:
        args.append("--disable-bias-linear")
        if spec.qkv_bias:
            args.append("--add-qkv-bias")
    if not spec.dropout:
        args += ["--attention-dropout 0", "--hidden-dropout 0"]
    return args + ["--bf16"]


def environment(plan: Plan) -> dict[str, str]:
    """What ``pretrain_gpt.py`` needs in its environment for ``plan``: with tensor (or context)
    parallelism on GPUs before Blackwell, validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1
    (megatron/training/arguments.py, core_v0.16.1; Megatron's own launch scripts set it)."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if view(plan).tp > 1 else {}


def note(plan: Plan) -> str:
    """What the arguments leave to the user: the tokenizer, whose vocabulary the plan assumed."""
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    return (f"# the plan assumed a vocabulary of {spec.vocab:,} tokens: give the tokenizer that has it "
            "(--tokenizer-type, --tokenizer-model), and your data")


def attention_arguments(spec: DecoderSpec) -> list[str]:
    """Heads of another width (``--kv-channels``), query/key norms, latent attention."""
    args = []
    if spec.kv_lora:
        args += ["--multi-latent-attention", f"--kv-lora-rank {spec.kv_lora}", f"--qk-head-dim {spec.head_size}",
                 f"--qk-pos-emb-head-dim {spec.rope_dim}", f"--v-head-dim {spec.v_head}"]
        args += [f"--q-lora-rank {spec.q_lora}"] if spec.q_lora else []
    elif spec.head_size and spec.head_size * spec.heads != spec.hidden:
        args.append(f"--kv-channels {spec.head_size}")
    return args + (["--qk-layernorm"] if spec.qk_norm else [])


def expert_arguments(spec: DecoderSpec) -> list[str]:
    """A mixture's experts: count, top-k, width, group-limited routing, shared experts, its
    dense first layers (``--moe-layer-freq``, a Python list expression) and the grouped GEMM
    pipeplan prices (``llm.experts``)."""
    if not spec.moe:
        return []
    args = [f"--num-experts {spec.experts}", f"--moe-router-topk {spec.top_k}",
            f"--moe-ffn-hidden-size {spec.expert_ffn}", "--moe-grouped-gemm"]
    if spec.route_groups:
        args += [f"--moe-router-num-groups {spec.route_groups}", f"--moe-router-group-topk {spec.route_group_topk}"]
    if spec.shared_ffn:
        args.append(f"--moe-shared-expert-intermediate-size {spec.shared_ffn}")
    if spec.dense_layers:
        freq = f"([0]*{spec.dense_layers}+[1]*{spec.layers - spec.dense_layers})"
        args.append(f"--moe-layer-freq {shlex.quote(freq)}")
    return args


#: the token dispatcher of each ``Parallelism.dispatcher`` (Megatron-core 0.16: DeepEP is the
#: flex dispatcher's backend, ``TransformerConfig.moe_flex_dispatcher_backend``)
DISPATCHER_ARGUMENTS = {"alltoall": ["--moe-token-dispatcher-type alltoall"],
                        "deepep": ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]}


def arguments(plan: Plan) -> list[str]:
    """``pretrain_gpt.py``'s arguments for ``plan``, one option (with its value) an entry: the
    parallelism, then the model."""
    return parallel_arguments(plan) + model_arguments(decoder_of(plan.graph.meta, f"model {plan.graph.name!r}"))


def parallel_arguments(plan: Plan) -> list[str]:
    """The parallelism, batch, recomputation and optimizer arguments of ``plan``."""
    v = view(plan)
    args = [f"--tensor-model-parallel-size {v.tp}", f"--pipeline-model-parallel-size {v.pp}"]
    if v.cp > 1:
        args += [f"--context-parallel-size {v.cp}", f"--cp-comm-type {v.cp_comm}"]
    if decoder_of(plan.graph.meta, f"model {plan.graph.name!r}").moe:  # Megatron's ETP default is TP: always said
        args += [f"--expert-model-parallel-size {v.ep}", f"--expert-tensor-parallel-size {v.etp}"]
        args += DISPATCHER_ARGUMENTS[v.dispatcher]
    args += layer_arguments(v)
    args += [f"--micro-batch-size {v.microbatch}", f"--global-batch-size {plan.global_batch}"]
    if v.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif v.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    flags = (("--sequence-parallel", v.sp), ("--use-distributed-optimizer", v.zero),
             ("--overlap-grad-reduce", v.overlap_grad_reduce), ("--grad-reduce-in-bf16", v.grad_reduce == "bf16"),
             ("--no-overlap-p2p-communication", v.vpp > 1 and not v.overlap_p2p))
    args += [flag for flag, on in flags if on]
    if plan.optimizer != "adam":
        args.append(f"--optimizer {plan.optimizer}")
    if v.precision == "fp8":  # Transformer Engine's FP8: E4M3 forward, E5M2 gradients (as pipeplan prices it)
        args += ["--fp8-format hybrid", "--transformer-impl transformer_engine"]
        args += ["--fp8-param-gather"] if v.fp8_params else []
    return args


#: ``--launch``: how the script starts Megatron on every node
LAUNCHERS = ("torchrun", "slurm")


def launch_script(plan: Plan, launcher: str) -> str:
    """A bash script that runs ``pretrain_gpt.py`` with ``arguments(plan)`` on the plan's
    nodes: torchrun on every node (MASTER_ADDR and NODE_RANK set by the user), or one Slurm job
    (``sbatch``; srun starts torchrun once a node). The data and tokenizer, which no plan
    decides, are required variables the script stops without (``${VAR:?...}``)."""
    gpus = len(plan.cluster)
    nodes, per_node = nodes_of(plan)
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    head = ["#!/bin/bash", f"# written by pipeplan export-plan: Megatron-LM pretrain_gpt.py on {nodes} node(s) x "
            f"{per_node} GPUs = {gpus} ranks, as planned; run from Megatron-LM's checkout"]
    if launcher == "slurm":
        head += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={per_node}",
                 "#SBATCH --exclusive"]
    head += [f"export {k}={v}" for k, v in environment(plan).items()]
    head += ["DATA_PATH=${DATA_PATH:?set DATA_PATH: your data, the --data-path prefix of Megatron}",
             f'TOKENIZER_MODEL=${{TOKENIZER_MODEL:?set TOKENIZER_MODEL: a tokenizer of {spec.vocab} tokens, as '
             'the plan assumed}',
             'TRAIN_ITERS=${TRAIN_ITERS:-1000}', 'LR=${LR:-3e-4}']
    if launcher == "slurm":
        head.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        start = (f"srun torchrun --nnodes={nodes} --nproc-per-node={per_node} --node-rank=\"$SLURM_NODEID\" "
                 '--master-addr="$MASTER_ADDR" --master-port=6000 \\')
    else:
        start = (f"torchrun --nnodes={nodes} --nproc-per-node={per_node} --node-rank=\"${{NODE_RANK:?set NODE_RANK}}\" "
                 '--master-addr="${MASTER_ADDR:?set MASTER_ADDR}" --master-port=6000 \\')
    body = ["    pretrain_gpt.py \\"] + [f"    {a} \\" for a in arguments(plan)]
    tail = ['    --data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL" \\',
            '    --train-iters "$TRAIN_ITERS" --lr "$LR"']
    return "\n".join(head + [start] + body + tail) + "\n"

