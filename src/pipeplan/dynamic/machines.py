"""The machines placements are studied on: a simulated one from a spec (``cpu+4gpu``: §8.2's
one CPU and four A100s) with this machine's CPU calibrated, or the real devices named on the
command line, each device kind calibrated and each link timed (Fig. 7's measurement).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch

from ..errors import PipeplanError
from .costmodel import DeviceSpec, Machine, calibrate, machine, profile, simulate
from .executor import Executor, torch_device
from .trees import Tree

_PART = re.compile(r"^(\d*)(cpu|gpu)$")


def parse_simulated(spec: str) -> tuple[int, int]:
    """``cpu+4gpu`` -> (1 logical CPU, 4 GPUs); ``2cpu`` -> (2, 0). One line on a bad spec."""
    cpus = gpus = 0
    for part in spec.split("+"):
        m = _PART.match(part.strip())
        if not m:
            raise PipeplanError(f"--simulated {spec!r}: expected parts like cpu, 2cpu, 4gpu joined by '+'")
        k = int(m.group(1) or 1)
        if m.group(2) == "cpu":
            cpus += k
        else:
            gpus += k
    if cpus < 1:
        raise PipeplanError(f"--simulated {spec!r}: the machine needs a CPU (device 0)")
    if cpus + gpus > 16:
        raise PipeplanError(f"--simulated {spec!r}: at most 16 devices")
    return cpus, gpus


@lru_cache(maxsize=1)
def this_cpu() -> DeviceSpec:
    """This machine's CPU, calibrated once a process (``costmodel.calibrate``)."""
    return calibrate()[0]


def simulated(spec: str, cpu: DeviceSpec | None = None) -> Machine:
    """The machine of ``spec`` with ``cpu`` (default: this machine's CPU, ``this_cpu``)."""
    cpus, gpus = parse_simulated(spec)
    cpu = cpu or this_cpu()
    m = machine(cpu, gpus=gpus, logical_cpus=cpus)
    m.note = f"simulated {spec}: CPU calibrated on this machine, GPUs A100 (assumed figures)"
    return m


def transfer_seconds(src: str, dst: str, numel: int = 1_000_000, repeats: int = 20) -> float:
    """Mean seconds to move a float tensor of ``numel`` elements from ``src`` to ``dst`` (Fig. 7:
    1000 x 1000 floats), synchronized on both ends."""
    a, b = torch_device(src), torch_device(dst)
    x = torch.randn(numel, device=a)
    _sync(a, b)
    x.to(b)  # warm-up
    _sync(a, b)
    t0 = time.perf_counter()
    for _ in range(repeats):
        x.to(b)
    _sync(a, b)
    return (time.perf_counter() - t0) / repeats


def _sync(*devices: torch.device) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def measured(devices: list[str]) -> Machine:
    """A cost model of the real ``devices``: every CPU device (``cpu``, ``cpu:K``) is this
    machine's calibrated CPU; CUDA devices are calibrated the same way on the device; a link
    between distinct memories is timed at two sizes (latency and bandwidth by a line through
    them); logical CPU devices share memory."""
    cpu = this_cpu()
    specs = []
    for name in devices:
        t = torch_device(name)
        spec = cpu if t.type == "cpu" else calibrate(t)[0]
        specs.append(DeviceSpec(name, spec.op_s, spec.flop_rate, spec.element_rate))
    n = len(devices)
    lat, bw = np.zeros((n, n)), np.full((n, n), np.inf)
    for i in range(n):
        for j in range(n):
            if i != j and torch_device(devices[i]) != torch_device(devices[j]):
                small, big = (transfer_seconds(devices[i], devices[j], k) for k in (256, 1_000_000))
                bw[i, j] = (1_000_000 - 256) * 4 / max(big - small, 1e-9)
                lat[i, j] = max(small - 256 * 4 / bw[i, j], 0.0)
    return Machine(specs, lat, bw, note=f"measured on {', '.join(devices)}")


def executor_overhead(ex: Executor, net: str, width: int, trees: list[Tree], m: Machine, repeats: int = 5) -> float:
    """Seconds the executor adds to every node part beyond the cost model's compute (thread
    hand-overs, Python), from ``trees`` run all on device 0: the median over trees of
    (measured - modelled) / parts, at least 0."""
    extra = []
    base = replace(m, part_overhead_s=0.0)
    for t in trees:
        p = profile(t, net, width)
        parts = t.n * (1 if p.output is None else 2)
        extra.append((ex.time(t, [0] * t.n, repeats) - simulate(p, [0] * t.n, base)) / parts)
    return max(0.0, float(np.median(extra)))
