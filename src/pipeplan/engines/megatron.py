"""A decoder LLM's plan as Megatron-LM's ``pretrain_gpt.py`` arguments (docs/engines.md).

Megatron expresses a plan whose every stage has one tensor-parallel degree t and one number
of data-parallel replicas d, laid out as ``layouts.megatron_stages`` lays it out (tensor-
parallel groups of consecutive GPUs inside a server; chunk j on pipeline position j mod PP),
with the embedding in the first chunk and the LM head in the last, equal layers per chunk but
for the first and last stage of a pipeline without interleaving, the schedule 1F1B (or
interleaved 1F1B with chunks), and one recomputation setting for every stage. Anything else
is refused with one line naming why and what the nearest plan Megatron can run (the same
shape in its layout, even layers, its schedule, one recomputation setting) is predicted to
cost, against the plan's own prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.llm import DecoderSpec, decoder_of
from ..plan import Plan
from .shape import common_why_not, layer_counts, require, shape


@dataclass(frozen=True)
class View:
    """What Megatron is told: the degrees, chunks, layers of the first and last pipeline stage
    where they differ from the rest (None: equal), batch sizes and the switches."""

    tp: int
    pp: int
    dp: int
    vpp: int
    first: int | None
    last: int | None
    layers_per_chunk: int
    micro: int
    global_batch: int
    recompute: str
    zero: bool
    sp: bool
    overlap: bool


def _why_not(plan: Plan) -> str | None:
    """The first thing Megatron cannot express, in words; None when it can express it all."""
    why = common_why_not(plan, ("single", "loop"))
    if why is not None:
        return why
    tp, pp, dp, vpp = shape(plan)
    counts = layer_counts(plan)
    if vpp > 1 and len(set(counts)) > 1:
        return f"its model chunks have unequal layer counts ({counts}); with interleaving Megatron takes equal ones"
    if vpp == 1 and pp > 2 and len(set(counts[1:-1])) > 1:
        return f"its middle stages have unequal layer counts ({counts}); Megatron sets only the first and last"
    if plan.schedule != ("1f1b" if vpp == 1 else "interleaved-1f1b"):
        return f"schedule {plan.schedule} (Megatron runs 1F1B, and interleaved 1F1B with model chunks)"
    per_replica = plan.microbatches // dp if plan.replicas == "round-robin" else plan.microbatches
    if vpp > 1 and per_replica % pp:
        return (f"with interleaving Megatron runs a multiple of PP = {pp} microbatches a replica, this plan "
                f"{per_replica}")
    return None


def view(plan: Plan) -> View:
    """What Megatron is told for ``plan``; a PipeplanError naming what it cannot express and
    the nearest plan's predicted cost."""
    require("megatron", "Megatron-LM", plan, _why_not)
    tp, pp, dp, vpp = shape(plan)
    counts = layer_counts(plan)
    middle = counts[1] if vpp == 1 and pp > 2 else counts[0]
    first = counts[0] if vpp == 1 and pp > 1 and counts[0] != middle else None
    last = counts[-1] if vpp == 1 and pp > 1 and counts[-1] != middle else None
    b = int(plan.graph.meta.get("microbatch", 1))
    micro = b // dp if plan.replicas == "split" else b
    mode = plan.recompute_mode(0)
    return View(tp, pp, dp, vpp, first, last, middle, micro, b * plan.microbatches, mode, bool(plan.zero),
                plan.sequence_parallel and tp > 1, plan.overlap_grad_reduce and dp > 1)


def model_arguments(spec: DecoderSpec) -> list[str]:
    """The model's dimensions as Megatron's arguments; the vocabulary is the tokenizer's
    (``--tokenizer-type``), so ``note`` says what the plan assumed."""
    args = [f"--num-layers {spec.layers}", f"--hidden-size {spec.hidden}", f"--ffn-hidden-size {spec.ffn}",
            f"--num-attention-heads {spec.heads}", f"--seq-length {spec.seq}",
            f"--max-position-embeddings {spec.seq}"]
    if spec.kv_heads != spec.heads:
        args += ["--group-query-attention", f"--num-query-groups {spec.kv_heads}"]
    if spec.gated:
        args.append("--swiglu")
    if spec.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if spec.positions == "rope":
        args.append("--position-embedding-type rope")
    if not spec.tied:
        args.append("--untie-embeddings-and-output-weights")
    if not spec.bias:
        args.append("--disable-bias-linear")
        if spec.qkv_bias:
            args.append("--add-qkv-bias")
    if not spec.dropout:
        args += ["--attention-dropout 0", "--hidden-dropout 0"]
    return args + ["--bf16"]


def note(plan: Plan) -> str:
    """What the arguments leave to the user: the tokenizer, whose vocabulary the plan assumed."""
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    return (f"# the plan assumed a vocabulary of {spec.vocab:,} tokens: give the tokenizer that has it "
            "(--tokenizer-type, --tokenizer-model), and your data")


def arguments(plan: Plan) -> list[str]:
    """``pretrain_gpt.py``'s arguments for ``plan``, one option (with its value) an entry: the
    parallelism, then the model."""
    return parallel_arguments(plan) + model_arguments(decoder_of(plan.graph.meta, f"model {plan.graph.name!r}"))


def parallel_arguments(plan: Plan) -> list[str]:
    """The parallelism, batch, recomputation and optimizer arguments of ``plan``."""
    v = view(plan)
    args = [f"--tensor-model-parallel-size {v.tp}", f"--pipeline-model-parallel-size {v.pp}"]
    if v.vpp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {v.layers_per_chunk}")
    if v.first is not None:
        args.append(f"--decoder-first-pipeline-num-layers {v.first}")
    if v.last is not None:
        args.append(f"--decoder-last-pipeline-num-layers {v.last}")
    args += [f"--micro-batch-size {v.micro}", f"--global-batch-size {v.global_batch}"]
    if v.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif v.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if v.sp:
        args.append("--sequence-parallel")
    if v.zero:
        args.append("--use-distributed-optimizer")
    if v.overlap:
        args.append("--overlap-grad-reduce")
    if plan.optimizer != "adam":
        args.append(f"--optimizer {plan.optimizer}")
    return args
