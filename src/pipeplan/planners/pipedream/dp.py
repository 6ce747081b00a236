"""PipeDream's partitioning dynamic program (Narayanan et al., SOSP'19, §3.1), vectorized.

Semantics follow PipeDream's published optimizer (``optimizer_graph_hierarchical.py``):

- states are the antichain DAG's states (``antichain``); a stage is the difference of
  an ancestor state k and a state j;
- a stage on r workers takes ``(compute + 4 (r-1) params / (bandwidth r)) / r`` — its
  compute (forward + backward) shared by r replicas plus their weight synchronisation; the
  first stage's synchronisation is also divided by the workers of the level below;
- A[j][m] = min( first stage = all of state j on m+1 workers,
                 min over ancestors k of j and 1 <= r <= m of max(A[k][m-r], stage (k, j] on r) )
  — every worker of the level is used (``use_fewer_machines`` off, as by default);
- inter-stage transfers count only when an activation compression ratio is given (as in
  PipeDream), then ``2 x activation bytes / (bandwidth r x ratio)`` on the stage's input and
  output must also fit under the objective;
- with a memory limit, a stage on r of W workers stashes ``ceil((W - used) / r)`` copies of
  its activations and parameters (PipeDream's formula) and must fit;
- hierarchical topologies solve the innermost level for every segment, then treat a whole
  lower-level group as one worker of the next level (its best time is the segment's time).
  PipeDream's program indexes segments by topological position and so also evaluates
  "segments" between states that are not nested (their time is then a meaningless
  difference); only nested states form segments here.

The objective A[full][W-1] is PipeDream's "time per stage in pipeline". Where PipeDream's
program loops over (k, r) per state in Python, this evaluates all (j, k) ancestor pairs of
one worker count at once with numpy. Ties are broken as PipeDream's program does where it is
deterministic (a split must be strictly faster than the single stage; for one split point the
fewest workers for the last stage win); between split points its order follows a set of
node objects hashed by identity, so here the earliest state wins (docs/baselines.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .antichain import AntichainDag

INF = float("inf")


@dataclass(frozen=True)
class Level:
    workers: int
    bandwidth: float


@dataclass(frozen=True)
class DPOptions:
    straight_pipeline: bool = False
    memory_size: float | None = None  # bytes per worker; None = no memory constraint
    activation_compression_ratio: float | None = None
    first_level_workers: int | None = None  # PipeDream's -m (first-stage workers, level 1)


@dataclass
class Segment:
    """States (start, end]: start == -1 means from the beginning. ``workers`` per level,
    innermost first."""

    start: int
    end: int
    workers: list[int]
    outer: int = 0  # index of the outermost-level stage it belongs to


@dataclass
class DPResult:
    objective_s: float
    stages: list[Segment]
    work: dict = field(default_factory=dict)


@dataclass
class _Pairs:
    jj: np.ndarray
    kk: np.ndarray
    starts: np.ndarray  # segment starts in the pair arrays, one per j that has pairs
    js: np.ndarray      # the j of each segment

    @classmethod
    def of(cls, jj: np.ndarray, kk: np.ndarray) -> "_Pairs":
        starts = np.flatnonzero(np.r_[True, jj[1:] != jj[:-1]]) if jj.size else jj
        return cls(jj, kk, starts, jj[starts] if jj.size else jj)


def ancestor_matrix(dag: AntichainDag) -> np.ndarray:
    """D[k, j]: state k is an ancestor of state j in the antichain DAG."""
    n = dag.n
    nbytes = (n + 7) // 8
    rows = [np.unpackbits(np.frombuffer(a.to_bytes(nbytes, "little"), np.uint8), bitorder="little")[:n]
            for a in dag.ancestor_sets()]
    return np.array(rows, dtype=bool).T if rows else np.zeros((0, 0), dtype=bool)


def _sync(m: int, params: np.ndarray, bw: float) -> np.ndarray | float:
    """PipeDream's weight synchronisation time 4 m |w| / (bw (m+1)): none with one worker
    (m = 0), never ending over a zero-bandwidth level."""
    if m == 0:
        return 0.0
    if bw <= 0:  # rare: a level without links
        return np.where(params > 0, INF, 0.0)
    return 4 * m * params / bw


def _solve(init_t: np.ndarray, init_p: np.ndarray, init_stash: np.ndarray,
           pairs: _Pairs, seg_t: np.ndarray, seg_p: np.ndarray, seg_stash: np.ndarray,
           out_act: np.ndarray | None, last_state: int, level: Level, below: int,
           opts: DPOptions, work: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One level's DP over states; returns A (n, W), chosen ancestor and chosen r (or -1)."""
    n, w, bw = init_t.size, level.workers, level.bandwidth
    a = np.full((n, w), INF)
    pick_k = np.full((n, w), -1, dtype=np.int64)
    pick_r = np.full((n, w), -1, dtype=np.int64)
    first_only = opts.first_level_workers  # PipeDream applies -m at every level
    for m in range(1 if opts.straight_pipeline else w):
        if first_only is not None and m != first_only - 1:
            continue
        stash = math.ceil((w - (m + 1)) / (m + 1)) * init_stash
        t = (init_t + (_sync(m, init_p, bw * (m + 1)) / below)) / (m + 1)
        if opts.memory_size is not None:
            t = np.where(stash > opts.memory_size, INF, t)
        a[:, m] = t
    min_m = 1 if first_only is None else first_only
    jj, kk, starts = pairs.jj, pairs.kk, pairs.starts
    ratio = opts.activation_compression_ratio
    for m in range(min_m, w):
        best = a[:, m].copy()
        for r in range(1, 2 if opts.straight_pipeline else m + 1):
            prev = a[kk, m - r]
            last = (seg_t + _sync(r - 1, seg_p, bw * r)) / r
            val = np.maximum(prev, last)
            if opts.memory_size is not None:
                val = np.where(seg_stash * math.ceil((w - (m + 1)) / r) > opts.memory_size, INF, val)
            if ratio is not None and out_act is not None:
                with np.errstate(divide="ignore"):  # a zero-bandwidth level: the transfer never ends
                    val = np.maximum(val, 2.0 * out_act[kk] / (bw * r) / ratio)
                val = np.maximum(val, np.where(jj == last_state, 0.0, 2.0 * out_act[jj] / (bw * r) / ratio))
            work["transitions"] = work.get("transitions", 0) + int(val.size)
            if not val.size:
                continue
            seg_min = np.minimum.reduceat(val, starts)
            better = seg_min < best[pairs.js]
            if better.any():
                js = pairs.js[better]
                # the first pair reaching the minimum in each improved segment
                hit = np.flatnonzero(val == np.repeat(seg_min, np.diff(np.r_[starts, val.size])))
                _, first = np.unique(jj[hit], return_index=True)
                first_pair = dict(zip(jj[hit][first].tolist(), hit[first].tolist()))
                best[js] = seg_min[better]
                for j in js.tolist():
                    pick_k[j, m] = kk[first_pair[j]]
                    pick_r[j, m] = r
        a[:, m] = best
    return a, pick_k, pick_r


def solve(dag: AntichainDag, levels: list[Level], opts: DPOptions = DPOptions(),
          out_act: np.ndarray | None = None) -> DPResult:
    """PipeDream's optimizer over ``levels`` (innermost first)."""
    n = dag.n
    work: dict = {"states": n, "antichain_edges": int(len(dag.edges))}
    comp, par, acts = dag.compute, dag.params, dag.acts
    full = n - 1
    anc = ancestor_matrix(dag)
    jj, kk = np.nonzero(anc.T)  # (j, k) pairs with k an ancestor of j, sorted by j
    # Segment times of the level below: row 0 = from the beginning, row s+1 = after state s.
    seg = np.full((n + 1, n), INF)
    seg[0] = comp
    seg[1:] = np.where(anc, comp[None, :] - comp[:, None], INF)
    below = 1
    choices: list[dict[int, tuple]] = []
    for li, level in enumerate(levels):
        final = li == len(levels) - 1
        level_choice: dict[int, tuple] = {}
        new_seg = np.full((n + 1, n), INF)
        for s in ([-1] if final else range(-1, n)):
            if s == -1:
                sel = slice(None)
                init_p, init_stash = par, acts + par
            else:
                sel = anc[s, kk]
                init_p, init_stash = par - par[s], (acts - acts[s]) + (par - par[s])
            pj, pk = jj[sel], kk[sel]
            if s >= 0 and not np.isfinite(seg[s + 1]).any():
                continue
            sp = par[pj] - par[pk]
            a, pick_k, pick_r = _solve(seg[s + 1], init_p, init_stash, _Pairs.of(pj, pk),
                                       seg[pk + 1, pj], sp, (acts[pj] - acts[pk]) + sp, out_act, full,
                                       level, below, opts, work)
            level_choice[s] = (a, pick_k, pick_r)
            new_seg[s + 1] = a[:, -1]
        choices.append(level_choice)
        seg = new_seg
        below = level.workers  # PipeDream divides by the previous level's workers only

    a_top = choices[-1][-1][0]
    objective = float(a_top[full, levels[-1].workers - 1])
    if not math.isfinite(objective):
        return DPResult(INF, [], work)
    return DPResult(objective, _rebuild(choices, levels, -1, full, len(levels) - 1), work)


def _rebuild(choices, levels, start: int, end: int, li: int) -> list[Segment]:
    """Unroll the choices of level ``li`` on segment (start, end], then recurse inward."""
    a, pk, pr = choices[li][start]
    m = levels[li].workers - 1
    segs: list[tuple[int, int, int]] = []
    j = end
    while pk[j, m] >= 0:
        k, r = int(pk[j, m]), int(pr[j, m])
        segs.append((k, j, r))
        j, m = k, m - r
    segs.append((start, j, m + 1))
    segs.reverse()
    out: list[Segment] = []
    for t, (s, e, r) in enumerate(segs):
        if li == 0:
            out.append(Segment(s, e, [r], t))
        else:
            for inner in _rebuild(choices, levels, s, e, li - 1):
                out.append(Segment(inner.start, inner.end, inner.workers + [r], t))
    return out
