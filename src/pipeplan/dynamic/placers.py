"""Placements of a dynamic tree network's nodes onto devices (dynpartition.txt §6.1's action:
"an allocation of nodes to devices"), scored by ``sim.formulas.simulate``:

* the paper's baselines: ``static`` (§8.2.1-8.2.2: every node on one device) and
  ``random_placement`` (§8.2.3: each node on a uniformly drawn device);
* ``heft``: earliest-finish-time list scheduling (HEFT, Topcuoglu et al. 2002; by default
  with a one-step lookahead), a fast per-input heuristic;
* ``optimal``: the exact best placement of a small tree, by exhaustive search over the
  placements that are distinct up to interchangeable devices, pruned by branch and bound
  and evaluated in numpy batches (``evaluate_many``, which gives exactly what ``simulate``
  gives);
* ``local_search``: hill climbing by single-node moves.

A placement is a list of device indices, one per node (index into ``machine.devices``); a
node's output part (TreeLSTM) runs on its state's device.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import PipeplanError
from .simulator import Machine, TreeProfile, part_seconds, simulate

#: placements evaluated per numpy batch in ``optimal``
BATCH = 1 << 15


# ----------------------------------------------------------------------------- baselines
def static(tree_n: int, device: int, devices: int | None = None) -> list[int]:
    """Every node on ``device`` (§8.2.1 static GPU, §8.2.2 static CPU); ``devices`` (the
    machine's device count), when given, is checked against."""
    if tree_n < 1:
        raise PipeplanError(f"static: a tree has at least one node, got {tree_n}")
    if device < 0 or (devices is not None and device >= devices):
        raise PipeplanError(f"static: device {device} is not one of the machine's {devices} devices")
    return [int(device)] * tree_n


def random_placement(n: int, devices: int | Sequence[int], rng: np.random.Generator) -> list[int]:
    """Each of ``n`` nodes on a uniformly drawn device (§8.2.3): ``devices`` is a device
    count (all of them) or the device indices to draw from (e.g. the CPU and one GPU)."""
    choices = list(range(devices)) if isinstance(devices, (int, np.integer)) else [int(d) for d in devices]
    if n < 1:
        raise PipeplanError(f"random_placement: a tree has at least one node, got {n}")
    if not choices or min(choices) < 0:
        raise PipeplanError(f"random_placement: no valid devices to draw from ({devices!r})")
    return [choices[k] for k in rng.integers(len(choices), size=n)]


# ----------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class _Tables:
    """Per node and device: state and output seconds, the machine's part overhead included
    (outputs: zeros without them); per device pair: the seconds of sending a state and an
    output's input; all as ``simulate`` computes them."""

    state: np.ndarray
    out: np.ndarray
    has_out: bool
    ts: np.ndarray
    to: np.ndarray


def _tables(prof: TreeProfile, m: Machine) -> _Tables:
    if not m.devices:
        raise PipeplanError("the machine has no devices")
    D = len(m.devices)
    extra = m.part_overhead_s  # simulate adds it to every part's seconds
    state = np.stack([part_seconds(prof.state, d) for d in m.devices], axis=1) + extra
    has_out = prof.output is not None
    out = np.zeros_like(state)
    if has_out:
        out = np.stack([part_seconds(prof.output, d) for d in m.devices], axis=1) + extra
    ts = np.array([[m.transfer_s(a, b, prof.state_bytes) for b in range(D)] for a in range(D)])
    to = np.array([[m.transfer_s(a, b, prof.output_bytes) for b in range(D)] for a in range(D)])
    return _Tables(state, out, has_out, ts, to)


def _as_placements(placements, n: int, D: int) -> np.ndarray:
    X = np.asarray(placements, dtype=np.intp)
    X = X.reshape(1, -1) if X.ndim == 1 else X
    if X.ndim != 2 or X.shape[1] != n:
        raise PipeplanError(f"placements of shape {X.shape} do not fit a tree of {n} nodes")
    if X.size and (X.min() < 0 or X.max() >= D):
        raise PipeplanError(f"a placement uses a device outside the machine's {D} devices")
    return X


def evaluate_many(prof: TreeProfile, m: Machine, placements) -> np.ndarray:
    """``simulate``'s seconds for each row of ``placements`` (B x n device indices; output
    parts on their state's device), computed for all rows at once: the same event
    simulation, one event per step in every row (the pending part that is ready first, ties
    to the state before the output and the lower node, as ``simulate``'s heap orders them),
    with the same floating-point operations, so the results are equal, not just close."""
    X = _as_placements(placements, len(prof.children), len(m.devices))
    return _evaluate(prof, _tables(prof, m), X)


def _evaluate(prof: TreeProfile, tab: _Tables, X: np.ndarray) -> np.ndarray:
    B, n = X.shape
    D, nodes = tab.ts.shape[0], np.arange(n)
    P = 2 * n if tab.has_out else n  # parts: states 0..n-1, outputs n..2n-1; column P: none
    W = P + 1
    dev, cost = np.zeros((B, W), dtype=np.intp), np.zeros((B, W))
    dev[:, :n], cost[:, :n] = X, tab.state[nodes, X]
    follow = np.full(W, P, dtype=np.intp)  # a state's output part
    if tab.has_out:
        dev[:, n:P], cost[:, n:P], follow[:n] = X, tab.out[nodes, X], nodes + n
    parent = np.full(W, P, dtype=np.intp)  # the state a part's state feeds
    parent[:n - 1] = prof.parents[:n - 1]
    ready = np.full((B, W), np.inf)
    ready[:, [i for i, ch in enumerate(prof.children) if not ch]] = 0.0
    waiting = np.tile(np.array([len(ch) for ch in prof.children] + [0] * (W - n - 1) + [1 << 40]), (B, 1))
    arrived, free, finish = np.zeros((B, W)), np.zeros((B, D)), np.zeros(B)
    rf, df, wf, af, cf, ff = ready.ravel(), dev.ravel(), waiting.ravel(), arrived.ravel(), cost.ravel(), free.ravel()
    base_w, base_d, to_self = np.arange(B) * W, np.arange(B) * D, np.diag(tab.to).copy()
    for _ in range(P):
        k = ready.argmin(axis=1)  # the first minimum: the lowest (part, node), as the heap's tuples
        fk = base_w + k
        r = rf[fk]
        rf[fk] = np.inf
        d = df[fk]
        fd = base_d + d
        end = np.maximum(r, ff[fd]) + cf[fk]
        ff[fd] = end
        np.maximum(finish, end, out=finish)
        if tab.has_out:
            rf[base_w + follow[k]] = np.where(k < n, end + to_self[d], np.inf)
        fp = base_w + parent[k]
        a = np.maximum(af[fp], end + tab.ts[d, df[fp]])
        af[fp] = a
        w = wf[fp] - 1
        wf[fp] = w
        rf[fp] = np.where(w == 0, a, rf[fp])
    return finish


# ----------------------------------------------------------------------------- HEFT
def heft(prof: TreeProfile, m: Machine, lookahead: bool = True) -> list[int]:
    """HEFT (Topcuoglu et al. 2002) over the tree, a per-input heuristic for §6.1's action.
    A node's upward rank is its mean cost over devices (state + output) plus the mean
    transfer of a state between distinct devices plus its parent's rank; nodes are taken in
    decreasing rank (ties: the lower node, so children before parents) and each is put on a
    device with HEFT's insertion policy (``_earliest_slot``: the earliest idle gap after its
    children's states have arrived, ordered as ``simulate``'s devices run parts). Device
    choice: the earliest finish (``lookahead=False``, plain HEFT), or by default a one-step
    lookahead (Bittencourt et al. 2010): the device from which the parent's state could end
    soonest, then the earliest finish, then the lower device; plain HEFT sends MathFunc's
    free input lookups to any idle device, then pays their transfers. A node's output part
    follows its state on the same device; the parent waits for the state only. The schedule
    is HEFT's estimate; ``simulate`` scores the placement."""
    n = len(prof.children)
    tab = _tables(prof, m)
    state, ts, D = tab.state, tab.ts, len(m.devices)
    total = state + tab.out
    comm = float(ts[~np.eye(D, dtype=bool)].mean()) if D > 1 else 0.0
    w = total.mean(axis=1)
    rank = np.empty(n)
    for i in range(n - 1, -1, -1):  # parents after children in post-order
        p = int(prof.parents[i])
        rank[i] = w[i] + (comm + rank[p] if p >= 0 else 0.0)
    busy: list[tuple[list, list, list]] = [([], [], []) for _ in range(D)]  # starts, ends, (ready, node)
    done = np.zeros(n)  # when each node's state is computed
    place = np.zeros(n, dtype=np.intp)
    for i in np.lexsort((np.arange(n), -rank)).tolist():
        ch = list(prof.children[i])
        ready = (done[ch, None] + ts[place[ch], :]).max(axis=0).tolist() if ch else [0.0] * D
        slots = [_earliest_slot(*busy[e], (ready[e], i), total[i, e]) for e in range(D)]
        fin = [slots[e][0] + total[i, e] for e in range(D)]
        p = int(prof.parents[i])
        look = [0.0] * D
        if lookahead and p >= 0:
            ends = np.array([slots[e][0] + state[i, e] for e in range(D)])[:, None] + ts + state[p]
            look = ends.min(axis=1).tolist()
        d = min(range(D), key=lambda e: (look[e], fin[e], e))
        s, k = slots[d]
        for seq, x in zip(busy[d], (s, fin[d], (ready[d], i))):
            seq.insert(k, x)
        place[i], done[i] = d, s + state[i, d]
    return place.tolist()


def _earliest_slot(starts: list[float], ends: list[float], keys: list[tuple[float, int]],
                   key: tuple[float, int], cost: float) -> tuple[float, int]:
    """HEFT's insertion policy, as ``simulate``'s devices run parts (in order of readiness):
    the earliest start at or after the node's ready time ``key[0]`` of an idle gap of
    ``cost`` seconds between a device's busy intervals (sorted, disjoint) that only comes
    before intervals of parts ready later (``keys``: ready time, node); and its position."""
    k = bisect_right(ends, key[0])
    s = key[0]
    while k < len(starts) and (s + cost > starts[k] or keys[k] < key):
        s = max(s, ends[k])
        k += 1
    return s, k


# ----------------------------------------------------------------------------- exact search
def interchangeable(m: Machine) -> list[list[int]]:
    """Classes of interchangeable devices: equal cost numbers and a machine unchanged by
    swapping the two (links to and from every other device, to each other, to themselves)."""
    D = len(m.devices)
    spec = [(d.op_s, d.flop_rate, d.element_rate) for d in m.devices]
    lat, bw = np.asarray(m.latency), np.asarray(m.bandwidth)

    def same(a: int, b: int) -> bool:
        if spec[a] != spec[b]:
            return False
        perm = np.arange(D)
        perm[[a, b]] = b, a
        return all(np.array_equal(x, x[np.ix_(perm, perm)]) for x in (lat, bw))

    classes: list[list[int]] = []
    for d in range(D):
        for c in classes:
            if same(c[0], d):
                c.append(d)
                break
        else:
            classes.append([d])
    return classes


def count_canonical(n: int, m: Machine) -> int:
    """How many placements of ``n`` nodes are distinct up to interchangeable devices (those
    that use each class's devices in first-use order)."""
    sizes = [len(c) for c in interchangeable(m)]
    counts: dict[tuple[int, ...], int] = {tuple([0] * len(sizes)): 1}
    for _ in range(n):
        nxt: dict[tuple[int, ...], int] = {}
        for used, ways in counts.items():
            for c, u in enumerate(used):
                if u:
                    nxt[used] = nxt.get(used, 0) + ways * u
                if u < sizes[c]:
                    key = used[:c] + (u + 1,) + used[c + 1:]
                    nxt[key] = nxt.get(key, 0) + ways
        counts = nxt
    return sum(counts.values())


def _classes(m: Machine) -> tuple[np.ndarray, np.ndarray, int]:
    """Each device's class and rank in its class, and the number of classes."""
    classes = interchangeable(m)
    cls, rank = np.zeros(len(m.devices), dtype=np.intp), np.zeros(len(m.devices), dtype=np.intp)
    for c, members in enumerate(classes):
        cls[members], rank[members] = c, np.arange(len(members))
    return cls, rank, len(classes)


def _grow(P: np.ndarray, U: np.ndarray, cls: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every canonical one-node extension of the prefixes ``P`` (their classes' used device
    counts ``U``): a used device or its class's next one. Returns the parent row of each
    extension, its device, the extended prefixes and counts (lexicographic order)."""
    r, d = np.nonzero(rank[None, :] <= U[:, cls])
    newP = np.concatenate([P[r], d[:, None].astype(P.dtype)], axis=1)
    newU = U[r]
    fresh = np.nonzero(rank[d] == newU[np.arange(len(d)), cls[d]])[0]
    newU[fresh, cls[d[fresh]]] += 1
    return r, d, newP, newU


def canonical_placements(n: int, m: Machine, batch: int = BATCH) -> Iterator[np.ndarray]:
    """The canonical placements of ``n`` nodes (``count_canonical`` of them: a class's next
    device used only once its earlier ones are) in lexicographic order, in int8 arrays of at
    most ``batch`` x devices rows."""
    cls, rank, C = _classes(m)
    stack = [(np.zeros((1, 0), dtype=np.int8), np.zeros((1, C), dtype=np.intp))]
    while stack:
        P, U = stack.pop()
        if P.shape[1] == n:
            yield P
            continue
        _, _, newP, newU = _grow(P, U, cls, rank)
        for lo in range(((len(newP) - 1) // batch) * batch, -1, -batch):  # the first piece on top
            stack.append((newP[lo:lo + batch], newU[lo:lo + batch]))


@dataclass
class _Prefixes:
    """Placed prefixes (nodes 0..i-1) and what bounds their completions: each placed node's
    state end without contention (``est``), each device's work (``load``), the longest
    chain bound (``chain``) and the classes' used device counts (``used``)."""

    place: np.ndarray
    used: np.ndarray
    est: np.ndarray
    load: np.ndarray
    chain: np.ndarray

    def take(self, sl) -> "_Prefixes":
        return _Prefixes(self.place[sl], self.used[sl], self.est[sl], self.load[sl], self.chain[sl])


def _floors(prof: TreeProfile, tab: _Tables) -> tuple[np.ndarray, np.ndarray]:
    """Per node i: the least work (states and outputs, each on its cheapest device) of the
    nodes after i, and the least seconds of the chain above i (its ancestors' states and the
    root's output, each on its cheapest device; 0 for the root)."""
    n = len(prof.children)
    work = (tab.state + tab.out).min(axis=1)
    after = np.concatenate([np.cumsum(work[::-1])[::-1][1:], [0.0]])
    cheap, tail = tab.state.min(axis=1), np.zeros(n)
    for i in range(n - 2, -1, -1):
        p = int(prof.parents[i])
        tail[i] = cheap[p] + (tail[p] if p < n - 1 else tab.out[p].min())
    return after, tail


def _extend(pre: _Prefixes, prof: TreeProfile, tab: _Tables, cls: np.ndarray, rank: np.ndarray,
            floors: tuple[np.ndarray, np.ndarray]) -> tuple[_Prefixes, np.ndarray]:
    """The canonical extensions of ``pre`` by its next node i and a lower bound on the
    ``simulate`` seconds of every completion of each: the largest of a device's work, all
    the work over the device count, and chains: i's state end without contention (its
    children's ends + transfers + its cost) then its output, or then its ancestors and the
    root's output (``_floors``)."""
    i, D = pre.place.shape[1], tab.ts.shape[0]
    r, d, place, used = _grow(pre.place, pre.used, cls, rank)
    e = np.zeros(len(r))
    for c in prof.children[i]:
        e = np.maximum(e, pre.est[r, c] + tab.ts[place[:, c], d])
    e += tab.state[i, d]
    load = pre.load[r]
    load[np.arange(len(r)), d] += tab.state[i, d] + tab.out[i, d]
    after, tail = floors
    chain = np.maximum(pre.chain[r], e + np.maximum(tab.out[i, d], tail[i]))
    out = _Prefixes(place, used, np.concatenate([pre.est[r], e[:, None]], axis=1), load, chain)
    bound = np.maximum(np.maximum(load.max(axis=1), chain), (load.sum(axis=1) + after[i]) / D)
    return out, bound


def optimal(prof: TreeProfile, m: Machine, max_work: int = 2_000_000,
            stats: dict | None = None) -> tuple[list[int], float]:
    """The placement with the fewest ``simulate`` seconds (output parts on their state's
    device) and those seconds: the exact optimum of §6.1's action for one input.

    Method: exhaustive search with symmetry breaking, pruned by branch and bound. Devices
    with equal cost numbers and links are interchangeable (``interchangeable``) and permuting
    them leaves ``simulate`` unchanged, so only the ``count_canonical`` placements that use
    each class's devices in first-use order are considered. They are grown node by node (post-order), depth first in numpy
    batches; a prefix whose lower bound (``_extend``: device work, average work, chains
    without contention) exceeds the best seconds known (at first HEFT's after a short
    ``local_search``) by more than rounding is dropped; complete placements are scored by
    ``evaluate_many``'s arithmetic, which is exactly ``simulate``'s. Ties go to the
    lexicographically first canonical placement. Raises once more than ``max_work`` prefixes
    and placements were grown and scored (the bound prunes well where one device dominates,
    badly where several are close). ``stats``, if given, receives the counts of canonical
    placements, prefixes grown and placements scored."""
    n, D = len(prof.children), len(m.devices)
    if D > 127:
        raise PipeplanError(f"optimal: {D} devices are too many for an exhaustive search")
    count = count_canonical(n, m)
    tab, (cls, rank, C) = _tables(prof, m), _classes(m)
    floors = _floors(prof, tab)
    _, bound = local_search(prof, m, heft(prof, m), np.random.default_rng(0), 4 * n * D)
    slack = 1 + 1e-9  # the bound and simulate add in different orders: a few ulps apart
    best, best_s, grown, scored = None, np.inf, 0, 0
    stack = [_Prefixes(np.zeros((1, 0), dtype=np.int8), np.zeros((1, C), dtype=np.intp), np.zeros((1, 0)),
                       np.zeros((1, D)), np.zeros(1))]
    while stack:
        if grown + scored > max_work:
            raise PipeplanError(f"optimal: a tree of {n} nodes has {count:,} canonical placements on {D} devices; "
                                f"the exact search passed max_work={max_work:,} partial placements unfinished")
        pre = stack.pop()
        if pre.place.shape[1] == n:
            t = _evaluate(prof, tab, pre.place.astype(np.intp))
            scored += len(t)
            k = int(t.argmin())
            if t[k] < best_s:
                best, best_s = pre.place[k].astype(int).tolist(), float(t[k])
                bound = min(bound, best_s)
            continue
        nxt, lower = _extend(pre, prof, tab, cls, rank, floors)
        nxt = nxt.take(np.nonzero(lower <= bound * slack)[0])
        grown += len(nxt.place)
        for lo in range(((len(nxt.place) - 1) // BATCH) * BATCH, -1, -BATCH):  # the first piece on top
            stack.append(nxt.take(slice(lo, lo + BATCH)))
    if stats is not None:
        stats.update(canonical=count, prefixes=grown, scored=scored)
    return best, simulate(prof, best, m)


# ----------------------------------------------------------------------------- local search
def _start(prof: TreeProfile, m: Machine, start: Sequence[int], evaluations: int,
           name: str) -> tuple[np.ndarray, "_Tables", float]:
    """A search's starting placement (checked), the cost tables and its seconds."""
    cur = _as_placements(start, len(prof.children), len(m.devices))[0]
    if evaluations < 1:
        raise PipeplanError(f"{name}: evaluations must be >= 1, got {evaluations}")
    tab = _tables(prof, m)
    return cur, tab, float(_evaluate(prof, tab, cur[None])[0])


def local_search(prof: TreeProfile, m: Machine, start: Sequence[int], rng: np.random.Generator,
                 evaluations: int = 10_000) -> tuple[list[int], float]:
    """Hill climbing from ``start`` by single-node moves: every round scores all moves of
    one node to another device (in a random order drawn from ``rng``, by ``evaluate_many``,
    i.e. ``simulate``) and takes the best if it is faster; stops at a local optimum or after
    ``evaluations`` scored placements. Returns the best placement and its seconds."""
    n, D = len(prof.children), len(m.devices)
    cur, tab, cur_s = _start(prof, m, start, evaluations, "local_search")
    left = evaluations - 1
    node, dev = np.divmod(np.arange(n * D), D)
    while left > 0 and D > 1:
        moves = rng.permutation(np.nonzero(dev != cur[node])[0])[:left]
        cand = np.tile(cur, (len(moves), 1))
        cand[np.arange(len(moves)), node[moves]] = dev[moves]
        t = _evaluate(prof, tab, cand)
        left -= len(moves)
        k = int(t.argmin())
        if not t[k] < cur_s:
            break
        cur, cur_s = cand[k], float(t[k])
    return cur.tolist(), cur_s


# ----------------------------------------------------------------------------- per-input searches
def random_search(prof: TreeProfile, m: Machine, rng: np.random.Generator, evaluations: int) -> tuple[list[int], float]:
    """The best of ``evaluations`` uniformly random placements (scored by ``evaluate_many``):
    the yardstick a learned policy's training evaluations are compared with."""
    if evaluations < 1:
        raise PipeplanError(f"random_search: evaluations must be >= 1, got {evaluations}")
    X = rng.integers(len(m.devices), size=(evaluations, len(prof.children)))
    t = evaluate_many(prof, m, X)
    k = int(t.argmin())
    return X[k].tolist(), float(t[k])


def annealing(prof: TreeProfile, m: Machine, start: Sequence[int], rng: np.random.Generator, evaluations: int,
              t0: float = 0.1) -> tuple[list[int], float]:
    """Simulated annealing by single-node moves from ``start``: a move that makes the tree
    slower by a fraction x is taken with probability exp(-x / T), T falling geometrically
    from ``t0`` to 1e-3 over ``evaluations`` scored placements. Returns the best seen."""
    n, D = len(prof.children), len(m.devices)
    cur, tab, cur_s = _start(prof, m, start, evaluations, "annealing")
    best, best_s = cur.copy(), cur_s
    nodes, shifts = rng.integers(n, size=evaluations), rng.integers(1, max(D, 2), size=evaluations)
    temps = t0 * (1e-3 / t0) ** (np.arange(evaluations) / max(evaluations - 1, 1))
    for k in range(1, evaluations if D > 1 else 1):
        cand = cur.copy()
        cand[nodes[k]] = (cand[nodes[k]] + shifts[k]) % D
        s = float(_evaluate(prof, tab, cand[None])[0])
        if s <= cur_s or rng.random() < np.exp(-(s / cur_s - 1) / temps[k]):
            cur, cur_s = cand, s
            if s < best_s:
                best, best_s = cand.copy(), s
    return best.tolist(), best_s
