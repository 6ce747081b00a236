"""Per-stage costs of a plan, from the graph (SPP §III-A notation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Plan

#: Share of a backward pass that computes the input gradient (torch's I); the rest is the
#: weight gradient (W). Zero-bubble pipelines (Qi et al., ICLR'24) take the two about equal;
#: ``pipeplan profile`` measures it and the zoo estimates it into
#: ``graph.meta["backward_input_fraction"]``; without it (PipeDream profiles) this is assumed.
DEFAULT_INPUT_FRACTION = 0.5


def split_cost(meta: dict) -> float:
    """What a backward split into I and W costs over the same backward in one pass
    (``graph.meta["backward_split_cost"]``, measured by ``pipeplan profile``: torch's input
    pass walks the autograd graph once more); 1 where not measured (the zoo, PipeDream
    profiles: I + W = B). Never below 1: I and W compute what B does, so a measured factor
    under 1 is timing noise, not a saving."""
    return max(1.0, float(meta.get("backward_split_cost", 1.0)))


def assumed_input_fraction(meta: dict) -> float | None:
    """The input-gradient share the simulator assumes for a graph that states none (a
    PipeDream profile, a hand-written graph); None when the graph measures or estimates it."""
    return None if "backward_input_fraction" in meta else DEFAULT_INPUT_FRACTION


@dataclass(frozen=True)
class StageCosts:
    """Whole-microbatch costs on the reference device, per stage s:
    ``fwd[s]``, ``bwd[s]`` (s) and their fixed per-call parts, ``params[s]`` (bytes),
    ``outputs[s]`` (bytes of the stage's own activations kept for backward), ``received[s]``
    (bytes of the activations it received), ``held[s]`` (bytes of the outputs it sends that
    it keeps until their backward beyond ``outputs``), ``workspace[s]`` (the largest gradient
    pair of one of its backward steps, docs/memory.md); per cut s|s+1: ``boundary[s]`` (bytes
    crossing it) and ``crossing[s]`` (some edge crosses it, so the two stages must talk even
    if the bytes are 0); ``recompute[s]``: the stage re-materializes (Huang et al. 2019, §2.3)."""

    fwd: np.ndarray
    bwd: np.ndarray
    fwd_fixed: np.ndarray
    bwd_fixed: np.ndarray
    params: np.ndarray
    outputs: np.ndarray
    received: np.ndarray
    held: np.ndarray
    workspace: np.ndarray
    boundary: np.ndarray
    crossing: np.ndarray
    recompute: np.ndarray
    input_fraction: float
    split_cost: float

    @property
    def stash(self) -> np.ndarray:
        """Bytes kept per microbatch in flight without recomputation."""
        return self.outputs + self.received + self.held

    @property
    def kept_recomputing(self) -> np.ndarray:
        """Bytes kept per microbatch in flight by a re-materializing stage."""
        return self.received + self.held


def _cuts(owner: np.ndarray, edges: list, act: np.ndarray,
          s_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes crossing each cut, whether any edge crosses it, and which nodes' outputs leave
    their stage: an output of a node in stage a consumed up to stage b crosses cuts
    a|a+1 ... b-1|b (relayed stage by stage)."""
    last = owner.copy()
    if edges:
        e = np.asarray(edges, dtype=np.int64)
        np.maximum.at(last, e[:, 0], owner[e[:, 1]])
    diff = np.zeros(s_count + 1)
    edge_diff = np.zeros(s_count + 1)
    cross = last > owner
    np.add.at(diff, owner[cross], act[cross])
    np.add.at(diff, last[cross], -act[cross])
    np.add.at(edge_diff, owner[cross], 1)
    np.add.at(edge_diff, last[cross], -1)
    return np.cumsum(diff)[: s_count - 1], np.cumsum(edge_diff)[: s_count - 1] > 0, cross


def stage_costs(plan: Plan) -> StageCosts:
    g = plan.graph
    s_count = plan.num_stages
    owner = plan.stage_of_node()
    per = lambda w: np.bincount(owner, weights=w, minlength=s_count)  # noqa: E731
    boundary, crossing, leaves = _cuts(owner, g.edges, g.act, s_count)
    fixed = np.zeros((2, len(g)))
    for nid, pair in (g.meta.get("fixed_s") or {}).items():
        i = g.index.get(nid)
        if i is not None:
            fixed[:, i] = pair
    kept = g.saved  # what autograd keeps per node (docs/memory.md); in-place nodes keep none of their own
    recompute = np.array([plan.recomputes(s) for s in range(s_count)], dtype=bool)
    workspace = np.zeros(s_count)
    np.maximum.at(workspace, owner, g.grad_pair)
    return StageCosts(per(g.fwd), per(g.bwd), per(fixed[0]), per(fixed[1]), per(g.params), per(kept),
                      np.concatenate(([0.0], boundary)), per(np.where(leaves, g.sent_held, 0.0)), workspace,
                      boundary, crossing, recompute,
                      float(g.meta.get("backward_input_fraction", DEFAULT_INPUT_FRACTION)), split_cost(g.meta))
