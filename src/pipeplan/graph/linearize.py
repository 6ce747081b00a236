"""DAG utilities for planners: topological order, chain detection, and linearization.

Interval partitioning needs a sequence of cut points. Any prefix of a topological order is
closed under predecessors, so cutting a topological order anywhere gives valid stages
(no edge goes from a later stage back to an earlier one). ``linearize`` fixes one such order
and precomputes, for every cut, the bytes that cross it: the output of every node before the
cut that has a consumer after it. Those activations travel stage to stage across the cut
(intermediate stages relay them, as in PipeDream's runtime), and their gradients travel back.
PipeDream's antichain states are the richer alternative used by its own planner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Graph


def is_chain(g: Graph) -> bool:
    """True if the graph is one path through all its nodes."""
    n = len(g)
    if len(g.edges) != n - 1:
        return False
    order = g.topo
    return all(g.succ[order[k]] == [order[k + 1]] for k in range(n - 1))


def chains(g: Graph) -> list[list[int]]:
    """Maximal chains: runs u1 -> u2 -> ... where each inner link is the only edge out of its
    source and the only edge into its target. Every node is in exactly one chain; chains are
    listed in topological order of their heads."""
    pos = {u: k for k, u in enumerate(g.topo)}
    out: list[list[int]] = []
    placed: set[int] = set()
    for u in g.topo:
        if u in placed:
            continue
        run = [u]
        placed.add(u)
        while len(g.succ[run[-1]]) == 1:
            v = g.succ[run[-1]][0]
            if len(g.pred[v]) != 1 or v in placed:
                break
            run.append(v)
            placed.add(v)
        out.append(run)
    out.sort(key=lambda r: pos[r[0]])
    return out


@dataclass(frozen=True)
class Linearization:
    """A topological order with prefix sums, for O(1) interval costs.

    ``order[k]`` is the k-th node; the interval [a, b) of positions has forward time
    ``fwd_cum[b] - fwd_cum[a]`` (likewise bwd, params, stash); ``cut_bytes[k]`` (0 <= k <= n)
    is the activation bytes crossing a cut placed after the first k nodes (0 at both ends).
    ``stash_cum`` sums each node's output activation: what a stage keeps per microbatch for
    its backward pass."""

    order: np.ndarray
    fwd_cum: np.ndarray
    bwd_cum: np.ndarray
    params_cum: np.ndarray
    stash_cum: np.ndarray
    cut_bytes: np.ndarray

    @property
    def n(self) -> int:
        return int(self.order.size)

    def interval(self, a: int, b: int) -> list[int]:
        return [int(u) for u in self.order[a:b]]


def cut_bytes_for_order(g: Graph, order: np.ndarray) -> np.ndarray:
    """Bytes crossing each cut of ``order`` (difference-array sweep, O(nodes + edges))."""
    n = len(g)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    last_use = pos.copy()
    if g.edges:
        e = np.asarray(g.edges, dtype=np.int64)
        np.maximum.at(last_use, e[:, 0], pos[e[:, 1]])
    diff = np.zeros(n + 2)
    crossing = last_use > pos
    np.add.at(diff, pos[crossing] + 1, g.act[crossing])
    np.add.at(diff, last_use[crossing] + 1, -g.act[crossing])
    return np.cumsum(diff)[: n + 1]


def as_chain(g: Graph) -> tuple[Graph, list[list[int]], np.ndarray]:
    """The graph as one path through its topological order, for a planner that cuts a chain:
    node k of the chain is the order's k-th node (same costs and output). Returns the chain,
    for each of its nodes the original node it stands for, and the bytes crossing each cut
    (``cut_bytes_for_order``: every output still needed past the cut, relayed)."""
    order = np.asarray(g.topo, dtype=np.int64)
    chain = Graph(name=g.name, ids=[g.ids[u] for u in order], fwd=g.fwd[order], bwd=g.bwd[order],
                  params=g.params[order], act=g.act[order], flops=g.flops[order], desc=[g.desc[u] for u in order],
                  edges=[(k, k + 1) for k in range(len(order) - 1)], meta=dict(g.meta),
                  inplace=None if g.inplace is None else g.inplace[order],
                  saved=None if g.saved is None else g.saved[order])
    return chain, [[int(u)] for u in order], cut_bytes_for_order(g, order)


def linearize(g: Graph) -> Linearization:
    """Linearize the graph along its deterministic topological order."""
    order = np.asarray(g.topo, dtype=np.int64)

    def cum(x: np.ndarray) -> np.ndarray:
        return np.concatenate(([0.0], np.cumsum(x[order])))

    return Linearization(order=order, fwd_cum=cum(g.fwd), bwd_cum=cum(g.bwd),
                         params_cum=cum(g.params), stash_cum=cum(g.act),
                         cut_bytes=cut_bytes_for_order(g, order))
