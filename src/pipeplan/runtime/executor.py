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
import queue as queue_mod
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import Kind, make_schedule
from .data import equal_replication
from .direct import stage_major_ranks, train_direct
from .models import input_signature, load_model, user_code
from .pipelined import pipelined_ranks, train_pipelined
from .rendezvous import join_local_group, local_rendezvous
from .split import split_model, stage_examples
from .timing import measured_timeline


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


#: seconds a worker may take, beyond the hang timeout, for each step of its set-up (spawn and
#: import torch, join the process group, build its stage) before it counts as stuck
STARTUP_GRACE_S = 30.0
#: the progress labels of those set-up steps (a training action's label ends the grace)
SETUP_STEPS = ("started", "joined the process group")
PROGRESS_EVERY_S = 0.2  # a rank reports its last action this often (hang detection is coarser)


def check_plan_against_model(plan: Plan, model: nn.Module, x: torch.Tensor, spec: str) -> None:
    """Refuse, before any process starts, a plan that does not match the model or the runtime:
    the model is split into the plan's stages and one microbatch runs through them."""
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
    with user_code(spec, "running the plan's stages once"):
        parts = split_model(model, [s.nodes for s in plan.stages], spec)
        stage_examples(model, parts, len(parts) - 1, x)


def _die_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when its parent ends, however it ends."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent ended before the request took effect
        os._exit(1)


def uses_pipelining(plan: Plan) -> bool:
    """torch's pipelining runs the plan (every stage on the same number of devices); else
    pipeplan's own executor (``direct.py``)."""
    return equal_replication(plan)


def rank_layout(plan: Plan) -> list[tuple[int, str]]:
    return pipelined_ranks(plan) if uses_pipelining(plan) else stage_major_ranks(plan)


def _worker(rank: int, world: int, init_method: str, plan_dict: dict, cfg: dict, results) -> None:
    from ..plan import plan_from_dict

    _die_with_parent(cfg["parent"])
    stage_index = -1
    try:
        torch.set_num_threads(cfg["threads"])
        plan = plan_from_dict(plan_dict)
        stage_index = rank_layout(plan)[rank][0]

        progress = _Progress(rank, results)
        progress("started")
        join_local_group("gloo", init_method, rank, world)
        progress("joined the process group")
        train = train_pipelined if uses_pipelining(plan) else train_direct
        steps, state = train(rank, plan, cfg, progress)
        for s, arrays in (state or {}).items():
            results.put(("params", s, arrays))
        results.put(("steps", rank, steps))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # report to the parent, which ends the run
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        results.put(("error", rank, stage_index, f"{type(e).__name__}: {text}"))
        raise SystemExit(1)


class _Progress:
    """A rank's progress: ``progress(label)`` after each action only notes it (a message per
    action cost the run CPU); a daemon thread sends the latest, with the time it was done,
    every PROGRESS_EVERY_S when it changed, also while the rank waits in a collective."""

    def __init__(self, rank: int, results) -> None:
        self.rank, self.results = rank, results
        self.latest: tuple[float, str] | None = None
        self.sent: tuple[float, str] | None = None
        threading.Thread(target=self._send_loop, daemon=True).start()

    def __call__(self, label: str) -> None:
        self.latest = (time.time(), label)

    def _send_loop(self) -> None:
        while True:
            latest = self.latest
            if latest is not None and latest is not self.sent:
                self.results.put(("progress", self.rank, latest[1], latest[0]))
                self.sent = latest
            time.sleep(PROGRESS_EVERY_S)


def _end_all(procs: list) -> None:
    procs = [p for p in procs if p.pid is not None]  # started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(5)


def target_warnings(plan: Plan, cores: int | None = None) -> list[str]:
    """What makes this run differ from what the plan was made for: devices that are not the
    CPU processes the executor starts, or more processes than cores."""
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


def _watch(plan: Plan, procs: list, results, cfg: RunConfig) -> tuple[dict[int, dict], dict[int, list[dict]]]:
    """Collect the workers' reports until every one finished; end the run on a failure, when
    no rank progressed for ``cfg.hang_s`` (naming the rank that stopped first: the others
    wait for it), or past the optional wall-clock cap."""
    start = time.time()
    params: dict[int, dict] = {}
    steps: dict[int, list[dict]] = {}
    errors: dict[int, str] = {}
    # rank -> (when it last progressed, what it did, the grace it has for its next step)
    last = {r: (start, "starting", STARTUP_GRACE_S) for r in range(len(procs))}
    while True:
        try:
            msg = results.get(timeout=0.05)
        except queue_mod.Empty:
            msg = None
        if msg is not None:
            if msg[0] == "progress":  # (tag, rank, label, when it was done)
                last[msg[1]] = (msg[3], msg[2], STARTUP_GRACE_S if msg[2] in SETUP_STEPS else 0.0)
            elif msg[0] == "error":
                errors[msg[1]] = msg[3]
            elif msg[0] == "params":
                params[msg[1]] = msg[2]
            elif msg[0] == "steps":
                steps[msg[1]] = msg[2]
            continue
        if errors or any(p.exitcode not in (None, 0) for p in procs):
            raise PipeplanError(_diagnose(plan, procs, errors, results))
        if all(p.exitcode == 0 for p in procs) and len(steps) == len(procs) and len(params) == plan.num_stages:
            return params, steps
        now = time.time()
        quiet = {r: now - t - grace for r, (t, _, grace) in last.items()}
        if min(quiet.values()) > cfg.hang_s:
            r = max(quiet, key=quiet.__getitem__)  # the one that stopped first
            raise PipeplanError(f"run failed: {_who(plan, r)} made no progress for {now - last[r][0]:.0f} s (last: "
                                f"{last[r][1]}); the other ranks wait for it")
        if cfg.timeout_s is not None and now - start > cfg.timeout_s:
            raise PipeplanError(f"run failed: not finished within {cfg.timeout_s:g} s (--timeout)")


def run_plan(plan: Plan, cfg: RunConfig) -> dict:
    """Train ``cfg.steps`` iterations (after ``cfg.warmup``); return measured and predicted times."""
    from ..sim import simulate

    model, x = load_model(cfg.spec, plan.graph.meta.get("microbatch"), cfg.seed)
    check_plan_against_model(plan, model, x, cfg.spec)
    predicted = simulate(plan, timeline=False).iteration_s
    world = len({d for s in plan.stages for d in s.devices})  # a process per device, whatever it holds
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    wcfg = {**asdict(cfg), "microbatch": int(x.shape[0]), "parent": os.getpid()}
    plan_dict = plan.to_dict()
    with local_rendezvous() as init_method:
        procs = [ctx.Process(target=_worker, args=(r, world, init_method, plan_dict, wcfg, results), daemon=True)
                 for r in range(world)]
        try:
            for p in procs:
                p.start()
            params, steps = _watch(plan, procs, results, cfg)
        finally:
            _end_all(procs)
    times = [s["seconds"] for s in steps[0]]
    steady = times[cfg.warmup:] or times
    measured = statistics.median(steady)
    median_step = cfg.warmup + int(np.argsort(steady)[len(steady) // 2]) if times[cfg.warmup:] else 0
    out = {"measured_s": measured, "predicted_s": predicted, "error": abs(predicted - measured) / measured,
           "steps": cfg.steps, "warmup": cfg.warmup, "processes": world, "per_step_s": times,
           "spread": (max(steady) - min(steady)) / measured,
           "schedule": plan.schedule, "replicas": plan.replicas, "microbatch": int(x.shape[0]),
           "warnings": target_warnings(plan) + input_warnings(plan, x)}
    out["_params"] = params
    layout = rank_layout(plan)
    out["_timeline"] = measured_timeline([d for _, d in layout], [s for s, _ in layout],
                                         {r: steps[r][median_step]["actions"] for r in steps},
                                         steps[0][median_step]["start"], steps[0][median_step]["seconds"])
    out["timeline_step"] = median_step
    return out


_PEER_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "Connection refused")


def root_failure(procs: list, results, errors: dict[int, str], settle_s: float = 0.5,
                 wait_s: float = 10.0) -> tuple[int, str | None]:
    """The rank at the root of a failure of workers that report ``(status, rank, payload)``
    (status ``"error"``: the payload is its text), and its error (None: it died without a
    word, ``procs[rank].exitcode`` says how). A rank that died silently comes first, then one
    whose error is its own rather than a peer's connection dropping; a peer's report may
    arrive first, so reports are awaited until one of those is in or every worker ended (at
    most ``wait_s``)."""
    start = time.monotonic()
    while True:
        try:
            status, rank, payload = results.get(timeout=0.1)
            if status == "error":
                errors.setdefault(rank, payload)
        except queue_mod.Empty:
            pass
        silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
        own = [r for r, e in errors.items() if not any(x in e for x in _PEER_ERRORS)]
        waited = time.monotonic() - start
        ended = all(p.exitcode is not None for p in procs)
        if waited > wait_s or (waited > settle_s and (silent or own or ended)):
            break
    if silent or not errors:
        return (silent or [0])[0], None
    r = own[0] if own else next(iter(errors))
    return r, errors[r]


def _diagnose(plan: Plan, procs: list, errors: dict[int, str], results) -> str:
    """Name the rank at the root of a failure: one that died without a word, else one whose
    error is its own rather than a peer's connection dropping."""
    time.sleep(0.5)  # let the other workers notice and report
    try:
        while True:
            msg = results.get_nowait()
            if msg[0] == "error":
                errors[msg[1]] = msg[3]
    except queue_mod.Empty:
        pass
    who = partial(_who, plan)
    silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
    if silent:
        return f"run failed: {who(silent[0])} died with exit code {procs[silent[0]].exitcode}"
    own = [r for r, e in sorted(errors.items()) if not any(x in e for x in _PEER_ERRORS)]
    r = own[0] if own else min(errors)
    return f"run failed: {who(r)} raised {errors[r][:300]}"


def _who(plan: Plan, rank: int) -> str:
    stage, device = rank_layout(plan)[rank]
    return f"rank {rank} (stage {stage}, device {device})"
