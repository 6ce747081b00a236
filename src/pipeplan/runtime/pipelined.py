"""Train on torch.distributed.pipelining: a plan whose device groups all have k devices runs
as k pipelines of P positions (rank = pipe * P + position); pipeline p holds device p of
every group. A position holds one stage, or several (model chunks: interleaved 1F1B, ZB-V),
each a ``PipelineStage`` of the same rank, driven by torch's ``_PipelineScheduleRuntime``
with the action lists translated from pipeplan's schedule IR (``translate.py``: F, B, I, W;
torch passes a chunk's output to the next chunk on the same rank without a send). After
each step every stage's gradients are summed over its k devices, then the optimizer steps.
On GPUs (``device.Target``) each rank's stages, data and pipeline buffers live on its
``cuda:LOCAL_RANK``, and NCCL carries the activations, gradients and all-reduces.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..plan import Plan
from ..schedule import Kind, Program, make_schedule
from ..schedule.layout import positions
from .clock import Clock
from .data import global_batch, pipeline_samples, share_size, squared_error
from .device import Target
from .models import load_model
from .split import Recomputed, split_model, stage_examples
from .steps import MOMENTUM, allreduce_gradients, program_micro, run_steps, state_arrays, weight_micro
from .timing import Timed
from .translate import microbatches_of, pipeline_orders


def pipelined_ranks(plan: Plan) -> list[tuple[int, str]]:
    """(first stage, device) of every rank when k pipelines of P positions run: rank p*P + d."""
    lay = positions(plan.stage_devices())
    p_count = lay.depth
    k = len(lay.groups[0])
    return [(lay.stages[r % p_count][0], plan.stages[lay.stages[r % p_count][0]].devices[r // p_count])
            for r in range(p_count * k)]


def _timed_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        """A pipelining stage whose backward calls (B, I, W) are timed on its ``Timed`` module."""

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
            start = self.submod.clock.mark()
            out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                             last_backward=last_backward)
            self.submod.backward_action(Kind.B if full_backward else Kind.I, start, self.submod.clock.mark())
            return out

        def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
            start = self.submod.clock.mark()
            out = super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
            self.submod.backward_action(Kind.W, start, self.submod.clock.mark())
            return out

    return TimedStage


class TimedGroup:
    """The ``Timed`` modules of a rank's stages, as one for ``run_steps``: the step-wide
    actions (all-reduce, optimizer step) go on the first stage's."""

    def __init__(self, timed: list[Timed]) -> None:
        self.timed, self.clock = timed, timed[0].clock
        self.module = nn.ModuleList(timed)

    def new_step(self) -> None:
        for t in self.timed:
            t.new_step()

    def record(self, kind: Kind, start: float, end: float) -> None:
        self.timed[0].record(kind, start, end)

    def finish(self) -> list[tuple]:
        return sorted((e for t in self.timed for e in t.finish()), key=lambda e: e[2])


def _stage_modules(plan: Plan, parts: list, stages: tuple[int, ...], program: Program, progress,
                   target: Target) -> list[Timed]:
    """Each stage of the rank wrapped to record its actions (tagged with their stage when
    the rank holds several) on the rank's clock, in the run's precision."""
    split = bool((program.kinds == Kind.I).any())
    clock = Clock(target.torch_device())
    out = []
    for s in stages:
        part = Recomputed(parts[s]) if plan.recomputes(s) else parts[s]
        out.append(Timed(part, *program_micro(program, s), progress, w_micro=weight_micro(program, s), marks=False,
                         stage=s if len(stages) > 1 else None, clone_views=split, clock=clock,
                         autocast=target.autocast))
    return out


def train_pipelined(rank: int, plan: Plan, cfg: dict, progress) -> tuple[list[dict], dict | None]:
    """This rank's steps (``steps.run_steps``) and, on pipeline 0, its stages' states."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    lay = positions(plan.stage_devices())
    p_count, k, s_count = lay.depth, len(lay.groups[0]), plan.num_stages
    pos, pipe = rank % p_count, rank // p_count
    pp_groups = [dist.new_group([q * p_count + d for d in range(p_count)]) for q in range(k)]
    dp_groups = [dist.new_group([q * p_count + d for q in range(k)]) for d in range(p_count)] if k > 1 else []
    target = Target(cfg["device"], cfg["precision"])
    dev = target.torch_device()
    model, x = load_model(cfg["spec"], cfg["microbatch"], cfg["seed"])
    xs, ys = global_batch(model, x, plan.microbatches, cfg["seed"])
    model, xs, ys = model.to(dev), xs.to(dev), ys.to(dev)
    parts = split_model(model, [st.nodes for st in plan.stages], cfg["spec"])
    z = x.shape[0]
    sel = pipeline_samples(plan.microbatches, z, pipe, k, plan.replicas).to(dev)
    sched_ir = make_schedule(plan.schedule, plan.stage_devices(), plan.microbatches, plan.replicas)
    program = dict(zip(sched_ir.devices, sched_ir.programs))[lay.groups[pos][pipe]]
    timed = _stage_modules(plan, parts, lay.stages[pos], program, progress, target)
    stage_cls = _timed_stage_class()
    stages = []
    for s, mod in zip(lay.stages[pos], timed):
        with target.autocast():  # the dtypes a stage receives and sends are those of the run
            inp, out = stage_examples(model, parts, s, xs[sel][: share_size(z, pipe, k, plan.replicas)])
        stages.append(stage_cls(mod, s, s_count, dev, input_args=inp, output_args=out, group=pp_groups[pipe]))
    denom = float(ys.numel())
    sched = _PipelineScheduleRuntime(stages, n_microbatches=len(microbatches_of(pipe, k, plan.microbatches,
                                                                                plan.replicas)),
                                     loss_fn=lambda out, y: squared_error(out.float(), y, denom), scale_grads=False)
    if cfg.get("schedule_csv"):  # torch's own loader; checked against the plan before any process started
        sched._load_csv(cfg["schedule_csv"], format="compute_only")
    else:
        sched._prepare_schedule_with_comms(pipeline_orders(sched_ir, plan.stage_devices(), plan.replicas)[pipe])
    group = TimedGroup(timed)
    opt = torch.optim.SGD(group.module.parameters(), lr=cfg["lr"], momentum=MOMENTUM)
    args = (xs[sel],) if 0 in lay.stages[pos] else ()
    kwargs = {"target": ys[sel]} if s_count - 1 in lay.stages[pos] else {}

    def step() -> None:
        sched.step(*args, **kwargs)
        if k > 1:
            allreduce_gradients(group.module, dp_groups[pos], group)

    steps = run_steps(step, group, opt, cfg["warmup"] + cfg["steps"], progress)
    return steps, ({s: state_arrays(parts[s]) for s in lay.stages[pos]} if pipe == 0 else None)
