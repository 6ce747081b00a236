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
"""

from __future__ import annotations

import numpy as np

from ..costmodel import state_bytes
from ..schedule import Kind
from .compile import Group
from .costs import StageCosts


def _activation_peak(g: Group, costs: StageCosts, share_f: np.ndarray) -> tuple[float, int]:
    """Peak activation bytes of the group per unit of a device's forward speed (a device's
    share of a microbatch is its speed over the summed speed running it), and the most
    microbatches in flight."""
    p = g.program
    comp = p.kinds != Kind.AR
    k, s, m = p.kinds[comp], p.stages[comp], p.micro[comp]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(share_f[s, m] > 0, 1.0 / share_f[s, m], 0.0)
    keep = np.where(costs.recompute[s], costs.kept_recomputing[s], costs.stash[s]) * frac
    frees = (k == Kind.B) | (k == Kind.W)
    delta = np.where(k == Kind.F, keep, np.where(frees, -keep, 0.0))
    level = np.cumsum(delta)
    before = level - delta  # level just before each action
    back = (k == Kind.B) | (k == Kind.I)
    extra = back * (costs.recompute[s] * costs.outputs[s] + costs.workspace[s]) * frac
    peak = float(max(level.max(initial=0.0), (before + extra).max(initial=0.0)))
    count = np.cumsum(np.where(k == Kind.F, 1, np.where(frees, -1, 0)))
    return peak, int(count.max(initial=0))


def device_memory(groups: list[Group], costs: StageCosts, optimizer: str, fspeed: np.ndarray,
                  share_f: np.ndarray, steady: bool) -> dict[int, float]:
    """Peak bytes of every device that runs a program."""
    out: dict[int, float] = {}
    for g in groups:
        stages = np.unique(g.program.stages)
        state = sum(state_bytes(float(costs.params[s]), optimizer) for s in stages.tolist())
        act, in_flight = _activation_peak(g, costs, share_f)
        stash = max(in_flight - 1, 0) * float(costs.params[stages].sum()) if steady else 0.0
        for d in g.devices:
            out[d] = state + float(fspeed[d]) * act + stash
    return out
