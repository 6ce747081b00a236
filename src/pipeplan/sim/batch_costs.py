"""Stage costs of many candidates at once (``costs.stage_costs`` over a batch, numpy)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..graph import Graph
from .costs import DEFAULT_INPUT_FRACTION, StageCosts, split_cost


@dataclass(frozen=True)
class BatchCosts(StageCosts):
    """``StageCosts`` with a leading candidate axis; ``valid[b]``: every stage has a node
    and no edge goes back to an earlier stage."""

    valid: np.ndarray

    def take(self, idx: np.ndarray) -> "BatchCosts":
        return BatchCosts(**{f.name: getattr(self, f.name) if f.name in ("input_fraction", "split_cost") else getattr(self, f.name)[idx]
                             for f in fields(self)})


def _per_stage(owner: np.ndarray, weights: np.ndarray, s_count: int) -> np.ndarray:
    """Row-wise bincount: sum of ``weights[u]`` over the nodes of each stage."""
    count = owner.shape[0]
    idx = (owner + s_count * np.arange(count)[:, None]).ravel()
    return np.bincount(idx, weights=np.tile(weights, count), minlength=count * s_count).reshape(count, s_count)


def _stage_max(owner: np.ndarray, weights: np.ndarray, s_count: int) -> np.ndarray:
    """Row-wise maximum of ``weights[u]`` over the nodes of each stage (0 for an empty one)."""
    count = owner.shape[0]
    out = np.zeros(count * s_count)
    np.maximum.at(out, (owner + s_count * np.arange(count)[:, None]).ravel(), np.tile(weights, count))
    return out.reshape(count, s_count)


def _fixed(g: Graph) -> np.ndarray:
    fixed = np.zeros((2, len(g)))
    for nid, pair in (g.meta.get("fixed_s") or {}).items():
        i = g.index.get(nid)
        if i is not None:
            fixed[:, i] = pair
    return fixed


def batch_costs(g: Graph, owner: np.ndarray, s_count: int, recompute: np.ndarray) -> BatchCosts:
    count = owner.shape[0]
    valid = ((owner >= 0) & (owner < s_count)).all(axis=1)
    own = np.clip(owner, 0, s_count - 1)
    last = own.copy()
    if g.edges:
        e = np.asarray(g.edges, dtype=np.int64)
        rows = np.arange(count)[:, None]
        np.maximum.at(last, (rows, e[None, :, 0]), own[:, e[:, 1]])
        valid &= (own[:, e[:, 0]] <= own[:, e[:, 1]]).all(axis=1)
    valid &= (_per_stage(own, np.ones(len(g)), s_count) > 0).all(axis=1)
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
    fixed = _fixed(g)
    held = np.bincount((own + s_count * np.arange(count)[:, None])[cross], weights=np.broadcast_to(
        g.sent_held, own.shape)[cross], minlength=count * s_count).reshape(count, s_count)
    return BatchCosts(_per_stage(own, g.fwd, s_count), _per_stage(own, g.bwd, s_count),
                      _per_stage(own, fixed[0], s_count), _per_stage(own, fixed[1], s_count),
                      _per_stage(own, g.params, s_count), _per_stage(own, g.saved, s_count),
                      np.concatenate([np.zeros((count, 1)), boundary], axis=1), held,
                      _stage_max(own, g.grad_pair, s_count), boundary, crossing, recompute.astype(bool),
                      float(g.meta.get("backward_input_fraction", DEFAULT_INPUT_FRACTION)), split_cost(g.meta), valid)


def structure_keys(costs: BatchCosts, device_stage: np.ndarray, s_count: int,
                   replicas: str) -> tuple[np.ndarray, np.ndarray]:
    """Candidates with equal keys compile to the same task graph (up to durations): the
    same replicas per stage (split replicas: only whether a stage has more than one, which
    adds its all-reduce) and the same cuts crossed by edges. Returns (each candidate's key
    index, the distinct key rows)."""
    reps = np.stack([(device_stage == s).sum(axis=1) for s in range(s_count)], axis=1)
    shape = (reps > 1).astype(np.int64) if replicas == "split" else reps
    rows = np.concatenate([shape, costs.crossing.astype(np.int64)], axis=1)
    distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
    return inverse.ravel(), distinct
