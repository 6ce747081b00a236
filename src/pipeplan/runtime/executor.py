"""Execute a plan on torch.distributed: one process per device, stages pipelined with
torch.distributed.pipelining, replicated stages all-reduced in their own process group.

Layout: a plan whose stages all have k devices runs as k pipelines of S stages (rank =
p*S + s; pipeline p holds device p of every stage). Each pipeline is a process group driven
by ``_PipelineScheduleRuntime`` with the action lists translated from pipeplan's schedule
IR (``translate.py``); after each step, each stage's gradients are summed over its k
devices (its own process group), then the optimizer steps. The loss is the mean squared
error against fixed random targets over the whole global batch, written as a sum divided
by the global element count so that microbatches and replicas add up to exactly the
single-process gradient (``scale_grads=False``).

Failures: a worker that raises, dies or hangs ends the run with one line naming its rank
and stage, within ``timeout``; every worker process is ended before returning.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import statistics
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch
import torch.multiprocessing as mp
from torch import nn

from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import make_schedule
from .models import load_model
from .translate import microbatches_of, pipeline_orders


@dataclass
class RunConfig:
    spec: str
    steps: int = 5
    warmup: int = 1
    lr: float = 0.05
    seed: int = 0
    threads: int = 1
    timeout_s: float = 300.0


class Recomputed(nn.Module):
    """A stage that re-materializes its activations (GPipe §2.3): only its input is kept
    per microbatch; the forward runs again inside the backward (torch.utils.checkpoint)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, x, use_reentrant=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layers_of(model: nn.Module, spec: str) -> OrderedDict:
    if not isinstance(model, nn.Sequential):
        raise PipeplanError(f"model {spec!r}: the executor runs nn.Sequential models (stages are runs of "
                            "its children); wrap the layers in nn.Sequential")
    return OrderedDict(model.named_children())


def check_plan_against_model(plan: Plan, model: nn.Module, spec: str, microbatch: int) -> None:
    """Refuse, before any process starts, a plan that does not match the model or the runtime."""
    names = list(layers_of(model, spec))
    ids = set(plan.graph.ids)
    unknown = [n for s in plan.stages for n in s.nodes if n not in names]
    if unknown:
        raise PipeplanError(f"plan does not match model {spec!r}: node {unknown[0]!r} is not one of its layers "
                            f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    missing = [n for n in names if n not in ids]
    if missing:
        raise PipeplanError(f"plan does not match model {spec!r}: layer {missing[0]!r} is in no stage")
    pos = {n: i for i, n in enumerate(names)}
    flat = [pos[n] for s in plan.stages for n in s.nodes]
    if flat != list(range(len(names))):
        raise PipeplanError("plan: the executor needs each stage to be a consecutive run of the model's "
                            "layers, in order")
    ks = {len(s.devices) for s in plan.stages}
    if len(ks) != 1:
        raise PipeplanError("plan: the executor runs plans whose stages all have the same number of devices "
                            f"(k pipelines of S stages); this one has {[len(s.devices) for s in plan.stages]}")
    k = ks.pop()
    sched = make_schedule(plan.schedule, plan.stage_devices(), plan.microbatches, plan.replicas)
    if sched.steady_state is not None or sched.lanes:
        what = ("an asynchronous steady state (no flush, weight stashing)" if sched.steady_state is not None
                else "forward and backward lanes side by side")
        raise PipeplanError(f"run: schedule {plan.schedule!r} is evaluated as {what}; the runtime executes "
                            "synchronous schedules: re-plan with --schedule 1f1b")
    if plan.replicas == "split" and k > 1 and microbatch % k:
        raise PipeplanError(f"plan: a microbatch of {microbatch} samples cannot be split evenly over {k} replicas")


def _global_batch(model: nn.Module, x: torch.Tensor, m_count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    z = x.shape[0]
    xs = torch.randn((m_count * z, *x.shape[1:]), generator=gen)
    with torch.no_grad():
        out_shape = model(xs[:1]).shape[1:]
    ys = torch.randn((m_count * z, *out_shape), generator=gen)
    return xs, ys


def _pipeline_samples(m_count: int, z: int, p: int, k: int, replicas: str) -> torch.Tensor:
    """Indices of the global batch's samples that pipeline p processes, microbatch by microbatch."""
    idx = []
    for m in microbatches_of(p, k, m_count, replicas):
        if replicas == "split":
            part = z // k
            idx.append(torch.arange(m * z + p * part, m * z + (p + 1) * part))
        else:
            idx.append(torch.arange(m * z, (m + 1) * z))
    return torch.cat(idx)


def _worker(rank: int, world: int, port: int, plan_dict: dict, cfg: dict, results) -> None:
    from ..plan import plan_from_dict

    stage_index = -1
    try:
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        torch.set_num_threads(cfg["threads"])
        plan = plan_from_dict(plan_dict)
        s_count = plan.num_stages
        k = len(plan.stages[0].devices)
        stage_index, pipe = rank % s_count, rank // s_count
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        pp_groups = [dist.new_group([q * s_count + s for s in range(s_count)]) for q in range(k)]
        dp_groups = [dist.new_group([q * s_count + s for q in range(k)]) for s in range(s_count)] if k > 1 else []
        model, x = load_model(cfg["spec"], cfg["microbatch"], cfg["seed"])
        layers = layers_of(model, cfg["spec"])
        xs, ys = _global_batch(model, x, plan.microbatches, cfg["seed"])
        z = x.shape[0]
        sel = _pipeline_samples(plan.microbatches, z, pipe, k, plan.replicas)
        layers_mod = nn.Sequential(OrderedDict((n, layers[n]) for n in plan.stages[stage_index].nodes))
        stage_mod = Recomputed(layers_mod) if plan.recomputes(stage_index) else layers_mod
        denom = float(ys.numel())

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return ((out - target) ** 2).sum() / denom

        sched_ir = make_schedule(plan.schedule, plan.stage_devices(), plan.microbatches, plan.replicas)
        order = pipeline_orders(sched_ir, plan.stage_devices(), plan.replicas)[pipe]
        n_local = len(microbatches_of(pipe, k, plan.microbatches, plan.replicas))
        stage = PipelineStage(stage_mod, stage_index, s_count, torch.device("cpu"), group=pp_groups[pipe])
        sched = _PipelineScheduleRuntime([stage], n_microbatches=n_local, loss_fn=loss_fn, scale_grads=False)
        sched._prepare_schedule_with_comms(order)
        opt = torch.optim.SGD(stage_mod.parameters(), lr=cfg["lr"], momentum=0.9)
        times = []
        for step in range(cfg["warmup"] + cfg["steps"]):
            opt.zero_grad()
            dist.barrier()
            t0 = time.perf_counter()
            first, last = stage_index == 0, stage_index == s_count - 1
            args = (xs[sel],) if first else ()
            kwargs = {"target": ys[sel]} if last else {}
            sched.step(*args, **kwargs)
            if k > 1:  # one all-reduce of all the stage's gradients, flattened (as DDP buckets)
                grads = [prm.grad for prm in stage_mod.parameters() if prm.grad is not None]
                flat = torch._utils._flatten_dense_tensors(grads)
                dist.all_reduce(flat, group=dp_groups[stage_index])
                for g_, new in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                    g_.copy_(new)
            opt.step()
            dist.barrier()
            times.append(time.perf_counter() - t0)
        if pipe == 0:
            # plain arrays: torch's shared-memory tensors would need this process to outlive the read
            results.put(("params", stage_index, {n: t.detach().cpu().numpy().copy()
                                                 for n, t in layers_mod.state_dict().items()}))
        if rank == 0:
            results.put(("times", times))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # report to the parent, which ends the run
        results.put(("error", rank, stage_index, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
        raise SystemExit(1)


def _end_all(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(5)


def run_plan(plan: Plan, cfg: RunConfig) -> dict:
    """Train ``cfg.steps`` iterations (after ``cfg.warmup``); return measured and predicted times."""
    from ..sim import simulate

    model, x = load_model(cfg.spec, plan.graph.meta.get("microbatch"), cfg.seed)
    check_plan_against_model(plan, model, cfg.spec, x.shape[0])
    predicted = simulate(plan, timeline=False).iteration_s
    world = sum(len(s.devices) for s in plan.stages)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    wcfg = {**asdict(cfg), "microbatch": int(x.shape[0])}
    plan_dict = plan.to_dict()
    procs = [ctx.Process(target=_worker, args=(r, world, port, plan_dict, wcfg, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    params: dict[int, dict] = {}
    times: list[float] = []
    deadline = time.time() + cfg.timeout_s
    s_count = plan.num_stages
    errors: dict[int, str] = {}
    try:
        while True:
            try:
                msg = results.get(timeout=0.05)
            except queue_mod.Empty:
                msg = None
            if msg is not None:
                if msg[0] == "error":
                    errors[msg[1]] = msg[3]
                elif msg[0] == "params":
                    params[msg[1]] = msg[2]
                elif msg[0] == "times":
                    times = msg[1]
                continue
            failed = errors or any(p.exitcode not in (None, 0) for p in procs)
            if failed:
                raise PipeplanError(_diagnose(plan, procs, errors, results))
            if all(p.exitcode == 0 for p in procs) and times and len(params) == s_count:
                break
            if time.time() > deadline:
                stuck = [r for r, p in enumerate(procs) if p.exitcode is None]
                r = stuck[0] if stuck else 0
                raise PipeplanError(f"run failed: rank {r} (stage {r % s_count}, device {_device_of(plan, r)}) "
                                    f"did not finish within {cfg.timeout_s:g} s")
    finally:
        _end_all(procs)
    steady = times[cfg.warmup:] or times
    measured = statistics.median(steady)
    out = {"measured_s": measured, "predicted_s": predicted, "error": abs(predicted - measured) / measured,
           "steps": cfg.steps, "warmup": cfg.warmup, "processes": world, "per_step_s": times,
           "schedule": plan.schedule, "replicas": plan.replicas}
    out["_params"] = params
    return out


_PEER_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "Connection refused")


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
    s_count = plan.num_stages

    def who(r: int) -> str:
        return f"rank {r} (stage {r % s_count}, device {_device_of(plan, r)})"

    silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
    if silent:
        return f"run failed: {who(silent[0])} died with exit code {procs[silent[0]].exitcode}"
    own = [r for r, e in sorted(errors.items()) if not any(x in e for x in _PEER_ERRORS)]
    r = own[0] if own else min(errors)
    return f"run failed: {who(r)} raised {errors[r][:300]}"


def _device_of(plan: Plan, rank: int) -> str:
    s_count = plan.num_stages
    return plan.stages[rank % s_count].devices[rank // s_count]


def reference_params(plan: Plan, cfg: RunConfig, microbatch: int) -> dict[str, torch.Tensor]:
    """The same training in one process: same model, seed, global batch, loss and optimizer."""
    torch.set_num_threads(cfg.threads)
    model, x = load_model(cfg.spec, microbatch, cfg.seed)
    xs, ys = _global_batch(model, x, plan.microbatches, cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    for _ in range(cfg.warmup + cfg.steps):
        opt.zero_grad()
        loss = ((model(xs) - ys) ** 2).sum() / float(ys.numel())
        loss.backward()
        opt.step()
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def max_rel_diff(staged: dict[int, dict], ref: dict[str, torch.Tensor]) -> float:
    worst = 0.0
    for stage_params in staged.values():
        for name, t in stage_params.items():
            t = torch.as_tensor(t)
            r = ref[name]
            scale = float(r.abs().max()) or 1.0
            worst = max(worst, float((t - r).abs().max()) / scale)
    return worst
