"""Auto-MAP's decision vector and linkage groups (auto-map.txt §3.2.2, §4.2, Figures 6, 8, 10).

The decision vector lists every dimension of every trainable variable (or, for auto data
parallelism, of every input tensor): 1 partitioned, 0 replicated, -1 undecided. It is read
off the propagation domains: dimension d of a variable is 1 when the variable's domain is
a single cut of d (plain, or strided: a fused weight cut block by block), 0 when no cut of d
is left in it, -1 otherwise. A variable is cut along one dimension
at most (the devices form one line), so partitioning one dimension replicates the others.

A linkage group is what one decision alone forces on the other variables: each (dimension,
decision) is propagated from the undecided start and the dimensions it decides are kept
(§4.2: "we only extract those deterministic ones"). The decisions are then taken in the order
of their linkage groups' sizes, largest first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .program import TensorInfo
from .propagate import Domains, Propagator, bit, codes, dim_cuts
from .rules import S, dim_of

#: Auto-MAP's reward of a decided dimension (§4.2)
PARTITION_REWARD, REPLICATE_REWARD = 0.4, 0.1


@dataclass(frozen=True)
class Position:
    """One dimension of one variable in the decision vector."""

    tensor: int
    dim: int


def positions(tensors: list[TensorInfo]) -> list[Position]:
    """Every dimension of every tensor, in order (the decision vector's layout)."""
    return [Position(t.id, d) for t in tensors for d in range(t.rank)]


def vector(dom: Domains, pos: list[Position]) -> np.ndarray:
    """The decision vector: 1 partitioned, 0 replicated, -1 undecided."""
    out = np.full(len(pos), -1, dtype=np.int8)
    for i, p in enumerate(pos):
        m, cuts = dom[p.tensor], dim_cuts(p.dim)
        out[i] = 1 if m & cuts == m and m.bit_count() == 1 else 0 if not m & cuts else -1
    return out


def score(v: np.ndarray) -> float:
    """Auto-MAP's reward of the decided entries of a decision vector."""
    return float(PARTITION_REWARD * (v == 1).sum() + REPLICATE_REWARD * (v == 0).sum())


def placement_rewards(start: Domains, pos: list[Position]) -> dict[tuple[int, int], float]:
    """(tensor, placement) -> the reward of giving the tensor that placement, counting its
    dimensions undecided in ``start`` (the integer program's ``paper`` objective)."""
    open_dims: dict[int, list[int]] = {}
    for p, v in zip(pos, vector(start, pos)):
        if v < 0:
            open_dims.setdefault(p.tensor, []).append(p.dim)
    return {(t, c): sum(PARTITION_REWARD if c >= 2 and dim_of(c)[0] == d else REPLICATE_REWARD for d in dims)
            for t, dims in open_dims.items() for c in codes(start[t])}


def decide(prop: Propagator, dom: Domains, p: Position, partition: bool) -> tuple[Domains, int | None]:
    """Partition (domain = {S(d)}, or its strided cut of d where the plain one is gone: a fused
    weight) or replicate (every cut of d removed) dimension ``p``, then propagate."""
    return prop.narrow(dom, {p.tensor: partition_mask(dom[p.tensor], p.dim) if partition else ~dim_cuts(p.dim)})


def partition_mask(mask: int, d: int) -> int:
    """What partitioning dimension d keeps of a domain: the plain cut where it is still
    possible, else the strided cuts left (empty: partitioning d is a conflict)."""
    return bit(S(d)) if mask & bit(S(d)) else mask & dim_cuts(d)


@dataclass(frozen=True)
class Linkage:
    """What each decision forces: ``forced[(i, partition)]`` maps other positions to 0/1;
    ``None`` when the decision alone is a conflict."""

    forced: dict[tuple[int, bool], dict[int, int] | None]

    def size(self, i: int, partition: bool) -> int:
        f = self.forced.get((i, partition))
        return len(f) if f else 0


def linkage_groups(prop: Propagator, start: Domains, pos: list[Position]) -> Linkage:
    """Propagate each undecided position's two decisions alone from ``start`` (Figure 10)."""
    before = vector(start, pos)
    forced: dict[tuple[int, bool], dict[int, int] | None] = {}
    for i in np.flatnonzero(before < 0):
        for partition in (True, False):
            dom, conflict = decide(prop, start, pos[i], partition)
            if conflict is not None:
                forced[(int(i), partition)] = None
                continue
            after = vector(dom, pos)
            changed = np.flatnonzero((after >= 0) & (before < 0))
            forced[(int(i), partition)] = {int(j): int(after[j]) for j in changed if j != i}
    return Linkage(forced)


def decision_order(linkage: Linkage, undecided: np.ndarray) -> list[int]:
    """Undecided positions by the size of their linkage groups, largest first (§4.2); ties in
    program order."""
    key = lambda i: (-max(linkage.size(i, True), linkage.size(i, False)), i)  # noqa: E731
    return sorted((int(i) for i in undecided), key=key)
