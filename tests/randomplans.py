"""Random graphs, clusters and candidate plans that exercise every term of the cost model:
DAGs with skip edges, latency, one-way links, mixed speeds, several compute resources,
contention (solo speeds), fixed per-call times, the optimizer step, all-reduce efficiency,
per-action overhead, half-duplex links."""

from __future__ import annotations

import numpy as np

from pipeplan.cluster import Cluster, Device
from pipeplan.cluster.model import Resource
from pipeplan.graph import Graph
from pipeplan.schedule import SCHEDULES

#: the schedules of one stage per device (the batched evaluator's candidates); chunked ones: test_schedules_chunked
SCHEDULE_NAMES = tuple(n for n, k in SCHEDULES.items() if k.placement == "single")


def random_graph(rng: np.random.Generator, layers: int) -> Graph:
    """A chain, plus skip edges now and then (a DAG whose stages may be any node sets)."""
    edges = [(u, u + 1) for u in range(layers - 1)]
    for u in range(layers - 2):
        if rng.random() < 0.3:
            edges.append((u, int(rng.integers(u + 2, layers))))
    ids = [f"n{u}" for u in range(layers)]
    meta: dict = {}
    if rng.random() < 0.3:
        meta["fixed_s"] = {nid: [float(rng.uniform(0, 2e-4)), float(rng.uniform(0, 2e-4))] for nid in ids}
    if rng.random() < 0.3:
        meta["update_s_per_byte"] = float(rng.uniform(1e-12, 1e-10))
    act = rng.uniform(1e5, 8e6, layers)
    inplace = saved = None
    if rng.random() < 0.3:  # in-place nodes and what autograd keeps, as a profile records them
        inplace = np.r_[False, rng.random(layers - 1) < 0.3]
        saved = np.where(inplace, 0.0, act * rng.choice([0.0, 0.5, 1.0, 3.0], layers))
    if rng.random() < 0.3:  # a profiled split backward costs more than one pass (I + W > B)
        meta["backward_split_cost"] = float(rng.uniform(1.0, 1.5))
    return Graph(name="random", ids=ids, fwd=rng.uniform(1e-4, 3e-3, layers), bwd=rng.uniform(2e-4, 6e-3, layers),
                 params=rng.uniform(0, 4e7, layers), act=act, flops=np.full(layers, np.nan),
                 desc=[""] * layers, edges=edges, meta=meta, inplace=inplace, saved=saved)


def _device(rng: np.random.Generator, i: int, servers: int) -> Device:
    speed = float(rng.choice([0.5, 1.0, 1.0, 2.0]))
    resources: tuple = ()
    if rng.random() < 0.2:
        resources = (Resource("cpu", float(rng.uniform(0.1, 0.5)), float(rng.uniform(0.1, 0.5))),
                     Resource("gpu", float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.5, 2.0))))
    solo = float(speed * rng.uniform(1.0, 1.6)) if rng.random() < 0.25 else None
    return Device(name=f"d{i}", memory=float(rng.uniform(0.4e9, 3e9)), speed=speed,
                  server=f"s{i % servers}", resources=resources, solo_speed=solo)


def random_cluster(rng: np.random.Generator, v: int) -> Cluster:
    servers = int(rng.integers(1, 3))
    devices = [_device(rng, i, servers) for i in range(v)]
    bw = rng.choice([1e9, 5e9, 2e10], size=(v, v))
    if rng.random() < 0.5:
        bw = np.minimum(bw, bw.T)  # symmetric, else one-way links differ
    lat = rng.choice([0.0, 1e-5, 1e-3, 1.5e-2], size=(v, v)) if rng.random() < 0.6 else np.zeros((v, v))
    meta: dict = {}
    if rng.random() < 0.3:
        meta["allreduce_efficiency"] = float(rng.uniform(0.3, 1.0))
        meta["update_s_per_byte"] = meta["allreduce_efficiency"] * 1e-10  # calibrated together; no new draw
    if rng.random() < 0.3:
        meta["action_overhead_s"] = float(rng.uniform(0, 5e-4))
    if rng.random() < 0.3:
        meta["duplex"] = "half"
    return Cluster("random", devices, bw, lat, meta=meta)


def random_candidates(rng: np.random.Generator, graph: Graph, cluster: Cluster, stages: int,
                      count: int) -> tuple[np.ndarray, np.ndarray]:
    """``stage_of_node`` (every node after its predecessors' stages, every stage used; not
    always intervals) and ``device_stage`` (every stage held, some devices idle)."""
    n, v = len(graph), len(cluster)
    son = np.empty((count, n), dtype=np.int64)
    for b in range(count):
        cuts = np.sort(rng.choice(np.arange(1, n), stages - 1, replace=False))
        base = np.searchsorted(cuts, np.arange(n), side="right")
        for u in graph.topo:  # push some nodes later while keeping predecessors first
            lo = max([base[u]] + [son[b, p] for p in graph.pred[u]])
            son[b, u] = lo if rng.random() < 0.8 else int(rng.integers(lo, stages))
        missing = np.setdiff1d(np.arange(stages), son[b])
        if missing.size:
            son[b] = base
    dst = np.full((count, v), -1, dtype=np.int64)
    for b in range(count):
        perm = rng.permutation(v)
        dst[b, perm[:stages]] = np.arange(stages)
        extra = perm[stages:]
        dst[b, extra] = np.where(rng.random(extra.size) < 0.6, rng.integers(0, stages, extra.size), -1)
    return son, dst
