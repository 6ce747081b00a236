"""The action space the learning planners share: DRL-PP's recurrent DAG partition
(Algorithm 1, §3.2) followed by a placement of partitions on devices (§3.3).

Partition phase. Partition k starts from a node the agent picks among the candidates, grows
by one candidate per step, and ends when the agent cuts. Every time a node joins, its
unassigned ancestors join too (the predecessor closure, line 5), so every edge runs from a
partition to itself or to a later one: the partitions, in the order they are made, are a
valid stage order, and a partition may be any node set (branches are not compressed).
Candidates (V_c, line 6) are the unassigned nodes that are sources or have an assigned
predecessor; when nodes remain there is always one. After the (K - 1)-th cut the nodes left
form the last partition (line 24); when none are left earlier there are fewer partitions.

Placement phase. Devices in index order each pick a partition; a partition with several
devices is replicated. A pick that would leave some partition without a device is masked,
so every placement that ends is valid (DRL-PP instead penalizes and resamples: its agent
does that itself, on ``placement_valid``).

Flat actions (``Actions``): ``0 .. N-1`` a node, ``N`` cut, ``N + 1 + p`` partition p.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Graph


@dataclass(frozen=True)
class Actions:
    """Indices of the flat action space of a graph of ``nodes`` nodes on ``devices`` devices."""

    nodes: int
    devices: int

    @property
    def cut(self) -> int:
        return self.nodes

    def partition(self, p: int) -> int:
        return self.nodes + 1 + p

    @property
    def size(self) -> int:
        return self.nodes + 1 + self.devices


class Ancestors:
    """Every node's ancestors as a boolean matrix (row u: the nodes with a path to u)."""

    def __init__(self, graph: Graph) -> None:
        n = len(graph)
        self.matrix = np.zeros((n, n), dtype=bool)
        for u in graph.topo:
            for p in graph.pred[u]:
                self.matrix[u] |= self.matrix[p]
                self.matrix[u, p] = True


class PartitionState:
    """One episode of Algorithm 1 then the placement (module docstring). ``part[u]``: the
    partition of node u (-1: not yet); ``device_part[d]``: the partition device d holds."""

    def __init__(self, graph: Graph, devices: int, ancestors: Ancestors | None = None) -> None:
        self.graph, self.devices = graph, devices
        self.actions = Actions(len(graph), devices)
        self.anc = (ancestors or Ancestors(graph)).matrix
        self.has_pred = np.array([bool(p) for p in graph.pred])
        self.topo = np.asarray(graph.topo, dtype=np.int64)
        self.pred_mask = np.zeros((len(graph), len(graph)), dtype=bool)
        for v, ps in enumerate(graph.pred):
            self.pred_mask[v, ps] = True
        self.part = np.full(len(graph), -1, dtype=np.int64)
        self.k = 0  # the partition being built
        self.starting = True  # the next action picks the partition's first node
        self.partitioning = True
        self.device_part = np.full(devices, -1, dtype=np.int64)
        self.next_device = 0
        self.added: list[int] = []  # nodes in the order they joined (for recurrent encoders)
        self._candidates: tuple[int, np.ndarray] | None = None  # (len(added) when computed, V_c)
        if devices == 1:  # K = 1: no cut to make, the whole graph is the one partition
            self._rest()

    # -- partition phase ---------------------------------------------------------------
    @property
    def num_partitions(self) -> int:
        return int(self.part.max()) + 1 if (self.part >= 0).any() else 0

    def candidates(self) -> np.ndarray:
        """V_c: unassigned nodes that are sources or have an assigned predecessor (computed
        once per change of the partition: an agent reads it, then ``step`` checks against it;
        read-only)."""
        if self._candidates is None or self._candidates[0] != len(self.added):
            free = self.part < 0
            fed = (self.pred_mask & ~free[None, :]).any(axis=1)
            self._candidates = (len(self.added), free & (~self.has_pred | fed))
        return self._candidates[1]

    def _join(self, v: int) -> None:
        """Node v and its unassigned ancestors join partition k (Alg. 1 line 5)."""
        new = self.anc[v] & (self.part < 0)
        new[v] = self.part[v] < 0
        order = self.topo[new[self.topo]].tolist()
        self.part[order] = self.k
        self.added.extend(order)

    def _rest(self) -> None:
        """The nodes left form partition k, the last (line 24)."""
        rest = self.topo[self.part[self.topo] < 0].tolist()
        self.part[rest] = self.k
        self.added.extend(rest)
        self.partitioning = False
        self.k = self.num_partitions

    def _close(self) -> None:
        """End partition k: the next starts, or the rest forms the last one."""
        self.k += 1
        if not (self.part < 0).any():
            self.partitioning = False
        elif self.k == self.devices - 1:
            self._rest()
        else:
            self.starting = True

    def mask(self) -> np.ndarray:
        """Which flat actions are valid now."""
        m = np.zeros(self.actions.size, dtype=bool)
        if self.partitioning:
            m[: self.actions.nodes] = self.candidates()
            m[self.actions.cut] = not self.starting
        elif not self.done:
            m[self.actions.nodes + 1: self.actions.nodes + 1 + self.num_partitions] = self.placement_choices()
        return m

    def step(self, action: int) -> None:
        """Take one flat action (it must be in ``mask()``)."""
        if not self.mask()[action]:
            raise ValueError(f"action {action} is not valid now")
        if not self.partitioning:
            self.device_part[self.next_device] = action - self.actions.nodes - 1
            self.next_device += 1
        elif action == self.actions.cut:
            self._close()
        else:
            self._join(int(action))
            self.starting = False
            if not (self.part < 0).any():
                self._close()

    # -- placement phase ---------------------------------------------------------------
    def placement_choices(self) -> np.ndarray:
        """Partitions the next device may take: any, unless the devices left are just enough
        for the partitions that have none yet (then only those)."""
        held = np.zeros(self.num_partitions, dtype=bool)
        held[self.device_part[self.device_part >= 0]] = True
        left = self.devices - self.next_device
        return ~held if left <= (~held).sum() else np.ones_like(held)

    @property
    def done(self) -> bool:
        return not self.partitioning and self.next_device == self.devices


def placement_valid(device_part: np.ndarray, partitions: int) -> bool:
    """Every partition has a device (DRL-PP §3.3: otherwise penalized and resampled)."""
    return bool(np.isin(np.arange(partitions), device_part).all())
