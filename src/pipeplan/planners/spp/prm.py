"""PRM — pipeline partition, replication and mapping by dynamic programming (SPP §IV-B2).

W(l, xi, r, i): the smallest maximum time of all M microbatches on one stage or one
channel when the first l layers form xi stages, the last replicated on r devices, on the
ordered devices v_1..v_i:

  W(l, xi, r, i) = min_{l' < l, r' <= i-r} max{ W(l', xi-1, r', i-r),
                      M (d^f_{l'} / (r' r b_{r'r}) + d^b_{l'} / (r' r b_{rr'})) ,
                      M sum_{l'+1..l}(p^f+p^b) / r + A_{l'+1..l}(v_{i-r+1}..v_i) }

and 𝒲(xi) = min_r W(L, xi, r, V). Costs come from ``sim.formulas`` so that the DP and the
simulator agree: transfers add link latency, compute divides by the slowest replica's
speed, the all-reduce is the ring of Eq. 1. A stage whose weights, gradients and optimizer
state do not fit on its devices is infeasible.

Vectorized: for a fixed xi and r, the choice of r' only meets the first two terms, so
U(l') = min_{r'} max(W_prev, comm) is one reduction over r', and W = min_{l'} max(U(l'),
stage(l', l)) one reduction over l' — both over all end positions i at once.
O(xi_max x V x (L V^2 + L^2 V)) numpy work instead of O(L^2 V^4) scalar steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cluster import Cluster
from ...cluster.collectives import collective_s
from ...sim.formulas import state_bytes
from ...graph import Linearization

INF = np.inf


@dataclass
class PRMResult:
    """For each number of stages xi (index xi-1): 𝒲(xi) and its partition: stage layer
    bounds (in the linearization) and device position ranges (in the device order)."""

    w: list[float]
    stages: list[list[tuple[int, int, int, int]] | None]  # (layer_a, layer_b, dev_a, dev_b)


def _range_tables(cluster: Cluster, order: list[int]):
    v = len(order)
    bw = cluster.bandwidth[np.ix_(order, order)]
    lat = cluster.latency[np.ix_(order, order)]
    speed = cluster.speed[order]
    mem = cluster.memory[order]
    smin = np.full((v + 1, v + 1), np.nan)   # [a, b): slowest speed
    mmin = np.full((v + 1, v + 1), np.nan)   # [a, b): smallest memory
    bin_ = np.full((v + 1, v + 1), INF)      # [a, b): slowest link inside
    lin = np.zeros((v + 1, v + 1))           # [a, b): largest latency inside
    for a in range(v):
        s, m_, b, l_ = INF, INF, INF, 0.0
        for e in range(a + 1, v + 1):
            k = e - 1
            s, m_ = min(s, speed[k]), min(m_, mem[k])
            if k > a:
                b = min(b, bw[a:k, k].min(), bw[k, a:k].min())
                l_ = max(l_, lat[a:k, k].max(), lat[k, a:k].max())
            smin[a, e], mmin[a, e], bin_[a, e], lin[a, e] = s, m_, b, l_
    # between [p-r', p) and [p, p+r), per direction: min bandwidth and max latency,
    # as tables [p, r', r]; forward is p-side -> later devices, backward the reverse.
    shape = (v + 1, v + 1, v + 1)
    bf, bbk, lf, lbk = np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for p in range(1, v):
        for out, blk, red in ((bf, bw[:p, p:], np.minimum), (bbk, bw[p:, :p].T, np.minimum),
                              (lf, lat[:p, p:], np.maximum), (lbk, lat[p:, :p].T, np.maximum)):
            acc = red.accumulate(red.accumulate(blk[::-1], axis=0), axis=1)  # rows: r'-1 back from p
            out[p, 1:p + 1, 1:v - p + 1] = acc
    return smin, mmin, bin_, lin, (bf, lf), (bbk, lbk)


def prm(lin: Linearization, cluster: Cluster, order: list[int], microbatches: int,
        optimizer: str = "adam", max_stages: int | None = None, precision: str = "fp32") -> PRMResult:
    """𝒲(xi) and the partition achieving it, for xi = 1..min(L, V, max_stages)."""
    m_count = float(microbatches)
    n_layers, v = lin.n, len(order)
    xi_max = min(n_layers, v, max_stages or v)
    smin, mmin, bin_, lin_in, (bf, lf), (bbk, lbk) = _range_tables(cluster, order)
    comp = lin.fwd_cum + lin.bwd_cum                      # (L+1,)
    par = lin.params_cum
    cut = lin.cut_bytes                                   # bytes crossing after l layers
    L1, V1 = n_layers + 1, v + 1
    lidx = np.arange(L1)
    # stage term for layers (l', l] on devices [p, p+r): M * compute / (r * speed) + all-reduce
    dcomp = comp[None, :] - comp[:, None]                 # [l', l]
    dpar = par[None, :] - par[:, None]
    valid_ll = lidx[:, None] < lidx[None, :]              # l' < l

    def stage_term(p: np.ndarray, r: int) -> np.ndarray:
        """Shape (len(p), L1, L1) over (i-index, l', l)."""
        e = p + r
        sp = smin[p, e][:, None, None]
        t = m_count * dcomp[None] / (r * sp)
        if r > 1:  # the all-reduce (sim.formulas.allreduce_time): free without parameters
            bw_g = bin_[p, e][:, None, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                ring = collective_s("all_reduce", dpar[None], r, bw_g, lin_in[p, e][:, None, None])
            t = t + np.where(dpar[None] > 0, ring, 0.0)
        fits = state_bytes(dpar[None], optimizer, precision) <= mmin[p, e][:, None, None]
        return np.where(valid_ll[None] & fits, t, INF)

    # W[xi][l, r, i]; choices for reconstruction
    w_prev = np.full((L1, V1, V1), INF)
    for r in range(1, v + 1):
        t = stage_term(np.array([0]), r)[0, 0]     # layers (0, l] on devices [0, r)
        w_prev[:, r, r] = t
    w_prev[0] = INF
    last_cols = [w_prev[n_layers, :, v].copy()]  # W(L, xi, r, V) for every xi
    # the choices are all that is kept per xi (int16: 4 bytes per state)
    small = np.int16 if max(L1, V1) < 2**15 else np.int32
    choice_l: list[np.ndarray] = [np.full((L1, V1, V1), -1, dtype=small)]
    choice_r: list[np.ndarray] = [np.full((L1, V1, V1), -1, dtype=small)]
    for xi in range(2, xi_max + 1):
        w = np.full((L1, V1, V1), INF)
        ch_l = np.full((L1, V1, V1), -1, dtype=small)
        ch_r = np.full((L1, V1, V1), -1, dtype=small)
        for r in range(1, v - xi + 2):
            i_all = np.arange(xi - 1 + r, v + 1)             # enough devices before
            p = i_all - r                                     # previous stages end at p
            # U over (i, l'): min over r' <= p of max(W_prev(l', r', p), comm(l', r', r, p))
            t1 = np.transpose(w_prev[:, :, p], (2, 0, 1))     # (i, l', r')
            rp = np.arange(V1)
            with np.errstate(divide="ignore", invalid="ignore"):
                comm = m_count * sum(cut[None, :, None] / (rp[None, None, :] * r * bw_[p, :, r][:, None, :])
                                     + lat_[p, :, r][:, None, :] for bw_, lat_ in ((bf, lf), (bbk, lbk)))
            comm = np.where((rp[None, None, :] >= 1) & (rp[None, None, :] <= p[:, None, None]), comm, INF)
            comm = np.nan_to_num(comm, nan=INF)
            both = np.maximum(t1, comm)
            best_rp = np.argmin(both, axis=2)                  # (i, l')
            u = np.take_along_axis(both, best_rp[:, :, None], axis=2)[:, :, 0]
            st = stage_term(p, r)                               # (i, l', l)
            cand = np.maximum(u[:, :, None], st)
            best_lp = np.argmin(cand, axis=1)                  # (i, l)
            val = np.take_along_axis(cand, best_lp[:, None, :], axis=1)[:, 0, :]
            w[:, r, i_all] = val.T
            ch_l[:, r, i_all] = best_lp.T
            ch_r[:, r, i_all] = np.take_along_axis(best_rp, best_lp, axis=1).T
        last_cols.append(w[n_layers, :, v].copy())
        choice_l.append(ch_l)
        choice_r.append(ch_r)
        w_prev = w
    out_w, out_stages = [], []
    for xi in range(1, xi_max + 1):
        col = last_cols[xi - 1]
        r_best = int(np.argmin(col))
        best = float(col[r_best])
        out_w.append(best)
        out_stages.append(_rebuild(choice_l, choice_r, xi, n_layers, r_best, v) if np.isfinite(best) else None)
    return PRMResult(out_w, out_stages)


def _rebuild(choice_l, choice_r, xi, l, r, i):
    stages = []
    while xi > 1:
        lp, rp = int(choice_l[xi - 1][l, r, i]), int(choice_r[xi - 1][l, r, i])
        stages.append((lp, l, i - r, i))
        l, i, r, xi = lp, i - r, rp, xi - 1
    stages.append((0, l, i - r, i))
    return stages[::-1]
