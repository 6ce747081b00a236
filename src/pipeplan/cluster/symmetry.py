"""Which devices of a cluster are interchangeable: searches (exact, joint) try one device of
each class where any would do."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .model import Cluster


def device_classes(cluster: Cluster) -> list[list[int]]:
    """Partition devices into classes of pairwise interchangeable devices (swapping two is
    an automorphism of the cluster, so the relation is an equivalence)."""
    bw, lat = cluster.bandwidth, cluster.latency
    v = len(cluster)

    def same(a: int, b: int) -> bool:
        if replace(cluster.devices[a], name="") != replace(cluster.devices[b], name=""):
            return False  # everything the simulator may read of a device
        others = [x for x in range(v) if x not in (a, b)]
        return all(np.array_equal(m[a, others], m[b, others]) and np.array_equal(m[others, a], m[others, b])
                   and m[a, b] == m[b, a] for m in (bw, lat))

    classes: list[list[int]] = []
    for d in range(v):
        for cls in classes:
            if same(cls[0], d):
                cls.append(d)
                break
        else:
            classes.append([d])
    return classes
