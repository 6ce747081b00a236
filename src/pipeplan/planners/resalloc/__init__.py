"""``resalloc``: resource allocation for pipelines on multi-resource and heterogeneous devices
(Duan & Wu, "Optimizing Resource Allocation in Pipeline Parallelism", ../shared/seeds/resalloc.txt).

For every pipeline depth q (or the one given with ``-O depth=q``):

1. group the devices into q workers (Alg. 2, local search; with one device per worker on a
   homogeneous cluster this is the identity), a worker's resources being the sum of its
   devices' (§V);
2. partition the linearized layers over the workers (Alg. 1: binary search on the
   bottleneck with the greedy feasibility check), each run's forward/backward split beta
   from the LP of §IV-A (or fixed with ``-O beta=0.5``, the paper's "without resource
   allocation"); a worker's resources are those of the weakest worker (Alg. 1 assumes
   homogeneous workers), and cutting after a layer costs its output over the link;
3. simulate the plan with the ``fb-parallel`` schedule (forward and backward side by side,
   steady state, §III-C) and keep the fastest depth.

A worker of several devices is a stage whose replicas split each microbatch in proportion
to their speeds and all-reduce their gradients — pipeplan's cost model, where the paper's
§VI assumes devices in a group share resources without overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...cluster import Cluster
from ...sim.formulas import transfer_time
from ...errors import Infeasible, PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan, Stage
from ...sim import simulate
from ..base import PlanOptions, register
from ..ranking import rank_key
from .grouping import local_search_groups
from .partition import partition


def resource_types(cluster: Cluster) -> list[str]:
    names: list[str] = []
    for d in cluster.devices:
        for r in d.resources or ():
            if r.name not in names:
                names.append(r.name)
    return names or ["*"]


def rates(cluster: Cluster, types: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per device and resource type: forward and backward speed (0 where absent)."""
    f = np.zeros((len(cluster), len(types)))
    b = np.zeros_like(f)
    for i, d in enumerate(cluster.devices):
        for r in d.resources or ():
            f[i, types.index(r.name)] = r.fwd_speed
            b[i, types.index(r.name)] = r.bwd_speed
        if not d.resources:
            f[i, 0], b[i, 0] = d.speed, d.speed
    return f, b


def per_resource_times(times: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """(layers, resources): each layer's time on all of each resource type; a layer with no
    work takes 0 anywhere, a resource with no capacity takes inf."""
    out = np.full((times.size, capacity.size), np.inf)
    np.divide(times[:, None], capacity[None, :], out=out, where=capacity[None, :] > 0)
    out[times == 0] = 0.0
    return out


def group_devices(cluster: Cluster, graph: Graph, q: int, types: list[str]) -> list[list[int]]:
    """Alg. 2 on the whole model as the reference workload (work = time x rate, per type)."""
    fr, br = rates(cluster, types)
    if q == len(cluster):
        return [[i] for i in range(len(cluster))]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.nanmax(np.where(br > 0, fr / br, np.nan), axis=0)  # fwd/bwd speed per type
    ratio = np.nan_to_num(ratio, nan=1.0)
    wf = np.full(len(types), graph.total_fwd)
    wg = graph.total_bwd * ratio
    return local_search_groups(fr, q, wf, wg)


def layer_times(graph: Graph, cluster: Cluster, groups: list[list[int]], types: list[str]):
    """Alg. 1's inputs: each layer's forward and backward time (linearized order) on all of
    each resource type of the weakest worker (Alg. 1 assumes homogeneous workers)."""
    lin = linearize(graph)
    fr, br = rates(cluster, types)
    cap_f = np.array([fr[g].sum(axis=0) for g in groups]).min(axis=0)
    cap_b = np.array([br[g].sum(axis=0) for g in groups]).min(axis=0)
    return lin, per_resource_times(graph.fwd[lin.order], cap_f), per_resource_times(graph.bwd[lin.order], cap_b)


def plan_for_depth(graph: Graph, cluster: Cluster, q: int, options: PlanOptions,
                   beta: float | None) -> Plan:
    types = resource_types(cluster)
    groups = group_devices(cluster, graph, q, types)
    lin, lf, lg = layer_times(graph, cluster, groups, types)
    # a cut's channel carries the activations forward and their gradients back (pipeplan's
    # simulator: one channel per pair of stages), so h is both transfers
    a, b = (groups[0], groups[1]) if len(groups) > 1 else (groups[0], groups[0])
    comm = np.array([transfer_time(cluster, a, b, float(lin.cut_bytes[k + 1]))
                     + transfer_time(cluster, b, a, float(lin.cut_bytes[k + 1]))
                     if len(groups) > 1 and k + 1 < lin.n else 0.0 for k in range(lin.n)])
    fixed = None if beta is None else np.full(len(types), beta)
    _, runs, betas = partition(lf, lg, comm, q, beta=fixed)
    stages = [Stage([graph.ids[u] for u in lin.interval(a, b + 1)], [cluster.devices[d].name for d in grp])
              for (a, b), grp in zip(runs, groups)]
    allocation = [{t: float(x) for t, x in zip(types, bt)} for bt in betas]
    return Plan(graph, cluster, stages, options.microbatches, schedule=options.schedule or "fb-parallel",
                optimizer=options.optimizer, replicas="split", allocation=allocation,
                extra={"resalloc": {"depth": q, "groups": [[cluster.devices[d].name for d in g] for g in groups],
                                    "beta": "optimal (LP)" if beta is None else beta}})


@dataclass(frozen=True)
class ResallocOptions:
    beta: float | None = field(default=None, metadata={"above": 0, "below": 1,
        "help": "one forward share in (0, 1) for every resource (0.5: the paper's 'without resource "
                "allocation'); default: each worker's optimum, the LP of §IV-A"})
    depth: int | None = field(default=None, metadata={"min": 1,
        "help": "pipeline depth q (workers); default: every q from 1 to min(devices, layers), the "
                "fastest kept"})


@register("resalloc", "resource allocation: forward/backward split of each device's resources, "
          "binary-search partition, grouping of heterogeneous devices", "fb-parallel", options=ResallocOptions)
def plan_resalloc(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """The fastest depth that fits (else the one that overflows least); a depth whose
    partition cannot run (a pass no resource of the weakest worker can run) is skipped."""
    opts = options.settings_of(ResallocOptions)
    deepest = min(len(cluster), len(graph))
    if opts.beta is not None and not 0 < opts.beta < 1:
        raise PipeplanError(f"resalloc: beta must be in (0, 1), got {opts.beta}")
    if opts.depth is not None and not 1 <= opts.depth <= deepest:
        raise PipeplanError(f"resalloc: depth must be an integer in 1..{deepest}, got {opts.depth}")
    best, reason = None, None
    for q in [opts.depth] if opts.depth is not None else range(1, deepest + 1):
        try:
            plan = plan_for_depth(graph, cluster, q, options, opts.beta)
            r = simulate(plan, timeline=False)
        except Infeasible as e:
            reason = f"depth {q}: {e}"
            continue
        key = rank_key(r, options.allow_over_memory)  # nothing fits: the plan that overflows least
        if best is None or key < best[0]:
            best = (key, plan)
    if best is None:
        raise Infeasible(f"resalloc: no pipeline depth can run on {cluster.name!r} ({reason})")
    return best[1]
