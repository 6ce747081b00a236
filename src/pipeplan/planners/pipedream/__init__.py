"""``pipedream``: PipeDream's planner (Narayanan et al., SOSP'19) on pipeplan's inputs.

The topology PipeDream expects — levels, each a worker count and a bandwidth — is derived
from the cluster: servers of equal size with more than one GPU give two levels (GPUs in a
server at the slowest intra-server link; servers at the slowest inter-server link);
anything else is one level of all devices at the slowest link. Stages are mapped in
device order: an outer stage takes consecutive servers, an inner stage consecutive GPUs in
each of them. Replicas take whole microbatches in turn (PipeDream's round-robin), and the
plan runs with the ``1f1b`` schedule (PipeDream-flush, as SPP's evaluation runs it);
``async-1f1b`` is PipeDream's original pipeline.

Models whose antichain DAG is too large for an exact solve (PipeDream's own program builds
(states+1) x states tables) have their branches compressed first, as PipeDream does for
such models (``compress_branches``); the plan says so. Where even the compressed DAG has
too many states (NASNet-style cells, whose branches cross cell boundaries), the model is
planned as one chain, a topological order of its layers (``graph.linearize.as_chain``), and
the plan says that too (``linearized``). The hierarchical DP is cubic in the
states: it is solved wherever it finishes within about 30 s (``MAX_STATES_HIERARCHICAL``);
above, a two-level topology is planned as one flat level at its slowest link (noted in the
plan as ``levels_flattened``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...cluster import Cluster
from ...errors import Infeasible
from ...graph import Graph
from ...graph.linearize import as_chain
from ...plan import Plan, Stage
from ...units import parse_bytes
from ..base import PlanOptions, register
from .antichain import AntichainDag, TooManyStates, antichain_dag, compress_branches
from .dp import DPOptions, DPResult, Level, solve

MAX_STATES = 5000
#: The hierarchical DP solves the inner level for every pair of nested states (cubic in the
#: states). Measured on this project's 2-core machine: 410 states (resnext101) take 1.2 s, so
#: about 1,100 states take 30 s; above that the topology is planned as one flat level instead
#: (a fixed count, not a clock, so the plan does not depend on the machine's load).
MAX_STATES_HIERARCHICAL = 1100


def levels_of(cluster: Cluster) -> tuple[list[Level], list[list[int]]]:
    """PipeDream levels (innermost first) and the device groups of the outer level."""
    servers = cluster.servers()
    sizes = {len(s) for s in servers}
    bw = cluster.bandwidth
    if len(servers) > 1 and len(sizes) == 1 and sizes.pop() > 1:
        intra = min(float(bw[np.ix_(s, s)][~np.eye(len(s), dtype=bool)].min()) for s in servers)
        inter = min(float(bw[np.ix_(a, b)].min()) for i, a in enumerate(servers)
                    for j, b in enumerate(servers) if i != j)
        return [Level(len(servers[0]), intra), Level(len(servers), inter)], servers
    v = len(cluster)
    link = float(bw[~np.eye(v, dtype=bool)].min()) if v > 1 else float("inf")
    return [Level(v, link)], [list(range(v))]


@dataclass(frozen=True)
class _Planned:
    """The graph PipeDream's DP runs on: ``dag`` over ``used`` (the model, its branches
    compressed, or a chain of it: ``how``), ``groups`` mapping used nodes to the model's."""

    dag: AntichainDag
    groups: list[list[int]] | None
    used: Graph
    how: str  # "antichain", "compressed" or "linearized"
    chain_cuts: np.ndarray | None = None  # linearized: bytes crossing the cut after k layers


def _dag(graph: Graph) -> _Planned:
    try:
        return _Planned(antichain_dag(graph, MAX_STATES), None, graph, "antichain")
    except TooManyStates:
        pass
    small, groups = compress_branches(graph)
    try:
        return _Planned(antichain_dag(small, MAX_STATES), groups, small, "compressed")
    except TooManyStates:
        pass
    chain, groups, cuts = as_chain(graph)
    return _Planned(antichain_dag(chain, MAX_STATES), groups, chain, "linearized", cuts)


def _output_activations(p: _Planned) -> np.ndarray:
    """Per state, the bytes its cut sends on: the augmented antichain's outputs, or on a
    chain every output still needed past the cut (a state of a chain is a prefix of it)."""
    if p.chain_cuts is None:
        return output_activations(p.used, p.dag)
    return p.chain_cuts[[m.bit_length() for m in p.dag.ideal]]


def output_activations(graph: Graph, dag: AntichainDag) -> np.ndarray:
    """Per state, PipeDream's ``output_activation_size``: the activations of its augmented
    antichain — its maximal nodes a, plus every ancestor p of such an a with an edge
    leaving a's ancestors (p's output is still needed past the cut)."""
    down: dict[int, int] = {}
    for u in graph.topo:
        m = 1 << u
        for p in graph.pred[u]:
            m |= down[p]
        down[u] = m
    extra = {}
    for a in range(len(graph)):
        anc = down[a] & ~(1 << a)
        extra[a] = sum(1 << p for p in range(len(graph))
                       if (anc >> p) & 1 and any(not (down[a] >> o) & 1 for o in graph.succ[p]))
    out = np.zeros(dag.n)
    for s in range(dag.n):
        inside = dag.ideal[s]
        maximal = [u for u in dag.nodes_of(s) if not any((inside >> v) & 1 for v in graph.succ[u])]
        aug = 0
        for a in maximal:
            aug |= (1 << a) | extra[a]
        out[s] = sum(graph.act[u] for u in range(len(graph)) if (aug >> u) & 1)
    return out


def stage_nodes(graph: Graph, dag: AntichainDag, groups, result: DPResult) -> list[list[int]]:
    """Original node indices of each stage; inputs join stage 0, dropped sinks their producer."""
    out = []
    for seg in result.stages:
        mask = dag.ideal[seg.end] & ~(dag.ideal[seg.start] if seg.start >= 0 else 0)
        nodes = []
        while mask:
            b = mask & -mask
            mask ^= b
            u = b.bit_length() - 1
            nodes.extend(groups[u] if groups is not None else [u])
        out.append(nodes)
    owner = {u: s for s, nodes in enumerate(out) for u in nodes}
    view_inputs = [u for u in range(len(graph)) if not graph.pred[u] and graph.desc[u].startswith("Input")]
    for u in view_inputs:
        if u not in owner:
            out[0].append(u)
            owner[u] = 0
    for u in graph.topo:  # anything left (dropped sinks): with its latest producer
        if u not in owner:
            s = max((owner[p] for p in graph.pred[u] if p in owner), default=len(out) - 1)
            out[s].append(u)
            owner[u] = s
    return [sorted(nodes, key=graph.topo.index) for nodes in out]


def run_pipedream(graph: Graph, cluster: Cluster, opts: DPOptions = DPOptions(),
                  levels: list[Level] | None = None) -> tuple[DPResult, list[list[int]], list[list[int]], dict]:
    """Solve PipeDream's problem; returns the DP result, each stage's nodes and devices, notes."""
    derived, groups_of_devices = levels_of(cluster)
    levels = levels or derived
    planned = _dag(graph)
    dag, groups = planned.dag, planned.groups
    out_act = _output_activations(planned) if opts.activation_compression_ratio else None
    flattened = len(levels) > 1 and dag.n > MAX_STATES_HIERARCHICAL
    if flattened:
        levels = [Level(len(cluster), min(lv.bandwidth for lv in levels))]
        groups_of_devices = [[d for grp in groups_of_devices for d in grp]]
    result = solve(dag, levels, opts, out_act)
    if not result.stages:
        raise Infeasible(f"pipedream: no partition of {graph.name!r} fits the memory limit")
    nodes = stage_nodes(graph, dag, groups, result)
    devices = _map_devices(result, levels, groups_of_devices, cluster)
    notes = {"levels": [{"workers": lv.workers, "bandwidth": lv.bandwidth} for lv in levels],
             "antichain_states": dag.n, "compressed_branches": planned.how == "compressed",
             "linearized": planned.how == "linearized", "levels_flattened": flattened}
    return result, nodes, devices, notes


def _map_devices(result: DPResult, levels: list[Level], groups: list[list[int]], cluster: Cluster) -> list[list[int]]:
    """Single level: consecutive devices. Two levels: outer stage t takes the next r_out
    servers; its inner stages take consecutive GPUs in each of those servers."""
    if len(levels) == 1:
        order, out, d = groups[0], [], 0
        for seg in result.stages:
            out.append(order[d:d + seg.workers[0]])
            d += seg.workers[0]
        return out
    out: list[list[int]] = []
    first_server = 0
    for t in sorted({seg.outer for seg in result.stages}):
        inner = [seg for seg in result.stages if seg.outer == t]
        servers = groups[first_server:first_server + inner[0].workers[1]]
        used = 0
        for seg in inner:
            out.append([d for srv in servers for d in srv[used:used + seg.workers[0]]])
            used += seg.workers[0]
        first_server += inner[0].workers[1]
    return out


@dataclass(frozen=True)
class PipedreamOptions:
    straight: bool = field(default=False, metadata={"help": "no replication (PipeDream's --straight_pipeline)"})
    compression: float | None = field(default=None, metadata={"above": 0,
        "help": "count inter-stage transfers, with PipeDream's activation compression ratio"})
    memory: str | None = field(default=None, metadata={
        "help": "memory per worker (e.g. 16GiB) for PipeDream's memory-constrained DP; none: no check"})


@register("pipedream", "PipeDream's optimizer: antichain DP with replication over a hierarchical "
          "topology (SOSP'19)", "1f1b", options=PipedreamOptions, memory_variants=False)
def plan_pipedream(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """What PipeDream's program returns: no memory check unless asked (``-O memory=16GiB``:
    its ``--use_memory_constraint`` with that memory per worker); the simulator's memory
    verdict is reported beside the plan."""
    opts = options.settings_of(PipedreamOptions)
    limit = parse_bytes(opts.memory, "pipedream -O memory") if opts.memory is not None else None
    return _pipedream_plan(graph, cluster, options, DPOptions(straight_pipeline=opts.straight,
                                                               activation_compression_ratio=opts.compression,
                                                               memory_size=limit))


def _pipedream_plan(graph: Graph, cluster: Cluster, options: PlanOptions, opts: DPOptions) -> Plan:
    off = ~np.eye(len(cluster), dtype=bool)
    if len(cluster) > 1 and not (cluster.bandwidth[off] > 0).all():
        i, j = np.argwhere((cluster.bandwidth <= 0) & off)[0]
        raise Infeasible(f"pipedream: zero bandwidth between {cluster.devices[i].name} and {cluster.devices[j].name}; "
                         "its optimizer assumes every worker reaches every other")
    result, nodes, devices, notes = run_pipedream(graph, cluster, opts)
    return Plan(graph, cluster,
                [Stage([graph.ids[u] for u in ns], [cluster.devices[d].name for d in ds])
                 for ns, ds in zip(nodes, devices)],
                options.microbatches, schedule=options.schedule or "1f1b", optimizer=options.optimizer,
                replicas="round-robin",
                extra={"objective_s": result.objective_s,
                       "pipedream": {**notes, **result.work, "memory_constraint": opts.memory_size}})
