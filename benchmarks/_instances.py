"""Seeded random small instances for the gap benchmarks (``spp/gap.py``, ``joint/gap.py``):
a chain of 3-8 layers whose compute, all-reduce and transfers all matter, and 2-5 devices in
1-3 servers with uneven links (intra-server 64-200 Gbps, inter-server 5-40 Gbps, drawn per
pair). ``joint_instance`` adds speeds 0.5-1.5, latency 0 / 1 ms / 20 ms per pair in a third
of the instances each, and device memory tight enough in 40% of them that re-materialization
or fewer devices per stage are needed; M = 2-8."""

from __future__ import annotations

import numpy as np

from pipeplan.cluster import Cluster, Device
from pipeplan.sim.formulas import state_bytes
from pipeplan.graph import Graph

Gbps = 1e9 / 8


def random_chain(rng: np.random.Generator) -> Graph:
    layers = int(rng.integers(3, 9))
    f = rng.uniform(2e-3, 20e-3, layers)
    return Graph.chain("rand", f, f * rng.uniform(1.5, 2.5, layers),
                       params=rng.uniform(0, 60e6, layers) * (rng.random(layers) < 0.7),
                       act=rng.uniform(1e6, 80e6, layers))


def uneven_links(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(each device's server, symmetric bandwidth matrix) of 2-5 devices."""
    v = int(rng.integers(2, 6))
    servers = np.sort(rng.integers(0, min(3, v), v))
    bw = np.where(servers[:, None] == servers[None, :], rng.uniform(64, 200, (v, v)),
                  rng.uniform(5, 40, (v, v))) * Gbps
    return servers, np.minimum(bw, bw.T)


def joint_instance(rng: np.random.Generator) -> tuple[Graph, Cluster, int]:
    g = random_chain(rng)
    servers, bw = uneven_links(rng)
    v = servers.size
    same = servers[:, None] == servers[None, :]
    lat_level = float(rng.choice([0.0, 1e-3, 20e-3]))
    lat = np.where(same, lat_level / 10, lat_level) * rng.uniform(0.5, 1.5, (v, v))
    np.fill_diagonal(lat, 0.0)
    m = int(rng.integers(2, 9))
    total = state_bytes(float(g.params.sum()), "adam") + float(g.act.sum()) * m
    memory = total * float(rng.uniform(0.3, 1.2)) if rng.random() < 0.4 else 64e9
    devs = [Device(f"d{i}", speed=float(rng.uniform(0.5, 1.5)), server=f"s{servers[i]}", memory=memory)
            for i in range(v)]
    return g, Cluster("rand", devs, bw, lat), m


def tiny_instance(rng: np.random.Generator) -> tuple[Graph, Cluster, int]:
    """``joint_instance`` at sizes an enumeration of every plan covers in seconds: 2-5 layers
    on 2-3 devices, or 2-4 layers on 4 devices (where device subsets and zero-bubble plans
    beat the others most often)."""
    while True:
        g, c, m = joint_instance(rng)
        if len(c) <= 3 and len(g) <= 5 or len(c) == 4 and len(g) <= 4:
            return g, c, m
