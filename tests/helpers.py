"""Small builders shared by the tests."""

from __future__ import annotations

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage


def uniform_chain(layers: int, f: float = 1.0, b: float = 2.0, params: float = 0.0, act: float = 0.0) -> Graph:
    return Graph.chain("uniform", [f] * layers, [b] * layers, params=[params] * layers, act=[act] * layers)


def one_server(v: int, bandwidth: float = 1e9):
    return hierarchical("test", 1, v, bandwidth, bandwidth)


def chain_plan(graph: Graph, cluster, cuts: list[int], replicas: list[int], m: int, schedule: str,
               mode: str = "split") -> Plan:
    """Stages [cuts[i], cuts[i+1]) of the chain; stage i on the next replicas[i] devices
    (``mode``: how replicas share microbatches)."""
    stages, d = [], 0
    for a, b, k in zip(cuts[:-1], cuts[1:], replicas):
        stages.append(Stage(graph.ids[a:b], cluster.names[d:d + k]))
        d += k
    return Plan(graph, cluster, stages, m, schedule=schedule, replicas=mode)
