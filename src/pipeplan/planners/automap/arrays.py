"""Auto-MAP's abstract array-partition problem (auto-map.txt §3.5, §4.5.1).

A model becomes three arrays over its instructions (here: the nodes of one topological
order): C, compute per node; A, the activation crossing a cut after each position; W,
parameters per node. Step 1 builds the prefix sums of C and W (A stays per position);
step 2 takes ``POINTS`` = 128 evenly spaced positions; step 3 divides all three by their
common maximum. Dividing seconds and bytes by one maximum needs one unit, which the paper
leaves open: we express A and W as seconds too, the time they take over the cluster's
fastest link, so that the joint scale means something (docs/automap.md). The topology is
the cluster's bandwidth matrix over its fastest link. Beyond the paper's 32 devices (its
Table 2's largest cluster) the agent cuts devices by whole servers: a device cut counts in
units of ``unit`` GPUs (one or more servers), at most ``MAX_DEVICES`` units, while the value
function still simulates every GPU (docs/automap.md).

The value function V(P | C, A, W) is pipeplan's evaluator on the coarsened instance: a chain
of ``POINTS - 1`` segments (segment i holds positions (q_i, q_i+1]: its compute split 1:2
into forward and backward, its parameters, and the activation at its end), on devices of
speed 1 linked by the normalized bandwidths. A plan of the instance is K-1 boundaries among
the points and K-1 device cuts; on a real model a boundary i is a cut at position q_i, so
the coarse value is the real one over the common maximum (memory aside: the abstract
problem has none, as in the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import limits
from ...cluster import Cluster, Device
from ...errors import PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan, Stage
from ...sim.batch import BatchEvaluator

POINTS = 128      # §4.5.1 step 2: "which we empirically set to 128"
MAX_DEVICES = 32  # device-cut units the agent sees (Table 2's largest cluster)
MAX_STAGES = 8    # K the agent plans at most


def coarsen(compute: np.ndarray, activation: np.ndarray, params: np.ndarray,
            points: int = POINTS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """§4.5.1: prefix sums of C and W, ``points`` evenly spaced positions, joint scaling to
    [0, 1]. ``activation[p]`` is the activation at a cut after the first p nodes (length
    n+1, zero at both ends). Returns C*, A*, W*, the positions and the common maximum."""
    n = compute.size
    if activation.size != n + 1 or params.size != n:
        raise PipeplanError("coarsen: expected C and W per node and A per cut position (n + 1)")
    c = np.concatenate(([0.0], np.cumsum(compute)))
    w = np.concatenate(([0.0], np.cumsum(params)))
    pos = np.rint(np.arange(points) * n / (points - 1)).astype(np.int64)
    cc, aa, ww = c[pos], activation[pos], w[pos]
    top = float(max(cc.max(), aa.max(), ww.max()))
    if top <= 0:
        raise PipeplanError("coarsen: the model has no compute, activations or parameters")
    return cc / top, aa / top, ww / top, pos, top


@dataclass
class Instance:
    """One abstract problem: the arrays, the normalized topology, M and K; ``positions``
    and ``scale`` tie it to a real model (None for generated data)."""

    C: np.ndarray
    A: np.ndarray
    W: np.ndarray
    topology: np.ndarray
    microbatches: int
    stages: int
    positions: np.ndarray | None = None
    scale: float = 1.0
    name: str = "generated"
    unit: int = 1  # GPUs per device-cut unit (one or more whole servers beyond MAX_DEVICES GPUs)

    def __post_init__(self) -> None:
        n_dev = self.topology.shape[0]
        if n_dev % self.unit or n_dev // self.unit > MAX_DEVICES:
            raise PipeplanError(f"automap-infer: {n_dev} devices in units of {self.unit}; the agent cuts at most "
                                f"{MAX_DEVICES} units")
        if not 2 <= self.stages <= self.units:
            raise PipeplanError(f"automap-infer: {self.stages} stages on {self.units} device units")
        dc, dw = np.diff(self.C), np.diff(self.W)
        ids = [f"p{i + 1}" for i in range(dc.size)]
        self.graph = Graph(self.name, ids, dc / 3, 2 * dc / 3, dw, np.append(self.A[1:-1], 0.0),
                           np.full(dc.size, np.nan), [""] * dc.size, [(i, i + 1) for i in range(dc.size - 1)])
        bw = np.where(self.topology > 0, self.topology, 0.0)
        devices = [Device(name=f"d{i}", kind="unit", memory=1e30, speed=1.0) for i in range(n_dev)]
        self.cluster = Cluster("topology", devices, bw, np.zeros_like(bw))
        self.evaluator = BatchEvaluator(self.graph, self.cluster, self.stages, self.microbatches, "1f1b", "split")

    @property
    def devices(self) -> int:
        return self.topology.shape[0]

    @property
    def units(self) -> int:
        """Device-cut units: the agent's device actions are 1..units-1 (GPU ``unit * d``)."""
        return self.devices // self.unit

    def assignment(self, bounds: np.ndarray, dcuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``stage_of_node`` and ``device_stage`` rows for boundaries (points 1..126) and
        device cuts (units 1..units-1), one plan per row."""
        bounds, dcuts = np.atleast_2d(bounds), np.atleast_2d(dcuts) * self.unit
        seg = np.arange(1, self.C.size)  # segment i ends at point i
        son = (seg[None, :, None] > bounds[:, None, :]).sum(axis=2)
        dst = (np.arange(self.devices)[None, :, None] >= dcuts[:, None, :]).sum(axis=2)
        return son, dst

    def equal_compute(self) -> float:
        """V of a rule anyone could write (a yardstick of the agent): K stages of equal
        compute (cuts at the points nearest j/K of the prefix sum C), each on an equal share
        of the device-cut units in order; inf where two cuts fall on one point."""
        k, points = self.stages, np.arange(1, self.C.size - 1)
        bounds = [int(points[np.argmin(np.abs(self.C[points] - j / k * self.C[-1]))]) for j in range(1, k)]
        if len(set(bounds)) < len(bounds):
            return float("inf")
        return float(self.values(np.array([bounds]), np.array([[round(j * self.units / k) for j in range(1, k)]]))[0])

    def values(self, bounds: np.ndarray, dcuts: np.ndarray) -> np.ndarray:
        """V(P | C, A, W) for each row: the iteration time in units of the common maximum."""
        son, dst = self.assignment(bounds, dcuts)
        res = self.evaluator.evaluate(son, dst)
        return np.where(res.feasible, res.iteration_s, np.inf)


def fastest_link(cluster: Cluster) -> float:
    """The largest bandwidth between two devices (1 for a single device)."""
    off = ~np.eye(len(cluster), dtype=bool)
    return float(cluster.bandwidth[off].max()) if len(cluster) > 1 else 1.0


def topology(cluster: Cluster) -> np.ndarray:
    """Bandwidth between devices over the fastest link (1 on the diagonal)."""
    off = ~np.eye(len(cluster), dtype=bool)
    return np.where(off, cluster.bandwidth / fastest_link(cluster), 1.0)


def cut_unit(cluster: Cluster) -> int:
    """GPUs per device-cut unit: 1 up to ``MAX_DEVICES`` GPUs, else the fewest whole servers
    of equal size that leave at most ``MAX_DEVICES`` units (ours: beyond the paper)."""
    n = len(cluster)
    if n <= MAX_DEVICES:
        return 1
    if n > limits.MAX_DEVICES:
        raise PipeplanError(f"automap-infer: {n:,} devices; its value function simulates every GPU's links, "
                            f"at most {limits.MAX_DEVICES:,}")
    sizes = {len(s) for s in cluster.servers()}
    if len(sizes) != 1:
        raise PipeplanError(f"automap-infer: {n} devices on servers of unequal sizes {sorted(sizes)}; beyond "
                            f"{MAX_DEVICES} devices the agent cuts by whole servers of one size")
    size, servers = sizes.pop(), len(cluster.servers())
    for k in range(1, servers):
        if servers % k == 0 and servers // k <= MAX_DEVICES:
            return size * k
    raise PipeplanError(f"automap-infer: {servers} servers cannot be grouped into 2 to {MAX_DEVICES} equal units "
                        "of whole servers")


def from_graph(graph: Graph, cluster: Cluster, microbatches: int, stages: int) -> Instance:
    """A real model as an abstract instance (§4.5.1): C in seconds per microbatch (forward +
    backward, over the devices' mean speed), A and W in seconds over the fastest link; device
    cuts in units of ``cut_unit(cluster)`` GPUs."""
    lin = linearize(graph)
    fastest = fastest_link(cluster)
    speed = float(cluster.speed.mean())
    order = lin.order
    compute = (graph.fwd[order] + graph.bwd[order]) / speed
    c, a, w, pos, top = coarsen(compute, lin.cut_bytes / fastest, graph.params[order] / fastest)
    return Instance(c, a, w, topology(cluster), microbatches, stages, pos, top, graph.name, cut_unit(cluster))


def real_plan(graph: Graph, cluster: Cluster, inst: Instance, bounds: list[int], dcuts: list[int],
              microbatches: int, schedule: str = "1f1b", optimizer: str = "adam") -> Plan:
    """The plan of the real model that boundaries and device cuts of its instance describe."""
    order = [graph.ids[int(u)] for u in linearize(graph).order]
    cuts = [0, *[int(inst.positions[b]) for b in bounds], len(order)]
    devs = [0, *[d * inst.unit for d in dcuts], len(cluster)]
    stages = [Stage(order[a:b], cluster.names[d:e]) for a, b, d, e in zip(cuts, cuts[1:], devs, devs[1:])]
    return Plan(graph, cluster, stages, microbatches, schedule=schedule, optimizer=optimizer, replicas="split")
