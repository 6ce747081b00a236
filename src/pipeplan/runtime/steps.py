"""The training loop both executors share: timed steps, gradient all-reduce, final state."""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ..schedule import Kind, Program
from .clock import Clock


#: The executor's optimizer: SGD with this momentum (the check's reference trains the same).
MOMENTUM = 0.9


def program_micro(program: Program, stage: int | None = None) -> tuple[list[int], list[int]]:
    """The microbatches of a device's forwards and of its backwards (B or I), in program
    order (of ``stage`` only, when given)."""
    acts = _actions(program, stage)
    return [m for k, m in acts if k == Kind.F], [m for k, m in acts if k in (Kind.B, Kind.I)]


def weight_micro(program: Program, stage: int | None = None) -> list[int]:
    """The microbatches of a device's weight-gradient actions (W), in program order."""
    return [m for k, m in _actions(program, stage) if k == Kind.W]


def _actions(program: Program, stage: int | None) -> list[tuple[int, int]]:
    return [(k, m) for k, s, m in zip(program.kinds.tolist(), program.stages.tolist(), program.micro.tolist())
            if stage is None or s == stage]


class Recorder(Protocol):
    """What records a rank's actions: a ``Timed`` stage, or the group of a rank's stages,
    with the rank's clock."""

    clock: Clock

    def new_step(self) -> None: ...

    def record(self, kind: Kind, start: float, end: float) -> None: ...

    def finish(self) -> list[tuple]: ...


def run_steps(step: Callable[[], None], timed: Recorder, opt: torch.optim.Optimizer,
              count: int, progress: Callable[..., None] = lambda label, step=None: None) -> list[dict]:
    """``count`` iterations between barriers; per step its start on this process's clock,
    its length and the rank's actions (kind, microbatch, start, end). On a GPU the step
    starts once the device is idle and ends once it is again (``Clock.anchor``, ``sync``).
    ``progress(label, step)`` as each iteration begins (``launch.Worker.progress``)."""
    out, clock = [], timed.clock
    for i in range(count):
        progress(f"iteration {i + 1} of {count}", i + 1)
        opt.zero_grad()
        timed.new_step()
        dist.barrier()
        t0 = clock.anchor()
        step()
        t_opt = clock.mark()
        opt.step()
        timed.record(Kind.UPDATE, t_opt, clock.mark())
        clock.sync()
        dist.barrier()
        out.append({"start": t0, "seconds": time.perf_counter() - t0, "actions": timed.finish()})
    return out


def allreduce_gradients(module: nn.Module, group, timed: Recorder) -> None:
    """Sum the module's gradients over the group (``allreduce_tensors``), recorded on the
    rank's timeline."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if grads:
        start = timed.clock.mark()
        allreduce_tensors(grads, group)
        timed.record(Kind.AR, start, timed.clock.mark())


def allreduce_tensors(tensors: list[torch.Tensor], group=None) -> None:
    """Sum the tensors over the group in one flattened call (as DDP's buckets), in place:
    the copies in and out are part of the cost calibrate measures."""
    flat = torch._utils._flatten_dense_tensors(tensors)
    dist.all_reduce(flat, group=group)
    for g, new in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors)):
        g.copy_(new)


def state_arrays(module: nn.Module) -> dict:
    """Plain arrays: torch's shared-memory tensors would need the worker to outlive the read."""
    return {n: t.detach().cpu().numpy().copy() for n, t in module.state_dict().items()}
