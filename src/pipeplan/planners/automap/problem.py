"""Auto-MAP's pruned pipeline-cut problem (auto-map.txt §3.4, §4.4), without learning.

The model is cut along one topological order (for an operator graph, the order of its
instructions) into K stages, one cut ("pivot") per step; pivot p cuts after the first p
nodes. Devices are a line, first device of the first server first (§4.4), and stages take
consecutive runs of it in proportion to their compute ("the distributed plan should
allocate computation resources according to the computation ratio among all stages", §3.4):
pivot p maps to the device cut ``round(N x work before p / total work)``. A stage on several
devices is replicated and all-reduces inside its group.

Pruning (§4.4): the *center solution* puts the K-1 device cuts on network boundaries (server
boundaries); a pivot is a candidate for the j-th cut when its device cut lies within
``radius`` of the j-th center cut; every stage holds at least one trainable node; a cut
never falls inside an earlier stage. We also keep only pivots from which the remaining cuts
can still be made (no dead ends), and widen the radius, one device at a time, when some cut
has no candidate at all (a model of few layers whose device cuts skip the window).

Features (§4.4, Fig. 11), for every candidate pivot if the next cut were made there (the
rest of the model forming the last stage): the gradient all-reduce time of the whole
pipeline (stages all-reduce in parallel: the slowest), the largest activation transfer time
between neighbouring stages, and the compute balance ratio (lightest over heaviest stage,
per device). Times are in units of the ideal iteration ``M x work / sum of speeds``.

Value (§4.4): the pipeline length L is pipeplan's simulated iteration time; reward 1/L, and
-1/sqrt(L) for a plan that runs out of device memory, with L in units of the ideal iteration
(so rewards are O(1) whatever the model; the order of plans is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...cluster import Cluster
from ...sim.formulas import allreduce_time, transfer_time
from ...errors import Infeasible, PipeplanError
from ...graph import Graph, linearize
from ...plan import Plan
from ...sim.batch import BatchEvaluator
from .bounds import pipeline_lower_bound

RADIUS = 3  # §5.2.3: "set the radius to 3"


def server_boundaries(cluster: Cluster) -> list[int]:
    """Device indices b where device b-1 and device b sit in different servers."""
    return [b for b in range(1, len(cluster))
            if (cluster.devices[b].server or cluster.devices[b].name) != (cluster.devices[b - 1].server
                                                                           or cluster.devices[b - 1].name)]


def center_cuts(devices: int, stages: int, boundaries: list[int]) -> list[int]:
    """The center solution: for each of the K-1 cuts, the network boundary nearest to an
    even split (``j N / K``) when one lies within half a stage of it, else the even split."""
    out: list[int] = []
    for j in range(1, stages):
        even = j * devices / stages
        near = [b for b in boundaries if abs(b - even) <= devices / (2 * stages) and (not out or b > out[-1])]
        cut = min(near, key=lambda b: (abs(b - even), b)) if near else int(round(even))
        out.append(max(cut, out[-1] + 1 if out else 1))
    if out and out[-1] > devices - 1:
        raise PipeplanError(f"cannot place {stages} stages on {devices} devices")
    return out


@dataclass
class CutProblem:
    """One (graph, cluster, K) instance: candidate pivots, masks, features and values."""

    graph: Graph
    cluster: Cluster
    stages: int
    microbatches: int
    schedule: str = "1f1b"
    replicas: str = "split"
    optimizer: str = "adam"
    radius: int = RADIUS
    cache: dict[tuple[int, ...], tuple[float, bool]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        g, n_dev = self.graph, len(self.cluster)
        if self.stages < 2:
            raise PipeplanError(f"automap: stages must be >= 2, got {self.stages}")
        if self.stages > n_dev:
            raise PipeplanError(f"automap: {self.stages} stages need {self.stages} devices; the cluster has {n_dev}")
        self.lin = linearize(g)
        self.n = self.lin.n
        self.work = self.lin.fwd_cum + self.lin.bwd_cum
        self.trainable = np.concatenate(([0], np.cumsum(g.params[self.lin.order] > 0)))
        if self.trainable[-1] < self.stages:
            raise PipeplanError(f"automap: {g.name!r} has {int(self.trainable[-1])} nodes with parameters; "
                                f"{self.stages} stages need at least one each")
        share = self.work / self.work[-1] if self.work[-1] > 0 else np.arange(self.n + 1) / self.n
        self.device_cut = np.clip(np.rint(n_dev * share).astype(np.int64), 1, n_dev - 1)
        self.centers = center_cuts(n_dev, self.stages, server_boundaries(self.cluster))
        self.ideal_s = self.microbatches * self.work[-1] / float(self.cluster.speed.sum())
        self.windows = self._windows()
        self.pivots = np.unique(np.concatenate(self.windows))
        self.evaluator = BatchEvaluator(g, self.cluster, self.stages, self.microbatches, self.schedule,
                                        self.replicas, self.optimizer)
        self._ar: dict[tuple[int, int], tuple[float, float]] = {}
        self._xfer: dict[tuple[int, int, int], tuple[float, float]] = {}

    # -- pruning --------------------------------------------------------------------------
    def _windows(self) -> list[np.ndarray]:
        for radius in range(self.radius, len(self.cluster) + 1):
            windows = self._pruned(radius)
            if all(w.size for w in windows):
                self.radius_used = radius
                return windows
        raise PipeplanError(f"automap: no way to cut {self.graph.name!r} into {self.stages} stages with a "
                            "trainable node in each")

    def _pruned(self, radius: int) -> list[np.ndarray]:
        """Candidate pivots of each cut: from the last cut back (each keeps a completion),
        then forward (each follows some earlier candidate)."""
        p = np.arange(1, self.n)
        dev, tr = self.device_cut[p], self.trainable[p]
        out: list[np.ndarray] = []
        q_max = self.n  # the end of the model: the last stage needs a trainable node
        for j in reversed(range(self.stages - 1)):
            ok = (np.abs(dev - self.centers[j]) <= radius) & (p < q_max) & (tr < self.trainable[q_max])
            if q_max < self.n:
                ok &= dev < self.device_cut[q_max]
            if j == 0:
                ok &= tr > 0
            w = p[ok]
            out.append(w)
            if not w.size:
                return [np.zeros(0, dtype=np.int64)] * (self.stages - 1)
            q_max = int(w.max())
        out = out[::-1]
        for j in range(1, len(out)):  # and each is reachable from some earlier cut
            lo, w = int(out[j - 1].min()), out[j]
            out[j] = w[(w > lo) & (self.device_cut[w] > self.device_cut[lo]) & (self.trainable[w] > self.trainable[lo])]
        return out

    def mask(self, cuts: list[int]) -> np.ndarray:
        """Valid next pivots (over ``self.pivots``) after ``cuts``."""
        j = len(cuts)
        ok = np.isin(self.pivots, self.windows[j])
        if cuts:
            c = cuts[-1]
            ok &= (self.pivots > c) & (self.device_cut[self.pivots] > self.device_cut[c]) \
                & (self.trainable[self.pivots] > self.trainable[c])
        return ok

    # -- costs of one stage / one boundary (cost model, cached per device range) ----------------
    def device_range(self, cuts: list[int], k: int) -> tuple[int, int]:
        bounds = [0] + [int(self.device_cut[c]) for c in cuts] + [len(self.cluster)]
        return bounds[k], bounds[k + 1]

    def _ar_coef(self, d0: int, d1: int) -> tuple[float, float]:
        """(seconds per byte, fixed seconds) of a ring all-reduce over devices [d0, d1)."""
        if (d0, d1) not in self._ar:
            group = list(range(d0, d1))
            try:
                fixed = allreduce_time(self.cluster, group, 1e-300)  # the ring's latency steps
                unit = allreduce_time(self.cluster, group, 1.0) - fixed
            except Infeasible:
                fixed, unit = np.inf, 0.0
            self._ar[(d0, d1)] = (unit, fixed)
        return self._ar[(d0, d1)]

    def _xfer_coef(self, d0: int, d1: int, d2: int) -> tuple[float, float]:
        """(seconds per byte, fixed seconds) of a transfer from devices [d0, d1) to [d1, d2)."""
        key = (d0, d1, d2)
        if key not in self._xfer:
            src, dst = list(range(d0, d1)), list(range(d1, d2))
            try:
                base = transfer_time(self.cluster, src, dst, 0.0)
                unit = transfer_time(self.cluster, src, dst, 1.0) - base
            except Infeasible:
                base, unit = np.inf, 0.0
            self._xfer[key] = (unit, base)
        return self._xfer[key]

    def allreduce_s(self, d0: int, d1: int, param_bytes: np.ndarray | float) -> np.ndarray:
        """Ring all-reduce of ``param_bytes`` over devices [d0, d1) (SPP Eq. 1, sim.formulas)."""
        unit, fixed = self._ar_coef(d0, d1)
        return np.where(np.asarray(param_bytes) > 0, unit * np.asarray(param_bytes) + fixed, 0.0)

    def transfer_s(self, d0: int, d1: int, d2: int, nbytes: np.ndarray | float) -> np.ndarray:
        """One microbatch's activations from devices [d0, d1) to [d1, d2) (sim.formulas)."""
        unit, base = self._xfer_coef(d0, d1, d2)
        return np.where(np.asarray(nbytes) > 0, unit * np.asarray(nbytes) + base, 0.0)

    def lower_bounds(self, cuts: np.ndarray) -> np.ndarray:
        """``bounds.pipeline_lower_bound`` of each row of complete cuts."""
        cuts = np.atleast_2d(np.asarray(cuts, dtype=np.int64))
        t = len(cuts)
        ends = np.concatenate([np.zeros((t, 1), dtype=np.int64), cuts, np.full((t, 1), self.n)], axis=1)
        devs = np.concatenate([np.zeros((t, 1), dtype=np.int64), self.device_cut[cuts],
                               np.full((t, 1), len(self.cluster))], axis=1)
        speed = np.concatenate(([0.0], np.cumsum(self.cluster.speed)))[devs]
        s = np.diff(speed, axis=1)
        lin = self.lin
        fwd, bwd = np.diff(lin.fwd_cum[ends], axis=1) / s, np.diff(lin.bwd_cum[ends], axis=1) / s
        par = np.diff(lin.params_cum[ends], axis=1)
        unit, fixed = _coefs(np.stack([devs[:, :-1], devs[:, 1:]], axis=2), self._ar_coef)
        ar = np.where(par > 0, unit * par + fixed, 0.0)
        nbytes = lin.cut_bytes[cuts]
        unit, fixed = _coefs(np.stack([devs[:, :-2], devs[:, 1:-1], devs[:, 2:]], axis=2), self._xfer_coef)
        xfer = np.where(nbytes > 0, unit * nbytes + fixed, 0.0)
        return pipeline_lower_bound(fwd, bwd, xfer, ar, self.microbatches)

    # -- state ----------------------------------------------------------------------------------
    def features(self, cuts: list[int]) -> np.ndarray:
        """(3, pivots): all-reduce, activation transfer (both in ideal iterations, the
        transfer counted for M microbatches) and balance, were the next cut at each pivot;
        zero where the pivot is not valid."""
        out = np.zeros((3, self.pivots.size))
        valid = self.mask(cuts)
        lin, prev = self.lin, (cuts[-1] if cuts else 0)
        d_prev = int(self.device_cut[prev]) if cuts else 0
        fixed_ar, fixed_x, fixed_w = self._fixed_terms(cuts)
        n_dev = len(self.cluster)
        for d in np.unique(self.device_cut[self.pivots[valid]]):
            sel = valid & (self.device_cut[self.pivots] == d)
            p = self.pivots[sel]
            ar = np.maximum(self.allreduce_s(d_prev, d, lin.params_cum[p] - lin.params_cum[prev]),
                            self.allreduce_s(d, n_dev, lin.params_cum[-1] - lin.params_cum[p]))
            x = self.transfer_s(d_prev, d, n_dev, lin.cut_bytes[p])
            if cuts:
                d_before = int(self.device_cut[cuts[-2]]) if len(cuts) > 1 else 0
                x = np.maximum(x, self.transfer_s(d_before, d_prev, d, lin.cut_bytes[prev]))
            w_here = (self.work[p] - self.work[prev]) / self._speed(d_prev, d)
            w_last = (self.work[-1] - self.work[p]) / self._speed(d, n_dev)
            lo = np.minimum(np.minimum(w_here, w_last), fixed_w[0])
            hi = np.maximum(np.maximum(w_here, w_last), fixed_w[1])
            out[0, sel] = np.maximum(ar, fixed_ar) / self.ideal_s
            out[1, sel] = np.maximum(x, fixed_x) * self.microbatches / self.ideal_s
            out[2, sel] = np.where(hi > 0, lo / np.maximum(hi, 1e-300), 1.0)
        return out

    def _speed(self, d0: int, d1: int) -> float:
        return float(self.cluster.speed[d0:d1].sum())

    def _fixed_terms(self, cuts: list[int]) -> tuple[float, float, tuple[float, float]]:
        """All-reduce max, transfer max (boundaries before the last cut) and (min, max)
        per-device work over the stages the cuts already close."""
        ar = x = 0.0
        lo, hi = np.inf, 0.0
        lin, starts = self.lin, [0] + cuts
        for k in range(len(cuts)):
            d0, d1 = self.device_range(cuts, k)
            ar = max(ar, float(self.allreduce_s(d0, d1, lin.params_cum[starts[k + 1]] - lin.params_cum[starts[k]])))
            w = (self.work[starts[k + 1]] - self.work[starts[k]]) / self._speed(d0, d1)
            lo, hi = min(lo, w), max(hi, w)
            if k >= 1:
                e0, _ = self.device_range(cuts, k - 1)
                x = max(x, float(self.transfer_s(e0, d0, d1, lin.cut_bytes[starts[k]])))
        return ar, x, (lo, hi)

    # -- plans and their value -------------------------------------------------------------------
    def assignment(self, cuts: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``stage_of_node`` and ``device_stage`` of complete cuts (rows of a batch)."""
        cuts = np.atleast_2d(np.asarray(cuts, dtype=np.int64))
        pos = np.empty(self.n, dtype=np.int64)
        pos[self.lin.order] = np.arange(self.n)
        son = (pos[None, :, None] >= cuts[:, None, :]).sum(axis=2)
        dcut = self.device_cut[cuts]
        dst = (np.arange(len(self.cluster))[None, :, None] >= dcut[:, None, :]).sum(axis=2)
        return son, dst

    def values(self, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Iteration time (inf: cannot run) and fits-in-memory of each row of complete cuts."""
        son, dst = self.assignment(cuts)
        res = self.evaluator.evaluate(son, dst)
        it = np.where(res.feasible, res.iteration_s, np.inf)
        return it, res.feasible & ~res.over_memory

    def value(self, cuts: list[int]) -> tuple[float, bool]:
        """Cached ``values`` of one plan."""
        key = tuple(int(c) for c in cuts)
        if key not in self.cache:
            it, fits = self.values(np.asarray([key]))
            self.cache[key] = (float(it[0]), bool(fits[0]))
        return self.cache[key]

    def reward(self, iteration_s: float, fits: bool) -> float:
        """§4.4: 1/L, or -1/sqrt(L) when out of memory; L in ideal iterations."""
        if not np.isfinite(iteration_s):
            return -1.0
        length = iteration_s / self.ideal_s
        return 1.0 / length if fits else -1.0 / np.sqrt(length)

    def plan(self, cuts: list[int]) -> Plan:
        son, dst = self.assignment(cuts)
        return self.evaluator.plan(son[0], dst[0])

    def describe(self, cuts: list[int]) -> dict:
        """Cut positions, the nodes before each cut and their layers, and the device cuts."""
        ids = [self.graph.ids[int(self.lin.order[c - 1])] for c in cuts]
        return {"cuts": [int(c) for c in cuts], "nodes": self.n, "after": ids,
                "layers": [layer_of(i) for i in ids], "device_cuts": [int(self.device_cut[c]) for c in cuts],
                "centers": list(self.centers), "radius": self.radius_used, "candidates": int(self.pivots.size)}


def _coefs(keys: np.ndarray, coef) -> tuple[np.ndarray, np.ndarray]:
    """``coef(*key)`` -> (unit, fixed) for every key in ``keys`` (..., m) of device indices,
    computed once per distinct key."""
    base = int(keys.max()) + 1
    code = np.zeros(keys.shape[:-1], dtype=np.int64)
    for i in range(keys.shape[-1]):
        code = code * base + keys[..., i]
    uniq, inv = np.unique(code.ravel(), return_inverse=True)
    digits = [(uniq // base ** (keys.shape[-1] - 1 - i)) % base for i in range(keys.shape[-1])]
    vals = np.array([coef(*(int(d[u]) for d in digits)) for u in range(uniq.size)], dtype=float).reshape(-1, 2)
    inv = inv.reshape(code.shape)
    return vals[inv, 0], vals[inv, 1]


def layer_of(node_id: str) -> str:
    """The layer an operator node belongs to: its id up to the last '/' (op-level graphs
    name nodes ``LAYER/OP``); a layer-level node is its own layer."""
    return node_id.rsplit("/", 1)[0] if "/" in node_id else node_id
