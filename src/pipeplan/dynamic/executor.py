"""Run one tree of a dynamic network with every node on its own device (dynpartition.txt
§8.1.2): a node starts as soon as its children are done, and its children's states move to
its device first.

Devices are names: ``cpu``, ``cuda:K``, and logical CPU devices ``cpu:K`` (all of them torch's
``cpu``; each is a serial resource, so two of them are two workers sharing the machine's cores:
how pipeplan measures multi-device placements on a machine without a GPU). A device computes
one node at a time (a lock per device), as a GPU's stream does.

Modes:
- ``threads`` (the paper's text): one thread per node, waiting on its children's events;
- ``devices`` (ours): one long-lived worker thread per device taking the parts placed on it
  in the order they became ready, the model ``sim.formulas.simulate`` predicts;
- ``sequential`` (the original program's executors): one thread computing the nodes in
  post-order (a topological order); devices overlap only through CUDA's asynchronous kernels.
``sync`` (the paper's synchronized pipeline, Fig. 8) waits after every node until its device
has finished (``torch.cuda.synchronize``) before its parent may start; without it a CUDA
node only enqueues its kernels, and cross-device copies order themselves. On CPU both are the
same: CPU kernels finish before they return.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import PipeplanError
from .trees import Tree

MODES = ("threads", "devices", "sequential")


def torch_device(name: str) -> torch.device:
    """The torch device of a device name (``cpu:K`` is a logical CPU device: torch's cpu)."""
    if name == "cpu" or (name.startswith("cpu:") and name[4:].isdigit()):
        return torch.device("cpu")
    if name.startswith("cuda:") and name[5:].isdigit():
        if not torch.cuda.is_available() or int(name[5:]) >= torch.cuda.device_count():
            raise PipeplanError(f"device {name!r}: no such CUDA device on this machine "
                                f"({torch.cuda.device_count()} visible)")
        return torch.device(name)
    raise PipeplanError(f"device {name!r}: expected cpu, cpu:K or cuda:K")


def parse_devices(text: str) -> list[str]:
    """``cpu,cuda:0,...`` -> device names, each checked; a one-line error otherwise."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise PipeplanError("--devices: no device named")
    if len(set(names)) != len(names):
        raise PipeplanError(f"--devices: a device is named twice in {text!r}")
    for n in names:
        torch_device(n)
    return names


class Replicas:
    """One copy of the network's weights per torch device (logical CPU devices share one)."""

    def __init__(self, net: nn.Module, devices: list[str]) -> None:
        self.torch = [torch_device(d) for d in devices]
        home = next(iter(list(net.parameters()) + list(net.buffers()))).device
        self._copies: dict[torch.device, nn.Module] = {}
        for t in self.torch:
            if t not in self._copies:
                self._copies[t] = net if t == home else copy.deepcopy(net).to(t)

    def net(self, device: int) -> nn.Module:
        return self._copies[self.torch[device]]


@dataclass
class Run:
    """One execution: the root's state (on the root's device), every node's output, and the
    wall-clock seconds from the first node's start to the last node's end."""

    root: torch.Tensor
    outputs: list[torch.Tensor | None]
    seconds: float


def _check(tree: Tree, placement, n_devices: int, name: str) -> list[int]:
    p = [int(x) for x in placement]
    if len(p) != tree.n:
        raise PipeplanError(f"{name}: {len(p)} devices given for a tree of {tree.n} nodes")
    bad = [x for x in p if not 0 <= x < n_devices]
    if bad:
        raise PipeplanError(f"{name}: device index {bad[0]} is not one of the {n_devices} devices")
    return p


class Executor:
    """Runs trees of one network on ``devices`` (see the module docstring)."""

    def __init__(self, net: nn.Module, devices: list[str], mode: str = "threads", sync: bool = True) -> None:
        if mode not in MODES:
            raise PipeplanError(f"executor mode {mode!r}: expected one of {', '.join(MODES)}")
        self.replicas = Replicas(net, devices)
        self.devices, self.mode, self.sync = list(devices), mode, sync
        self.has_output = bool(getattr(net, "has_output", False))
        self._locks = [threading.Lock() for _ in devices]
        self._cuda = [t.type == "cuda" for t in self.replicas.torch]
        self._queues: list[queue.SimpleQueue] | None = None

    @torch.no_grad()
    def run(self, tree: Tree, placement, output_placement=None) -> Run:
        """Execute ``tree`` with node i's state on device ``placement[i]`` and its output on
        ``output_placement[i]`` (default: the same device)."""
        place = _check(tree, placement, len(self.devices), "placement")
        out_place = place if output_placement is None else _check(tree, output_placement, len(self.devices),
                                                                   "output placement")
        job = _Job(tree, place, out_place, tree.n * (2 if self.has_output else 1))
        t0 = time.perf_counter()
        if self.mode == "sequential":
            for i in range(tree.n):
                self._state(job, i)
                self._output(job, i)
        elif self.mode == "threads":
            self._threads(job)
        else:
            self._workers(job)
        self._finish(set(place) | set(out_place))
        return Run(job.states[-1], job.outputs, time.perf_counter() - t0)

    def _state(self, job: "_Job", i: int) -> None:
        d = job.place[i]
        dev = self.replicas.torch[d]
        inputs = [job.states[c].to(dev, non_blocking=not self.sync) for c in job.tree.children[i]]
        with self._locks[d]:
            job.states[i] = self.replicas.net(d).state(job.tree, i, inputs)
            if self.sync and self._cuda[d]:
                torch.cuda.synchronize(dev)

    def _output(self, job: "_Job", i: int) -> None:
        if not self.has_output:
            return
        o = job.out_place[i]
        dev = self.replicas.torch[o]
        with self._locks[o]:
            job.outputs[i] = self.replicas.net(o).output(job.states[i].to(dev, non_blocking=not self.sync))
            if self.sync and self._cuda[o]:
                torch.cuda.synchronize(dev)

    def _threads(self, job: "_Job") -> None:
        """One thread per node (§8.1.2), each waiting on its children's events."""
        tree = job.tree
        done = [threading.Event() for _ in range(tree.n)]

        def work(i: int) -> None:
            try:
                for c in tree.children[i]:
                    done[c].wait()
                if not job.errors:
                    self._state(job, i)
                    self._output(job, i)
            except BaseException as e:  # re-raised in the caller's thread
                job.errors.append(e)
            finally:
                done[i].set()

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(tree.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if job.errors:
            raise job.errors[0]

    def _workers(self, job: "_Job") -> None:
        """One long-lived worker thread per device, taking the parts placed on it in the order
        they became ready (the simulator's model of a device)."""
        self._start(job)
        job.finished.wait()
        if job.errors:
            raise job.errors[0]

    def _start(self, job: "_Job") -> None:
        if self._queues is None:
            self._queues = [queue.SimpleQueue() for _ in self.devices]
            for q in self._queues:
                threading.Thread(target=self._serve, args=(q,), daemon=True).start()
        for i in job.tree.leaves:
            self._queues[job.place[i]].put((job, i, 0))

    def submit(self, tree: Tree, placement, output_placement=None) -> "_Job":
        """Start ``tree`` on the device workers and return at once (``devices`` mode: trees
        submitted one after another share the devices, as a server's stream does); the job's
        ``finished`` event is set and its ``end`` (``time.perf_counter``) stamped when it is done."""
        if self.mode != "devices":
            raise PipeplanError("submit needs the executor's devices mode")
        place = _check(tree, placement, len(self.devices), "placement")
        out_place = place if output_placement is None else _check(tree, output_placement, len(self.devices),
                                                                   "output placement")
        job = _Job(tree, place, out_place, tree.n * (2 if self.has_output else 1))
        self._start(job)
        return job

    def _serve(self, q: queue.SimpleQueue) -> None:
        while True:
            job, i, part = q.get()
            try:
                if not job.errors:
                    self._part(job, i, part)
            except BaseException as e:  # re-raised in the caller's thread
                job.errors.append(e)
                job.finished.set()

    @torch.no_grad()
    def _part(self, job: "_Job", i: int, part: int) -> None:
        if part == 1:
            self._output(job, i)
        else:
            self._state(job, i)
            if self.has_output:
                self._queues[job.out_place[i]].put((job, i, 1))
            parent = int(job.tree.parent[i])
            if parent >= 0 and job.child_done(parent):
                self._queues[job.place[parent]].put((job, parent, 0))
        job.part_done()

    def _finish(self, used: set[int]) -> None:
        for d in used:
            if self._cuda[d]:
                torch.cuda.synchronize(self.replicas.torch[d])

    def time(self, tree: Tree, placement, repeats: int = 10, output_placement=None) -> float:
        """Mean seconds of ``repeats`` runs (§6.1: "averaged over 10 runs")."""
        return sum(self.run(tree, placement, output_placement).seconds for _ in range(repeats)) / repeats


class _Job:
    """One tree's run: its states and outputs, and what is left to do (for the workers)."""

    def __init__(self, tree: Tree, place: list[int], out_place: list[int], parts: int) -> None:
        self.tree, self.place, self.out_place = tree, place, out_place
        self.states: list[torch.Tensor | None] = [None] * tree.n
        self.outputs: list[torch.Tensor | None] = [None] * tree.n
        self.errors: list[BaseException] = []
        self.finished = threading.Event()
        self._waiting = [len(ch) for ch in tree.children]
        self._left = parts
        self._lock = threading.Lock()
        self.end = 0.0

    def child_done(self, parent: int) -> bool:
        """Count one finished child of ``parent``; True when it was the last."""
        with self._lock:
            self._waiting[parent] -= 1
            return self._waiting[parent] == 0

    def part_done(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.end = time.perf_counter()
                self.finished.set()
