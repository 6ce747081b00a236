"""Measure how each layer's backward splits into the input gradient (I) and the weight
gradient (W), as zero-bubble schedules run them (Qi et al., ICLR'24 §2: B = I, W = W).

Each layer runs alone on the input it received in one forward of the whole model (captured
by a pre-hook, detached): forward, then I with ``stage_backward_input`` (``torch.autograd.grad``
w.r.t. the layer's inputs, keeping the intermediate gradients that W needs), then W with
``stage_backward_weight`` (``torch.autograd.grad`` w.r.t. its parameters from those
intermediates) — the two calls torch's pipelining runtime makes for I and W. A layer whose
inputs need no gradient (the model's first: its input is data) has I = 0 and W = its whole
backward, as torch runs a first stage; a layer without parameters has W = 0. B, the layer's
backward in one pass, is timed the same way for comparison (the split costs more:
``split_cost``). Times are medians over the repetitions.
"""

from __future__ import annotations

import statistics
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from .clock import Clock, tensors
from .trace import Calls, calls_by_module


def _inputs_of(model: nn.Module, mods: dict[str, nn.Module], x: torch.Tensor) -> dict[str, tuple]:
    """(args, kwargs) each layer (each module call) was given in one forward, detached."""
    seen: dict[str, tuple] = {}

    def pre(calls: Calls, _m: nn.Module, args: tuple, kwargs: dict) -> None:
        nid = calls.start()
        if nid not in seen:
            detach = lambda v: v.detach() if isinstance(v, torch.Tensor) else v  # noqa: E731
            seen[nid] = (tuple(detach(a) for a in args), {k: detach(v) for k, v in kwargs.items()})

    handles = [m.register_forward_pre_hook(partial(pre, Calls(nids)), with_kwargs=True)
               for m, nids in calls_by_module(mods)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def _one(m: nn.Module, args: tuple, kwargs: dict, data: set[int], clock: Clock,
         split: bool = True) -> tuple[float, float]:
    """(I, W) seconds of one forward+backward of layer ``m`` (``split=False``: (0, the whole
    backward in one pass)); inputs whose storage is the model's input (``data``) take no gradient."""
    def leaf(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        grad = v.is_floating_point() and v.untyped_storage().data_ptr() not in data
        return v.clone().requires_grad_(grad)

    args, kwargs = tuple(leaf(a) for a in args), {k: leaf(v) for k, v in kwargs.items()}
    # torch's I detaches the outputs in place, which a view (Flatten's) refuses: copy those
    outs = [t.clone() if t._is_view() else t for t in tensors(m(*args, **kwargs)) if t.requires_grad]
    if not outs:
        return 0.0, 0.0
    grads = [torch.randn_like(t) for t in outs]
    weights = [p for p in m.parameters() if p.requires_grad]
    inputs = [v for v in tensors((args, kwargs)) if v.requires_grad]
    clock.sync()
    t0 = clock.mark()
    if not inputs or not split:  # nothing upstream waits: the whole backward is W
        torch.autograd.backward(outs, grads)
        t1, t2 = t0, clock.mark()
    elif not weights:  # no parameters: the whole backward is I
        torch.autograd.backward(outs, grads, inputs=inputs)
        t1 = t2 = clock.mark()
    else:
        _, groups = stage_backward_input(outs, grads, inputs, iter(weights))
        t1 = clock.mark()
        stage_backward_weight(iter(weights), groups)
        t2 = clock.mark()
    clock.sync()
    m.zero_grad(set_to_none=True)
    return clock.between(t0, t1), clock.between(t1, t2)


def measure_split(model: nn.Module, mods: dict[str, nn.Module], x: torch.Tensor, clock: Clock, warmup: int,
                  reps: int) -> dict[str, list[float]]:
    """Per layer, its median [I, W, B] seconds: B its whole backward in one pass, measured
    the same way (module docstring)."""
    calls = _inputs_of(model, mods, x)
    data = {t.untyped_storage().data_ptr() for t in tensors(x)}
    times: dict[str, list[tuple[float, float, float]]] = {nid: [] for nid in calls}
    for r in range(warmup + reps):
        for nid, (args, kwargs) in calls.items():
            i, w = _one(mods[nid], args, kwargs, data, clock)
            b = _one(mods[nid], args, kwargs, data, clock, split=False)[1]
            if r >= warmup:
                times[nid].append((i, w, b))
    model.zero_grad(set_to_none=True)
    return {nid: [statistics.median(t[k] for t in ts) for k in range(3)] for nid, ts in times.items() if ts}


def input_fraction(split: dict[str, list[float]], bwd: dict[str, float], extra_input_s: float = 0.0) -> float:
    """The model's input-gradient share of its backward: each layer's measured I share
    weighted by its backward time in the profile (``bwd``), plus ``extra_input_s`` of input
    gradient outside the layers (the loss)."""
    num, den = extra_input_s, extra_input_s
    for nid, b in bwd.items():
        i, w = split.get(nid, (0.0, 0.0))[:2]
        num += b * (i / (i + w) if i + w > 0 else 0.5)
        den += b
    return num / den if den > 0 else 0.5


def split_cost(split: dict[str, list[float]]) -> float:
    """Summed over the layers, I + W over the same layers' backward in one pass: what
    splitting costs beyond it (torch's input pass walks the autograd graph); the simulator
    charges it to every I and W (``sim.stage_costs.split_cost``)."""
    whole = sum(v[2] for v in split.values())
    return sum(v[0] + v[1] for v in split.values()) / whole if whole > 0 else 1.0
