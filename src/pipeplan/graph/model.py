"""The model graph: a DAG of layers or operators with per-microbatch costs (DESIGN.md).

Per node, for ONE microbatch on the reference device: forward and backward time (s),
parameter bytes, output-activation bytes; optionally FLOPs (forward) and a description.
Per node for memory (docs/memory.md): ``inplace`` (its output aliases its input: an in-place
op or a view, so it allocates no output of its own) and ``saved`` (bytes that autograd keeps
for backward and that this node allocated; by default its output, 0 where in-place).
Costs live in numpy arrays indexed by node position, so planners and the simulator
work on vectors, not on per-node objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import PipeplanError
from ..limits import check_layers


@dataclass(frozen=True)
class NodeSpec:
    """One node as a loader reads it, before the graph is assembled."""

    id: str
    fwd: float
    bwd: float
    params: float
    act: float
    desc: str = ""
    flops: float = float("nan")
    inplace: bool = False
    saved: float | None = None  # None: the default, :func:`default_saved`


def default_saved(act: np.ndarray, inplace: np.ndarray) -> np.ndarray:
    """Bytes kept for backward where nothing better is known: a node's output, none for a
    node whose output aliases its input (it is counted on the node that allocated it)."""
    return np.where(np.asarray(inplace, dtype=bool), 0.0, np.asarray(act, dtype=float))


def _node_saved(nd: NodeSpec) -> float:
    if nd.saved is not None:
        return nd.saved
    return 0.0 if nd.inplace else nd.act


@dataclass(eq=False)
class Graph:
    """A validated DAG. ``ids[i]`` names node i; ``edges`` are (src, dst) index pairs."""

    name: str
    ids: list[str]
    fwd: np.ndarray
    bwd: np.ndarray
    params: np.ndarray
    act: np.ndarray
    flops: np.ndarray
    desc: list[str]
    edges: list[tuple[int, int]]
    meta: dict = field(default_factory=dict)
    inplace: np.ndarray | None = None  # bool per node; None: no node is in-place
    saved: np.ndarray | None = None  # bytes per node; None: default_saved(act, inplace)
    #: tied parameters: name -> the ids of the nodes that use it (two or more); its bytes are
    #: counted on the first. A plan keeps each group in one stage (``planners.base``).
    tied: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.ids)
        self.fwd = np.asarray(self.fwd, dtype=float)
        self.bwd = np.asarray(self.bwd, dtype=float)
        self.params = np.asarray(self.params, dtype=float)
        self.act = np.asarray(self.act, dtype=float)
        self.flops = np.asarray(self.flops, dtype=float)
        where = f"model {self.name!r}"
        if n == 0:
            raise PipeplanError(f"{where}: the graph has no nodes")
        self._memory_fields(where, n)
        for arr, what in ((self.fwd, "forward time"), (self.bwd, "backward time"),
                          (self.params, "parameter size"), (self.act, "activation size"),
                          (self.saved, "saved size")):
            if arr.shape != (n,):
                raise PipeplanError(f"{where}: {what} has {arr.size} values for {n} nodes")
            bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
            if bad.size:
                i = int(bad[0])
                raise PipeplanError(
                    f"{where}: node {self.ids[i]!r} has a negative or non-finite {what} ({arr[i]!r})")
        if len(self.desc) != n or self.flops.shape != (n,):
            raise PipeplanError(f"{where}: descriptions/FLOPs do not match the {n} nodes")
        self.index = {}
        for i, nid in enumerate(self.ids):
            if nid in self.index:
                raise PipeplanError(f"{where}: node id {nid!r} appears twice")
            self.index[nid] = i
        edges = []
        seen = set()
        for u, v in self.edges:
            if not (0 <= u < n and 0 <= v < n):
                raise PipeplanError(f"{where}: edge ({u}, {v}) refers to a node that does not exist")
            if u == v:
                raise PipeplanError(f"{where}: node {self.ids[u]!r} has an edge to itself (a cycle)")
            if (u, v) not in seen:
                seen.add((u, v))
                edges.append((int(u), int(v)))
        self.edges = edges
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        for u, v in edges:
            self.succ[u].append(v)
            self.pred[v].append(u)
        self.topo = self._topological_order()
        self._derived_memory()
        self._check_tied(where)

    def _check_tied(self, where: str) -> None:
        """Each tied group names two or more distinct nodes of this graph."""
        if not isinstance(self.tied, dict):
            raise PipeplanError(f"{where}: 'tied' must map a parameter name to the ids of the nodes using it")
        self.tied = {str(k): list(v) if isinstance(v, (list, tuple)) else v for k, v in self.tied.items()}
        for name, ids in self.tied.items():
            if not isinstance(ids, list) or len(set(map(str, ids))) < 2:
                raise PipeplanError(f"{where}: tied parameter {name!r} must list two or more node ids, got {ids!r}")
            unknown = [nid for nid in ids if str(nid) not in self.index]
            if unknown:
                raise PipeplanError(f"{where}: tied parameter {name!r} names unknown node {unknown[0]!r}")
            self.tied[name] = [str(nid) for nid in ids]

    def _memory_fields(self, where: str, n: int) -> None:
        """Fill ``inplace`` and ``saved`` (defaults where None) and check their shapes."""
        self.inplace = (np.zeros(n, dtype=bool) if self.inplace is None
                        else np.asarray(self.inplace, dtype=bool))
        if self.inplace.shape != (n,):
            raise PipeplanError(f"{where}: in-place flags have {self.inplace.size} values for {n} nodes")
        if self.act.shape == (n,) and self.saved is None:
            self.saved = default_saved(self.act, self.inplace)
        self.saved = np.asarray(self.saved, dtype=float)

    def _derived_memory(self) -> None:
        """Per-node memory terms a stage pays beyond ``saved`` (docs/memory.md):

        ``sent_held[i]``: bytes a stage keeps until its backward when node i's output leaves
        it (torch.distributed.pipelining holds a stage's outputs to call backward on them),
        beyond what the stage's layers keep of that storage anyway: an in-place or view
        node's storage is its first input's, so it is looked up there.
        ``grad_pair[i]``: bytes of the gradients that live together during node i's
        backward, w.r.t. its output and w.r.t. each of its inputs."""
        root = np.arange(len(self.ids))
        for i in self.topo:
            if self.inplace[i] and self.pred[i]:
                root[i] = root[self.pred[i][0]]
        self.sent_held = np.maximum(self.act - self.saved[root], 0.0)
        self.grad_pair = self.act.copy()
        if self.edges:
            e = np.asarray(self.edges, dtype=np.int64)
            np.add.at(self.grad_pair, e[:, 1], self.act[e[:, 0]])

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_nodes(cls, name: str, nodes: Sequence[NodeSpec], edges: Iterable[tuple[str, str]],
                   meta: dict | None = None, tied: dict[str, list[str]] | None = None) -> "Graph":
        """Assemble a graph from node specs and edges given by node id."""
        check_layers(len(nodes), f"model {name!r}")
        ids = [nd.id for nd in nodes]
        index = {nid: i for i, nid in enumerate(ids)}
        pairs = []
        for a, b in edges:
            for end in (a, b):
                if end not in index:
                    raise PipeplanError(f"model {name!r}: edge {a} -> {b} names unknown node {end!r}")
            pairs.append((index[a], index[b]))
        return cls(name=name, ids=ids,
                   fwd=np.array([nd.fwd for nd in nodes], dtype=float),
                   bwd=np.array([nd.bwd for nd in nodes], dtype=float),
                   params=np.array([nd.params for nd in nodes], dtype=float),
                   act=np.array([nd.act for nd in nodes], dtype=float),
                   flops=np.array([nd.flops for nd in nodes], dtype=float),
                   desc=[nd.desc for nd in nodes], edges=pairs, meta=dict(meta or {}),
                   inplace=np.array([nd.inplace for nd in nodes], dtype=bool),
                   saved=np.array([_node_saved(nd) for nd in nodes], dtype=float), tied=dict(tied or {}))

    @classmethod
    def chain(cls, name: str, fwd: Sequence[float], bwd: Sequence[float],
              params: Sequence[float] | None = None, act: Sequence[float] | None = None,
              desc: Sequence[str] | None = None, flops: Sequence[float] | None = None,
              meta: dict | None = None, inplace: Sequence[bool] | None = None,
              saved: Sequence[float] | None = None) -> "Graph":
        """A linear chain of layers ``l0 -> l1 -> ...`` (the common case)."""
        n = len(fwd)
        return cls(name=name, ids=[f"l{i}" for i in range(n)], fwd=np.asarray(fwd, float),
                   bwd=np.asarray(bwd, float),
                   params=np.zeros(n) if params is None else np.asarray(params, float),
                   act=np.zeros(n) if act is None else np.asarray(act, float),
                   flops=np.full(n, np.nan) if flops is None else np.asarray(flops, float),
                   desc=[""] * n if desc is None else list(desc),
                   edges=[(i, i + 1) for i in range(n - 1)], meta=dict(meta or {}),
                   inplace=None if inplace is None else np.asarray(inplace, bool),
                   saved=None if saved is None else np.asarray(saved, float))

    # -- structure ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def _topological_order(self) -> list[int]:
        """Kahn's algorithm, ties broken by node position (deterministic); raises on a cycle."""
        import heapq

        indeg = [len(p) for p in self.pred]
        heap = [i for i, d in enumerate(indeg) if d == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            u = heapq.heappop(heap)
            order.append(u)
            for v in self.succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(heap, v)
        if len(order) != len(self.ids):
            stuck = next(i for i, d in enumerate(indeg) if d > 0)
            raise PipeplanError(
                f"model {self.name!r}: the graph has a cycle (through node {self.ids[stuck]!r})")
        return order

    @property
    def total_fwd(self) -> float:
        return float(self.fwd.sum())

    @property
    def total_bwd(self) -> float:
        return float(self.bwd.sum())

    @property
    def total_params(self) -> float:
        return float(self.params.sum())

    def node_indices(self, ids: Iterable[str], where: str = "plan") -> list[int]:
        out = []
        for nid in ids:
            i = self.index.get(str(nid))
            if i is None:
                raise PipeplanError(f"{where}: node {nid!r} is not in model {self.name!r}")
            out.append(i)
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self.name == other.name and self.ids == other.ids and self.desc == other.desc
                and sorted(self.edges) == sorted(other.edges) and self.meta == other.meta and self.tied == other.tied
                and all(np.array_equal(getattr(self, a), getattr(other, a), equal_nan=True)
                        for a in ("fwd", "bwd", "params", "act", "flops", "inplace", "saved")))

    __hash__ = None  # type: ignore[assignment]

    def scaled(self, *, time: float = 1.0, act: float = 1.0, name: str | None = None) -> "Graph":
        """A copy with times and/or activation sizes (output and saved) multiplied (what-if sweeps)."""
        return Graph(name=name or self.name, ids=list(self.ids), fwd=self.fwd * time,
                     bwd=self.bwd * time, params=self.params.copy(), act=self.act * act,
                     flops=self.flops.copy(), desc=list(self.desc), edges=list(self.edges),
                     meta=dict(self.meta), inplace=self.inplace.copy(), saved=self.saved * act,
                     tied={k: list(v) for k, v in self.tied.items()})
