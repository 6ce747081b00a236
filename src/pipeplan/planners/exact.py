"""``exact``: the yardstick — the best simulated plan of a small instance, by exhaustive search.

What it searches: every interval partition of the (linearized) layers x every assignment of
disjoint non-empty device sets to the stages (devices may stay idle) x replica sharing
{split, round-robin} x, for round-robin, every order of each stage's replicas (replica r
of k takes microbatches r, r+k, ..., so the order decides who takes the extra microbatches
and which replicas exchange data) x schedules {gpipe, 1f1b, spp-pe}. Each candidate is
simulated; one that overflows is simulated again with re-materialization (Huang et al.
2019, §2.3) on exactly the stages that overflowed, and kept if it then fits.

Reductions, each exact:

- Interchangeable devices (equal in every field but the name, and swapping them leaves
  every link unchanged) are counted, not named: swapping two of them maps every plan onto
  one the simulator times identically. Round-robin orders are enumerated as sequences of
  device classes; replicas after the M-th take no microbatch and keep one order.
- Split replicas run one program in lockstep on a microbatch shared by speed: their order
  in a stage is immaterial.

Branch and bound, per replica mode: a partial plan is cut when, for each mode, a lower
bound on the simulated iteration of every completion already reaches the best plan found.
With ``peak`` a device's most reference work per second in any pass (its solo speed when
calibrated, the sum over its resources of the faster pass: ``sim.bounds.peak_rates``), the
bounds below hold for every completion, schedule, recompute setting, latency, one-way
link, per-call fixed time, action overhead and optimizer step (these only add time), on
full- and half-duplex clusters:

- compute: every task lasts at least its work over the summed peak of the devices that run
  it (a split share adds its fixed part at the slowest replica's speed, so it never goes
  below work / sum of speeds). A stage's busiest device is busy at least
  ``M (f+b) / sum(peak)``; round-robin replica r runs ``len(range(r, M, k))`` whole
  microbatches, so in any order the slowest replica runs at least the fewest and some
  replica the most (with the order fixed, each its own count at its peak). That device's
  first task is a forward, which waits for its microbatch's forwards and forward transfers
  through the stages before; after its last backward come that microbatch's backward
  transfers and backwards through them: at least ``(f+b)/sum(peak)`` per stage and the
  cheapest transfer each way per cut. With a schedule that splits the backward (zero bubble,
  ``split_backward``) among those searched, a device's last task may be a weight gradient
  that nothing on the stages before waits for: the chain is then the forward half alone
  (``f/sum(peak)`` per stage, the forward transfer per cut). A cut no edge crosses still
  orders the stages but sends nothing (no transfer, no channel).
- channel: split stages send all M microbatches over one channel per direction (both
  directions on one channel when half-duplex), each transfer of ``sim.formulas.transfer_time``.
  Round-robin replicas each use their own channel per pair of replicas and direction: the
  busiest pair carries ``max_x,y #{m < M: m mod k_a = x, m mod k_b = y}`` transfers each way,
  each at least the cheapest single link's bytes / bandwidth + latency. A direction is
  added to the other only on a half-duplex cluster (one shared channel); else the larger.
- memory: weights, gradients and optimizer state are counted on every device of a stage
  (each device's program lists the stage), whatever else it holds; a stage whose state alone
  exceeds one of its devices overflows in every completion, with or without re-materialization.

Floating sums in another order than the simulator's are absorbed by a relative ``SLACK``.
With full-duplex links and no contention, re-materializing exactly the stages that
overflow is also the best recompute setting: each channel carries its transfers in its
sender's program order, so the iteration is a longest path, non-decreasing in every
duration, and a stage's memory depends only on its own setting (``tests/test_exact.py``).
On a half-duplex cluster or with contention the engine's arbitration can make extra
recomputation a few percent faster; exact does not search that (docs/spp.md).

The search starts from the SPP plan (an incumbent only). Its budget counts evaluations,
partial plans bounded and plans simulated (``-O evaluations``, so the same command gives the same plan on any machine), with wall-clock
seconds only as an optional cap (``-O budget``); when either stops it the plan says
``complete: false`` and why. ``tests/test_exact.py`` checks it against a brute force, and
``benchmarks/joint/optimality.py`` against an enumeration that shares none of its code.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..budget import Budget
from ..cluster import Cluster
from ..cluster.symmetry import device_classes
from ..sim.formulas import precision_of, state_bytes
from ..errors import Infeasible, PipeplanError
from ..graph import Graph, linearize
from ..plan import Plan, Stage
from ..schedule import SCHEDULES as SCHEDULE_KINDS
from ..sim import SimResult, simulate
from ..sim.bounds import peak_rates
from .base import PlanOptions, register
from .ranking import rank_key

MAX_LAYERS, MAX_DEVICES = 12, 8
SCHEDULES = ("gpipe", "1f1b", "spp-pe")
#: what ``--schedule`` may pin: exact's schedules and zero-bubble H1 (one stage per device)
PINNABLE = SCHEDULES + ("zb-h1",)
MODES = ("split", "round-robin")
SLACK = 1e-9  # relative: prune only what the bound beats by more than float noise
#: Evaluations the search may make by default: partial plans bounded plus plans simulated
#: (about 0.1 ms and a few ms each here). Every instance of ``benchmarks/joint/gap.py`` (up to
#: 8 layers, 5 devices) completes well within them.
DEFAULT_EVALUATIONS = 1_000_000


def crossed_cuts(graph: Graph, order: np.ndarray) -> np.ndarray:
    """``out[k]``: some edge crosses the cut after the first k nodes of ``order`` (else the
    simulator orders the two stages but sends nothing between them)."""
    n = len(graph)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    diff = np.zeros(n + 2)
    for u, w in graph.edges:
        lo, hi = sorted((int(pos[u]), int(pos[w])))
        diff[lo + 1] += 1
        diff[hi + 1] -= 1
    return np.cumsum(diff)[: n + 1] > 0


def link_floors(cluster: Cluster, a: list[int], b: list[int], nbytes: float) -> np.ndarray:
    """Least transfer time of one microbatch a -> b and b -> a, per mode: rows (split,
    round-robin), columns (forward, backward). Split: ``sim.formulas.transfer_time``;
    round-robin: the cheapest single link. inf where no link can carry it."""
    out = np.full((2, 2), np.inf)
    for col, (src, dst) in enumerate(((a, b), (b, a))):
        bw = cluster.bandwidth[np.ix_(src, dst)]
        lat = cluster.latency[np.ix_(src, dst)]
        if bw.min() > 0:
            out[0, col] = nbytes / (len(src) * len(dst) * float(bw.min())) + float(lat.max())
        ok = bw > 0
        if ok.any():
            out[1, col] = float((nbytes / bw[ok] + lat[ok]).min())
    return out


def busiest_pair(ka: int, kb: int, m: int) -> int:
    """Most microbatches one round-robin replica pair exchanges: m goes from replica
    m mod ka to replica m mod kb."""
    micro = np.arange(m)
    return int(np.bincount((micro % ka) * kb + micro % kb).max())


def channel_bounds(floors: np.ndarray, half: bool, ka: int, kb: int, m: int) -> np.ndarray:
    """Least time the busiest channel between two consecutive stages needs, per mode."""
    per = floors.sum(axis=1) if half else floors.max(axis=1)
    return per * np.array([m, busiest_pair(ka, kb, m)])


def replica_orders(devs: list[int], class_of: list[int], m: int) -> list[list[int]]:
    """Every distinct round-robin order of a stage's devices up to interchangeable devices:
    the class sequence of the first min(k, M) replicas (the others run no microbatch)."""
    labels = sorted(class_of[d] for d in devs)
    out = []
    for head in sorted({p[:m] for p in itertools.permutations(labels)}):
        rest = list(labels)
        for c in head:
            rest.remove(c)
        pools = {c: [d for d in devs if class_of[d] == c] for c in set(labels)}
        out.append([pools[c].pop(0) for c in list(head) + rest])
    return out


class _Part(NamedTuple):
    """A placed stage: layers [layer, end) of the linearization on ``devs``; ``through``:
    per mode, the least time one microbatch spends before and after it (its chain)."""

    layer: int
    end: int
    devs: list[int]
    through: np.ndarray


def round_robin_shares(k: int, m: int) -> np.ndarray:
    """Microbatches of round-robin replica r of k: r, r+k, ... below M."""
    return np.array([len(range(r, m, k)) for r in range(k)])


@dataclass
class _Best:
    """The first plan so far by ``ranking.rank_key``: the fastest that fits, else the one
    that overflows least."""

    key: tuple[int, float, float] = (2, 0.0, np.inf)
    plan: Plan | None = None

    @property
    def time(self) -> float:
        """The incumbent's time when it fits (the bound that prunes), else infinity."""
        return self.key[2] if self.key[0] == 0 else np.inf

    def offer(self, plan: Plan, r: SimResult, allow_over: bool) -> None:
        key = rank_key(r, allow_over)
        if key < self.key:
            self.key, self.plan = key, plan


def rematerialized(plan: Plan, r: SimResult) -> Plan:
    """The plan with re-materialization on exactly the stages whose devices overflow."""
    over = {s for s, b, lim in zip(r.stage_of_device, r.memory_bytes, r.memory_limit) if b > lim}
    return replace(plan, recompute=[s in over for s in range(plan.num_stages)])


@dataclass
class _Search:
    """Depth-first over stages: the next stage's end layer and device classes, with
    per-mode lower bounds (module docstring)."""

    graph: Graph
    cluster: Cluster
    options: PlanOptions
    budget: Budget
    schedules: tuple[str, ...] = SCHEDULES
    best: _Best = field(default_factory=_Best)

    def __post_init__(self) -> None:
        self.lin = linearize(self.graph)
        self.classes = device_classes(self.cluster)
        self.class_of = [0] * len(self.cluster)
        for k, cls in enumerate(self.classes):
            for d in cls:
                self.class_of[d] = k
        self.peak, self.mem = peak_rates(self.cluster), self.cluster.usable
        self.comp = self.lin.fwd_cum + self.lin.bwd_cum
        # the chain through the stages before a device: forward and backward, or with a split
        # backward (zero bubble) the forward alone (module docstring)
        split = any(SCHEDULE_KINDS[s].split_backward for s in self.schedules)
        self.chain, self.chain_ways = (self.lin.fwd_cum, 1) if split else (self.comp, 2)
        self.crossed = crossed_cuts(self.graph, self.lin.order)
        self.half = self.cluster.meta.get("duplex", "full") == "half"
        self.stats = {"candidates": 0, "simulated": 0, "bounded": 0, "evaluations": 0, "complete": True,
                      "device_classes": len(self.classes)}

    def out_of_time(self) -> bool:
        """True (and the search marked incomplete, with why) once the budget is spent."""
        self.stats["evaluations"] = self.stats["simulated"] + self.stats["bounded"]
        why = self.budget.why_stopped(self.stats["evaluations"])
        if why is not None and self.stats["complete"]:
            self.stats.update(complete=False, incomplete=why)
        return not self.stats["complete"]

    def simulate_fit(self, plan: Plan) -> None:
        """Simulate a candidate (and its re-materialized variant when it overflows)."""
        try:
            r = simulate(plan, timeline=False)
            self.stats["simulated"] += 1
            if r.over_memory and not self.options.allow_over_memory:
                plan = rematerialized(plan, r)
                r = simulate(plan, timeline=False)
                self.stats["simulated"] += 1
        except Infeasible:  # a round-robin pair with no link
            return
        self.best.offer(plan, r, self.options.allow_over_memory)

    def consider(self, parts: list[_Part], alive: np.ndarray, bound: np.ndarray) -> None:
        """Every mode still alive x replica order x schedule of a complete partition."""
        self.stats["candidates"] += 1
        g, cl, m = self.graph, self.cluster, self.options.microbatches
        layers = [[g.ids[u] for u in self.lin.interval(p.layer, p.end)] for p in parts]
        replicated = any(len(p.devs) > 1 for p in parts)
        for mode in MODES if replicated else MODES[:1]:  # one device per stage: the modes coincide
            if not alive[MODES.index(mode)]:
                continue
            orders = ([[p.devs for p in parts]] if mode == "split" else
                      itertools.product(*[replica_orders(p.devs, self.class_of, m) for p in parts]))
            for devs in orders:
                if self.out_of_time():
                    return
                if mode != "split" and max(bound[1], self.order_bound(parts, devs)) * (1 - SLACK) >= self.best.time:
                    continue
                stages = [Stage(ls, [cl.devices[d].name for d in ds]) for ls, ds in zip(layers, devs)]
                for sched in self.schedules:
                    self.simulate_fit(Plan(g, cl, stages, m, schedule=sched, optimizer=self.options.optimizer,
                                           replicas=mode))

    def order_bound(self, parts: list[_Part], orders: tuple[list[int], ...]) -> float:
        """Round-robin with these replica orders: each stage's busiest replica (its own
        microbatches at its peak rate) between its chain's two halves."""
        m, out = self.options.microbatches, 0.0
        for p, devs in zip(parts, orders):
            work = float(self.comp[p.end] - self.comp[p.layer])
            busiest = float((round_robin_shares(len(devs), m) / self.peak[devs]).max()) * work
            out = max(out, float(p.through[1]) + busiest)
        return out

    def stage_bounds(self, layer: int, end: int, prev: list[int] | None, devs: list[int],
                     path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per mode: the bound this stage sets, and the chain through it (``path``: one
        microbatch's forward and backward through the stages before, transfers between)."""
        self.stats["bounded"] += 1
        m = self.options.microbatches
        peak = self.peak[devs]
        work = float(self.comp[end] - self.comp[layer])
        rr = round_robin_shares(len(devs), m)  # in some order: the slowest takes >= min, someone max
        busiest = work * np.array([m / peak.sum(), max(m / peak.sum(), rr.min() / peak.min(), rr.max() / peak.max())])
        chan, through = np.zeros(2), path  # an uncrossed cut orders the stages, sends nothing
        if prev is not None and self.crossed[layer]:
            floors = link_floors(self.cluster, prev, devs, float(self.lin.cut_bytes[layer]))
            chan = channel_bounds(floors, self.half, len(prev), len(devs), m)
            through = path + floors[:, :self.chain_ways].sum(axis=1)
        return np.maximum(chan, through + busiest), through

    def search(self, layer: int, avail: list[int], prev: list[int] | None, parts: list,
               load: np.ndarray, path: np.ndarray) -> None:
        """Extend ``parts`` (layers before ``layer`` placed) by one stage in every way the
        bounds ``load`` (per mode, so far) and ``path`` (the chain so far) leave open."""
        n = self.lin.n
        for end in range(layer + 1, n + 1):
            state = state_bytes(float(self.lin.params_cum[end] - self.lin.params_cum[layer]), self.options.optimizer,
                                precision_of(self.graph.meta))
            for counts in itertools.product(*[range(a + 1) for a in avail]):
                if self.out_of_time():
                    return
                if not any(counts):
                    continue
                devs = [d for k, c in enumerate(counts) for d in self.classes[k][len(self.classes[k]) - avail[k]:][:c]]
                if state > float(self.mem[devs].min()) * (1 + SLACK) and not self.options.allow_over_memory:
                    continue
                bound, through = self.stage_bounds(layer, end, prev, devs, path)
                bound = np.maximum(load, bound)
                alive = bound * (1 - SLACK) < self.best.time
                if not alive.any():
                    continue
                rest = [a - c for a, c in zip(avail, counts)]
                here = parts + [_Part(layer, end, devs, through)]
                per_micro = float(self.chain[end] - self.chain[layer]) / float(self.peak[devs].sum())
                if end == n:
                    self.consider(here, alive, bound)
                elif any(rest):
                    self.search(end, rest, devs, here, bound, through + per_micro)


def _spp_incumbent(graph: Graph, cluster: Cluster, options: PlanOptions) -> list[tuple[Plan, SimResult]]:
    """SPP's plan, simulated, as the first incumbent when it lies in the searched space."""
    from .spp import plan_spp

    try:
        seed = plan_spp(graph, cluster, options)  # SPP reads its own settings, not exact's
        if seed.schedule in SCHEDULES and not any(seed.recompute or []):
            return [(seed, simulate(seed, timeline=False))]
    except (PipeplanError, Infeasible):
        pass
    return []


def within_limits(graph: Graph, cluster: Cluster) -> bool:
    return len(graph) <= MAX_LAYERS and len(cluster) <= MAX_DEVICES


def search_exhaustively(graph: Graph, cluster: Cluster, options: PlanOptions, budget: Budget,
                        schedules: tuple[str, ...] = SCHEDULES,
                        incumbents: list[tuple[Plan, SimResult]] = ()) -> tuple[Plan | None, dict]:
    """The best plan of the space the module docstring names (with ``schedules``), or the
    overflowing plan that overflows least when nothing fits (None: no plan runs), and the
    search's facts: ``complete`` is True only when the whole space was searched or bounded.
    ``incumbents`` (simulated plans, in the space or not) only prune: an answer is never
    worse than the best of them that fits, and may be one of them."""
    s = _Search(graph, cluster, options, budget, tuple(schedules))
    for plan, r in incumbents:
        s.best.offer(plan, r, options.allow_over_memory)
    s.search(0, [len(c) for c in s.classes], None, [], np.zeros(2), np.zeros(2))
    s.stats["seconds"] = budget.elapsed
    return s.best.plan, s.stats


@dataclass(frozen=True)
class ExactOptions:
    evaluations: int = field(default=DEFAULT_EVALUATIONS, metadata={"min": 1, "help": (
        "partial plans bounded plus plans simulated; when they run out the plan says complete: false")})
    budget: float | None = field(default=None, metadata={"above": 0, "duration": True, "help": (
        "a wall-clock cap (90s, 3m, 1h; a bare number is seconds; default: none, so that the same command gives "
        "the same plan on any machine); when it stops the search the plan says complete: false")})


def _budget_s(graph: Graph, cluster: Cluster, options: PlanOptions) -> float | None:
    """The seconds the search may take, for progress bars: its cap (None: no cap)."""
    return options.settings_of(ExactOptions).budget


@register("exact", "exhaustive search over partitions, replication, mapping, replica order and "
          "schedules (small instances: <= 12 layers, <= 8 devices)", "best", options=ExactOptions,
          estimate=_budget_s, in_best=False)
def plan_exact(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """The best simulated plan of a small instance (module docstring)."""
    n, v = len(graph), len(cluster)
    if not within_limits(graph, cluster):
        raise PipeplanError(f"exact: instance too large ({n} layers, {v} devices; "
                            f"at most {MAX_LAYERS} and {MAX_DEVICES})")
    opts = options.settings_of(ExactOptions)
    schedules = SCHEDULES
    if options.schedule is not None:
        if options.schedule not in PINNABLE:
            raise PipeplanError(f"exact: --schedule {options.schedule} is not a schedule it searches "
                                f"({', '.join(PINNABLE)})")
        schedules = (options.schedule,)
    seeds = [pr for pr in _spp_incumbent(graph, cluster, options) if pr[0].schedule in schedules]
    plan, stats = search_exhaustively(graph, cluster, options, Budget(opts.budget, opts.evaluations), schedules, seeds)
    if plan is None:
        raise Infeasible("exact: no plan fits in memory: the weights, gradients and optimizer state "
                         "alone overflow every device set")
    plan.extra = {"exact": stats}
    return plan
