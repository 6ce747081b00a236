"""What a learning planner sees of a graph and a cluster, as arrays.

Node features follow DRL-PP §3.1: the operator's type one-hot, then in-degree, input size,
out-degree, output size and parameter size, each divided by its largest value in the graph
(so in [0, 1]). Operator types come from a node's description (its first word, e.g.
``Conv2d``) folded into a fixed vocabulary (``OP_TYPES``), so that one agent reads every
model with the same feature width. The adjacency is symmetric (edges both ways); GCN layers
add the self-loops (Eq. 1).

Device features (for agents that see the cluster; DRL-PP sees only device indices, §3.3):
relative forward and backward speed, memory, and the mean and least bandwidth to the other
devices, each divided by its largest value in the cluster.
"""

from __future__ import annotations

import re

import numpy as np

from ..cluster import Cluster
from ..graph import Graph

#: operator types (a description's first word, lower-cased, is matched against each pattern
#: in turn; the first that matches names the type; none: "other")
OP_TYPES: tuple[tuple[str, str], ...] = (
    ("input", r"^input"),
    ("conv", r"conv"),
    ("linear", r"linear|dense|fc$|lm_head|classifier|head"),
    ("norm", r"norm|^bn"),
    ("activation", r"relu|gelu|tanh|sigmoid|softmax|silu|activation"),
    ("pool", r"pool"),
    ("dropout", r"dropout"),
    ("recurrent", r"lstm|gru|rnn"),
    ("embedding", r"embed"),
    ("attention", r"attention|transformer|encoderlayer|decoderlayer|^enc|^dec"),
    ("block", r"bottleneck|block|inception|resnext|layer"),
    ("merge", r"add|concat|cat$|mul|sum"),
    ("shape", r"view|reshape|flatten|size|getitem|transpose|permute|squeeze|contiguous"),
)
OP_NAMES: tuple[str, ...] = tuple(name for name, _ in OP_TYPES) + ("other",)
NODE_FEATURES = len(OP_NAMES) + 5
DEVICE_FEATURES = 5


def op_type(desc: str) -> int:
    """Index in ``OP_NAMES`` of the operator a node description names."""
    words = desc.strip().split()
    word = re.split(r"[(\[{:,]", words[0])[0].lower() if words else ""
    for i, (_, pattern) in enumerate(OP_TYPES):
        if word and re.search(pattern, word):
            return i
    return len(OP_TYPES)


def _scaled(x: np.ndarray) -> np.ndarray:
    top = float(np.max(x)) if x.size else 0.0
    return x / top if top > 0 else np.zeros_like(x)


def node_features(graph: Graph) -> np.ndarray:
    """(nodes, NODE_FEATURES) float32: one-hot type, in-degree, input size, out-degree,
    output size, parameter size (DRL-PP §3.1), the last five in [0, 1]."""
    n = len(graph)
    onehot = np.zeros((n, len(OP_NAMES)), dtype=np.float32)
    onehot[np.arange(n), [op_type(d) for d in graph.desc]] = 1.0
    indeg = np.array([len(p) for p in graph.pred], dtype=float)
    outdeg = np.array([len(s) for s in graph.succ], dtype=float)
    insize = np.array([graph.act[p].sum() if p else 0.0 for p in graph.pred], dtype=float)
    rest = np.stack([_scaled(indeg), _scaled(insize), _scaled(outdeg), _scaled(graph.act.copy()),
                     _scaled(graph.params.copy())], axis=1)
    return np.concatenate([onehot, rest.astype(np.float32)], axis=1)


def adjacency(graph: Graph) -> np.ndarray:
    """(nodes, nodes) float32, symmetric: 1 where an edge joins two nodes either way."""
    n = len(graph)
    a = np.zeros((n, n), dtype=np.float32)
    if graph.edges:
        src, dst = np.array(graph.edges).T
        a[src, dst] = a[dst, src] = 1.0
    return a


def device_features(cluster: Cluster) -> np.ndarray:
    """(devices, DEVICE_FEATURES) float32: forward and backward speed, memory, mean and least
    bandwidth to the others, each divided by its largest value in the cluster."""
    bw = cluster.bandwidth.copy()
    np.fill_diagonal(bw, np.nan)
    finite = np.where(np.isfinite(bw), bw, np.nan)
    if len(cluster) > 1:
        mean_bw, min_bw = np.nanmean(finite, axis=1), np.nanmin(finite, axis=1)
    else:
        mean_bw = min_bw = np.zeros(1)
    cols = [cluster.fspeed, cluster.bspeed, cluster.memory, np.nan_to_num(mean_bw), np.nan_to_num(min_bw)]
    return np.stack([_scaled(np.asarray(c, dtype=float)) for c in cols], axis=1).astype(np.float32)
