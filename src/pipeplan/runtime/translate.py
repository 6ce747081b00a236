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

from typing import TYPE_CHECKING

from ..schedule import Kind, Schedule
from ..schedule.layout import positions

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _Action


def _kinds() -> dict:
    """pipeplan's action kinds as torch's. torch's pipelining is imported where it runs (the
    workers, whose fork server preloads it): the launcher and the check skip its seconds."""
    from torch.distributed.pipelining.schedules import _ComputationType

    return {Kind.F: _ComputationType.FORWARD, Kind.B: _ComputationType.FULL_BACKWARD,
            Kind.I: _ComputationType.BACKWARD_INPUT, Kind.W: _ComputationType.BACKWARD_WEIGHT}


def pipeline_orders(schedule: Schedule, stage_devices: list[list[int]], replicas: str) -> list[dict[int, list[_Action]]]:
    """One ``{pp rank (pipeline position): [actions]}`` per pipeline p, from the devices' programs."""
    from torch.distributed.pipelining.schedules import _Action

    kinds = _kinds()
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
            order[pos] = [_Action(int(s), kinds[int(op)], local[int(m)])
                          for op, s, m in zip(prog.kinds, prog.stages, prog.micro) if int(op) in kinds]
        orders.append(order)
    return orders


def microbatches_of(pipeline: int, k: int, m_count: int, replicas: str) -> list[int]:
    """The global microbatches pipeline p runs (all of them, on a 1/k share, when split)."""
    return list(range(m_count)) if replicas == "split" else list(range(pipeline, m_count, k))


def check_csv(path: str, stage_devices: list[list[int]], microbatches: int) -> None:
    """That a compute-only schedule CSV (one row a pipeline rank, actions such as ``0F0``, ``1B2``,
    ``0I0``, ``0W0``; ``pipeplan export-plan --to torchtitan`` writes one) fits one pipeline of
    the plan, by torch's own ``_validate_schedule`` and send/receive lowering before
    any process starts; a PipeplanError naming the file and torch's complaint otherwise."""
    import csv

    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule

    from ..errors import PipeplanError
    from ..readers import read_text

    lay = positions(stage_devices)
    text = read_text(path, "--schedule-csv")
    try:
        rows = [row for row in csv.reader(text.splitlines())]
        orders = {rank: [_Action.from_str(a) for a in row] for rank, row in enumerate(rows)}
        stage_of = _validate_schedule(orders, lay.depth, len(stage_devices), microbatches)
        if any(stage_of[s] != pos for pos, stages in enumerate(lay.stages) for s in stages):
            raise AssertionError("its stages sit on other pipeline ranks than the plan's")
        _add_send_recv({r: list(v) for r, v in orders.items()}, lambda s: stage_of[s], len(stage_devices))
    except (AssertionError, RuntimeError, ValueError, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipeplanError(f"--schedule-csv {path}: torch's pipelining refuses it: {first}") from None
