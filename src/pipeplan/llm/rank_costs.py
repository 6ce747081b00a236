"""A node of a decoder LLM (embedding, layer, head) on one GPU for one microbatch, as a training
run spends it (docs/llm.md): the tensor-parallel layer of ``llm.costs`` on the rank's share of
the sequence under context parallelism, a mixture's routed experts (``llm.experts``), and each
kind of communication apart, so that ``explain`` can name it.

- Context parallelism (CP ranks, Megatron-core's ``--context-parallel-size``): each rank holds
  s / CP of every sequence (two chunks, causal load balancing: every rank does 1 / CP of the
  attention), so every per-token term is the layer's at s / CP, while its queries see all s
  keys (``keys``). Keys and values cross the CP group either by Megatron-core's ring (``p2p``,
  ``collectives.ring_exchange_s``: CP - 1 sends of the rank's key/value block, each behind the
  attention on the block in hand; backward the blocks and their gradients) or by an all-gather
  before the attention and a reduce-scatter of their gradients (``allgather``, Llama 3's).
  The ring's partial attentions are merged step by step (``cp_merge_s``: each of the CP - 1
  later steps reads and writes the rank's fp32 output and its rows' log-sum-exp, forward and
  twice in the backward).
- Expert parallelism: a mixture's layer adds its routed experts' compute and their dispatch
  and combine (``llm.experts``) to the dense part (attention, shared experts, router).
- Full recomputation runs the forward again in the backward, its exchanges included.
- FP8 (``Cut.fp8``): the layers' GEMMs and experts in FP8 with Transformer Engine's casts
  (``costs.fp8_cast_bytes``, ``llm.experts``); the embedding, the LM head and the attention
  core in bf16, as Megatron-LM's ``--fp8-format hybrid`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..cluster.collectives import collective_s, ring_exchange_s
from . import costs
from .costs import Collective, comm_s, embedding_compute_s, head_compute_s, layer_cost, rates_of
from .experts import ExpertCut, copies, dispatch_s, expert_params, experts_activation_bytes, experts_compute_s
from .spec import BF16, DecoderSpec

#: how context-parallel ranks exchange keys and values (Megatron-core's ``--cp-comm-type`` names)
CP_COMM = ("p2p", "allgather")

NO_LINK = (0.0, 0.0)


@dataclass(frozen=True)
class Cut:
    """How one GPU's share of a node is cut: TP ranks (sequence-parallel or not), CP ranks and
    their exchange, the routed experts' cut, and the layers' GEMM precision."""

    tp: int = 1
    sp: bool = False
    cp: int = 1
    cp_comm: str = "p2p"
    experts: ExpertCut = ExpertCut()
    fp8: bool = False  # the layers' GEMMs in FP8 (``costs.Rates``)
    fp8_params: bool = False  # FP8 weights kept as the weights (Megatron's --fp8-param-gather)


@dataclass(frozen=True)
class Links:
    """(bus bytes/s, latency) of the rank's TP, CP, EP and expert-TP groups."""

    tp: tuple[float, float] = NO_LINK
    cp: tuple[float, float] = NO_LINK
    ep: tuple[float, float] = NO_LINK
    etp: tuple[float, float] = NO_LINK


@dataclass(frozen=True)
class NodeParts:
    """One node on one rank for one microbatch, in seconds by what spends them (``explain``):
    the forward's and backward's compute, what recomputation runs again, the tensor-parallel
    collectives, the context-parallel exchange and the expert dispatch of each pass; and the
    bytes kept for the backward."""

    fwd: float
    fwd_tp: float
    bwd: float
    recompute: float
    bwd_tp: float
    kept: float
    fwd_cp: float = 0.0
    bwd_cp: float = 0.0
    fwd_ep: float = 0.0
    bwd_ep: float = 0.0

    @property
    def fwd_s(self) -> float:
        return self.fwd + self.fwd_tp + self.fwd_cp + self.fwd_ep

    @property
    def bwd_s(self) -> float:
        return self.bwd + self.recompute + self.bwd_tp + self.bwd_cp + self.bwd_ep


def local_spec(spec: DecoderSpec, cp: int) -> DecoderSpec:
    """The model as one of ``cp`` ranks sees a sequence: s / CP of it."""
    return spec if cp == 1 else replace(spec, seq=spec.seq // cp)


def cp_exchange_s(spec: DecoderSpec, samples: int, cut: Cut, link: tuple[float, float],
                  core_s: float) -> tuple[float, float]:
    """(forward, backward) exposed seconds of the key/value exchange of one layer (module
    docstring); ``core_s``: the rank's attention core forward, all CP blocks."""
    if cut.cp == 1:
        return 0.0, 0.0
    qk, v = spec.head_widths
    width = 2 * spec.kv_rank(cut.tp) if spec.standard_heads else spec.heads * (qk + v) / cut.tp
    block = BF16 * samples * spec.seq / cut.cp * width
    if cut.cp_comm == "allgather":
        gather = collective_s("all_gather", block * cut.cp, cut.cp, *link)
        return gather, gather + collective_s("reduce_scatter", block * cut.cp, cut.cp, *link)
    step = core_s / cut.cp
    return (ring_exchange_s(block, cut.cp, *link, step), ring_exchange_s(2 * block, cut.cp, *link, 2 * step))


def cp_merge_s(spec: DecoderSpec, samples: int, cut: Cut, hbm: float) -> float:
    """Forward seconds of merging a ring's partial attentions (module docstring)."""
    if cut.cp == 1 or cut.cp_comm != "p2p":
        return 0.0
    _, v = spec.head_widths
    rows = samples * spec.seq / cut.cp * spec.heads / cut.tp
    return (cut.cp - 1) * 2 * 4 * rows * (v + 1) / hbm


def layer_parts(spec: DecoderSpec, kind, samples: int, cut: Cut, mode: str, links: Links,
                moe: bool) -> NodeParts:
    """One rank's parts of a layer (module docstring)."""
    run, local = 1.0 / costs.END_TO_END, local_spec(spec, cut.cp)
    lc = layer_cost(local, kind, samples, cut.tp, cut.sp, mode, *links.tp, keys=spec.seq if cut.cp > 1 else 0,
                    moe=moe, fp8=cut.fp8)
    cp_f, cp_b = cp_exchange_s(spec, samples, cut, links.cp, lc.core_s)
    merge = cp_merge_s(spec, samples, cut, rates_of(kind).hbm)
    fwd, bwd, again, kept, ep_f = lc.fwd_s + merge, lc.bwd_s + 2 * merge, lc.recompute_s, lc.activation_bytes, 0.0
    if moe:
        n = copies(spec, samples, cut.tp, cut.cp, cut.experts)
        e_f, e_b = experts_compute_s(spec, rates_of(kind, cut.fp8), n, cut.experts)
        ep_f = dispatch_s(spec, n, cut.experts, links.ep, links.etp)
        fwd, bwd, again = fwd + e_f, bwd + e_b, again + (e_f if mode == "full" else 0.0)
        kept += experts_activation_bytes(spec, samples, cut.tp, cut.cp, cut.experts, mode, cut.fp8)
    again_comm = mode == "full"
    return NodeParts(fwd * run, lc.fwd_comm_s, bwd * run, again * run, lc.bwd_comm_s, kept,
                     cp_f, cp_b + (cp_f if again_comm else 0.0), ep_f, ep_f * (2 if again_comm else 1))


def node_parts(spec: DecoderSpec, role: str, kind, samples: int, cut: Cut, mode: str, links: Links,
               moe: bool = False) -> NodeParts:
    """One rank's parts of a node (``embed``, ``layer``, ``head``; ``moe``: a mixture's layer):
    compute as a training run spends it (over ``costs.END_TO_END``) and the collectives; the
    embedding's output and the head's input cross the TP group as Megatron's f and g operators
    do (an all-reduce, or a reduce-scatter / all-gather with sequence parallelism)."""
    if role == "layer":
        return layer_parts(spec, kind, samples, cut, mode, links, moe)
    rates, run, t, local = rates_of(kind), 1.0 / costs.END_TO_END, cut.tp, local_spec(spec, cut.cp)
    hidden = BF16 * samples * local.seq * spec.hidden
    reduce = comm_s((Collective("reduce_scatter" if cut.sp else "all_reduce", 1, hidden),), t, *links.tp)
    gather = comm_s((Collective("all_gather", 1, hidden),), t, *links.tp) if cut.sp else 0.0
    if role == "embed":
        f, b = embedding_compute_s(local, rates, samples)
        return NodeParts(f * run, reduce, b * run, 0.0, gather, 0.0)
    f, b = head_compute_s(local, rates, samples, t)
    kept = 4.0 * samples * local.seq * spec.vocab / t + hidden / (t if cut.sp else 1)  # fp32 logits, the input
    return NodeParts(f * run, gather, b * run, 0.0, reduce, kept)


def node_costs(spec: DecoderSpec, role: str, kind, samples: int, cut: Cut, mode: str, links: Links,
               moe: bool = False) -> tuple[float, float, float]:
    """(forward s, backward s, bytes kept) of one rank for one node (``node_parts``)."""
    p = node_parts(spec, role, kind, samples, cut, mode, links, moe)
    return p.fwd_s, p.bwd_s, p.kept


def fp8_weight_bytes(spec: DecoderSpec, moe: bool, cut: Cut) -> float:
    """Bytes a rank keeps beside a layer's 16-bit weights under FP8: Transformer Engine's FP8
    copy of each linear's weight and its transpose (1 + 1 bytes a parameter; the router, norms
    and biases aside); 0 in bf16, and 0 with FP8 parameters (``Cut.fp8_params``: the FP8 weight
    and its transpose stand in for the 16-bit weight, 2 bytes a parameter either way)."""
    if not cut.fp8 or cut.fp8_params:
        return 0.0
    kv = spec.kv_replicated_params(cut.tp) if spec.standard_heads else 0
    linear = sum(spec.attention_weights()) + kv + spec.mlp_matrices * spec.hidden * (spec.shared_ffn if moe else spec.ffn)
    return 2.0 * (linear / cut.tp + (rank_params(spec, True, cut)[1] if moe else 0.0))


def rank_params(spec: DecoderSpec, moe: bool, cut: Cut) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one layer a rank holds: the attention, norms and
    shared experts over TP (key/value heads replicated where TP outnumbers them), the router
    whole; the routed experts over EP x ETP (``experts.expert_params``)."""
    kv = spec.kv_replicated_params(cut.tp) if spec.standard_heads else 0
    if not moe:
        return (spec.layer_params() + kv) / cut.tp, 0.0
    shared = spec.attention_params() + spec.mlp_matrices * spec.hidden * spec.shared_ffn
    norms = spec.layer_params() - spec.attention_params() - spec.mlp_params(False)
    return (shared + norms + kv) / cut.tp + spec.hidden * spec.experts, expert_params(spec, cut.experts)
