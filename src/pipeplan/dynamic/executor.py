"""Run one tree of a dynamic network with every node on its own device (dynpartition.txt
§8.1.2): a node starts as soon as its children are done, and its children's states move to
its device first.

Devices are names: ``cpu``, ``cuda:K``, and logical CPU devices ``cpu:K`` (all of them torch's
``cpu``; each is a serial resource, so two of them are two workers sharing the machine's cores:
how pipeplan measures multi-device placements on a machine without a GPU). A device computes
one node at a time (a lock per device), as a GPU's stream does.

Modes:
- ``threads`` (the paper's): one thread per node, waiting on its children's events;
- ``sequential``: one thread computing the nodes in post-order (a topological order).
``sync`` (the paper's synchronized pipeline, Fig. 8) waits after every node until its device
has finished (``torch.cuda.synchronize``) before its parent may start; without it a CUDA
node only enqueues its kernels, and cross-device copies order themselves. On CPU both are the
same: CPU kernels finish before they return.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import PipeplanError
from .trees import Tree

MODES = ("threads", "sequential")


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
        self._locks = [threading.Lock() for _ in devices]
        self._cuda = [t.type == "cuda" for t in self.replicas.torch]

    @torch.no_grad()
    def run(self, tree: Tree, placement, output_placement=None) -> Run:
        """Execute ``tree`` with node i's state on device ``placement[i]`` and its output on
        ``output_placement[i]`` (default: the same device)."""
        place = _check(tree, placement, len(self.devices), "placement")
        out_place = place if output_placement is None else _check(tree, output_placement, len(self.devices),
                                                                   "output placement")
        states: list[torch.Tensor | None] = [None] * tree.n
        outputs: list[torch.Tensor | None] = [None] * tree.n
        t0 = time.perf_counter()
        if self.mode == "sequential":
            for i in range(tree.n):
                self._node(tree, i, place, out_place, states, outputs)
        else:
            self._threads(tree, place, out_place, states, outputs)
        self._finish(set(place) | set(out_place))
        return Run(states[-1], outputs, time.perf_counter() - t0)

    def _node(self, tree: Tree, i: int, place: list[int], out_place: list[int], states: list, outputs: list) -> None:
        d = place[i]
        dev = self.replicas.torch[d]
        inputs = [states[c].to(dev, non_blocking=not self.sync) for c in tree.children[i]]
        with self._locks[d]:
            s = self.replicas.net(d).state(tree, i, inputs)
            if self.sync and self._cuda[d]:
                torch.cuda.synchronize(dev)
        states[i] = s
        o = out_place[i]
        if self.replicas.net(o).has_output:
            with self._locks[o]:
                outputs[i] = self.replicas.net(o).output(s.to(self.replicas.torch[o], non_blocking=not self.sync))
                if self.sync and self._cuda[o]:
                    torch.cuda.synchronize(self.replicas.torch[o])

    def _threads(self, tree: Tree, place: list[int], out_place: list[int], states: list, outputs: list) -> None:
        """One thread per node (§8.1.2), each waiting on its children's events."""
        done = [threading.Event() for _ in range(tree.n)]
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                for c in tree.children[i]:
                    done[c].wait()
                if not errors:
                    self._node(tree, i, place, out_place, states, outputs)
            except BaseException as e:  # re-raised in the caller's thread
                errors.append(e)
            finally:
                done[i].set()

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(tree.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _finish(self, used: set[int]) -> None:
        for d in used:
            if self._cuda[d]:
                torch.cuda.synchronize(self.replicas.torch[d])

    def time(self, tree: Tree, placement, repeats: int = 10, output_placement=None) -> float:
        """Mean seconds of ``repeats`` runs (§6.1: "averaged over 10 runs")."""
        return sum(self.run(tree, placement, output_placement).seconds for _ in range(repeats)) / repeats
