"""Execute a plan on torch.distributed: one process per device, stages pipelined with
torch.distributed.pipelining, replicated stages all-reduced in their own process group.

Stages are cut from the model's fx trace (``split.py``): any module the profiler can trace,
skip connections across stages included. A plan whose stages all have k devices runs as k
pipelines of S stages (rank = p*S + s; pipeline p holds device p of every stage), each a
process group driven by torch's ``_PipelineScheduleRuntime`` with the action lists
translated from pipeplan's schedule IR (``translate.py``); after each step, each stage's
gradients are summed over its k devices (its own process group), then the optimizer
steps. A plan whose stages have different numbers of devices runs on pipeplan's own
executor of the same IR (``direct.py``). The loss is the mean squared
error against fixed random targets over the whole global batch, written as a sum divided
by the global element count so that microbatches and replicas add up to exactly the
single-process gradient (``scale_grads=False``).

Failures: a worker that raises or dies ends the run with one line naming its rank and
stage; so does one that hangs, once no rank has progressed (an action done) for ``hang_s``;
every worker process is ended before returning.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import nn

from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import Kind, make_schedule
from .data import equal_replication
from .device import Target, resolve
from .direct import stage_major_ranks, train_direct
from .launch import Failure, Progress, Worker, launch, one_line_error, torchrun_world
from .models import input_signature, load_model, user_code
from .pipelined import pipelined_ranks, train_pipelined
from .split import split_model, stage_examples
from .timing import measured_timeline
from .translate import check_csv

if TYPE_CHECKING:
    from .timing import Timeline  # the measured step (timing.py builds it)


@dataclass
class RunConfig:
    spec: str
    steps: int = 5
    warmup: int = 1
    lr: float = 0.05
    seed: int = 0
    threads: int = 1
    hang_s: float = 60.0  # no rank progressing this long ends the run, naming the one stuck longest
    timeout_s: float | None = None  # optional wall-clock cap
    #: a compute-only schedule CSV torch's pipelining runs instead of the plan's translated
    #: schedule (``translate.check_csv``; the plan must run on torch's pipelining)
    schedule_csv: str | None = None
    device: str = "cpu"  # auto, cpu or cuda (device.py; the command line's default is auto)
    precision: str = "fp32"  # fp32 or bf16 autocast


def check_plan_against_model(plan: Plan, model: nn.Module, x: torch.Tensor, spec: str,
                             csv_path: str | None = None) -> None:
    """Refuse, before any process starts, a plan that does not match the model or the runtime
    (or a ``csv_path`` schedule torch refuses): the model is split into the plan's stages and
    one microbatch runs through them."""
    k = max(len(s.devices) for s in plan.stages)
    sched = make_schedule(plan.schedule, plan.stage_devices(), plan.microbatches, plan.replicas)
    if sched.steady_state is not None or sched.lanes:
        what = ("an asynchronous steady state (no flush, weight stashing)" if sched.steady_state is not None
                else "forward and backward lanes side by side")
        raise PipeplanError(f"run: schedule {plan.schedule!r} is evaluated as {what}; the runtime executes "
                            "synchronous schedules: re-plan with --schedule 1f1b")
    if not uses_pipelining(plan) and any(set(p.kinds.tolist()) - {Kind.F, Kind.B, Kind.AR} for p in sched.programs):
        raise PipeplanError(f"run: schedule {plan.schedule!r} splits backward passes (I, W); the runtime runs "
                            "those only when every stage has the same number of devices: re-plan with --schedule 1f1b")
    if not uses_pipelining(plan) and len({tuple(s.devices) for s in plan.stages}) < plan.num_stages:
        raise PipeplanError(f"run: schedule {plan.schedule!r} puts several stages on a device; the runtime runs "
                            "model chunks only when every stage has the same number of devices")
    if plan.replicas == "split" and x.shape[0] < k:
        raise PipeplanError(f"plan: a microbatch of {x.shape[0]} samples cannot be split over {k} replicas")
    if csv_path is not None:
        check_schedule_csv(plan, csv_path)
    if spec.startswith("hf:") and "decoder" in plan.graph.meta:
        from .hf import decoder_mismatch

        why = decoder_mismatch(spec, plan.graph.meta["decoder"])
        if why is not None:
            raise PipeplanError(f"plan does not match model {spec!r}: {why}")
    with user_code(spec, "running the plan's stages once"):
        parts = split_model(model, [s.nodes for s in plan.stages], spec)
        stage_examples(model, parts, len(parts) - 1, x)


def check_schedule_csv(plan: Plan, path: str) -> None:
    """A ``--schedule-csv`` file torch's pipelining would run for ``plan``
    (``translate.check_csv``), or one line saying why not."""
    if not uses_pipelining(plan):
        raise PipeplanError("run: --schedule-csv runs on torch's pipelining, which runs plans whose stages all "
                            "have the same number of devices")
    k_pipes = len(plan.stages[0].devices)
    check_csv(path, plan.stage_devices(),
                    plan.microbatches // k_pipes if plan.replicas == "round-robin" else plan.microbatches)


def uses_pipelining(plan: Plan) -> bool:
    """torch's pipelining runs the plan (every stage on the same number of devices); else
    pipeplan's own executor (``direct.py``)."""
    return equal_replication(plan)


def rank_layout(plan: Plan) -> list[tuple[int, str]]:
    return pipelined_ranks(plan) if uses_pipelining(plan) else stage_major_ranks(plan)


def _worker(ctx: Worker, plan_dict: dict, cfg: dict) -> dict:
    """One rank of the run: train its stage(s); its step records and its stages' parameters."""
    from ..plan import plan_from_dict

    plan = plan_from_dict(plan_dict)
    train = train_pipelined if uses_pipelining(plan) else train_direct
    steps, state = train(ctx.rank, plan, cfg, ctx.progress)
    return {"steps": steps, "params": state or {}}


def _error_text(e: BaseException) -> str:
    return one_line_error(e)[:300]


def target_warnings(plan: Plan, cores: int | None = None, target: Target = Target()) -> list[str]:
    """What makes this run differ from what the plan was made for: devices that are not the
    CPU processes the executor starts, or more processes than cores (on GPUs: none said)."""
    if target.device == "cuda":
        return []
    cores = cores or os.cpu_count() or 1
    used = {d for s in plan.stages for d in s.devices}
    world = len(used)
    kinds = sorted({plan.cluster.devices[plan.cluster.index[d]].kind for d in used})
    out = []
    if any(k.upper() != "CPU" for k in kinds):
        out.append(f"the plan was made for cluster {plan.cluster.name!r} ({', '.join(kinds)}) and runs on this "
                   f"machine ({cores} CPU cores) as {world} CPU processes: its prediction is for "
                   f"{plan.cluster.name!r}, not for this machine (pipeplan calibrate writes a cluster of this "
                   "machine to plan for)")
    if world > cores:
        out.append(f"{world} worker processes on {cores} cores: they share cores, so times are slower than "
                   "either the plan or a calibration assumes")
    return out


def input_warnings(plan: Plan, x: torch.Tensor) -> list[str]:
    """The model is fed another input than the one its profile measured (a longer sequence,
    larger images): the plan runs, but its prediction is for the profile's input."""
    profiled = plan.graph.meta.get("input")
    if not isinstance(profiled, dict):
        return []
    now = input_signature(x)
    if all(profiled.get(k) == v for k, v in now.items()):
        return []
    return [f"the model's input is {_shown(now)} per sample but the plan's profile measured {_shown(profiled)}: "
            "the prediction is for the profile's input (profile the model as it runs, then plan again)"]


def _shown(signature: dict) -> str:
    shape = signature.get("sample_shape")
    dims = "x".join(map(str, shape)) if isinstance(shape, list) and shape else "scalar"
    return f"{dims} {signature.get('dtype')}"


@dataclass
class RunResult:
    """What ``run_plan`` measured. ``params``: each stage's trained parameters (stage ->
    name -> array); ``timeline``: the measured median step (``timing.measured_timeline``).
    The command line adds the per-action error (``--vs-prediction``) and the check
    (``--check``); ``to_dict`` is the JSON it prints."""

    measured_s: float
    predicted_s: float | None
    error: float | None
    steps: int
    warmup: int
    processes: int
    per_step_s: list[float]
    spread: float
    schedule: str
    replicas: str
    microbatch: int
    device: str
    precision: str
    warnings: list[str]
    timeline_step: int
    params: dict[int, dict] = field(repr=False)
    timeline: Timeline = field(repr=False)
    action_error: dict | None = None
    max_rel_diff: float | None = None
    check: dict | None = None

    def to_dict(self) -> dict:
        """Every field but ``params`` and ``timeline``; the last three only once set."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("params", "timeline")}
        for key in ("action_error", "max_rel_diff", "check"):
            if out[key] is None:
                del out[key]
        return out


def run_plan(plan: Plan, cfg: RunConfig, predicted_s: float | None = None,
             on_progress: Callable[[Progress], None] | None = None) -> RunResult:
    """Train ``cfg.steps`` iterations (after ``cfg.warmup``); the measured times, against
    ``predicted_s`` (the simulator's, from the caller: the runtime never imports it) when given.
    ``on_progress``: each rank's progress, its iteration among them (``launch``)."""
    world = len({d for s in plan.stages for d in s.devices})  # a process per device, whatever it holds
    target = run_target(plan, cfg, world)
    model, x = load_model(cfg.spec, plan.graph.meta.get("microbatch"), cfg.seed)
    check_plan_against_model(plan, model, x, cfg.spec, cfg.schedule_csv)
    wcfg = {**asdict(cfg), "microbatch": int(x.shape[0]), "device": target.device}
    done = launch(_worker, world, (plan.to_dict(), wcfg), diagnose=partial(_diagnose, plan), threads=cfg.threads,
                  hang_s=cfg.hang_s, timeout_s=cfg.timeout_s, error_text=_error_text, join=True,
                  backend=target.backend, on_progress=on_progress)
    steps = {r: d["steps"] for r, d in done.items()}
    params = {s: arrays for d in done.values() for s, arrays in d["params"].items()}
    times = [s["seconds"] for s in steps[0]]
    steady = times[cfg.warmup:] or times
    measured = statistics.median(steady)
    median_step = cfg.warmup + int(np.argsort(steady)[len(steady) // 2]) if times[cfg.warmup:] else 0
    layout = rank_layout(plan)
    timeline = measured_timeline([d for _, d in layout], [s for s, _ in layout],
                                 {r: steps[r][median_step]["actions"] for r in steps},
                                 steps[0][median_step]["start"], steps[0][median_step]["seconds"])
    error = None if predicted_s is None else abs(predicted_s - measured) / measured
    return RunResult(measured_s=measured, predicted_s=predicted_s, error=error,
                     steps=cfg.steps, warmup=cfg.warmup, processes=world, per_step_s=times,
                     spread=(max(steady) - min(steady)) / measured, schedule=plan.schedule,
                     replicas=plan.replicas, microbatch=int(x.shape[0]), device=target.device,
                     precision=target.precision,
                     warnings=target_warnings(plan, target=target) + input_warnings(plan, x), timeline_step=median_step,
                     params=params, timeline=timeline)


def run_target(plan: Plan, cfg: RunConfig, world: int) -> Target:
    """The run's device and precision (``device.resolve``): one GPU for each process on this
    machine (torchrun's ``LOCAL_WORLD_SIZE`` when joined, else every process); plans on
    pipeplan's own executor run on the CPU (its messages need tags, which NCCL ignores)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torchrun_world() is not None else world
    target = resolve(cfg.device, cfg.precision, local)
    if target.device == "cuda" and not uses_pipelining(plan):
        if cfg.device == "cuda":
            raise PipeplanError("run: --device cuda runs plans whose stages all have the same number of devices "
                                "(torch's pipelining over NCCL); this plan's stages differ, so it runs on pipeplan's "
                                "own executor, on CPU processes only (--device cpu)")
        target = Target("cpu", target.precision)
    return target


def _diagnose(plan: Plan, failure: Failure) -> str:
    """A failure in words, naming the rank's stage and device."""
    text = failure.words("run", _who(plan, failure.rank))
    return text + " (--timeout)" if failure.kind == "timed out" else text


def _who(plan: Plan, rank: int) -> str:
    stage, device = rank_layout(plan)[rank]
    return f"rank {rank} (stage {stage}, device {device})"
