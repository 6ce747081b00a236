"""Peak memory of each device under a schedule (docs/design.md, "Memory model").

Per device: the state of the stages it holds (weights, gradients, optimizer state), plus,
walking its program, the activations it keeps for backward: for each microbatch in flight
(forward done, backward not yet), its share of the stage's kept activations and of the
activations it received. A share is the device's part of the microbatch's samples, in
proportion to its speed among the replicas running it. A re-materializing stage (Huang et
al. 2019, §2.3) keeps only what it received and sent, and during each backward holds one
microbatch's activations again. Every backward step also holds its gradient pair (the
gradients w.r.t. a layer's output and input, ``StageCosts.workspace``). A split backward
frees at W. An asynchronous steady state (PipeDream's
weight stashing, §3.3) keeps one weight version per microbatch in flight beyond the first.

The walk is linear in the bytes: a group's actions fall in a few *keys* (stage and the
groups sharing the microbatch), so the level after each action is the keys' bytes per unit
of speed times a count that depends on the program alone (``GroupWalk``), for every
candidate at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formulas import state_bytes
from ..schedule import Kind
from .compile import TaskGraph, mat
from .stage_costs import StageCosts
from .durations import Layout, class_shares


@dataclass(frozen=True)
class GroupWalk:
    """One group's program as counts: key k is (stage ``stage[k]``, sharers of compute class
    ``cls[k]``); the activation level before or after each action, over a candidate's
    per-key bytes ``x = [kept, at_backward]`` (per unit of speed), is ``x @ counts[:, a]``
    (backward actions only for the latter); ``in_flight``: the most microbatches in flight."""

    cls: np.ndarray
    stage: np.ndarray
    counts: np.ndarray
    in_flight: int


def _walk(tg: TaskGraph, ids: np.ndarray, kinds: np.ndarray) -> GroupWalk:
    cls = tg.cls[ids]
    _, first, key = np.unique(tg.stage[ids] * (tg.sharer_set.max(initial=0) + 2) + tg.sharer_set[cls] + 1,
                              return_index=True, return_inverse=True)
    sign = np.where(kinds == Kind.F, 1.0, np.where((kinds == Kind.B) | (kinds == Kind.W), -1.0, 0.0))
    one = np.zeros((first.size, ids.size))
    one[key, np.arange(ids.size)] = 1.0
    level = np.cumsum(one * sign, axis=1)
    back = (kinds == Kind.B) | (kinds == Kind.I)
    counts = np.concatenate([np.concatenate([level, (level - one * sign)[:, back]], axis=1),
                             np.concatenate([np.zeros_like(one), one[:, back]], axis=1)])
    return GroupWalk(cls[first], tg.stage[ids[first]], counts,
                     int(np.cumsum(sign).max(initial=0)))


def walks(tg: TaskGraph) -> list[GroupWalk]:
    """Each group's ``GroupWalk`` (depends on the task graph only)."""
    out = []
    for g in tg.groups:
        comp = g.program.kinds != Kind.AR
        out.append(_walk(tg, g.ids[comp], g.program.kinds[comp]))
    return out


def device_memory(tg: TaskGraph, walk: list[GroupWalk], lay: Layout, c: StageCosts, optimizer: str,
                  fs: np.ndarray, steady: bool, precision: str = "fp32", shards=1,
                  extra: list[float] | None = None) -> np.ndarray:
    """(candidates, devices): peak bytes, 0 for a device that runs no program; ``shards``:
    ZeRO-1's, one count or one a stage; ``extra``: bytes each stage holds beside its state
    and activations (FP8 weight copies, ``sim.tensor_groups``)."""
    share = class_shares(tg, lay, fs)
    params = mat(c.params, tg.group_stages.T)  # (candidates, groups)
    if np.ndim(shards):  # a stage's state at its own shards, summed over a group's stages
        state = mat(state_bytes(c.params, optimizer, precision, np.asarray(shards, dtype=float)), tg.group_stages.T)
    else:
        state = state_bytes(params, optimizer, precision, shards)
    if extra is not None:
        state = state + mat(np.broadcast_to(np.asarray(extra, dtype=float), c.params.shape), tg.group_stages.T)
    extra = np.where(c.recompute, c.outputs, 0.0) + c.workspace
    mem = np.zeros(fs.shape)
    for gi, w in enumerate(walk):
        sh = share[:, w.cls]
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(sh > 0, 1.0 / sh, 0.0)
        x = np.concatenate([c.kept[:, w.stage] * per, extra[:, w.stage] * per], axis=1)
        peak = mat(x, w.counts).max(axis=1, initial=0.0)
        fixed = state[:, gi] + (max(w.in_flight - 1, 0) * params[:, gi] if steady else 0.0)
        mem += lay.groups[:, gi] * (fixed[:, None] + fs * peak[:, None])
    return mem
