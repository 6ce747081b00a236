"""Per-stage costs of a plan, from the graph (SPP §III-A notation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Plan


@dataclass(frozen=True)
class StageCosts:
    """Whole-microbatch costs on the reference device, per stage s:
    ``fwd[s]``, ``bwd[s]`` (s), ``params[s]`` (bytes), ``stash[s]`` (bytes kept per microbatch
    for the backward pass: the stage's layer outputs plus the activations it received);
    per cut s|s+1: ``boundary[s]`` (bytes crossing it) and ``crossing[s]`` (some edge
    crosses it, so the two stages must talk even if the bytes are 0)."""

    fwd: np.ndarray
    bwd: np.ndarray
    fwd_fixed: np.ndarray  # the part of fwd/bwd that a share of the microbatch still pays
    bwd_fixed: np.ndarray
    params: np.ndarray
    stash: np.ndarray
    boundary: np.ndarray
    crossing: np.ndarray


def stage_costs(plan: Plan) -> StageCosts:
    g = plan.graph
    s_count = plan.num_stages
    owner = plan.stage_of_node()
    fwd = np.bincount(owner, weights=g.fwd, minlength=s_count)
    bwd = np.bincount(owner, weights=g.bwd, minlength=s_count)
    params = np.bincount(owner, weights=g.params, minlength=s_count)
    outputs = np.bincount(owner, weights=g.act, minlength=s_count)
    # An output of a node in stage a consumed up to stage b crosses cuts a|a+1 ... b-1|b.
    last = owner.copy()
    if g.edges:
        e = np.asarray(g.edges, dtype=np.int64)
        np.maximum.at(last, e[:, 0], owner[e[:, 1]])
    diff = np.zeros(s_count + 1)
    edge_diff = np.zeros(s_count + 1)
    cross = last > owner
    np.add.at(diff, owner[cross], g.act[cross])
    np.add.at(diff, last[cross], -g.act[cross])
    np.add.at(edge_diff, owner[cross], 1)
    np.add.at(edge_diff, last[cross], -1)
    boundary = np.cumsum(diff)[: s_count - 1]
    crossing = np.cumsum(edge_diff)[: s_count - 1] > 0
    received = np.concatenate(([0.0], boundary))
    fixed = np.zeros((2, len(g)))
    for nid, pair in (g.meta.get("fixed_s") or {}).items():
        i = g.index.get(nid)
        if i is not None:
            fixed[:, i] = pair
    fwd_fixed = np.bincount(owner, weights=fixed[0], minlength=s_count)
    bwd_fixed = np.bincount(owner, weights=fixed[1], minlength=s_count)
    return StageCosts(fwd, bwd, fwd_fixed, bwd_fixed, params, outputs + received, boundary, crossing)
