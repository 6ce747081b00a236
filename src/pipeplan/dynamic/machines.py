"""The machines placements are studied on: a simulated one from a spec (``cpu+4gpu``: §8.2's
one CPU and four A100s) with this machine's CPU calibrated once and kept in a machine model
file (JSON) that every later run and every checkpoint trained on it shares, so that simulated
results repeat; or the real devices named on the command line, each device kind calibrated
and each link timed (Fig. 7's measurement).
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from dataclasses import replace
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import PipeplanError
from ..readers import load_json, regular_file
from .simulator import DeviceSpec, Machine, calibrate, machine, profile, simulate
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
    """This machine's CPU, calibrated once a process (``sim.formulas.calibrate``), for the cost
    model of real devices measured now."""
    return calibrate()[0]


# ----------------------------------------------------------------------------- machine models
#: where ``pipeplan dynamic`` keeps the simulated machine's CPU between runs (relative to the
#: current directory), measured on first use
DEFAULT_MACHINE = Path("out") / "dynamic-machine.json"
MACHINE_FORMAT = "pipeplan.dynamic-machine/1"
_RATES = ("op_s", "flop_rate", "element_rate")


def calibrated_model() -> dict:
    """This machine's CPU calibrated now, as a machine model: what the simulator charges,
    when and where it was measured, and each part's fit (``sim.formulas.calibrate``)."""
    spec, fit = calibrate()
    return {"format": MACHINE_FORMAT,
            "about": "this CPU as pipeplan's DynPartition simulator charges it (docs/dynpartition.md); "
                     "delete this file to measure again",
            "cpu": {k: getattr(spec, k) for k in _RATES},
            "measured": {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
                         "processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                         "torch": torch.__version__, "threads": fit["threads"]},
            "parts": fit["parts"]}


def model_cpu(model: Any, where: str) -> DeviceSpec:
    """The CPU of a machine model (a file's or a checkpoint's); one line if it is not one."""
    cpu = model.get("cpu") if isinstance(model, dict) and model.get("format") == MACHINE_FORMAT else None
    if not isinstance(cpu, dict):
        raise PipeplanError(f"{where}: not a pipeplan machine model (format {MACHINE_FORMAT})")
    for key in _RATES:
        value = cpu.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise PipeplanError(f"{where}: cpu {key!r} must be a positive number, got {value!r}")
    return DeviceSpec("cpu", *(float(cpu[k]) for k in _RATES))


def machine_model(path: str | Path) -> tuple[dict, bool]:
    """The machine model in the file ``path``, or, where there is none, this CPU calibrated
    now (True: to be written there, so that later runs share it)."""
    if not os.path.lexists(path):
        return calibrated_model(), True
    model = load_json(regular_file(path, "--machine"), "--machine")
    model_cpu(model, f"--machine {path}")
    return model, False


def model_text(model: dict) -> str:
    return json.dumps(model, indent=1) + "\n"


def shared_model(path: str | Path = DEFAULT_MACHINE) -> dict:
    """``machine_model(path)``, written there when it was measured now (the benchmarks')."""
    model, new = machine_model(path)
    if new:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(model_text(model))
    return model


def simulated(spec: str, model: dict) -> Machine:
    """The machine of ``spec`` with the CPU of the machine ``model``."""
    cpus, gpus = parse_simulated(spec)
    m = machine(model_cpu(model, "machine model"), gpus=gpus, logical_cpus=cpus)
    at = model.get("measured") if isinstance(model.get("measured"), dict) else {}
    m.note = (f"simulated {spec}: CPU as measured on {at.get('host', '?')} at {at.get('at', '?')}, "
              "GPUs A100 (assumed figures)")
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
