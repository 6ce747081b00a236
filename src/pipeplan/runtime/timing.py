"""The measured timeline: when each forward and backward ran on each rank.

``Timed`` wraps a stage's module. Its forward is the F action (start and end around the
call). On pipeplan's own executor the backward is bracketed by two autograd marks: an
identity on the stage's outputs, whose backward runs when their gradients arrive (B starts),
and the latest of an identity on its inputs (their gradients computed) and the parameters'
gradient accumulation (what ends the first stage's backward, whose input needs no gradient).
On torch's pipelining runtime (``marks=False``) the stage's backward calls are timed around
instead (``pipelined.py``): B, or I then W for zero-bubble schedules (torch's first stage
does its whole backward at W). A rank runs its actions one after another, so the microbatch
of each call is the next of its kind in its program. Times are ``time.perf_counter()``, one
monotonic clock for every process of the machine; on a GPU they are CUDA events, placed on
that clock when the step ends (``clock.Clock``), so an action's span is when the GPU ran it,
not when the host queued it. pipeplan's own executor also records each
receive (``received``: the wait and the transfer) on its channel; torch's pipelining
communicates internally, so there a forward's wait for its input falls before its start. A
rank that holds several stages (model chunks) tags each action with its stage.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..schedule import Kind
from ..schedule.timeline import Timeline
from .clock import Clock


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, note, *xs):
        ctx.note = note
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.note()
        return (None, *grads)


class Timed(nn.Module):
    """A stage module that records its F and B actions (module docstring); ``w_micro`` the
    microbatches of its W actions, ``stage`` its stage when the rank holds several; ``clock``
    the rank's (CPU by default), ``autocast`` the precision its forward runs in."""

    def __init__(self, inner: nn.Module, f_micro: list[int], b_micro: list[int],
                 progress: Callable[[str], None] = lambda label: None, *, w_micro: list[int] | None = None,
                 marks: bool = True, stage: int | None = None, clone_views: bool = False, clock: Clock | None = None,
                 autocast: Callable[[], AbstractContextManager] = nullcontext) -> None:
        super().__init__()
        self.inner, self.f_micro, self.b_micro, self.progress = inner, f_micro, b_micro, progress
        self.w_micro, self.marks, self.stage, self.clone_views = w_micro or [], marks, stage, clone_views
        self.clock, self.autocast = clock or Clock(torch.device("cpu")), autocast
        self.events: list[tuple] = []  # (kind, microbatch, start, end[, channel, stage])
        self._f = self._b = self._w = 0
        self._open: list | None = None
        if marks:
            for p in inner.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda _p: self._touch())

    def new_step(self) -> None:
        self._close()
        self.events, self._f, self._b, self._w = [], 0, 0, 0

    def _touch(self) -> None:
        if self._open is not None:
            self._open[3] = self.clock.mark()

    def _begin_backward(self) -> None:
        self._close()
        now = self.clock.mark()
        self._open = [int(Kind.B), self.b_micro[self._b % len(self.b_micro)], now, now]
        self._b += 1
        self.progress(f"backward of microbatch {self._open[1]}")

    def _close(self) -> None:
        if self._open is not None:
            self._add(*self._open)
            self._open = None

    def _add(self, kind: int, m: int, start: float, end: float) -> None:
        self.events.append((kind, m, start, end) if self.stage is None else (kind, m, start, end, None, self.stage))

    def forward(self, *args: torch.Tensor):
        self._close()
        start = self.clock.mark()
        if self.marks and any(a.requires_grad for a in args):
            args = _Mark.apply(self._touch, *args)
        with self.autocast():
            out = self.inner(*args)
        outs = out if isinstance(out, tuple) else (out,)
        if self.clone_views:  # torch's I detaches a stage's outputs in place: a view refuses
            outs = tuple(o.clone() if o._is_view() else o for o in outs)
        if self.marks and any(o.requires_grad for o in outs):
            outs = _Mark.apply(self._begin_backward, *outs)
        m = self.f_micro[self._f % len(self.f_micro)]
        self._add(int(Kind.F), m, start, self.clock.mark())
        self._f += 1
        self.progress(f"forward of microbatch {m}")
        return outs if isinstance(out, tuple) else outs[0]

    def backward_action(self, kind: Kind, start: float, end: float) -> None:
        """A backward call timed around (torch's runtime): B or I (the next backward of the
        program), or W."""
        if kind == Kind.W:
            m = self.w_micro[self._w % len(self.w_micro)]
            self._w += 1
        else:
            m = self.b_micro[self._b % len(self.b_micro)]
            self._b += 1
        self._add(int(kind), m, start, end)
        self.progress(f"{kind.name} of microbatch {m}")

    def received(self, backward: bool, m: int, start: float, end: float, channel: str) -> None:
        """A receive (pipeplan's own executor): the wait for, and transfer of, microbatch m's
        activations or gradients over ``channel``."""
        self.events.append((int(Kind.SEND_B if backward else Kind.SEND_F), m, start, end, channel))

    def record(self, kind: Kind, start: float, end: float) -> None:
        """A step-wide action of the rank (its stage's all-reduce, the optimizer step)."""
        self._add(int(kind), -1, start, end)

    def finish(self) -> list[tuple]:
        """The step's actions, their marks as host times."""
        self._close()
        self.clock.sync()
        return [(k, m, self.clock.seconds(a), self.clock.seconds(b), *rest) for k, m, a, b, *rest in self.events]


def measured_timeline(devices: list[str], stage_of_rank: list[int], events: dict[int, list],
                      t0: float, iteration_s: float) -> Timeline:
    """The Timeline of one step: ``events[rank]`` as (kind, microbatch, start, end) on the
    rank's device, (kind, microbatch, start, end, channel) for a receive, or (kind, microbatch,
    start, end, None, stage) on a rank of several stages, with absolute clock times, shifted
    so the step starts at ``t0``."""
    channels = sorted({e[4] for evs in events.values() for e in evs if len(e) > 4 and e[4] is not None})
    where = {c: len(devices) + i for i, c in enumerate(channels)}
    rows = [(e[0], e[5] if len(e) > 5 else stage_of_rank[r], e[1],
             where[e[4]] if len(e) > 4 and e[4] is not None else r, e[2] - t0, e[3] - t0)
            for r, evs in events.items() for e in evs]
    arr = np.array(rows, dtype=float).reshape(-1, 6)
    return Timeline(resources=[*devices, *channels], resource_is_device=[True] * len(devices) + [False] * len(channels),
                    kind=arr[:, 0].astype(np.int8), stage=arr[:, 1].astype(np.int64), micro=arr[:, 2].astype(np.int64),
                    resource=arr[:, 3].astype(np.int64), start=arr[:, 4], end=arr[:, 5],
                    iteration_s=float(iteration_s))


def side_by_side(predicted: Timeline, measured: Timeline) -> tuple[Timeline, dict]:
    """One timeline with each device's predicted row above its measured row (the
    predicted channels after them), and the error of each measured F/B duration against the
    predicted one: median and worst |error| per kind, and per action."""
    rows, pos = [], {}
    for r, d in enumerate(measured.resources):
        if measured.resource_is_device[r]:
            pos[("p", d)], pos[("m", d)] = len(rows), len(rows) + 1
            rows += [f"{d} predicted", f"{d} measured"]
    is_dev = [True] * len(rows)
    channels = [n for r, n in enumerate(predicted.resources) if not predicted.resource_is_device[r]]
    channels += [n for r, n in enumerate(measured.resources) if not measured.resource_is_device[r] and n not in channels]
    for name in channels:
        for side in ("p", "m"):
            if name in (predicted.resources if side == "p" else measured.resources):
                pos[(side, name)] = len(rows)
                rows.append(f"{name} {'predicted' if side == 'p' else 'measured'}")
                is_dev.append(False)
    keep = np.array([("p", predicted.resources[r]) in pos for r in predicted.resource.tolist()], dtype=bool)
    res = np.concatenate([[pos[("p", predicted.resources[r])] for r in predicted.resource[keep].tolist()],
                          [pos[("m", measured.resources[r])] for r in measured.resource.tolist()]]).astype(np.int64)
    cat = lambda a, b: np.concatenate([a[keep], b])  # noqa: E731
    merged = Timeline(rows, is_dev, cat(predicted.kind, measured.kind), cat(predicted.stage, measured.stage),
                      cat(predicted.micro, measured.micro), res, cat(predicted.start, measured.start),
                      cat(predicted.end, measured.end), max(predicted.iteration_s, measured.iteration_s))
    return merged, action_errors(predicted, measured)


#: The measured kinds compared with the prediction, by the names reports use.
COMPARED = {Kind.F: "forward", Kind.B: "backward", Kind.I: "input gradient", Kind.W: "weight gradient",
            Kind.AR: "all-reduce", Kind.UPDATE: "optimizer step"}


def action_errors(predicted: Timeline, measured: Timeline) -> dict:
    """Each measured action's duration against the predicted one of the same device, kind
    and microbatch: median and worst |error| per kind, and every action."""
    def durations(tl: Timeline) -> dict:
        return {(tl.resources[r], int(k), int(m), int(s)): float(b - a)
                for k, m, s, r, a, b in zip(tl.kind, tl.micro, tl.stage, tl.resource, tl.start, tl.end)
                if k in COMPARED}

    pred, meas = durations(predicted), durations(measured)
    per = [{"device": d, "kind": COMPARED[Kind(k)], "microbatch": m, "stage": s,
            "predicted_s": pred[key], "measured_s": t, "error": (t - pred[key]) / pred[key]}
           for key, t in sorted(meas.items()) for d, k, m, s in [key] if pred.get(key, 0) > 0]
    summary = {}
    for kind in COMPARED.values():
        errs = [abs(a["error"]) for a in per if a["kind"] == kind]
        if errs:
            summary[kind] = {"median_abs_error": float(np.median(errs)), "worst_abs_error": float(max(errs)),
                             "actions": len(errs)}
    return {"summary": summary, "actions": per}
