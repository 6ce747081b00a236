"""A candidate of the joint search: what the batched evaluator scores, plus how to read it
as a Plan.

Stages are intervals of a topological order (``order``; a seed plan's stages become
intervals of an order sorted by its stages, so any valid plan is representable), each with
a set of devices (idle devices allowed), a re-materialization flag, one replica mode and
one schedule for the whole plan."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...cluster import Cluster
from ...graph import Graph
from ...plan import Plan, Stage


@dataclass(frozen=True)
class Candidate:
    order: int  # index into the search's topological orders
    bounds: tuple[int, ...]  # S + 1 positions: stage s = order[bounds[s]:bounds[s + 1]]
    groups: tuple[tuple[int, ...], ...]  # each stage's devices (cluster indices, sorted)
    recompute: tuple[bool, ...]
    schedule: str
    replicas: str

    @property
    def stages(self) -> int:
        return len(self.groups)

    def shape(self) -> tuple[int, str, str]:
        """What the batched evaluator needs to be equal across a batch."""
        return self.stages, self.schedule, self.replicas

    def stage_of_node(self, order: np.ndarray) -> np.ndarray:
        out = np.empty(order.size, dtype=np.int64)
        for s in range(self.stages):
            out[order[self.bounds[s]:self.bounds[s + 1]]] = s
        return out

    def device_stage(self, devices: int) -> np.ndarray:
        out = np.full(devices, -1, dtype=np.int64)
        for s, g in enumerate(self.groups):
            out[list(g)] = s
        return out

    def with_recompute(self, stages: set[int]) -> "Candidate":
        return replace(self, recompute=tuple(r or s in stages for s, r in enumerate(self.recompute)))


def canonical(c: Candidate, classes: list[list[int]]) -> Candidate:
    """``c`` with each class of interchangeable devices (``cluster.symmetry.device_classes``: swapping
    two is an automorphism of the cluster) relabelled in stage order, so plans equal up to
    such swaps become one candidate. Split replicas only: a round-robin stage's replica order
    is its devices' index order, which relabelling could change."""
    if c.replicas != "split" or all(len(k) == 1 for k in classes):
        return c
    label = {}
    for members in classes:
        used = [d for g in c.groups for d in g if d in members]
        label.update(zip(used, sorted(members)[:len(used)]))
    groups = tuple(tuple(sorted(label.get(d, d) for d in g)) for g in c.groups)
    return c if groups == c.groups else replace(c, groups=groups)


def make(order: int, bounds, groups, recompute=None, schedule: str = "1f1b",
         replicas: str = "split") -> Candidate:
    """A candidate with its groups normalized (sorted device tuples)."""
    groups = tuple(tuple(sorted(int(d) for d in g)) for g in groups)
    rec = tuple(bool(r) for r in recompute) if recompute is not None else (False,) * len(groups)
    return Candidate(order, tuple(int(b) for b in bounds), groups, rec, schedule, replicas)


def to_plan(c: Candidate, order: np.ndarray, graph: Graph, cluster: Cluster, microbatches: int,
            optimizer: str, replica_order: tuple[tuple[int, ...], ...] | None = None) -> Plan:
    """The Plan of ``c``; ``replica_order`` lists each stage's devices in replica order
    (round-robin replica r takes microbatches r, r+k, ...; default: index order)."""
    groups = replica_order or c.groups
    stages = [Stage([graph.ids[u] for u in order[c.bounds[s]:c.bounds[s + 1]]],
                    [cluster.devices[d].name for d in groups[s]]) for s in range(c.stages)]
    return Plan(graph, cluster, stages, microbatches, schedule=c.schedule, optimizer=optimizer,
                replicas=c.replicas, recompute=list(c.recompute) if any(c.recompute) else None)


def order_of_plan(plan: Plan, base: np.ndarray) -> np.ndarray:
    """``base`` (a topological order) stably sorted by the plan's stage of each node: a
    topological order in which every stage of the plan is an interval."""
    owner = plan.stage_of_node()
    return base[np.argsort(owner[base], kind="stable")]


def from_plan(plan: Plan, order: int, order_nodes: np.ndarray) -> Candidate:
    """``plan`` as a candidate over ``order_nodes`` (= ``order_of_plan(plan, ...)``)."""
    owner = plan.stage_of_node()[order_nodes]
    bounds = [0] + [int(np.searchsorted(owner, s, side="right")) for s in range(plan.num_stages)]
    return make(order, bounds, plan.stage_devices(), plan.recompute, plan.schedule, plan.replicas)


def balanced_bounds(work_cum: np.ndarray, weights: np.ndarray) -> list[int]:
    """Cut positions giving stage s about ``weights[s] / sum`` of the work (prefix sums
    ``work_cum``), each stage at least one node."""
    n = work_cum.size - 1
    share = np.cumsum(weights) / weights.sum()
    bounds = [0]
    for s, frac in enumerate(share[:-1]):
        b = int(np.searchsorted(work_cum, frac * work_cum[-1]))
        lo, hi = bounds[-1] + 1, n - (len(weights) - s - 1)
        bounds.append(min(max(b, lo), hi))
    return bounds + [n]
