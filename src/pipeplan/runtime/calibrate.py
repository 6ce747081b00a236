"""Measure this machine as a pipeplan Cluster: worker speeds and loopback links.

``calibrate`` spawns ``workers`` processes joined by ``torch.distributed`` (gloo on CPU, NCCL
between GPUs; rendezvous in a private file, data over loopback only: ``rendezvous.py``), each
with ``torch.set_num_threads(threads)``.

Compute: every worker times a fixed training benchmark (an MLP of 512x512 fp32 Linear+ReLU
layers, forward+backward of a 64-row batch; larger on a GPU) while ALL workers run at once,
so contention for cores and memory bandwidth is in the figure. The reference is the same
benchmark in ONE process (this one) with ``profile_threads`` threads, i.e. the conditions
of ``pipeplan profile --threads``: ``speed_i = t_reference / t_worker_i``. A profile taken with
``threads=T`` and workers running with ``threads=T`` agree (the default); if the profile used
a different thread count, pass it as ``profile_threads`` and the speed ratio accounts for it.

Links: ping-pong between every pair of workers (rank 0 and each other one beyond
``_ALL_PAIRS_UP_TO`` workers; other pairs then get the slower of their two links to rank 0),
with a 4-byte message for latency and a large one (16 MiB, 64 MiB on GPUs) for bandwidth:
one-way time = round trip / 2 (median), ``bandwidth = bytes / (one-way(large) - latency)``.

``seconds`` is the length of each compute phase (reference, then all workers together).
Workers are always joined or killed before ``calibrate`` returns or raises.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
import yaml
from torch import nn

from ..cluster.build import CALIBRATED
from ..cluster.collectives import latency_steps
from ..cluster.model import Cluster, Device
from ..errors import PipeplanError
from ..limits import MAX_CALIBRATION_S
from ..plan import Plan, Stage
from .models import user_code
from .launch import Failure, Worker, launch
from .steps import MOMENTUM, allreduce_tensors

_SMALL = 4
#: The longest compute measurement (``seconds``) and the most worker processes a CPU core
#: (without ``force``): calibration ends, and does not start processes until the system's limit.
WORKERS_PER_CORE = 4
_ALL_PAIRS_UP_TO = 8
_SMALL_REPS, _LARGE_REPS, _WARMUP = 100, 8, 3


def _bench_shape(device: str) -> tuple[int, int]:
    """(width, batch) of the benchmark MLP."""
    return (4096, 2048) if device == "cuda" else (512, 64)


def benchmark_description(device: str) -> str:
    width, batch = _bench_shape(device)
    return f"4 x (Linear({width}, {width}) + ReLU), batch {batch}, fp32, forward+backward"


class _Bench(NamedTuple):
    times: list[float]  # forward and backward, per iteration
    update_rates: list[float]  # the optimizer step after each, seconds per parameter byte
    param_bytes: int  # of the benchmark model's trained parameters


def _bench(dev: torch.device, seconds: float, start_barrier: Any = None,
           model_spec: str | None = None) -> _Bench:
    """Per-iteration times of the benchmark (a fixed MLP, or one microbatch of ``model_spec``)
    forward and backward, and of the optimizer step that follows each (the executor's SGD
    with momentum, timed apart), run for about ``seconds``."""
    torch.manual_seed(0)
    if model_spec:
        from .models import load_model

        model, x = load_model(model_spec)
        model, x = model.to(dev), x.to(dev)
    else:
        width, batch = _bench_shape(dev.type)
        model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())]).to(dev)
        x = torch.randn(batch, width, device=dev)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-6, momentum=MOMENTUM)
    nbytes = sum(p.numel() * p.element_size() for p in params)

    def sync() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        t1 = sync()
        opt.step()
        return t1 - t0, (sync() - t1) / nbytes

    for _ in range(_WARMUP):
        step()
    if start_barrier is not None:
        start_barrier()
    times: list[tuple[float, float]] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        times.append(step())
    return _Bench([t for t, _ in times], [u for _, u in times], nbytes)


def _allreduce_times(large: int, dev: torch.device) -> list[float]:
    """One all-reduce of ``large`` bytes in 8 tensors over every worker, as the executor
    sums gradients (``steps.allreduce_tensors``: flattened, then copied back); timed on
    each worker from the barrier before it."""
    import torch.distributed as dist

    grads = [torch.zeros(large // 32, device=dev) for _ in range(8)]
    out = []
    for _ in range(2 + _LARGE_REPS):
        dist.barrier()
        t0 = time.perf_counter()
        allreduce_tensors(grads)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        out.append(time.perf_counter() - t0)
    return out[2:]


def _pairs(workers: int) -> list[tuple[int, int]]:
    if workers <= _ALL_PAIRS_UP_TO:
        return [(a, b) for a in range(workers) for b in range(a + 1, workers)]
    return [(0, b) for b in range(1, workers)]


def _ping_pong(rank: int, a: int, b: int, nbytes: int, reps: int, dev: torch.device) -> list[float]:
    """Round trips a -> b -> a of ``nbytes``; rank a returns their one-way times (halves)."""
    import torch.distributed as dist

    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=dev)
    peer = b if rank == a else a
    out = []
    for i in range(_WARMUP + reps):
        t0 = time.perf_counter()
        if rank == a:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= _WARMUP:
            out.append((time.perf_counter() - t0) / 2)
    return out if rank == a else []


def _worker(ctx: Worker, device: str, seconds: float, model_spec: str | None, large: int) -> dict:
    """One calibration process: compute phase with all workers, then its ping-pongs."""
    import torch.distributed as dist

    rank, world = ctx.rank, ctx.world
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    ctx.progress("computing with every worker", 1)
    shared = _bench(dev, seconds, start_barrier=dist.barrier, model_spec=model_spec)
    solo: list[float] = []
    for r in range(world):  # each worker alone: no contention from the others
        ctx.progress(f"worker {r} computing alone", 2 + r)
        dist.barrier()
        if rank == r:
            solo = _bench(dev, seconds / 2, model_spec=model_spec).times
    dist.barrier()
    # the collective's size: the model's gradients where it is given (its efficiency
    # depends on the size), else the large message of the links
    ar_bytes = shared.param_bytes if model_spec else large
    ctx.progress("all-reduce", world + 2)
    allreduce = _allreduce_times(ar_bytes, dev) if world > 1 else []
    dist.barrier()  # links are measured only once every worker has stopped computing
    links = {}
    for i, (a, b) in enumerate(_pairs(world)):
        ctx.progress(f"link {a}-{b}", world + 3 + i)
        if rank in (a, b):
            small = _ping_pong(rank, a, b, _SMALL, _SMALL_REPS, dev)
            big = _ping_pong(rank, a, b, large, _LARGE_REPS, dev)
            if rank == a:
                links[(a, b)] = (small, big)
        dist.barrier()
    return {"compute_s": shared.times, "solo_s": solo, "links": links, "allreduce_s": allreduce,
            "update_s_per_byte": statistics.median(shared.update_rates), "allreduce_bytes": ar_bytes}


def default_workers(device: str) -> int:
    """The workers calibrate starts unless told: a GPU each, else two CPU processes."""
    return torch.cuda.device_count() if device == "cuda" else 2


def worker_steps(workers: int) -> int:
    """The steps each calibration worker reports (``_worker``): computing together, each one
    alone, the all-reduce, each link."""
    return workers + 2 + len(_pairs(workers))


def _error_text(e: BaseException) -> str:
    """The error's first line and where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    line = (str(e).strip().splitlines() or [""])[0]
    at = f" at {os.path.basename(where.filename)}:{where.lineno}" if where else ""
    return f"{type(e).__name__}: {line}{at}"


def _host_memory() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _run_workers(workers: int, device: str, threads: int, seconds: float, large: int,
                 model_spec: str | None = None, on_progress: Callable | None = None) -> dict[int, dict]:
    """Spawn the workers and collect one result per rank; no process survives this call."""
    return launch(_worker, workers, (device, seconds, model_spec, large), diagnose=_diagnose,
                  backend="nccl" if device == "cuda" else "gloo", threads=threads,
                  join_timeout=timedelta(seconds=120), timeout_s=120 + 3 * seconds + 10 * len(_pairs(workers)),
                  error_text=_error_text, name="pipeplan-calibrate", on_progress=on_progress)


def _diagnose(failure: Failure) -> str:
    """A calibration worker's failure in words."""
    if failure.kind == "died":
        return f"calibration worker rank {failure.rank} died (exit code {failure.exitcode})"
    if failure.kind == "raised":
        return f"calibration worker rank {failure.rank} failed: {failure.text}"
    missing = ", ".join(map(str, failure.pending))
    return f"calibration timed out: worker rank(s) {missing} did not report"


def _links(got: dict, workers: int, large: int) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Bandwidth and latency matrices from the ping-pongs (pairs measured only through rank 0
    get the slower of their two links to it), and the raw figures per pair."""
    med = statistics.median
    bw = np.full((workers, workers), np.nan)
    lat = np.full((workers, workers), np.nan)
    links = []
    for r in range(workers):
        for (a, b), (small, big) in got[r]["links"].items():
            latency, one_way = med(small), med(big)
            transfer = one_way - latency if one_way > latency else one_way  # noise guard
            bw[a, b] = bw[b, a] = large / transfer
            lat[a, b] = lat[b, a] = latency
            links.append({"pair": [a, b], "small_bytes": _SMALL, "small_one_way_s": small,
                          "large_bytes": large, "large_one_way_s": big,
                          "latency_s": latency, "bandwidth_Bps": large / transfer})
    for a in range(workers):
        for b in range(workers):
            if a != b and math.isnan(bw[a, b]):
                bw[a, b] = min(bw[0, a], bw[0, b])
                lat[a, b] = max(lat[0, a], lat[0, b])
    np.fill_diagonal(bw, np.inf)  # a worker to itself: no link
    np.fill_diagonal(lat, 0.0)
    return bw, lat, links


def _check_request(workers: int, device: str, threads: int, profile_threads: int, seconds: float,
                   force: bool) -> None:
    """Refuse, before any measurement, what cannot be measured or would not end."""
    if workers < 1 or threads < 1 or profile_threads < 1:
        raise PipeplanError(f"calibrate: need workers >= 1 and threads >= 1 (got {workers}, {threads}, "
                            f"{profile_threads})")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_CALIBRATION_S):
        raise PipeplanError(f"calibrate: --seconds (each measurement's length) must be > 0 and at most "
                            f"{MAX_CALIBRATION_S:g}, got {seconds:g}")
    if device == "cuda" and workers > torch.cuda.device_count():
        raise PipeplanError(f"calibrate: {workers} workers but only {torch.cuda.device_count()} GPUs")
    cores = os.cpu_count() or 1
    if device == "cpu" and workers > WORKERS_PER_CORE * cores and not force:
        raise PipeplanError(f"calibrate: {workers:,} worker processes on {cores} CPU cores; at most "
                            f"{WORKERS_PER_CORE * cores:,} ({WORKERS_PER_CORE} a core) unless --force")


def calibrate(workers: int | None = None, device: str = "cpu", threads: int = 1, seconds: float = 2.0,
              profile_threads: int | None = None, model_spec: str | None = None,
              predict: Callable[[Plan], float] | None = None, force: bool = False,
              on_progress: Callable | None = None) -> tuple[Cluster, dict]:
    """Measure ``workers`` local processes; returns the Cluster and the raw measurements.
    With ``model_spec`` the compute benchmark is that model's own training step, so the
    measured contention between workers is that of the workload to be planned. ``predict``
    (a plan's predicted seconds per iteration, the simulator's: the caller's, so that the
    runtime never imports it): the executor's overhead per action is measured against it too
    (``runtime_overhead``; CPU workers only). ``force``: more than ``WORKERS_PER_CORE``
    processes a CPU core. ``on_progress``: the workers' progress (``launch.Progress``; their
    steps are ``worker_steps``)."""
    if device not in ("cpu", "cuda"):
        raise PipeplanError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise PipeplanError("--device cuda: no CUDA device")
    if workers is None:
        workers = default_workers(device)
    profile_threads = threads if profile_threads is None else profile_threads
    _check_request(workers, device, threads, profile_threads, seconds, force)
    large = (64 if device == "cuda" else 16) * 2**20

    old = torch.get_num_threads()
    torch.set_num_threads(profile_threads)
    try:
        # a user's model runs here first, in this process: whatever it raises (sys.exit too) is one line
        with user_code(model_spec, "benchmarking its training step") if model_spec else nullcontext():
            reference = _bench(torch.device("cuda", 0) if device == "cuda" else torch.device("cpu"), seconds,
                               model_spec=model_spec).times
    finally:
        torch.set_num_threads(old)
    got = _run_workers(workers, device, threads, seconds, large, model_spec, on_progress)

    med = statistics.median
    t_ref = med(reference)
    t_workers = [med(got[r]["compute_s"]) for r in range(workers)]
    t_solo = [med(got[r]["solo_s"]) for r in range(workers)]
    if device == "cpu" and threads == profile_threads:
        # A worker alone is the profiling process (same machine, same threads): its speed is 1
        # by construction, and t_ref / t_solo would only add the machine's drift between the
        # two measurements. Contention is the ratio measured inside each worker, close in time.
        solo_speeds = [1.0] * workers
    else:
        solo_speeds = [t_ref / t for t in t_solo]
    speeds = [min(s, s * ts / tc) for s, ts, tc in zip(solo_speeds, t_solo, t_workers)]
    bw, lat, links = _links(got, workers, large)
    if device == "cuda":
        memory = [float(torch.cuda.get_device_properties(r).total_memory) for r in range(workers)]
    else:
        memory = [_host_memory() / workers] * workers
    kind = "GPU" if device == "cuda" else "CPU"
    devices = [Device(name=f"worker{r}", kind=kind, memory=memory[r], speed=speeds[r], server="localhost",
                      solo_speed=solo_speeds[r])
               for r in range(workers)]
    meta = {"source": "pipeplan calibrate", "device": device, "threads": threads,
            "profile_threads": profile_threads, "benchmark_model": model_spec or "built-in MLP"}
    if workers > 1:
        # all-reduce: 2(k-1)/k x bytes cross the slowest link; its measured time against
        # what the point-to-point bandwidth predicts is the collective's efficiency
        # (less its latency term, so that sim.formulas.allreduce_time gives back the measured time)
        off = np.eye(workers) > 0
        t_ar = med(got[0]["allreduce_s"]) - latency_steps("all_reduce", workers) * float(np.max(np.where(off, 0.0, lat)))
        ideal = 2 * (workers - 1) / workers * got[0]["allreduce_bytes"] / float(np.nanmin(np.where(off, np.nan, bw)))
        meta["allreduce_efficiency"] = min(1.0, ideal / t_ar) if t_ar > 0 else 1.0
    # the optimizer step on the workers, all at once, after a backward: the slowest worker's
    meta["update_s_per_byte"] = max(got[r]["update_s_per_byte"] for r in range(workers))
    cluster = Cluster("localhost", devices, bw, lat, meta=meta)
    if predict is not None and workers >= 2 and device == "cpu":
        meta["action_overhead_s"] = runtime_overhead(cluster, predict, threads)
        cluster = Cluster("localhost", devices, bw, lat, meta=meta)
    measurements = {**meta, "workers": workers, "seconds": seconds, "torch": torch.__version__,
                    "benchmark": benchmark_description(device),
                    "reference_s": t_ref, "reference_times_s": reference,
                    "worker_s": t_workers, "worker_times_s": [got[r]["compute_s"] for r in range(workers)],
                    "speed": speeds, "solo_speed": solo_speeds, "links": sorted(links, key=lambda x: x["pair"]),
                    "allreduce_s": got[0]["allreduce_s"]}
    return cluster, measurements


def runtime_overhead(cluster: Cluster, predict: Callable[[Plan], float], threads: int = 1, microbatches: int = 8,
                     steps: int = 6) -> float:
    """Seconds of framework work per compute action of the executor (pipelining's bookkeeping,
    P2P set-up, autograd around each stage call), measured by running a 2-stage 1F1B plan of
    a model with negligible compute (``example:tiny``) for real: (measured - simulated) /
    the actions on a device's path ((M + 1) per stage and pass)."""
    from .executor import RunConfig, run_plan
    from .profiler import profile_model

    graph = profile_model("example:tiny", reps=5, threads=threads)
    half = len(graph.ids) // 2
    names = cluster.names[:2]
    plan = Plan(graph, cluster, [Stage(graph.ids[:half], names[:1]), Stage(graph.ids[half:], names[1:2])],
                microbatches, schedule="1f1b")
    out = run_plan(plan, RunConfig("example:tiny", steps=steps, warmup=2, threads=threads, device="cpu"))
    actions = 2 * (microbatches + 1)
    return max(0.0, (out.measured_s - predict(plan)) / actions)


def cluster_to_yaml(cluster: Cluster) -> str:
    """The cluster in the YAML schema of :func:`pipeplan.cluster.load_cluster`: explicit devices
    and one link per pair (bandwidth in bytes/s, latency in s, floats written exactly)."""
    v = len(cluster)
    off = ~np.eye(v, dtype=bool)
    if not np.isfinite(cluster.bandwidth[off]).all():
        raise PipeplanError(f"cluster {cluster.name!r}: cannot write an infinite bandwidth between devices")
    devices = [{"name": d.name, "kind": d.kind, "memory": float(d.memory), "speed": float(d.speed),
                "server": d.server, **({"solo_speed": float(d.solo_speed)} if d.solo_speed else {})}
               for d in cluster.devices]
    links: list[dict] = []
    for a in range(v):
        for b in range(a + 1, v):
            fwd = (float(cluster.bandwidth[a, b]), float(cluster.latency[a, b]))
            back = (float(cluster.bandwidth[b, a]), float(cluster.latency[b, a]))
            names = cluster.devices[a].name, cluster.devices[b].name
            if fwd == back:
                links.append({"from": names[0], "to": names[1], "bandwidth": fwd[0], "latency": fwd[1]})
            else:
                links.append({"from": names[0], "to": names[1], "bandwidth": fwd[0], "latency": fwd[1],
                              "directed": True})
                links.append({"from": names[1], "to": names[0], "bandwidth": back[0], "latency": back[1],
                              "directed": True})
    top: dict = {"name": cluster.name, "devices": devices, "links": links}
    for key in CALIBRATED:
        if key in cluster.meta:
            top[key] = float(cluster.meta[key])
    body = yaml.safe_dump(top,
                          sort_keys=False, default_flow_style=None, width=120)
    return "# pipeplan cluster: memory in bytes, bandwidth in bytes/s, latency in seconds\n" + body
