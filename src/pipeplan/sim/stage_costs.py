"""Per-stage costs of a plan, from the graph (SPP §III-A notation)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..graph import Graph
from ..plan import Plan

#: Share of a backward pass that computes the input gradient (torch's I); the rest is the
#: weight gradient (W). Zero-bubble pipelines (Qi et al., ICLR'24) take the two about equal;
#: ``pipeplan profile`` measures it and the zoo estimates it into
#: ``graph.meta["backward_input_fraction"]``; without it (PipeDream profiles) this is assumed.
DEFAULT_INPUT_FRACTION = 0.5
#: graph meta key: per node, the (forward, backward) seconds of its time that are exchanges a
#: paired pass can hide (a mixture's dispatch and combine all-to-alls: DualPipe's overlapped
#: forward/backward pairs, ``Schedule.overlap_pairs``); nodes left out have none
PAIR_COMM = "pair_comm_s"


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
    """Whole-microbatch costs on the reference device, per stage s (SPP §III-A), with a
    leading candidate axis (one row: ``simulate``; many: the batched evaluator) or, from
    ``stage_costs``/``row``, without it: ``fwd[s]``, ``bwd[s]`` (s) and their fixed per-call
    parts, ``params[s]`` (bytes), ``outputs[s]`` (bytes of the stage's own activations kept
    for backward), ``received[s]`` (bytes of the activations it received), ``held[s]`` (bytes
    of the outputs it sends that it keeps until their backward beyond ``outputs``),
    ``workspace[s]`` (the largest gradient pair of one of its backward steps, docs/memory.md);
    per cut s|s+1: ``boundary[s]`` (bytes crossing it) and ``crossing[s]`` (some edge crosses
    it, so the two stages must talk even if the bytes are 0); ``recompute[s]``: the stage
    re-materializes (Huang et al. 2019, §2.3); ``valid``: every stage has a node and no edge
    goes back to an earlier stage; ``fwd_comm[s]``, ``bwd_comm[s]``: of ``fwd``, ``bwd`` the
    exchanges a paired pass can hide (``PAIR_COMM``)."""

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
    valid: np.ndarray
    fwd_comm: np.ndarray
    bwd_comm: np.ndarray

    @property
    def stash(self) -> np.ndarray:
        """Bytes kept per microbatch in flight without recomputation."""
        return self.outputs + self.received + self.held

    @property
    def kept_recomputing(self) -> np.ndarray:
        """Bytes kept per microbatch in flight by a re-materializing stage."""
        return self.received + self.held

    @property
    def kept(self) -> np.ndarray:
        """Bytes kept per microbatch in flight, as each stage recomputes or not."""
        return np.where(self.recompute, self.kept_recomputing, self.stash)

    def take(self, idx) -> "StageCosts":
        """The candidates ``idx`` (an index array keeps the axis, an int drops it)."""
        return StageCosts(**{f.name: getattr(self, f.name) if f.name in ("input_fraction", "split_cost")
                             else getattr(self, f.name)[idx] for f in fields(self)})


def _per_stage(owner: np.ndarray, weights: np.ndarray, s_count: int) -> np.ndarray:
    """Row-wise bincount: sum of ``weights[u]`` over the nodes of each stage."""
    count = owner.shape[0]
    if count == 1:  # a plan's own costs (simulate): the same sums without the tiling
        return np.bincount(owner[0], weights=weights, minlength=s_count)[None]
    idx = (owner + s_count * np.arange(count)[:, None]).ravel()
    return np.bincount(idx, weights=np.tile(weights, count), minlength=count * s_count).reshape(count, s_count)


def _stage_max(owner: np.ndarray, weights: np.ndarray, s_count: int) -> np.ndarray:
    """Row-wise maximum of ``weights[u]`` over the nodes of each stage (0 for an empty one)."""
    count = owner.shape[0]
    out = np.zeros(count * s_count)
    np.maximum.at(out, (owner + s_count * np.arange(count)[:, None]).ravel(), np.tile(weights, count))
    return out.reshape(count, s_count)


def _fixed(g: Graph, key: str = "fixed_s") -> np.ndarray:
    """Each node's fixed per-call (forward, backward) time (``graph.meta["fixed_s"]``), or
    another per-node pair of the graph's meta (``PAIR_COMM``)."""
    fixed = np.zeros((2, len(g)))
    for nid, pair in (g.meta.get(key) or {}).items():
        i = g.index.get(nid)
        if i is not None:
            fixed[:, i] = pair
    return fixed


def _cuts(g: Graph, own: np.ndarray, s_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate: bytes crossing each cut, whether any edge crosses it, which nodes'
    outputs leave their stage, and whether no edge goes back. An output of a node in stage a
    consumed up to stage b crosses cuts a|a+1 ... b-1|b (relayed stage by stage)."""
    count = own.shape[0]
    last, forward = own.copy(), np.ones(count, dtype=bool)
    if g.edges:
        e = np.asarray(g.edges, dtype=np.int64)
        np.maximum.at(last, (np.arange(count)[:, None], e[None, :, 0]), own[:, e[:, 1]])
        forward = (own[:, e[:, 0]] <= own[:, e[:, 1]]).all(axis=1)
    cross = last > own
    width = s_count + 1
    base = width * np.arange(count)[:, None]
    act = np.broadcast_to(g.act, own.shape)
    diff = np.bincount((own + base)[cross], weights=act[cross], minlength=count * width) \
        - np.bincount((last + base)[cross], weights=act[cross], minlength=count * width)
    edge_diff = np.bincount((own + base)[cross], minlength=count * width) \
        - np.bincount((last + base)[cross], minlength=count * width)
    boundary = np.cumsum(diff.reshape(count, width), axis=1)[:, : s_count - 1]
    crossing = np.cumsum(edge_diff.reshape(count, width), axis=1)[:, : s_count - 1] > 0
    return boundary, crossing, cross, forward


def batch_costs(g: Graph, owner: np.ndarray, s_count: int, recompute: np.ndarray) -> StageCosts:
    """Stage costs of candidates ``owner[b, u]`` (the stage of node u), with a leading axis."""
    count = owner.shape[0]
    valid = ((owner >= 0) & (owner < s_count)).all(axis=1)
    own = np.clip(owner, 0, s_count - 1)
    boundary, crossing, cross, forward = _cuts(g, own, s_count)
    valid &= forward & (_per_stage(own, np.ones(len(g)), s_count) > 0).all(axis=1)
    fixed, comm = _fixed(g), _fixed(g, PAIR_COMM)
    held = np.bincount((own + s_count * np.arange(count)[:, None])[cross], weights=np.broadcast_to(
        g.sent_held, own.shape)[cross], minlength=count * s_count).reshape(count, s_count)
    per = lambda w: _per_stage(own, w, s_count)  # noqa: E731
    return StageCosts(per(g.fwd), per(g.bwd), per(fixed[0]), per(fixed[1]), per(g.params), per(g.saved),
                      np.concatenate([np.zeros((count, 1)), boundary], axis=1), held,
                      _stage_max(own, g.grad_pair, s_count), boundary, crossing, recompute.astype(bool),
                      float(g.meta.get("backward_input_fraction", DEFAULT_INPUT_FRACTION)), split_cost(g.meta),
                      valid, per(comm[0]), per(comm[1]))


def plan_costs(plan: Plan) -> StageCosts:
    """The plan's stage costs as a batch of one."""
    rec = np.array([[plan.recomputes(s) for s in range(plan.num_stages)]], dtype=bool)
    return batch_costs(plan.graph, plan.stage_of_node()[None], plan.num_stages, rec)


def stage_costs(plan: Plan) -> StageCosts:
    """The plan's stage costs, one value per stage (no candidate axis)."""
    return plan_costs(plan).take(0)
