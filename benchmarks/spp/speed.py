"""SPP planning time: BERT-large on spp-sim (target < 0.5 s), and its growth with layers and GPUs.

Models: zoo BERT with L-3 transformer layers (L layers in all); clusters: SPP's simulated
clusters (spp_like) with V/4 servers of 4 GPUs. Time = the whole `spp` planner (RDO, PRM for
every number of stages, PE simulation of each candidate), best of --repeat. Cases predicted
to exceed --limit seconds (from the measured growth, O(V x (L V^2 + L^2 V)) per stage count)
are not run; their estimate is reported as such. Writes benchmarks/results/spp/speed.{md,json}.

    python benchmarks/spp/speed.py [--limit SECONDS] [--repeat N] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pipeplan.cluster import load_cluster
from pipeplan.cluster.presets import spp_like
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions, get_planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

GRID_L = [27, 64, 128]
GRID_V = [8, 16, 32, 64, 128, 256]


def timed(graph, cluster, repeat: int) -> float:
    fn = get_planner("spp").fn
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(graph, cluster, PlanOptions(microbatches=32, allow_over_memory=True))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=120.0)
    ap.add_argument("--repeat", type=int, default=3)
    add_out_argument(ap, "spp")
    args = ap.parse_args()
    headline = timed(load_graph("zoo:bert-large?microbatch=6"), load_cluster("spp-sim"), args.repeat)
    print(f"BERT-large on spp-sim: {headline:.3f} s (target < 0.5 s)")
    cells: dict[tuple[int, int], dict] = {}
    for L in GRID_L:
        g = load_graph(f"zoo:bert-large?microbatch=6&layers={L - 3}")
        for V in GRID_V:
            c = spp_like(servers=V // 4, gpus=4, name=f"spp-like-{V}")
            ops = min(L, V) * V * (L * V * V + L * L * V)  # PRM's numpy work, elements
            known = [(o, t) for (o, t) in ((x["ops"], x["seconds"]) for x in cells.values() if x["measured"])]
            if known:
                rate = max(t / o for o, t in known[-3:])
                est = ops * rate
            else:
                est = 0.0
            if est > args.limit:
                cells[(L, V)] = {"layers": L, "gpus": V, "ops": ops, "seconds": est, "measured": False}
                print(f"L={L:>3} V={V:>3}: ~{est:.0f} s estimated (not run)")
                continue
            t = timed(g, c, 1 if est > 5 else args.repeat)
            cells[(L, V)] = {"layers": L, "gpus": V, "ops": ops, "seconds": t, "measured": True}
            print(f"L={L:>3} V={V:>3}: {t:.3f} s")
    out = {"limit_s": args.limit, "repeat": args.repeat, "bert_large_spp_sim_s": headline,
           "cells": list(cells.values())}
    write_json(args.out / "speed.json", out)
    md = ["# SPP planning time", "", f"The whole planner (RDO + PRM for every number of stages + PE simulations), "
          f"one process, best of {args.repeat} runs (1 run where the estimate exceeds 5 s); cases estimated to take "
          f"more than {args.limit:g} s are not run, their estimate is shown instead.", "",
          f"BERT-large (27 layers) on spp-sim (32 GPUs): **{headline:.3f} s**.", "",
          "| layers \\ GPUs | " + " | ".join(map(str, GRID_V)) + " |", "|---" * (len(GRID_V) + 1) + "|"]
    for L in GRID_L:
        row = []
        for V in GRID_V:
            x = cells[(L, V)]
            row.append(f"{x['seconds']:.3g} s" if x["measured"] else f"~{x['seconds']:.3g} s (est.)")
        md.append(f"| {L} | " + " | ".join(row) + " |")
    meas = [x for x in cells.values() if x["measured"] and x["seconds"] > 0.05]
    if len(meas) >= 3:
        slope = np.polyfit(np.log([x["ops"] for x in meas]), np.log([x["seconds"] for x in meas]), 1)[0]
        md += ["", f"Measured time grows as (numpy work)^{slope:.2f}, the work being "
               "min(L, V) x V x (L V^2 + L^2 V) elements; estimates extrapolate linearly in that work "
               "from the largest measured cases."]
    write_markdown(args.out / "speed.md", "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
