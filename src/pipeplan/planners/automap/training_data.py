"""The instances Auto-MAP's train-once agent learns from (auto-map.txt §4.5.1 "Data
Generation"), each through the same prefix-sum / coarsen / normalize steps as a real model.

``mix`` (the shipped agent's): generated arrays, C, A, W drawn from uniform, normal and
binomial distributions at random relative scales (compute- to communication-bound), as the
paper, and a quarter of the instances from the zoo's training models at random depths,
microbatches and granularities; clusters of 1-4 servers of 2-8 GPUs, links between servers
2-100x slower, one stage per server.

``wide`` (ours): the same, with decoder LLMs (GPT-style of random width, Llama 3 8B/70B at
random depths) and random layer graphs (chains with skip connections and random costs, so
that cut sizes come from crossing edges) among the models, and a quarter of the clusters of
8-64 servers of 8 GPUs, where the agent cuts devices by whole servers (``arrays.cut_unit``);
K up to ``MAX_STAGES``. The rest of the zoo and PipeDream's profiles stay unseen by both.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...cluster import Cluster, hierarchical
from ...errors import PipeplanError
from ...graph import Graph
from .arrays import MAX_STAGES, POINTS, Instance, coarsen, cut_unit, from_graph, topology

DISTRIBUTIONS = ("uniform", "normal", "binomial")
LARGE_CLUSTERS = 0.25       # the share of clusters of 8-64 servers
INTRA = 400e9               # bytes/s inside a drawn server


def _draw(rng: np.random.Generator, dist: str, n: int) -> np.ndarray:
    if dist == "uniform":
        return rng.random(n)
    if dist == "normal":
        return np.clip(rng.normal(0.5, 0.2, n), 0.0, 1.0)
    return rng.binomial(10, rng.uniform(0.1, 0.9), n) / 10.0


def _arrays(rng: np.random.Generator, dist: str | None) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """C per instruction, A per cut position, W per instruction, from one distribution at
    random relative scales (compute- to communication-bound)."""
    dist = dist or str(rng.choice(DISTRIBUTIONS))
    n = int(rng.integers(POINTS, 4000))
    compute = _draw(rng, dist, n)
    act = np.concatenate(([0.0], _draw(rng, dist, n - 1), [0.0])) * 10 ** rng.uniform(-3, 0)
    params = _draw(rng, dist, n) * (rng.random(n) < rng.uniform(0.05, 0.6)) * 10 ** rng.uniform(-3, 0)
    return dist, compute, act, params


def random_topology(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """The shipped agent's clusters: 1-4 servers' normalized bandwidths and their number."""
    servers = int(rng.integers(1, 5))
    gpus = int(rng.choice([4, 8])) if servers > 1 else int(rng.choice([2, 4, 8]))
    inter = 10 ** rng.uniform(-2, np.log10(0.5))
    server = np.repeat(np.arange(servers), gpus)
    return np.where(server[:, None] == server[None, :], 1.0, inter), servers


def _stages_of(rng: np.random.Generator, servers: int, devices: int) -> int:
    """The shipped agent's K: one stage per server, 2-4 on one server."""
    return min(servers if servers > 1 else int(rng.integers(2, 5)), devices)


def random_cluster(rng: np.random.Generator) -> Cluster:
    """The wide mix's clusters: 1-4 servers of 2-8 GPUs or (a quarter) 8-64 servers of 8,
    links between servers 2-100x slower than inside."""
    if rng.random() < LARGE_CLUSTERS:
        servers, gpus = int(rng.choice([8, 16, 32, 64])), 8
    else:
        servers = int(rng.integers(1, 5))
        gpus = int(rng.choice([4, 8])) if servers > 1 else int(rng.choice([2, 4, 8]))
    inter = INTRA * 10 ** rng.uniform(-2, np.log10(0.5)) if servers > 1 else INTRA
    return hierarchical("train", servers, gpus, INTRA, inter, kind="V100")


def random_stages(rng: np.random.Generator, cluster: Cluster) -> int:
    """The wide mix's K: one stage per server on 2-8 servers (§5.2.3), else 2-4 on one
    server or 2-8 on more than 8; at most one per device-cut unit."""
    servers = len(cluster.servers())
    if 1 < servers <= MAX_STAGES:
        k = servers
    else:
        k = int(rng.integers(2, 5 if servers == 1 else MAX_STAGES + 1))
    return min(k, len(cluster) // cut_unit(cluster))


def generated(rng: np.random.Generator, dist: str | None = None, wide: bool = False) -> Instance:
    """One generated instance (§4.5.1): C, A, W from one distribution, a random cluster
    (the wide mix's when ``wide``), K and M."""
    dist, compute, act, params = _arrays(rng, dist)
    if wide:
        cluster = random_cluster(rng)
        stages, topo, unit = random_stages(rng, cluster), topology(cluster), cut_unit(cluster)
    else:
        topo, servers = random_topology(rng)
        stages, unit = _stages_of(rng, servers, topo.shape[0]), 1
    c, a, w, pos, top = coarsen(compute, act, params)
    return Instance(c, a, w, topo, int(rng.choice([4, 8, 16, 32])), stages, pos, top, dist, unit)


TRAIN_MODELS = {  # zoo name -> options drawn per instance (inclusive ranges): the shipped agent's
    "bert-large": {"layers": (6, 36)}, "transformer": {"layers": (2, 12)}, "xlnet-large": {"layers": (6, 36)},
    "gnmt-4": {"layers": (2, 8)}, "vgg16": {}, "resnet50": {}, "alexnet": {}, "googlenet": {},
}
WIDE_MODELS = {**TRAIN_MODELS, "gpt": {"layers": (8, 96), "heads": (8, 64)}, "llama3-8b": {"layers": (8, 32)},
               "llama3-70b": {"layers": (16, 80)}, "random": {}}
LLMS = ("gpt", "llama3-8b", "llama3-70b")
OP_LEVEL = ("bert-large", "transformer")
CNN_MODELS = ("vgg16", "resnet50", "alexnet", "googlenet")


def random_graph(rng: np.random.Generator) -> Graph:
    """A chain of 16-3000 layers with skip connections from up to 16 layers back, costs
    log-normal (forward 0.01-10 ms, backward 1.5-2.5x, outputs and parameters 10 KB-100 MB,
    a random share of layers without parameters)."""
    from ...graph.model import NodeSpec

    n = int(rng.integers(16, 3001))
    fwd = 10 ** rng.uniform(-5, -2, n)
    act = 10 ** rng.uniform(4, 8, n)
    params = 10 ** rng.uniform(4, 8, n) * (rng.random(n) < rng.uniform(0.2, 1.0))
    nodes = [NodeSpec(f"l{i}", float(fwd[i]), float(fwd[i] * rng.uniform(1.5, 2.5)), float(params[i]),
                      float(act[i])) for i in range(n)]
    edges = [(f"l{i - 1}", f"l{i}") for i in range(1, n)]
    skips = rng.random(n) < rng.uniform(0.0, 0.3)
    edges += [(f"l{max(0, i - int(rng.integers(2, 17)))}", f"l{i}") for i in range(2, n) if skips[i]]
    return Graph.from_nodes("random", nodes, sorted(set(edges), key=lambda e: int(e[1][1:])))


def zoo_graph(rng: np.random.Generator, name: str) -> Graph:
    """A training model at a random depth (width for ``gpt``), microbatch and granularity."""
    from ...graph import load_graph

    if name == "random":
        return random_graph(rng)
    opts = {k: int(rng.integers(lo, hi + 1)) for k, (lo, hi) in WIDE_MODELS[name].items()}
    if name == "gpt":
        opts["hidden"] = 128 * opts["heads"]
    opts["microbatch"] = int(rng.choice([1, 2, 4] if name in LLMS else [4, 8, 16, 32]))
    if name in OP_LEVEL and rng.random() < 0.5:
        opts["granularity"] = "op"
    return load_graph(f"zoo:{name}?" + "&".join(f"{k}={v}" for k, v in opts.items()))


def zoo_instance(rng: np.random.Generator, names: tuple[str, ...] | None = None, wide: bool = False) -> Instance:
    """A training model (or, in the wide mix, a random graph) on a random cluster, through
    the same steps as any real model."""
    graph = zoo_graph(rng, str(rng.choice(names or tuple(WIDE_MODELS if wide else TRAIN_MODELS))))
    if wide:
        cluster = random_cluster(rng)
        stages = random_stages(rng, cluster)
    else:
        topo, servers = random_topology(rng)
        cluster = hierarchical("train", servers, topo.shape[0] // servers, INTRA,
                               INTRA * float(topo[0, -1]) if servers > 1 else INTRA, kind="V100")
        stages = _stages_of(rng, servers, len(cluster))
    return from_graph(graph, cluster, int(rng.choice([4, 8, 16, 32])), stages)


DATA = ("mix", "wide", "generated", "cnn")


def sampler(rng: np.random.Generator, data: str) -> Callable[[], Instance]:
    """Training instances: ``mix`` (generated from the three distributions, and a quarter
    from the zoo's training models: the shipped agent's), ``wide`` (the same shares with
    decoder LLMs, random graphs and clusters of up to 512 GPUs), ``generated`` or ``cnn``
    (the CNN training models, the paper's fine-tuning distribution for CNNs, §5.2.4)."""
    if data not in DATA:
        raise PipeplanError(f"automap-infer: unknown training data {data!r} (known: {', '.join(DATA)})")

    def draw() -> Instance:
        if data == "cnn":
            return zoo_instance(rng, CNN_MODELS)
        if data in ("mix", "wide") and rng.random() < 0.25:
            return zoo_instance(rng, wide=data == "wide")
        return generated(rng, wide=data == "wide")
    return draw
