"""PipeDream's antichain DAG: the cut points of a branching model.

PipeDream (Narayanan et al., SOSP'19, §3.1 and its ``antichain_dag``) plans over *states*: the
downward-closed node sets (ideals) reachable from the first source by repeatedly adding a
node y that has a predecessor inside the current set, together with all of y's ancestors.
A stage is the difference of two nested states, so branching models need no manual
compression. Its program identifies a state by the antichain of its maximal nodes; here a
state is its ideal, held as a Python int bitmask, which is the same set of states (a
straightforward check against its augment/next-antichain construction).

Before planning, PipeDream removes the ``Input`` sources (they always go with the first
stage) and the unused ``__getitem__`` sinks; ``optimizer_view`` does the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import PipeplanError
from ...graph.model import Graph


@dataclass(frozen=True)
class OptimizerView:
    """The nodes PipeDream's optimizer plans over, and what it set aside."""

    nodes: list[int]          # kept node indices, in graph order
    inputs: list[int]         # removed Input sources (always stage 0)
    dropped_sinks: list[int]  # removed __getitem__ sinks (go with their producer)


def optimizer_view(g: Graph) -> OptimizerView:
    inputs = [i for i in range(len(g)) if not g.pred[i] and g.desc[i].startswith("Input")]
    gone = set(inputs)
    sinks = [i for i in range(len(g)) if i not in gone and not g.succ[i]
             and g.desc[i].startswith("__getitem__")]
    gone.update(sinks)
    return OptimizerView([i for i in range(len(g)) if i not in gone], inputs, sinks)


@dataclass(frozen=True)
class AntichainDag:
    """States in a topological order (by size). ``ideal[s]`` is the bitmask of graph nodes;
    ``compute``, ``params``, ``acts`` are sums over the ideal of fwd+bwd time, parameter and
    activation bytes; ``edges`` are (from, to) state pairs; the last state is the whole graph."""

    ideal: list[int]
    compute: np.ndarray
    params: np.ndarray
    acts: np.ndarray
    edges: np.ndarray
    view: OptimizerView

    @property
    def n(self) -> int:
        return len(self.ideal)

    def nodes_of(self, s: int) -> list[int]:
        m, out = self.ideal[s], []
        while m:
            b = m & -m
            out.append(b.bit_length() - 1)
            m ^= b
        return out

    def ancestor_sets(self) -> list[int]:
        """Bitmask over states of each state's ancestors in the DAG (transitive)."""
        anc = [0] * self.n
        preds: list[list[int]] = [[] for _ in range(self.n)]
        for a, b in self.edges.tolist():
            preds[b].append(a)
        for s in range(self.n):  # states are in topological order
            m = 0
            for p in preds[s]:
                m |= anc[p] | (1 << p)
            anc[s] = m
        return anc


class TooManyStates(PipeplanError):
    pass


def antichain_dag(g: Graph, max_states: int = 50_000) -> AntichainDag:
    """Enumerate PipeDream's states by breadth-first search from the first source."""
    view = optimizer_view(g)
    keep = set(view.nodes)
    succ = {u: [v for v in g.succ[u] if v in keep] for u in view.nodes}
    pred = {u: [v for v in g.pred[u] if v in keep] for u in view.nodes}
    down: dict[int, int] = {}
    for u in g.topo:
        if u in keep:
            m = 1 << u
            for p in pred[u]:
                m |= down[p]
            down[u] = m
    succ_mask = {u: sum(1 << v for v in succ[u]) for u in view.nodes}
    cost = (g.fwd + g.bwd).tolist()
    par = g.params.tolist()
    act = g.act.tolist()
    sources = [u for u in view.nodes if not pred[u]]
    if not sources:
        raise PipeplanError(f"model {g.name!r}: nothing to plan after removing inputs")
    start = down[sources[0]]
    index = {start: 0}
    ideal = [start]
    frontier = [succ_mask[sources[0]] & ~start]
    comp, pars, acts = [cost[sources[0]]], [par[sources[0]]], [act[sources[0]]]
    edges: list[tuple[int, int]] = []
    head = 0
    while head < len(ideal):
        i_mask, f_mask = ideal[head], frontier[head]
        c0, p0, a0 = comp[head], pars[head], acts[head]
        f = f_mask
        while f:
            b = f & -f
            f ^= b
            y = b.bit_length() - 1
            j_mask = i_mask | down[y]
            j = index.get(j_mask)
            if j is None:
                j = index[j_mask] = len(ideal)
                if j >= max_states:
                    raise TooManyStates(f"model {g.name!r} has more than {max_states} antichain states")
                new = j_mask & ~i_mask
                c, p, a, nf = c0, p0, a0, f_mask
                while new:
                    nb = new & -new
                    new ^= nb
                    u = nb.bit_length() - 1
                    c += cost[u]
                    p += par[u]
                    a += act[u]
                    nf |= succ_mask[u]
                ideal.append(j_mask)
                frontier.append(nf & ~j_mask)
                comp.append(c)
                pars.append(p)
                acts.append(a)
            edges.append((head, j))
        head += 1
    # Topological order: every edge strictly grows the ideal, so sort by size.
    sizes = np.array([m.bit_count() for m in ideal])
    order = np.argsort(sizes, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    e = rank[np.asarray(edges, dtype=np.int64).reshape(-1, 2)]
    return AntichainDag(ideal=[ideal[k] for k in order.tolist()], compute=np.asarray(comp)[order],
                        params=np.asarray(pars)[order], acts=np.asarray(acts)[order], edges=e, view=view)


def compress_branches(g: Graph) -> tuple[Graph, list[list[int]]]:
    """PipeDream's remedy for very branchy models (its ``compress_branches``): every chain
    that starts right after a fork (single-in, single-out nodes) becomes one node with the
    summed times and parameters and the last node's output. Returns the compressed graph and,
    for each of its nodes, the original nodes it stands for."""
    from ...graph.linearize import chains

    groups: list[list[int]] = []
    for run in chains(g):
        head = run[0]
        branch = len(g.pred[head]) == 1 and len(g.succ[g.pred[head][0]]) > 1
        if branch and len(run) > 1:
            groups.append(run)
        else:
            groups.extend([u] for u in run)
    groups.sort(key=lambda r: r[0])
    owner = {u: k for k, run in enumerate(groups) for u in run}
    ids = ["+".join(g.ids[u] for u in run) for run in groups]
    edges = {(owner[u], owner[v]) for u, v in g.edges if owner[u] != owner[v]}
    return Graph(name=g.name, ids=ids,
                 fwd=np.array([g.fwd[r].sum() for r in groups]), bwd=np.array([g.bwd[r].sum() for r in groups]),
                 params=np.array([g.params[r].sum() for r in groups]),
                 act=np.array([g.act[r[-1]] for r in groups]), flops=np.array([g.flops[r].sum() for r in groups]),
                 saved=np.array([g.saved[r].sum() for r in groups]),
                 desc=[g.desc[r[0]] if len(r) == 1 else f"Branch({len(r)} nodes)" for r in groups],
                 edges=sorted(edges), meta=dict(g.meta)), groups
