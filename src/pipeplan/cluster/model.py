"""Devices and links (DESIGN.md): the cluster a plan runs on.

Bandwidth and latency are V x V matrices (bytes/s and s) over ordered device pairs: dense, or
held by server (``links.ServerLinks``) on clusters beyond ``limits.MAX_DEVICES``; the diagonal
is infinite bandwidth and zero latency (no transfer to oneself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import PipeplanError
from ..limits import MAX_SPEED
from .links import ServerLinks

#: The longest link latency a cluster may have (an hour): more is a typo, and would overflow
#: the simulator's sums.
MAX_LATENCY_S = 3600.0


@dataclass(frozen=True)
class Resource:
    """One compute resource of a device (its CPU, its GPU, ...): forward and backward
    throughput relative to the reference device (they may differ in ratio per resource)."""

    name: str
    fwd_speed: float
    bwd_speed: float


@dataclass(frozen=True)
class Device:
    """One accelerator: ``speed`` is its throughput relative to the reference device on which
    the model graph's times were measured (2.0 = twice as fast); ``memory`` is bytes.
    A device with several compute ``resources`` (resalloc.txt §III-B) runs a pass on all of
    them at once (their rates add), or splits them between forward and backward.
    ``speed`` is measured with every device of its server busy; ``solo_speed``, when known
    (``pipeplan calibrate``), alone — devices that share cores or memory bandwidth slow each
    other down, and the simulator interpolates between the two."""

    name: str
    kind: str = "GPU"
    memory: float = 32 * 2.0**30
    speed: float = 1.0
    server: str = ""
    resources: tuple[Resource, ...] = ()
    solo_speed: float | None = None  # speed when the other devices of its server are idle

    @property
    def fwd_speed(self) -> float:
        return sum(r.fwd_speed for r in self.resources) if self.resources else self.speed

    @property
    def bwd_speed(self) -> float:
        return sum(r.bwd_speed for r in self.resources) if self.resources else self.speed


@dataclass(eq=False)
class Cluster:
    name: str
    devices: list[Device]
    bandwidth: np.ndarray  # or ServerLinks (beyond limits.MAX_DEVICES)
    latency: np.ndarray
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        v = len(self.devices)
        where = f"cluster {self.name!r}"
        if v == 0:
            raise PipeplanError(f"{where}: no devices")
        self.index: dict[str, int] = {}
        for i, d in enumerate(self.devices):
            if d.name in self.index:
                raise PipeplanError(f"{where}: device name {d.name!r} appears twice")
            if not (0 < d.speed <= MAX_SPEED):
                raise PipeplanError(f"{where}: device {d.name!r} has speed {d.speed!r} (must be > 0 and "
                                    f"<= {MAX_SPEED:g}, relative to the reference device)")
            if d.resources and not (d.fwd_speed > 0 and d.bwd_speed > 0):
                raise PipeplanError(f"{where}: device {d.name!r} has no resource for forward or backward")
            if any(not (0 <= r.fwd_speed <= MAX_SPEED and 0 <= r.bwd_speed <= MAX_SPEED) for r in d.resources):
                raise PipeplanError(f"{where}: device {d.name!r} has a resource speed < 0 or > {MAX_SPEED:g}")
            if d.solo_speed is not None and not 0 < d.solo_speed <= MAX_SPEED:
                raise PipeplanError(f"{where}: device {d.name!r} has solo_speed {d.solo_speed!r} (must be > 0 and "
                                    f"<= {MAX_SPEED:g})")
            if not (d.memory > 0):
                raise PipeplanError(f"{where}: device {d.name!r} has memory {d.memory!r} (must be > 0)")
            self.index[d.name] = i
        self._links(v, where)
        self.speed = np.array([d.speed for d in self.devices])
        self.fspeed = np.array([d.fwd_speed for d in self.devices])
        self.bspeed = np.array([d.bwd_speed for d in self.devices])
        self.memory = np.array([d.memory for d in self.devices])
        self.usable = self.memory - self._reserve()
        if (self.usable <= 0).any():
            d = self.devices[int(np.argmin(self.usable))]
            raise PipeplanError(f"{where}: device {d.name!r} has memory {d.memory:.4g} bytes, not above its reserve "
                                f"({float(self.memory.max() - self.usable.max()):.4g} bytes, --memory-reserve)")

    def _reserve(self) -> np.ndarray:
        """Bytes of each device that no plan may use: ``meta["memory_reserve"]`` (``--memory-reserve``)
        where set, else its kind's default (``kinds.Kind.memory_reserve``)."""
        from .kinds import KINDS

        if "memory_reserve" in self.meta:
            return np.full(len(self.devices), float(self.meta["memory_reserve"]))
        return np.array([KINDS[d.kind.lower()].memory_reserve if d.kind.lower() in KINDS else 0.0
                         for d in self.devices])

    def _links(self, v: int, where: str) -> None:
        """Check the link matrices (dense ones get their diagonal set)."""
        if isinstance(self.bandwidth, ServerLinks) and isinstance(self.latency, ServerLinks):
            bw, lat = np.array(self.bandwidth.off_diagonal()), np.array(self.latency.off_diagonal())
            if self.bandwidth.shape != (v, v) or self.latency.shape != (v, v):
                raise PipeplanError(f"{where}: links for {self.bandwidth.shape[0]} devices, expected {v}")
        else:
            self.bandwidth = np.array(self.bandwidth, dtype=float)
            self.latency = np.array(self.latency, dtype=float)
            for arr, what in ((self.bandwidth, "bandwidth"), (self.latency, "latency")):
                if arr.shape != (v, v):
                    raise PipeplanError(f"{where}: {what} matrix is {arr.shape}, expected {(v, v)}")
                if np.any(np.isnan(arr) | (arr < 0)):  # the diagonal too, before it is set: never ignored
                    raise PipeplanError(f"{where}: a link's {what} is negative or not a number")
            np.fill_diagonal(self.bandwidth, np.inf)
            np.fill_diagonal(self.latency, 0.0)
            bw, lat = self.bandwidth, self.latency
        if np.any(np.isnan(bw) | (bw < 0)) or not np.all(np.isfinite(lat)) or np.any(lat < 0):
            raise PipeplanError(f"{where}: a link's bandwidth or latency is negative or not a number")
        if np.any(lat > MAX_LATENCY_S):
            raise PipeplanError(f"{where}: a link's latency is over {MAX_LATENCY_S:g} s")

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def device_indices(self, names: Sequence[str], where: str = "plan") -> list[int]:
        index = self.index
        try:
            return [index[n] for n in names]
        except (KeyError, TypeError):
            pass
        out = []
        for n in names:
            i = index.get(str(n))
            if i is None:
                raise PipeplanError(f"{where}: device {n!r} is not in cluster {self.name!r}")
            out.append(i)
        return out

    def min_bandwidth(self, a: Sequence[int], b: Sequence[int]) -> float:
        """Slowest link from any device of ``a`` to any device of ``b``."""
        return float(self.bandwidth[np.ix_(list(a), list(b))].min())

    def max_latency(self, a: Sequence[int], b: Sequence[int]) -> float:
        return float(self.latency[np.ix_(list(a), list(b))].max())

    def group_min_bandwidth(self, group: Sequence[int]) -> float:
        """Slowest link inside a group (both directions), inf for a single device."""
        g = list(group)
        if len(g) < 2:
            return float("inf")
        return float(self.bandwidth[np.ix_(g, g)].min())

    def servers(self) -> list[list[int]]:
        """Devices grouped by their ``server`` label, in order of first appearance."""
        groups: dict[str, list[int]] = {}
        for i, d in enumerate(self.devices):
            groups.setdefault(d.server or d.name, []).append(i)
        return list(groups.values())

    def with_memory(self, memory: float) -> "Cluster":
        """A copy in which every device has ``memory`` bytes (the --memory-limit override)."""
        from dataclasses import replace

        return Cluster(self.name, [replace(d, memory=memory) for d in self.devices],
                       self.bandwidth.copy(), self.latency.copy(), dict(self.meta))

    def with_reserve(self, reserve: float) -> "Cluster":
        """A copy in which every device keeps ``reserve`` bytes from plans (--memory-reserve)."""
        return Cluster(self.name, list(self.devices), self.bandwidth.copy(), self.latency.copy(),
                       {**self.meta, "memory_reserve": float(reserve)})

    def scaled(self, factor: int) -> "Cluster":
        """``factor`` copies of the cluster side by side (copy k's devices and servers named
        ``NAME.k``), linked to each other by the cluster's slowest link with its largest latency."""
        from dataclasses import replace

        v = len(self.devices)
        devices = [replace(d, name=f"{d.name}.{k}" if k else d.name,
                           server=(f"{d.server}.{k}" if d.server else "") if k else d.server)
                   for k in range(factor) for d in self.devices]
        off = ~np.eye(v, dtype=bool)
        slow = float(self.bandwidth[off].min()) if v > 1 else float("inf")
        lat = float(self.latency.max())
        bw = np.full((v * factor, v * factor), slow)
        la = np.full((v * factor, v * factor), lat)
        for k in range(factor):
            bw[k * v:(k + 1) * v, k * v:(k + 1) * v] = self.bandwidth
            la[k * v:(k + 1) * v, k * v:(k + 1) * v] = self.latency
        return Cluster(f"{factor}x {self.name}", devices, bw, la, dict(self.meta))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        if isinstance(self.bandwidth, ServerLinks) or isinstance(other.bandwidth, ServerLinks):
            # held by server only beyond the dense limit, so a dense cluster is never the same
            same = (isinstance(self.bandwidth, ServerLinks) and isinstance(other.bandwidth, ServerLinks)
                    and self.bandwidth == other.bandwidth and self.latency == other.latency)
        else:
            same = np.array_equal(self.bandwidth, other.bandwidth) and np.array_equal(self.latency, other.latency)
        return self.name == other.name and self.devices == other.devices and bool(same)

    __hash__ = None  # type: ignore[assignment]
