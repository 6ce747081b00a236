"""A mixture-of-experts layer's routed experts on one GPU, for one microbatch (docs/llm.md,
"Expert parallelism"), as Megatron-core's MoE layer runs them with its all-to-all token
dispatcher (``--moe-token-dispatcher-type alltoall``, ``--moe-grouped-gemm``).

- Tokens: a rank holds b x s / (CP x TP) of the microbatch's tokens (sequence-parallel under
  TP, which Megatron-core requires of MoE training); each goes to ``top_k`` experts, so the
  rank sends ``top_k`` copies a token and, routing balanced, its experts receive as many; the
  busiest rank ``skew`` x that (1: balanced routing, as auxiliary-loss or DeepSeek-V3's bias
  balancing aims at; a measured ratio of the busiest rank's tokens to the mean otherwise).
- Compute: the rank's E / EP experts, each matrix one grouped GEMM; every expert's share of
  the copies at the kind's GEMM rate, or its weights read from HBM where that takes longer
  (small expert GEMMs are bound by their weights: a roofline), backward twice the forward;
  the activation function's bytes as the dense MLP's (``costs.elementwise_bytes``), and the
  permutation before the experts and the weighted un-permutation after them each reading and
  writing every copy.
- Dispatch and combine: one all-to-all each of the rank's copies (hidden wide, 16-bit) over the
  EP group, forward and backward (four a layer, exposed: Megatron-core does not overlap them
  without its 1F1B A2A overlap or DualPipe); with expert tensor parallelism (ETP > 1) the ETP
  group all-gathers the dispatched copies and reduce-scatters the experts' outputs, each way.
  ``alltoall`` (Megatron-core's all-to-all dispatcher) sends every copy to its expert's rank,
  so (S - 1) / S of them leave the server, S the servers the EP group spans; ``deepep``
  (DeepEP, Megatron-core's flex dispatcher; DeepSeek-V3 §3.2.2) sends a token once to each
  other server its experts are on and forwards it over NVLink there (the combine the same way
  back), so only the servers a token reaches cross the network: with group-limited routing
  whose groups lie within servers (route_groups a multiple of S), the servers holding the
  route_group_topk groups it chooses, taken uniformly; otherwise the distinct servers of
  top_k experts drawn uniformly (with replacement), S (1 - (1 - 1/S)^k).
- Kept for backward, per copy: the experts' input (hidden wide, whole on each ETP rank), the
  first matrices' outputs and the activation's output (gated: 3 x the expert width / ETP,
  else 2 x); the router's fp32 scores, experts wide, per token. Full recomputation keeps none.
  Under FP8 the two matrices' inputs (the experts' input, the activation's output) are kept as
  their FP8 copies, a byte an element.
- Weights of a rank: (E / EP) x m x h x f_e / ETP, m the MLP's matrices.
- FP8 (``Rates.fp8_peak``): the grouped GEMMs at the FP8 peak; each microbatch casts the
  weights (read 16 bits, write 8) before reading them, the copies going in forward and the
  output gradients backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from .spec import BF16, DecoderSpec


#: how tokens reach their experts (module docstring)
DISPATCHERS = ("alltoall", "deepep")


@dataclass(frozen=True)
class ExpertCut:
    """How a rank's share of the routed experts is cut: EP ranks, ETP ranks, routing skew, and
    how tokens are dispatched (``DISPATCHERS``)."""

    ep: int = 1
    etp: int = 1
    skew: float = 1.0
    dispatcher: str = "alltoall"


def servers_reached(spec: DecoderSpec, servers: int) -> float:
    """Servers a token's ``top_k`` copies reach, on average, the EP group spanning ``servers``
    (module docstring)."""
    g, m = spec.route_groups, spec.route_group_topk
    if g and g % servers == 0:  # whole groups in each server: the chosen groups' servers
        per = g // servers  # groups a server holds; P(a server holds none of the m chosen)
        return servers * (1.0 - comb(g - per, m) / comb(g, m))
    return servers * (1.0 - (1.0 - 1.0 / servers) ** spec.top_k)


def remote_share(spec: DecoderSpec, cut: ExpertCut, servers: int) -> float | None:
    """The share of a rank's dispatched copies that crosses its server's network adapters
    (``collectives.exchange_links``), or None for the all-to-all's own (module docstring)."""
    if cut.dispatcher == "alltoall" or servers < 2:
        return None
    return servers_reached(spec, servers) * (servers - 1) / servers / spec.top_k


def rank_tokens(spec: DecoderSpec, samples: int, tp: int, cp: int) -> float:
    """Tokens a rank routes: b x s / (CP x TP) (sequence-parallel under TP)."""
    return samples * spec.seq / (cp * tp)


def copies(spec: DecoderSpec, samples: int, tp: int, cp: int, cut: ExpertCut) -> float:
    """Token copies the busiest rank's experts process (module docstring)."""
    return rank_tokens(spec, samples, tp, cp) * spec.top_k * cut.skew


def experts_compute_s(spec: DecoderSpec, rates, n_copies: float, cut: ExpertCut) -> tuple[float, float]:
    """(forward, backward) seconds of a rank's experts on ``n_copies`` copies (module
    docstring); ``rates``: ``costs.Rates``."""
    m, h, f = spec.mlp_matrices, spec.hidden, spec.expert_ffn / cut.etp
    local = spec.experts // cut.ep
    per_expert = n_copies * cut.etp / local  # copies an expert's ETP ranks take, all of them gathered
    gemm = 2.0 * per_expert * m * h * f / ((rates.fp8_peak or rates.peak) * rates.gemm_efficiency)
    weights = (BF16 + (2 if rates.fp8_peak else 0)) * m * h * f / rates.hbm  # FP8: cast (3 bytes), read (1)
    launch = m * rates.gemm_overhead_s  # one grouped GEMM a matrix
    act_f = (3 if spec.gated else 2) * BF16 * f * per_expert * local
    act_b = (5 if spec.gated else 3) * BF16 * f * per_expert * local
    permute = 2 * 2 * BF16 * h * n_copies  # permute and un-permute: read and write each copy
    casts = (3 * per_expert * local * (h + f), 3 * per_expert * local * ((m - 1) * f + h)) if rates.fp8_peak \
        else (0.0, 0.0)  # FP8: the inputs forward, the output gradients backward (costs.CAST_BYTES)
    fwd = local * max(gemm, weights) + launch + (act_f + permute + casts[0]) / rates.hbm
    bwd = local * max(2 * gemm, 2 * weights) + 2 * launch + (act_b + permute + casts[1]) / rates.hbm
    return fwd, bwd


def dispatch_bytes(spec: DecoderSpec, n_copies: float) -> float:
    """Bytes one all-to-all of a rank's copies moves from it (its whole array)."""
    return BF16 * spec.hidden * n_copies


def dispatch_s(spec: DecoderSpec, n_copies: float, cut: ExpertCut, ep_links: tuple[float, float],
               etp_links: tuple[float, float]) -> float:
    """Seconds of one pass's dispatch and combine (module docstring): two all-to-alls over EP,
    and with ETP an all-gather and a reduce-scatter of the dispatched copies."""
    from ..cluster.collectives import collective_s

    nbytes = dispatch_bytes(spec, n_copies)
    out = 2 * collective_s("all_to_all", nbytes, cut.ep, *ep_links)
    if cut.etp > 1:
        out += collective_s("all_gather", nbytes * cut.etp, cut.etp, *etp_links)
        out += collective_s("reduce_scatter", nbytes * cut.etp, cut.etp, *etp_links)
    return out


def experts_activation_bytes(spec: DecoderSpec, samples: int, tp: int, cp: int, cut: ExpertCut,
                             recompute: str, fp8: bool = False) -> float:
    """Bytes a rank keeps for its experts' and router's backward (module docstring); ``fp8``:
    the two matrices' inputs as their FP8 copies (``DecoderSpec.layer_activation_bytes``)."""
    if recompute == "full":
        return 0.0
    n = copies(spec, samples, tp, cp, cut)
    linear_in = 1 if fp8 else BF16
    per_copy = linear_in * (cut.etp * spec.hidden + spec.expert_ffn) + BF16 * (2 if spec.gated else 1) * spec.expert_ffn
    return n * per_copy + 4.0 * rank_tokens(spec, samples, tp, cp) * spec.experts


def expert_params(spec: DecoderSpec, cut: ExpertCut) -> float:
    """A rank's routed-expert weights in one MoE layer (a count)."""
    return spec.experts / cut.ep * spec.mlp_matrices * spec.hidden * spec.expert_ffn / cut.etp
