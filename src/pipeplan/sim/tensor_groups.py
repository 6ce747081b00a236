"""A plan of a decoder LLM as the simulator runs it (docs/llm.md, "Tensor parallelism"): each
tensor-parallel group becomes one device of a derived cluster, and each node costs what one
rank of its stage's group spends on it, from the decoder's dimensions and the GPUs' own bf16
rates (``llm.costs``), tensor-parallel collectives included.

- A group of t GPUs: their kind and least speed, t x the least memory (the per-GPU figures
  ``simulate`` reports are the group's / t: Megatron divides weights, gradients, optimizer
  state and activations evenly but for the few tensors Korthikanti's count keeps whole).
- A link between two groups: the pipeline hands over the hidden state with Megatron's
  scatter/gather (Narayanan et al. 2021 §4.1): each of the min(t_a, t_b) rank pairs sends its
  share over its own link, so the bandwidth is that many x the slowest pair's, the latency the
  largest. The data-parallel all-reduce of a stage's replicas then moves the group's
  parameter bytes at t x one rank's rail: each rank all-reduces its 1/t.
- Node costs on stage s (t ranks, r replicas; each replica gets whole samples: the
  microbatch in turn with ``round-robin``, b / r of it with ``split``, refused unless whole):
  forward = compute + collectives, backward = compute + recomputation + collectives (compute
  over ``llm.costs.END_TO_END``, the share of the kernel rate a run keeps), times the
  kind's speed (graph times are reference seconds) and, with ``split``, r (the simulator
  divides a split microbatch over the r groups); activation bytes kept = a rank's x t (x r).
- ZeRO-1: the optimizer state is sharded over the stage's replicas (``memory_shards``).
- Context and expert parallelism (a plan's ``parallelism``, docs/llm.md): a group is a
  replica's TP x CP GPUs, each rank costed on its s / CP of the sequence with the key/value
  exchange over its CP group and a mixture's routed experts over its EP group
  (``llm.rank_costs``); weights replicated over CP count once a rank; dense gradients are
  reduced (and, ZeRO-1, the optimizer sharded) over DP x CP ranks, the routed experts' over
  the expert data-parallel ranks, a stage's optimizer shards then the count that gives its
  state exactly (``_stage_shards``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cluster import Cluster, Device
from ..cluster.collectives import exchange_links, group_links, servers_of
from ..cluster.kinds import KINDS
from ..errors import PipeplanError
from ..graph import Graph
from ..llm.experts import remote_share
from ..llm.rank_costs import Cut, Links, fp8_weight_bytes, node_parts, rank_params
from ..llm.spec import BF16, DecoderSpec, decoder_of
from ..llm.step_costs import OPTIMIZER_STEP_BYTES, dp_collectives_s, dp_ring, tied_reduction_s
from ..plan import Plan, Stage, is_decoder
from .compile import BLOCKING_SENDS
from .durations import OVERLAP, STAGE_ALLREDUCE_S, STAGE_STEP_EXTRA_S
from .stage_costs import PAIR_COMM
from .replicas import as_two, between_groups, ring_links, symmetric_count


#: graph meta key of a graph costed on groups already
LOWERED = "costed_on_groups"
#: graph meta key: per stage, one microbatch's seconds by part (``NodeParts``' fields), for ``explain``
STAGE_PARTS = "stage_parts"


@dataclass(frozen=True)
class Group:
    """A tensor-parallel group of the plan: its name, its GPUs and the device of the lowered
    plan that runs as it does (itself, or replica 0's or 1's where replicas run as two)."""

    name: str
    gpus: list[str]
    runs_as: int


@dataclass(frozen=True)
class Lowered:
    """``plan`` on the group cluster and every group of the original plan, in order of use."""

    plan: Plan
    groups: list[Group]


def has_rates(cluster: Cluster, devices: list[int] | None = None) -> bool:
    """Every device (of ``devices``, default all) is of a kind with measured bf16 rates."""
    kinds = {cluster.devices[d].kind.lower() for d in (range(len(cluster)) if devices is None else devices)}
    return all(k in KINDS and KINDS[k].gemm_efficiency > 0 for k in kinds)


def needs_lowering(plan: Plan) -> bool:
    """A decoder graph on GPUs with bf16 rates is always costed per group; elsewhere only the
    old per-node costs exist, which know no tensor parallelism (refused with one line)."""
    if not is_decoder(plan.graph) or plan.graph.meta.get(LOWERED):
        return False
    if has_rates(plan.cluster, [d for devs in plan.stage_devices() for d in devs]):
        return True
    if plan.tensor_parallel or plan.selective or plan.sequence_parallel or plan.zero or plan.overlap_grad_reduce:
        raise PipeplanError("plan: tensor parallelism, selective recomputation, sequence parallelism and zero are "
                            "priced with a GPU kind's bf16 rates (A100-40GB, A100-80GB, H100-SXM); this cluster "
                            "has other kinds")
    return False


def _cp(plan: Plan) -> int:
    return plan.parallelism.cp if plan.parallelism else 1


def _groups(plan: Plan) -> tuple[list[list[int]], list[list[int]]]:
    """Distinct groups (GPU indices: a replica's TP x CP) and, per stage, the indices of its groups."""
    cl, index, groups, of_stage = plan.cluster, {}, [], []
    owner: dict[int, int] = {}
    for k, st in enumerate(plan.stages):
        mine, size = [], st.tp * _cp(plan)
        for g in (st.devices[i:i + size] for i in range(0, len(st.devices), size)):
            idx = tuple(cl.device_indices(g, where=f"plan stage {k}"))
            if idx not in index:
                clash = [owner[d] for d in idx if d in owner]
                if clash:
                    raise PipeplanError(f"plan: stage {k} puts {cl.devices[idx[0]].name!r} in a tensor-parallel "
                                        "group that differs from its group in an earlier stage")
                index[idx] = len(groups)
                groups.append(list(idx))
                owner.update({d: index[idx] for d in idx})
            mine.append(index[idx])
        of_stage.append(mine)
    return groups, of_stage


def _name(cl: Cluster, g: list[int]) -> str:
    return cl.devices[g[0]].name if len(g) == 1 else f"{cl.devices[g[0]].name}..{cl.devices[g[-1]].name}"


def group_cluster(cl: Cluster, groups: list[list[int]]) -> Cluster:
    """The cluster whose devices are ``groups`` (module docstring)."""
    devices = []
    for g in groups:
        first = cl.devices[g[0]]
        devices.append(Device(_name(cl, g), first.kind, float(cl.usable[g].min()) * len(g),
                              float(cl.speed[g].min()), first.server))
    bw, lat = between_groups(cl, groups, groups)
    # a group's memory is its GPUs' usable memory (their reserves subtracted once, here)
    return Cluster(f"{cl.name} (tensor-parallel groups)", devices, bw, lat, {**cl.meta, "memory_reserve": 0.0})


def _role(nid: str) -> str:
    role = "layer" if nid.startswith("layer") else nid
    if role not in ("embed", "layer", "head"):
        raise PipeplanError(f"plan: node {nid!r} of a decoder graph is not embed, layer<i> or head")
    return role


def _samples(plan: Plan, k: int, replicas: int) -> int:
    b = int(plan.graph.meta.get("microbatch", 1))
    if plan.replicas == "round-robin" or replicas == 1:
        return b
    if b % replicas:
        raise PipeplanError(f"plan: stage {k} splits a microbatch of {b} sample(s) over {replicas} data-parallel "
                            "replicas: not whole samples (a multiple of the replicas, or replicas round-robin)")
    return b // replicas


#: a stage's parts (``llm.rank_costs.NodeParts``' fields) summed over its nodes
PARTS = ("fwd", "fwd_tp", "bwd", "recompute", "bwd_tp", "fwd_cp", "bwd_cp", "fwd_ep", "bwd_ep")


def stage_cut(plan: Plan, k: int) -> Cut:
    """How stage ``k``'s GPUs cut its nodes: the plan's parallelism, else its TP alone."""
    par = plan.parallelism
    return par.cut() if par is not None else Cut(plan.stages[k].tp, plan.sequence_parallel)


def stage_links(cl: Cluster, devs: list[int], cut: Cut, spec: DecoderSpec) -> Links:
    """The links of a stage's first TP, CP, EP and expert-TP groups, its GPUs ``devs`` in
    Megatron's order (TP fastest, then CP, then DP; the expert grid ETP, EP, expert DP); the
    EP group's as an all-to-all's of ``spec``'s tokens (``collectives.exchange_links``,
    ``experts.remote_share``)."""
    def of(group: list[int]) -> tuple[float, float]:
        return group_links(cl, group) if len(group) > 1 else (0.0, 0.0)

    e, ep = cut.experts, devs[:cut.experts.ep * cut.experts.etp:cut.experts.etp]
    share = remote_share(spec, e, servers_of(cl, ep)) if len(ep) > 1 else None
    return Links(of(devs[:cut.tp]), of(devs[:cut.tp * cut.cp:cut.tp]), exchange_links(cl, ep, share),
                 of(devs[:e.etp]))


def _is_moe(spec: DecoderSpec, nid: str) -> bool:
    return nid.startswith("layer") and spec.is_moe_layer(int(nid[5:]))


def group_graph(plan: Plan, of_stage: list[list[int]]) -> Graph:
    """The plan's graph with each node's costs on its stage's groups (module docstring)."""
    g, cl = plan.graph, plan.cluster
    spec = decoder_of(g.meta, f"model {g.name!r}")
    fwd, bwd, saved = g.fwd.copy(), g.bwd.copy(), g.saved.copy()
    parts: list[dict[str, float]] = []
    pair_comm: dict[str, list[float]] = {}
    for k, (idx, devs) in enumerate(zip(plan.stage_nodes(), plan.stage_devices())):
        kind = KINDS[cl.devices[devs[0]].kind.lower()]
        r, cut = len(of_stage[k]), stage_cut(plan, k)
        samples = _samples(plan, k, r)
        links = stage_links(cl, devs, cut, spec)
        speed = float(cl.speed[devs].min())
        scale = r if plan.replicas == "split" else 1
        mine = dict.fromkeys(PARTS, 0.0)
        for i in idx:
            p = node_parts(spec, _role(g.ids[i]), kind, samples, cut, plan.recompute_mode(k), links,
                           _is_moe(spec, g.ids[i]))
            fwd[i], bwd[i] = p.fwd_s * speed * scale, p.bwd_s * speed * scale
            if p.fwd_ep or p.bwd_ep:
                pair_comm[g.ids[i]] = [p.fwd_ep * speed * scale, p.bwd_ep * speed * scale]
            saved[i] = p.kept * cut.tp * cut.cp * scale
            for key in mine:
                mine[key] += getattr(p, key)
        parts.append(mine)
    params, expert = _group_params(plan, spec)
    if spec.tied and not _tied_together(plan):
        # Megatron-LM: the last stage keeps a copy of the tied embedding (its gradient all-reduce
        # with the first stage, once an iteration, is not priced: docs/llm.md)
        params[g.index["head"]] += BF16 * spec.vocab * spec.hidden
    meta = {**{k: v for k, v in g.meta.items() if k != "fixed_s"}, LOWERED: True}
    if plan.zero:
        meta["optimizer_shards"] = _stage_shards(plan, of_stage, params, expert)
    if plan.overlap_grad_reduce:
        meta[OVERLAP] = plan.replicas
    meta[STAGE_ALLREDUCE_S] = _stage_reductions(plan, spec, params, expert)
    meta[STAGE_STEP_EXTRA_S] = _tied_reduction(plan, spec)
    meta[STAGE_PARTS] = parts
    meta[PAIR_COMM] = pair_comm
    if plan.parallelism is not None and plan.parallelism.precision == "fp8":
        meta["stage_extra_bytes"] = _fp8_copies(plan, spec)
    meta[BLOCKING_SENDS] = plan.parallelism is not None and not plan.parallelism.overlap_p2p
    meta["update_s_per_byte"] = _update_s_per_byte(plan, of_stage)
    return replace(g, fwd=fwd, bwd=bwd, saved=saved, params=params, meta=meta, tied={})


def _group_params(plan: Plan, spec: DecoderSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per node, a group's parameter bytes (its ranks' summed: weights replicated over CP count
    on every rank, key/value heads replicated over TP too) and of them the routed experts'."""
    g = plan.graph
    params, expert = g.params.copy(), np.zeros(len(g))
    for k, idx in enumerate(plan.stage_nodes()):
        cut = stage_cut(plan, k)
        for i in idx:
            if _is_moe(spec, g.ids[i]):
                dense, routed = rank_params(spec, True, cut)
                params[i], expert[i] = BF16 * (dense + routed) * cut.tp * cut.cp, BF16 * routed * cut.tp * cut.cp
            elif g.ids[i].startswith("layer"):
                params[i] = (params[i] + BF16 * spec.kv_replicated_params(cut.tp)) * cut.cp
            else:
                params[i] *= cut.cp
    return params, expert


def _fp8_copies(plan: Plan, spec: DecoderSpec) -> list[float]:
    """Per stage, a group's FP8 weight copies (``rank_costs.fp8_weight_bytes``, its ranks')."""
    out, ids = [], plan.graph.ids
    for k, idx in enumerate(plan.stage_nodes()):
        cut = stage_cut(plan, k)
        out.append(sum(fp8_weight_bytes(spec, _is_moe(spec, ids[i]), cut) for i in idx if ids[i].startswith("layer"))
                   * cut.tp * cut.cp)
    return out


def _stage_shards(plan: Plan, of_stage: list[list[int]], params: np.ndarray, expert: np.ndarray) -> int | list[float]:
    """ZeRO-1's shards: the replicas (DP); with CP or experts, per stage, the count S that
    gives its state exactly, (P_dense + P_expert) / (P_dense / (DP x CP) + P_expert / EDP)."""
    dp = min(len(s) for s in of_stage)
    par = plan.parallelism
    if par is None or (par.cp == 1 and not expert.any()):
        return dp
    out = []
    for idx in plan.stage_nodes():
        total, routed = float(params[idx].sum()), float(expert[idx].sum())
        out.append(total / ((total - routed) / (dp * par.cp) + routed / par.expert_dp))
    return out


def _stage_reductions(plan: Plan, spec: DecoderSpec, params: np.ndarray, expert: np.ndarray) -> list[float]:
    """Each stage's data-parallel collectives (``dp_collectives_s``, the plan's parallelism or
    Megatron's defaults: fp32 gradients): a rank's dense gradients over the ring of its DP x CP
    peers (every TP-th GPU of the stage), its routed experts' over its expert data-parallel
    peers (every EP x ETP-th)."""
    cl, out, rings = plan.cluster, [], {}
    grad = plan.parallelism.grad_reduce if plan.parallelism else "fp32"

    weight = 1.0 if plan.parallelism is not None and plan.parallelism.fp8_params else BF16

    def reduce(ring: list[int], nbytes: float) -> float:
        if tuple(ring) not in rings:
            rings[tuple(ring)] = dp_ring(cl, ring)
        return dp_collectives_s(len(ring), plan.zero, grad, nbytes / BF16, rings[tuple(ring)], weight)

    for k, (idx, devs) in enumerate(zip(plan.stage_nodes(), plan.stage_devices())):
        cut = stage_cut(plan, k)
        size, routed = cut.tp * cut.cp, float(expert[idx].sum())
        seconds = reduce(devs[::cut.tp], (float(params[idx].sum()) - routed) / size)
        if routed:
            seconds += reduce(devs[::cut.experts.ep * cut.experts.etp], routed / size)
        out.append(seconds)
    return out


def _tied_together(plan: Plan) -> bool:
    """The embedding and the head on the same GPUs (one stage, or a V's first and last chunk)."""
    owner = plan.stage_of_node()
    return plan.stages[owner[plan.graph.index["embed"]]].devices == plan.stages[owner[plan.graph.index["head"]]].devices


def _tied_reduction(plan: Plan, spec: DecoderSpec) -> list[float]:
    """Per stage, the all-reduce of a tied embedding's gradient between the first and the last
    stage that hold it (Megatron-LM's embedding group, ``finalize_model_grads``: fp32 gradients,
    2 ranks, after the data-parallel reduction and before the optimizer step, with or without
    data parallelism; ``tied_reduction_s``); 0 elsewhere."""
    if not spec.tied or _tied_together(plan):
        return [0.0] * plan.num_stages
    grad = plan.parallelism.grad_reduce if plan.parallelism else "fp32"
    first, last = plan.stage_devices()[0][0], plan.stage_devices()[-1][0]
    return [tied_reduction_s(spec, plan.cluster, st.tp, grad, first, last)
            if "embed" in st.nodes or "head" in st.nodes else 0.0 for st in plan.stages]


def _update_s_per_byte(plan: Plan, of_stage: list[list[int]]) -> float:
    """The optimizer step's seconds per 16-bit parameter byte of a group (``OPTIMIZER_STEP_BYTES``
    through one GPU's HBM, its 1 / TP of the stage, 1 / DP with ZeRO-1), in the reference
    seconds the simulator divides by the GPU's speed; 0 where the stages' TP differ."""
    tps = {st.tp for st in plan.stages}
    if len(tps) > 1:
        return 0.0
    d = plan.stage_devices()[0][0]
    kind = KINDS[plan.cluster.devices[d].kind.lower()]
    shards = min(len(s) for s in of_stage) * _cp(plan) if plan.zero else 1
    per_param = OPTIMIZER_STEP_BYTES.get(plan.optimizer, OPTIMIZER_STEP_BYTES["adam"])
    return per_param / BF16 / kind.hbm_bytes_per_s / tps.pop() / _cp(plan) / shards * float(plan.cluster.speed[d])


def lower(plan: Plan) -> Lowered:
    """``plan`` with its tensor-parallel groups as devices and its nodes costed on them."""
    if plan.zero and len({len(s.tp_groups) for s in plan.stages}) > 1:
        raise PipeplanError("plan: zero shards the optimizer over the data-parallel replicas, which must be as "
                            "many on every stage")
    groups, of_stage = _groups(plan)
    graph = group_graph(plan, of_stage)
    r = symmetric_count(plan, groups, of_stage)
    named = [(_name(plan.cluster, g), [plan.cluster.devices[d].name for d in g]) for g in groups]
    if r is None:
        cl = group_cluster(plan.cluster, groups)
        stages = [Stage(list(st.nodes), [cl.names[v] for v in of_stage[k]]) for k, st in enumerate(plan.stages)]
        return Lowered(Plan(graph, cl, stages, plan.microbatches, schedule=plan.schedule, planner=plan.planner,
                            optimizer=plan.optimizer, replicas=plan.replicas),
                       [Group(n, gpus, v) for v, (n, gpus) in enumerate(named)])
    return _as_two_replicas(plan, graph, groups, of_stage, r, named)


def _as_two_replicas(plan: Plan, graph: Graph, groups: list[list[int]], of_stage: list[list[int]], r: int,
                     named: list[tuple[str, list[str]]]) -> Lowered:
    """The plan's replicas 0 and 1 with 2M / r microbatches, the link between them pricing
    each stage's all-reduce as over all r (``sim.replicas``); replica k > 1 runs as replica 0."""
    kept = list(dict.fromkeys(g for s in of_stage for g in s[:2]))
    at = {g: i for i, g in enumerate(kept)}
    cl = group_cluster(plan.cluster, [groups[g] for g in kept])
    for ring in {tuple(s) for s in of_stage}:
        a, b = at[ring[0]], at[ring[1]]
        bw, lat = as_two(r, *ring_links(plan.cluster, [groups[g] for g in ring]))
        cl.bandwidth[a, b] = cl.bandwidth[b, a] = bw
        cl.latency[a, b] = cl.latency[b, a] = lat
    stages = [Stage(list(st.nodes), [cl.names[at[g]] for g in of_stage[k][:2]]) for k, st in enumerate(plan.stages)]
    low = Plan(graph, cl, stages, 2 * plan.microbatches // r, schedule=plan.schedule, planner=plan.planner,
               optimizer=plan.optimizer, replicas=plan.replicas)
    runs_as = {g: at[s[1] if k == 1 else s[0]] for s in of_stage for k, g in enumerate(s)}
    low.extra["replicas"] = {"simulated": 2, "of": r}
    order = dict.fromkeys(g for s in of_stage for g in s)
    return Lowered(low, [Group(*named[g], runs_as[g]) for g in order])


def throughput(plan: Plan, iteration_s: float) -> dict:
    """Per GPU: model TFLOP/s (forward + backward, the MFU convention), hardware TFLOP/s (with
    what recomputation runs again, Megatron's Eq. 3 convention) and MFU against the kind's dense
    peak in the plan's precision (``mfu_peak`` says which), for one iteration of ``iteration_s``."""
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    samples = int(plan.graph.meta.get("microbatch", 1)) * plan.microbatches
    gpus = sorted({d for devs in plan.stage_devices() for d in devs})
    again = 0.0
    for k, idx in enumerate(plan.stage_nodes()):
        mode = plan.recompute_mode(k)
        again += sum({"none": 0.0, "selective": spec.attention_core_flops(1),
                      "full": spec.layer_flops(1, _is_moe(spec, plan.graph.ids[i]))}[mode]
                     for i in idx if plan.graph.ids[i].startswith("layer"))
    model = spec.model_flops_per_sample() * samples / (iteration_s * len(gpus)) / 1e12
    hw = model + again * samples / (iteration_s * len(gpus)) / 1e12
    fp8 = plan.parallelism is not None and plan.parallelism.precision == "fp8"
    kinds = [KINDS[plan.cluster.devices[d].kind.lower()] for d in gpus]
    peak = min(k.fp8_flops if fp8 else k.bf16_flops for k in kinds)
    return {"model_tflops_per_gpu": model, "hw_tflops_per_gpu": hw, "mfu": model * 1e12 / peak,
            "mfu_peak": "fp8 dense" if fp8 else "bf16 dense"}
