"""A device cost model of dynamic tree networks (dynpartition.txt §2: "the computational
capability of each GPU ... the time of running the forward pass in each module and the
overhead of transferring data across devices"), so that placements on machines we do not
have (§8.2's 1 CPU + 4 GPUs) can be studied, and a simulator of one tree or a stream of trees.

A node part (a node's state or output computation) is described by what it asks of a device:
``ops`` (kernels launched), ``flops`` (of its matrix products) and ``elements`` (written by
its other kernels). On device d it takes

    ops x op_s[d] + flops / flop_rate[d] + elements / element_rate[d]

and a state sent from device a to b takes ``latency[a, b] + bytes / bandwidth[a, b]``.
The CPU's three numbers are fitted to measurements on this machine (``calibrate``); the
GPUs' are the published figures in ``GPU_A100`` (docs/dynpartition.md).

``simulate`` runs the placement as the executor does: a part starts when its inputs have
arrived and its device is free; a device takes the waiting parts in the order they became
ready (ties: the lower node first).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..errors import PipeplanError
from .nets import MathFunc, TreeLSTM, build_net
from .trees import FUNCTION_NAMES, Tree


@dataclass(frozen=True)
class DeviceSpec:
    """What a device charges: seconds per kernel, matrix FLOP/s, elementwise elements/s."""

    name: str
    op_s: float
    flop_rate: float
    element_rate: float

    def seconds(self, ops: float, flops: float, elements: float) -> float:
        return ops * self.op_s + flops / self.flop_rate + elements / self.element_rate


#: an A100 under eager PyTorch (assumptions, docs/dynpartition.md): ~8 us to dispatch and launch a
#: small kernel, 19.5 TFLOP/s FP32 peak at 60% for small products, 1.55 TB/s HBM at 70% over
#: a read and a write of 4-byte elements
GPU_A100 = dict(op_s=8e-6, flop_rate=0.6 * 19.5e12, element_rate=0.7 * 1.555e12 / 8)
#: PCIe 4 x16 host<->device: ~12 GB/s achieved from pageable memory, ~10 us per copy; GPU<->GPU
#: 2.2x faster (the paper's Fig. 7, 1000x1000 floats)
PCIE = (10e-6, 12e9)
GPU_TO_GPU = (10e-6, 2.2 * 12e9)


@dataclass
class Machine:
    """Devices and the links between them (``latency``/``bandwidth`` D x D; a device to itself
    and logical CPU devices to one another share memory: no cost)."""

    devices: list[DeviceSpec]
    latency: np.ndarray
    bandwidth: np.ndarray
    note: str = ""
    part_overhead_s: float = 0.0  # the executor's own time per node part (``executor_overhead``)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def transfer_s(self, a: int, b: int, nbytes: int) -> float:
        if a == b or self.bandwidth[a, b] == np.inf:
            return 0.0
        return float(self.latency[a, b] + nbytes / self.bandwidth[a, b])


def machine(cpu: DeviceSpec, gpus: int = 0, logical_cpus: int = 1) -> Machine:
    """``logical_cpus`` copies of this machine's CPU (``cpu``, ``cpu:1``...) and ``gpus`` A100s."""
    devs = [DeviceSpec("cpu" if k == 0 else f"cpu:{k}", cpu.op_s, cpu.flop_rate, cpu.element_rate)
            for k in range(logical_cpus)]
    devs += [DeviceSpec(f"cuda:{k}", **GPU_A100) for k in range(gpus)]
    n = len(devs)
    lat, bw = np.zeros((n, n)), np.full((n, n), np.inf)
    for a in range(n):
        for b in range(n):
            ga, gb = devs[a].name.startswith("cuda"), devs[b].name.startswith("cuda")
            if a != b and (ga or gb):
                lat[a, b], bw[a, b] = GPU_TO_GPU if ga and gb else PCIE
    return Machine(devs, lat, bw)


# ----------------------------------------------------------------------------- node profiles
class _Count(TorchDispatchMode):
    """Counts kernels and the elements written by those that are not matrix products."""

    MATMULS = {"mm", "addmm", "bmm", "matmul", "linear"}

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("detach", "view", "_unsafe_view", "t", "split", "chunk", "slice", "select", "alias",
                    "lift_fresh", "expand", "unsqueeze"):
            return out  # views launch no kernel
        self.ops += 1
        if name not in self.MATMULS:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.elements += t.numel()
        return out


def _measure_part(fn) -> tuple[int, float, int]:
    counter, flops = _Count(), FlopCounterMode(display=False)
    with flops, counter:
        fn()
    return counter.ops, float(flops.get_total_flops()), counter.elements


@dataclass(frozen=True)
class PartCost:
    ops: int
    flops: float
    elements: int


@lru_cache(maxsize=64)
def node_kinds(net: str, width: int) -> dict[str, PartCost]:
    """What each kind of node part asks of a device, counted on one CPU run: TreeLSTM
    ``leaf``, ``inner``, ``output``; MathFunc ``input`` (a lookup: nothing) and each function."""
    model = build_net(net, width)
    out: dict[str, PartCost] = {"input": PartCost(0, 0.0, 0)} if isinstance(model, MathFunc) else {}
    with torch.no_grad():
        for kind, call in _calls(model):
            out[kind] = PartCost(*_measure_part(call))
    return out


def _calls(model):
    """(kind, zero-argument call) for every kind of node part of ``model``."""
    if isinstance(model, TreeLSTM):
        leaf, pair = Tree(((),), (1,)), Tree(((), (), (0, 1)), (1, 2, -1))
        s = model.state(leaf, 0, [])
        return [("leaf", lambda: model.state(leaf, 0, [])), ("inner", lambda: model.state(pair, 2, [s, s])),
                ("output", lambda: model.output(s))]
    x, out = model.inputs[0], []
    for f, name in enumerate(FUNCTION_NAMES):
        arity = 2 if name in ("add", "sub", "mul") else 1
        t = Tree(tuple([()] * arity + [tuple(range(arity))]), tuple([0] * arity + [f]))
        out.append((name, lambda t=t, a=arity: model.state(t, a, [x] * a)))
    return out


@dataclass
class TreeProfile:
    """Per node: the state part's and output part's costs, and the bytes of a state."""

    state: np.ndarray            # (n, 3): ops, flops, elements
    output: np.ndarray | None    # (n, 3) or None (MathFunc)
    state_bytes: int             # a state, sent to the parent
    output_bytes: int            # what an output part reads of its node's state
    children: tuple[tuple[int, ...], ...] = field(repr=False)
    parents: np.ndarray = field(repr=False, default=None)


@lru_cache(maxsize=64)
def _net_bytes(net: str, width: int) -> tuple[int, int]:
    model = build_net(net, width)
    return model.state_bytes(), model.output_bytes()


def profile(tree: Tree, net: str, width: int) -> TreeProfile:
    kinds = node_kinds(net, width)
    state_bytes, output_bytes = _net_bytes(net, width)
    rows, outs = [], None
    for i, ch in enumerate(tree.children):
        if net == "treelstm":
            k = kinds["inner" if ch else "leaf"]
        else:
            k = kinds[FUNCTION_NAMES[tree.labels[i]] if ch else "input"]
        rows.append((k.ops, k.flops, k.elements))
    if net == "treelstm":
        o = kinds["output"]
        outs = np.tile([o.ops, o.flops, o.elements], (tree.n, 1)).astype(float)
    return TreeProfile(np.array(rows, dtype=float), outs, state_bytes, output_bytes, tree.children, tree.parent)


# ----------------------------------------------------------------------------- simulation
def part_seconds(prof_rows: np.ndarray, dev: DeviceSpec) -> np.ndarray:
    return prof_rows @ np.array([dev.op_s, 1 / dev.flop_rate, 1 / dev.element_rate])


def simulate_jobs(jobs: list[tuple[TreeProfile, list[int], list[int] | None, float]], m: Machine) -> np.ndarray:
    """Seconds from arrival to finish of each job ``(profile, placement, output placement or
    None, arrival s)``, the jobs sharing the machine's devices."""
    D = len(m.devices)
    costs = [np.stack([part_seconds(p.state, d) for d in m.devices], axis=1) for p, *_ in jobs]
    out_costs = [None if p.output is None else np.stack([part_seconds(p.output, d) for d in m.devices], axis=1)
                 for p, *_ in jobs]
    free = np.zeros(D)
    heap: list[tuple[float, int, int, int, int]] = []  # (ready, job, part kind 0 state / 1 output, node, device)
    waiting = [[len(ch) for ch in p.children] for p, *_ in jobs]
    arrived = [[0.0] * len(p.children) for p, *_ in jobs]
    finish = np.zeros(len(jobs))
    for j, (p, place, _, t0) in enumerate(jobs):
        for i, ch in enumerate(p.children):
            if not ch:
                heapq.heappush(heap, (t0, j, 0, i, place[i]))
            arrived[j][i] = t0
    while heap:
        ready, j, part, i, d = heapq.heappop(heap)
        p, place, out_place, _ = jobs[j]
        cost = (costs[j][i, d] if part == 0 else out_costs[j][i, d]) + m.part_overhead_s
        end = max(ready, free[d]) + cost
        free[d] = end
        finish[j] = max(finish[j], end)
        if part == 1:
            continue
        if out_costs[j] is not None:
            o = place[i] if out_place is None else out_place[i]
            heapq.heappush(heap, (end + m.transfer_s(d, o, p.output_bytes), j, 1, i, o))
        parent = int(p.parents[i])
        if parent >= 0:
            arrived[j][parent] = max(arrived[j][parent], end + m.transfer_s(d, place[parent], p.state_bytes))
            waiting[j][parent] -= 1
            if waiting[j][parent] == 0:
                heapq.heappush(heap, (arrived[j][parent], j, 0, parent, place[parent]))
    return finish - np.array([t0 for *_, t0 in jobs])


def simulate(prof: TreeProfile, placement, m: Machine, output_placement=None) -> float:
    """Predicted seconds of one tree's forward pass with ``placement``."""
    place = [int(x) for x in placement]
    if len(place) != len(prof.children) or min(place) < 0 or max(place) >= len(m.devices):
        raise PipeplanError(f"placement of {len(place)} nodes onto {len(m.devices)} devices does not fit a "
                            f"tree of {len(prof.children)} nodes")
    return float(simulate_jobs([(prof, place, output_placement, 0.0)], m)[0])


# ----------------------------------------------------------------------------- calibration
def _time_part(fn, repeats: int, device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up
    best = np.inf
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / repeats)
    return float(best)


def calibrate(device: torch.device | str = "cpu", widths: dict[str, tuple[int, ...]] | None = None,
              repeats: int = 50) -> tuple[DeviceSpec, dict]:
    """A device as a ``DeviceSpec``: every kind of node part of both networks is timed on it
    at several widths (the best of 3 means of ``repeats`` calls; on CPU with one intra-op
    thread, what each logical CPU device's work gets) and ``op_s``, ``1/flop_rate`` and
    ``1/element_rate`` are fitted by non-negative least squares on relative errors. Returns
    the spec and each part's measured and modelled seconds."""
    from scipy.optimize import nnls

    device = torch.device(device)
    widths = widths or {"treelstm": (32, 150, 512, 1024), "mathfunc": (1, 10_000, 100_000, 1_000_000)}
    rows, seconds, names = [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for net, ws in widths.items():
                for w in ws:
                    kinds = node_kinds(net, w)
                    for kind, fn in _calls(build_net(net, w).to(device)):
                        cost = kinds[kind]
                        rows.append((cost.ops, cost.flops, cost.elements))
                        seconds.append(_time_part(fn, repeats, device))
                        names.append(f"{net}/{w}/{kind}")
    finally:
        torch.set_num_threads(threads)
    a, b = np.array(rows, dtype=float), np.array(seconds)
    scale = 1 / b  # relative error: small parts matter as much as big ones
    coef, _ = nnls(a * scale[:, None], b * scale)
    op_s, per_flop, per_element = (max(float(c), 1e-15) for c in coef)
    spec = DeviceSpec(str(device), op_s, 1 / per_flop, 1 / per_element)
    fit = [{"part": n, "measured_s": s, "model_s": float(r @ coef)} for n, s, r in zip(names, seconds, a)]
    return spec, {"parts": fit, "threads": 1}
