"""Operator granularity for the analytic zoo (``zoo:NAME?granularity=op``).

The zoo's building blocks (``_linear``, ``_attention``, ``_norm``, ...) record every operation
they price as an :class:`Op` of the node (layer) under construction: its name, a description
with its shapes, its output size, the ops whose outputs it reads, and the FLOPs, times and
parameters charged while it was open. The layer-level node keeps the running totals it always
had; at op granularity each op becomes a graph node ``"<layer id>/<op name>"`` and the recorded
reads become the edges, so the bytes crossing a cut are the outputs produced before it and read
after it (:func:`pipeplan.graph.linearize.cut_bytes_for_order`).
"""

from __future__ import annotations

import heapq
from typing import Protocol, Sequence

from .model import NodeSpec

GRANULARITIES = ("layer", "op")
#: Relative tolerance of the check that a node's costs all belong to its ops.
_TOLERANCE = 1e-9


class Op:
    """One operation of a node: ``out`` output elements, ``inputs`` the op ids it reads (None
    entries: nothing to read), described by ``what``, its tensor ``shapes`` and a ``note``
    (formatted by :meth:`desc` only when an op-level graph is assembled)."""

    __slots__ = ("name", "out", "inputs", "what", "shapes", "sep", "note",
                 "flops", "fwd", "bwd", "params")

    def __init__(self, name: str, out: float, inputs: tuple[str | None, ...], what: str,
                 shapes: tuple[tuple[float, ...], ...], sep: str = "x", note: str = "") -> None:
        self.name, self.out, self.inputs = name, out, inputs
        self.what, self.shapes, self.sep, self.note = what, shapes, sep, note
        self.flops = self.fwd = self.bwd = self.params = 0.0

    def desc(self) -> str:
        """E.g. ``matmul [6144x1024]x[1024x1024] + bias``."""
        return f"{self.what} {self.sep.join(dims(*s) for s in self.shapes)}{self.note}"

    def reads(self) -> list[str]:
        return [ref for ref in self.inputs if ref is not None]


class OpOwner(Protocol):
    """What :func:`assemble` needs of a zoo node: its id, totals and recorded ops."""

    id: str
    flops: float
    fwd: float
    bwd: float
    params: float
    ops: list[Op]


def dims(*sizes: float) -> str:
    """``[6144x1024]``: a tensor shape for a description."""
    return "[" + "x".join(str(int(s)) if float(s).is_integer() else f"{s:g}" for s in sizes) + "]"


def _ordered(owner: OpOwner) -> list[Op]:
    """The node's ops in a topological order of their reads inside the node, ties broken by
    the order they were recorded in (a builder may record an op before the one it reads)."""
    index: dict[str, int] = {}
    for k, op in enumerate(owner.ops):
        oid = f"{owner.id}/{op.name}"
        if oid in index:
            raise RuntimeError(f"zoo: op {oid!r} recorded twice")
        index[oid] = k
    succ: list[list[int]] = [[] for _ in owner.ops]
    indeg = [0] * len(owner.ops)
    for k, op in enumerate(owner.ops):
        for ref in op.reads():
            if ref in index:
                succ[index[ref]].append(k)
                indeg[k] += 1
    ready = [k for k, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for j in succ[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(owner.ops):
        raise RuntimeError(f"zoo: the ops of node {owner.id!r} read each other in a cycle")
    return [owner.ops[k] for k in order]


def _check_complete(owner: OpOwner) -> None:
    """Every cost of the node was charged to one of its ops (else op granularity would lose it)."""
    for what in ("flops", "fwd", "bwd", "params"):
        total = float(getattr(owner, what))
        parts = sum(float(getattr(op, what)) for op in owner.ops)
        if abs(parts - total) > _TOLERANCE * max(abs(total), 1e-30):
            raise RuntimeError(f"zoo: node {owner.id!r}: its ops sum to {what}={parts!r}, "
                               f"the node has {total!r} (a cost was charged outside any op)")


def assemble(owners: Sequence[OpOwner],
             nbytes: int) -> tuple[list[NodeSpec], list[tuple[str, str]]]:
    """Op-level node specs (params and act in bytes of ``nbytes`` per element) and edges.

    Ops are listed node by node, each node's in a topological order, so the list is itself a
    topological order and every node's ops stay contiguous in ``Graph.topo``."""
    specs: list[NodeSpec] = []
    edges: list[tuple[str, str]] = []
    seen: set[str] = set()
    for owner in owners:
        if not owner.ops:
            raise RuntimeError(f"zoo: node {owner.id!r} recorded no ops")
        _check_complete(owner)
        for op in _ordered(owner):
            oid = f"{owner.id}/{op.name}"
            for ref in op.reads():
                if ref not in seen:
                    raise RuntimeError(f"zoo: op {oid!r} reads {ref!r}, which is not an earlier op")
                edges.append((ref, oid))
            seen.add(oid)
            specs.append(NodeSpec(id=oid, fwd=op.fwd, bwd=op.bwd, params=op.params * nbytes,
                                  act=op.out * nbytes, desc=op.desc(), flops=op.flops))
    return specs, edges
