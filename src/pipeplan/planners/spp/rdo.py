"""RDO — recursive device ordering (SPP Alg. 2, §IV-B1).

Split the device graph (edge weight = bandwidth) by a global minimum cut (Stoer–Wagner),
order each side recursively, and concatenate: links inside a min-cut are used by at most
one pair of consecutive stages (or one replicated stage), so slow links are used least.

On dense hierarchical clusters the minimum cut often peels off a single device (its
weighted degree is below any server's cut), and the paper leaves the orientation of the
two halves open. pipeplan orients them so that the link across the junction is the
fastest of the four end-to-end choices (ties: as found) — the same device groups, with
consecutive devices kept on fast links (e.g. the peeled device next to its server-mates).
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from ...cluster import Cluster


def device_order(cluster: Cluster) -> list[int]:
    """Device indices in RDO order (ranks 1..V of Alg. 2)."""
    bw = np.minimum(cluster.bandwidth, cluster.bandwidth.T)  # a link is as fast as its slower direction
    return _order(bw, list(range(len(cluster))))


def _order(bw: np.ndarray, devices: list[int]) -> list[int]:
    if len(devices) <= 1:
        return list(devices)
    if len(devices) == 2:
        return sorted(devices)
    g = nx.Graph()
    g.add_nodes_from(devices)
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            u, v = devices[a], devices[b]
            w = float(bw[u, v])
            if w > 0:
                g.add_edge(u, v, weight=w)
    if not nx.is_connected(g):
        part = sorted(nx.connected_components(g), key=min)
        left, right = sorted(part[0]), sorted(set(devices) - part[0])
    else:
        _, (a_side, b_side) = nx.stoer_wagner(g, weight="weight")
        left, right = sorted(a_side), sorted(b_side)
        if min(right) < min(left):  # deterministic: the side with the lowest device first
            left, right = right, left
    a, b = _order(bw, left), _order(bw, right)
    options = [(a, b), (a, b[::-1]), (a[::-1], b), (a[::-1], b[::-1])]
    best = max(range(4), key=lambda k: (bw[options[k][0][-1], options[k][1][0]], -k))
    return options[best][0] + options[best][1]
