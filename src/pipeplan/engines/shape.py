"""The 3D shape of a decoder LLM's plan as the engines read it (docs/engines.md): tensor-
parallel degree, pipeline positions, data-parallel replicas and model chunks, and what every
engine needs of it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..errors import PipeplanError
from ..llm.spec import decoder_of
from ..llm.layout import even, stages as layout_stages
from ..llm.parallelism import Parallelism
from ..plan import Plan, Stage, is_decoder
from ..schedule import SCHEDULES
from ..sim import simulate


def positions(plan: Plan) -> list[tuple[str, ...]]:
    """The pipeline positions: the stages' distinct device lists, in order of first use."""
    return list(dict.fromkeys(tuple(s.devices) for s in plan.stages))


def layer_counts(plan: Plan) -> list[int]:
    """Decoder layers of each stage."""
    return [sum(1 for n in s.nodes if n.startswith("layer")) for s in plan.stages]


def shape(plan: Plan) -> tuple[int, int, int, int]:
    """(TP, PP, DP, chunks): the plan's parallelism where a 3D planner declared it, else read
    off the stages (the most common degree and replica count)."""
    if plan.parallelism is not None:
        par = plan.parallelism
        return par.tp, par.pp, par.dp, par.vpp
    tp = Counter(s.tp for s in plan.stages).most_common(1)[0][0]
    world = len({d for s in plan.stages for d in s.devices})
    pp = len(positions(plan))
    vpp = len(plan.stages) // pp if len(plan.stages) % pp == 0 else 1
    return tp, pp, max(world // (tp * pp), 1), vpp


def parallelism_of(plan: Plan) -> Parallelism:
    """The plan's ``Parallelism``: as a 3D planner declared it, else read off the stages of a
    plan an engine can express (``common_why_not`` found nothing): the shape, the layers of
    each chunk, the microbatch a replica runs, one recomputation setting, the switches, the
    gradients in fp32 and sends overlapped where Megatron overlaps them (its defaults)."""
    if plan.parallelism is not None:
        return plan.parallelism
    tp, pp, dp, vpp = shape(plan)
    b = int(plan.graph.meta.get("microbatch", 1))
    return Parallelism(tp, pp, dp, tuple(layer_counts(plan)), vpp,
                       microbatch=b // dp if plan.replicas == "split" else b, recompute=plan.recompute_mode(0),
                       sp=plan.sequence_parallel and tp > 1, zero=plan.zero,
                       overlap_grad_reduce=plan.overlap_grad_reduce and dp > 1, schedule=plan.schedule)


def placement_of(plan: Plan) -> str:
    """``single``, ``loop`` or ``v``: how the plan's schedule places model chunks."""
    return SCHEDULES[plan.schedule].placement if plan.schedule in SCHEDULES else "single"


def _chunk_position(j: int, pp: int, placement: str) -> int:
    return min(j, 2 * pp - 1 - j) if placement == "v" else j % pp


def common_why_not(plan: Plan, placements: tuple[str, ...]) -> str | None:
    """What no engine's layout expresses (uniform TP and replicas, chunks placed by one of
    ``placements``, TP groups inside a server, the embedding first and the head last, one
    recomputation setting, whole samples per replica); None when the plan has none of it."""
    tp, pp, dp, vpp = shape(plan)
    pos, placement = positions(plan), placement_of(plan)
    if len({s.tp for s in plan.stages}) > 1:
        return f"its stages have different tensor-parallel degrees ({sorted({s.tp for s in plan.stages})})"
    if len({len(s.tp_groups) for s in plan.stages}) > 1:
        return "its stages have different numbers of data-parallel replicas"
    if placement not in placements or len(plan.stages) != pp * vpp or any(
            tuple(s.devices) != pos[_chunk_position(j, pp, placement)] for j, s in enumerate(plan.stages)):
        return f"its model chunks are not placed as the engine places them ({', '.join(placements)})"
    servers = {d.name: d.server or d.name for d in plan.cluster.devices}
    if any(len({servers[g] for g in group}) > 1 for s in plan.stages for group in s.tp_groups):
        return "a tensor-parallel group spans servers (the engines' groups are consecutive ranks of one node)"
    if "embed" not in plan.stages[0].nodes or "head" not in plan.stages[-1].nodes:
        return "the embedding is not in the first stage or the LM head not in the last"
    if len({plan.recomputes(s) for s in range(plan.num_stages)}) > 1:
        return "some stages recompute and others do not (the engines set recomputation for every stage)"
    if plan.replicas == "split" and int(plan.graph.meta.get("microbatch", 1)) % dp:
        return "a microbatch is split over the replicas into parts of unequal samples"
    return None


def nearest(plan: Plan) -> Plan:
    """The plan the engines can run that is nearest ``plan``: its shape in Megatron's layout
    (``llm.layout``), even layers, 1F1B or interleaved 1F1B, full recomputation on every stage if
    on any (a declared parallelism: the same but for the layers and the schedule, 1F1B where a
    replica's microbatches are not a multiple of PP, as interleaving needs)."""
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    tp, pp, dp, vpp = shape(plan)
    world = sorted({d for devs in plan.stage_devices() for d in devs})
    names = [plan.cluster.devices[d].name for d in world]
    schedule = "1f1b" if vpp == 1 else "interleaved-1f1b"
    if plan.parallelism is not None:  # its CP, EP and switches kept
        par = replace(plan.parallelism, layout=even(spec.layers, pp, vpp), schedule=schedule)
        if vpp > 1 and (plan.global_batch // (par.dp * par.microbatch)) % pp:  # interleaving cannot run it: 1F1B
            par = replace(par, layout=even(spec.layers, pp, 1), vpp=1, schedule="1f1b", overlap_p2p=False)
        stages = [Stage(*chunk) for chunk in layout_stages(names, par)]
        return replace(plan, stages=stages, schedule=par.schedule, recompute=[par.recompute == "full"] * len(stages),
                       prediction={}, extra={}, parallelism=par)
    par = Parallelism(tp, pp, dp, even(spec.layers, pp, vpp), vpp, schedule=schedule)
    stages = [Stage(*chunk) for chunk in layout_stages(names, par)]
    full = any(plan.recomputes(s) for s in range(plan.num_stages))
    return replace(plan, stages=stages, schedule="1f1b" if vpp == 1 else "interleaved-1f1b",
                   recompute=[full] * len(stages), selective=plan.selective and not full, prediction={},
                   extra={}, replicas="round-robin" if plan.replicas == "split" and dp > 1 else plan.replicas,
                   parallelism=None)


def refusal(engine: str, plan: Plan, why: str) -> str:
    """One line: why ``engine`` cannot express ``plan``, and the nearest plan's predicted cost
    (``nearest``) against the plan's own."""
    try:
        near = nearest(plan)
        cost = simulate(near, timeline=False).iteration_s
    except PipeplanError as e:
        return f"{engine} cannot express this plan: {why}; no plan in its layout comes near ({e})"
    own = simulate(plan, timeline=False).iteration_s
    tp, pp, dp, vpp = shape(near)
    text = f"TP {tp} x PP {pp} x DP {dp}" + (f", {vpp} chunks" if vpp > 1 else "")
    return (f"{engine} cannot express this plan: {why}; the nearest plan it can run ({text}, even layers, "
            f"{near.schedule}) is predicted at {cost:.4g} s an iteration, this plan at {own:.4g} s")


def require(engine: str, label: str, plan: Plan, why_not) -> None:
    """A PipeplanError unless ``engine`` (``label`` in messages) can express ``plan``: a decoder
    LLM's plan that ``why_not(plan)`` finds nothing wrong with (else ``refusal``)."""
    if not is_decoder(plan.graph):
        raise PipeplanError(f"{engine}: {label} trains decoder LLMs, configured by their dimensions; this plan's "
                            f"model {plan.graph.name!r} has none (plan on a decoder's analytic graph: --model "
                            "zoo:gpt?..., zoo:llama3-*, hf:ARCH?... or hf:PATH; a profile measures layers, not dimensions)")
    why = why_not(plan)
    if why is not None:
        raise PipeplanError(refusal(engine, plan, why))


def nodes_of(plan: Plan) -> tuple[int, int]:
    """(nodes, GPUs a node) of the plan's cluster, as the launch scripts start them: the first
    server's GPUs a node."""
    first = plan.cluster.devices[0].server
    per_node = max(sum(d.server == first for d in plan.cluster.devices), 1)
    return -(-len(plan.cluster) // per_node), per_node

