"""Batched evaluator: many candidate plans of one graph and cluster in one call.

Candidates share the stage count, microbatches, schedule and replica mode; each has its own
``stage_of_node[b, u]`` (stage of node u: intervals of a linearization, or any node sets in
a topological stage order, as a DAG partitioner emits them) and ``device_stage[b, d]`` (the
stage device d holds, -1 if idle; a stage's devices in index order are its replicas). Every
figure is what ``simulate()`` gives ``evaluator.plan(b)``: both run ``iteration.run_layouts``,
``simulate`` with a batch of one. Candidates of the same structure share one compiled task
graph (``compile.py``); what differs between them is the layout (which devices run each
group) and the stage costs, from which ``durations`` costs every task class per candidate.
A candidate that cannot run (an edge back to an earlier stage, a stage without nodes or
devices, no link between stages that talk, a deadlock) comes back ``feasible = False``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import Infeasible, PipeplanError
from ..graph import Graph
from ..plan import Plan, Stage
from ..schedule import SCHEDULES
from .bounds import work_bound
from .compile import compile_tasks
from .stage_costs import StageCosts, batch_costs, plan_costs
from .durations import Layout, pass_speeds
from .iteration import Shape, run_layouts
from .memory import walks
from .simulate import schedule_of


@dataclass
class BatchResult:
    """Per candidate b: ``iteration_s[b]``, bounds, ``memory_bytes[b, d]`` per cluster
    device (0 where idle), ``over_memory[b]`` (some device over its memory),
    ``feasible[b]`` (False: every other figure is inf / meaningless)."""

    iteration_s: np.ndarray
    lower_s: np.ndarray
    work_bound_s: np.ndarray
    path_bound_s: np.ndarray
    memory_bytes: np.ndarray
    memory_limit: np.ndarray
    feasible: np.ndarray

    @property
    def efficiency(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.iteration_s > 0, self.lower_s / self.iteration_s, 1.0)

    @property
    def over_memory(self) -> np.ndarray:
        return np.any(self.memory_bytes > self.memory_limit[None, :], axis=1)


class BatchEvaluator:
    """Evaluates candidates of ``graph`` on ``cluster`` with ``num_stages`` stages."""

    def __init__(self, graph: Graph, cluster: Cluster, num_stages: int, microbatches: int,
                 schedule: str, replicas: str = "split", optimizer: str = "adam") -> None:
        if schedule not in SCHEDULES:
            raise PipeplanError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
        if num_stages < 1 or microbatches < 1:
            raise PipeplanError("batch evaluator: num_stages and microbatches must be >= 1")
        self.graph, self.cluster = graph, cluster
        self.num_stages, self.microbatches = num_stages, microbatches
        self.schedule, self.replicas, self.optimizer = schedule, replicas, optimizer
        self._compiled: dict[bytes, _Compiled] = {}  # structure key row -> its compiled bucket

    def plan(self, stage_of_node: np.ndarray, device_stage: np.ndarray,
             recompute: np.ndarray | None = None) -> Plan:
        """The Plan of one candidate (raises PipeplanError if it is not a valid plan)."""
        g, c = self.graph, self.cluster
        stages = [Stage([g.ids[u] for u in np.flatnonzero(stage_of_node == s)],
                        [c.devices[d].name for d in np.flatnonzero(device_stage == s)])
                  for s in range(self.num_stages)]
        rec = None if recompute is None or not np.any(recompute) else [bool(x) for x in recompute]
        return Plan(g, c, stages, self.microbatches, schedule=self.schedule, optimizer=self.optimizer,
                    replicas=self.replicas, recompute=rec)

    def evaluate(self, stage_of_node: np.ndarray, device_stage: np.ndarray,
                 recompute: np.ndarray | None = None) -> BatchResult:
        son = np.atleast_2d(np.asarray(stage_of_node, dtype=np.int64))
        dst = np.atleast_2d(np.asarray(device_stage, dtype=np.int64))
        count = son.shape[0]
        if son.shape != (count, len(self.graph)) or dst.shape != (count, len(self.cluster)):
            raise PipeplanError(f"batch evaluator: expected stage_of_node ({count}, {len(self.graph)}) and "
                                f"device_stage ({count}, {len(self.cluster)}), got {son.shape} and {dst.shape}")
        rec = np.zeros((count, self.num_stages), dtype=bool) if recompute is None else \
            np.atleast_2d(np.asarray(recompute, dtype=bool))
        costs = batch_costs(self.graph, son, self.num_stages, rec)
        ok = costs.valid & self._devices_valid(dst)
        out = _empty(count, len(self.cluster), self.cluster.usable)
        keys, rows = _structure_keys(costs, dst, self.num_stages, self.replicas)
        for key in np.unique(keys[ok]) if ok.any() else []:
            idx = np.flatnonzero(ok & (keys == key))
            self._bucket(idx, son, dst, rec, costs, out, rows[key].tobytes())
        steady = SCHEDULES[self.schedule].stream > 1
        out.work_bound_s[:] = work_bound(self.graph, self.cluster, self.microbatches)
        out.path_bound_s[~out.feasible] = 0.0 if steady else np.inf
        out.lower_s[:] = np.maximum(out.work_bound_s, out.path_bound_s)
        return out

    def _devices_valid(self, dst: np.ndarray) -> np.ndarray:
        held = np.stack([(dst == s).any(axis=1) for s in range(self.num_stages)], axis=1)
        return held.all(axis=1) & (dst < self.num_stages).all(axis=1)

    def _bucket(self, idx: np.ndarray, son: np.ndarray, dst: np.ndarray, rec: np.ndarray,
                costs: StageCosts, out: BatchResult, key: bytes) -> None:
        """Candidates ``idx`` share one task graph: compile it from the first that makes a
        valid plan (one that does not is infeasible itself; a later batch with the same key
        reuses it), then run them all."""
        for j, b in enumerate(idx.tolist()):
            try:
                template = self.plan(son[b], dst[b], rec[b])
                comp = self._compiled.get(key)
                if comp is None:
                    comp = self._compiled[key] = _compile(template)
                break
            except (Infeasible, PipeplanError):
                out.feasible[b] = False
        else:
            return
        idx = idx[j:]
        count = idx.size
        fs, bs = pass_speeds(self.cluster, comp.shape.lanes)
        res = run_layouts(comp.shape, comp.layout(dst[idx], self.num_stages), costs.take(idx), self.cluster,
                          self.graph.meta, self.optimizer, np.broadcast_to(fs, (count, fs.size)),
                          np.broadcast_to(bs, (count, bs.size)))
        out.iteration_s[idx] = res.iteration
        out.path_bound_s[idx] = res.path
        out.memory_bytes[idx] = res.memory
        out.feasible[idx] = res.done


@dataclass(frozen=True)
class _Compiled:
    """What a bucket's candidates share, reusable by later batches of the same structure
    key: the shape (task graph...), each group's stage and (round-robin) replica ranks."""

    shape: Shape
    stage_of_group: np.ndarray
    ranks: tuple[tuple[int, ...], ...] | None

    def layout(self, dst: np.ndarray, s_count: int) -> Layout:
        """Each candidate's devices per group: a stage's devices (split replicas), or its
        devices of the template's replica ranks (round-robin), in index order."""
        gmask = np.zeros((dst.shape[0], len(self.stage_of_group), dst.shape[1]), dtype=bool)
        if self.ranks is None:
            for gi, s in enumerate(self.stage_of_group.tolist()):
                gmask[:, gi] = dst == s
        else:
            rank = np.full(dst.shape, -1)
            for st in np.unique(self.stage_of_group).tolist():  # a device's position among its stage's devices
                held = dst == st
                rank = np.where(held, np.cumsum(held, axis=1) - 1, rank)
            for gi, s in enumerate(self.stage_of_group.tolist()):
                gmask[:, gi] = (dst == s) & np.isin(rank, self.ranks[gi])
        return Layout(gmask, dst[:, None, :] == np.arange(s_count)[None, :, None])


def _compile(template: Plan) -> _Compiled:
    sched = schedule_of(template)
    tg = compile_tasks(template, sched, plan_costs(template).crossing[0])
    stage_devs = template.stage_devices()
    sog = np.array([int(g.program.stages[0]) if len(g.program) else 0 for g in tg.groups], dtype=np.int64)
    ranks = None if template.replicas == "split" else tuple(
        tuple(stage_devs[s].index(d) for d in g.devices) for s, g in zip(sog.tolist(), tg.groups))
    shape = Shape(tg, walks(tg), sched.steady_state, sched.microbatches, sched.lanes)
    return _Compiled(shape, sog, ranks)


def _structure_keys(costs: StageCosts, device_stage: np.ndarray, s_count: int,
                    replicas: str) -> tuple[np.ndarray, np.ndarray]:
    """Candidates with equal keys compile to the same task graph (up to durations): the
    same replicas per stage (split replicas: only whether a stage has more than one, which
    adds its all-reduce) and the same cuts crossed by edges. Returns (each candidate's key
    index, the distinct key rows)."""
    reps = np.stack([(device_stage == s).sum(axis=1) for s in range(s_count)], axis=1)
    shape = (reps > 1).astype(np.int64) if replicas == "split" else reps
    rows = np.concatenate([shape, costs.crossing.astype(np.int64)], axis=1)
    distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
    return inverse.ravel(), distinct


def _empty(count: int, v: int, limit: np.ndarray) -> BatchResult:
    return BatchResult(np.full(count, np.inf), np.zeros(count), np.zeros(count), np.zeros(count),
                       np.zeros((count, v)), limit.copy(), np.zeros(count, dtype=bool))
