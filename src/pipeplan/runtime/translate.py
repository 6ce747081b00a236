"""pipeplan's schedule IR -> torch.distributed.pipelining's per-rank action lists.

torch.distributed.pipelining (torch 2.13, pinned) runs a "compute only" schedule given as
``{pp_rank: [_Action(stage, F|B, microbatch), ...]}`` and inserts the sends and receives
itself (``_PipelineScheduleRuntime._prepare_schedule_with_comms``). That API is private,
hence the pinned version and the tests of this translation.

pipeplan runs a plan whose device groups all have k devices as k pipelines of P positions:
pipeline p holds device p of every group, and position d is the pipeline's rank d, holding
one stage or several (model chunks: the interleaved and V schedules), its actions naming
their stage. With ``split`` replicas every pipeline runs every microbatch on its 1/k share
of the samples; with ``round-robin`` replicas pipeline p runs microbatches p, p+k, ...
(renumbered 0, 1, ... inside the pipeline). The stage's all-reduce (``AR``) is not a
pipelining action: the executor all-reduces each stage's gradients over its k devices after
the step.
"""

from __future__ import annotations

from torch.distributed.pipelining.schedules import _Action, _ComputationType

from ..schedule import Kind, Schedule
from ..schedule.layout import positions

_KIND = {Kind.F: _ComputationType.FORWARD, Kind.B: _ComputationType.FULL_BACKWARD,
         Kind.I: _ComputationType.BACKWARD_INPUT, Kind.W: _ComputationType.BACKWARD_WEIGHT}


def pipeline_orders(schedule: Schedule, stage_devices: list[list[int]], replicas: str) -> list[dict[int, list[_Action]]]:
    """One ``{pp rank (pipeline position): [actions]}`` per pipeline p, from the devices' programs."""
    lay = positions(stage_devices)
    k = len(lay.groups[0])
    by_device = dict(zip(schedule.devices, schedule.programs))
    orders = []
    for p in range(k):
        order: dict[int, list[_Action]] = {}
        for pos, group in enumerate(lay.groups):
            prog = by_device[group[p]]
            local = {m: i for i, m in enumerate(sorted({int(m) for m in prog.micro if m >= 0}))}
            if replicas == "split":
                local = {m: m for m in local}
            order[pos] = [_Action(int(s), _KIND[int(op)], local[int(m)])
                          for op, s, m in zip(prog.kinds, prog.stages, prog.micro) if int(op) in _KIND]
        orders.append(order)
    return orders


def microbatches_of(pipeline: int, k: int, m_count: int, replicas: str) -> list[int]:
    """The global microbatches pipeline p runs (all of them, on a 1/k share, when split)."""
    return list(range(m_count)) if replicas == "split" else list(range(pipeline, m_count, k))
