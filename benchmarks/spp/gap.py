"""SPP's gap to the exact optimum on seeded random small instances.

Each instance: a chain of 3-8 layers (forward/backward times, parameters and activations
drawn so that compute, all-reduce and transfers all matter), 2-5 devices in 1-3 servers
with uneven links (intra-server 64-200 Gbps, inter-server 5-40 Gbps, drawn per pair) and
speeds 0.8-1.2, and 2-8 microbatches. The gap is T_spp / T_exact - 1 (0 = optimal), the
exact planner searching every partition, replication, mapping, replica sharing and
schedule. Writes benchmarks/results/spp/gap.{md,json,png}.

    python benchmarks/spp/gap.py [--instances N] [--seed S] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pipeplan.cluster import Cluster, Device
from pipeplan.errors import PipeplanError
from pipeplan.graph import Graph
from pipeplan.planners import PlanOptions, run_planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _instances import random_chain, uneven_links  # noqa: E402
from _results import add_out_argument, save_figure, write_json, write_markdown  # noqa: E402


def instance(rng: np.random.Generator) -> tuple[Graph, Cluster, int]:
    g = random_chain(rng)
    servers, bw = uneven_links(rng)
    v = servers.size
    devs = [Device(f"d{i}", speed=float(rng.uniform(0.8, 1.2)), server=f"s{servers[i]}") for i in range(v)]
    return g, Cluster("rand", devs, bw, np.zeros((v, v))), int(rng.integers(2, 9))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2024)
    add_out_argument(ap, "spp")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    while len(rows) < args.instances:
        g, c, m = instance(rng)
        opts = PlanOptions(microbatches=m)
        try:
            ex, ex_r = run_planner("exact", g, c, opts)
            sp, sp_r = run_planner("spp", g, c, opts)
        except PipeplanError:
            continue
        rows.append({"layers": len(g), "devices": len(c), "microbatches": m,
                     "exact_s": ex_r.iteration_s, "spp_s": sp_r.iteration_s,
                     "gap": sp_r.iteration_s / ex_r.iteration_s - 1.0,
                     "exact_complete": ex.extra["exact"]["complete"],
                     "exact_plan": [len(s.devices) for s in ex.stages], "exact_schedule": ex.schedule,
                     "exact_replicas": ex.replicas, "spp_plan": [len(s.devices) for s in sp.stages]})
    gaps = np.array([r["gap"] for r in rows])
    summary = {"instances": len(rows), "median_gap": float(np.median(gaps)),
               "p90_gap": float(np.quantile(gaps, 0.9)), "worst_gap": float(gaps.max()),
               "optimal_fraction": float(np.mean(gaps <= 1e-9)),
               "all_exact_complete": all(r["exact_complete"] for r in rows)}
    write_json(args.out / "gap.json", {"seed": args.seed, "summary": summary, "instances": rows})
    worst = sorted(rows, key=lambda r: -r["gap"])[:5]
    md = ["# SPP's gap to the exact optimum", "", f"{args.instances} random instances, seed {args.seed}.", "",
          "| instances | median gap | 90th percentile | worst | SPP optimal |", "|---|---|---|---|---|",
          f"| {len(rows)} | {summary['median_gap']:.2%} | {summary['p90_gap']:.2%} | {summary['worst_gap']:.2%} "
          f"| {summary['optimal_fraction']:.0%} of instances |", "", "Worst cases:", "",
          "| layers | devices | M | SPP (s) | exact (s) | gap | SPP replication | exact replication, schedule, replicas |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['layers']} | {r['devices']} | {r['microbatches']} | {r['spp_s']:.4f} | {r['exact_s']:.4f} | "
           f"{r['gap']:.1%} | {r['spp_plan']} | {r['exact_plan']}, {r['exact_schedule']}, {r['exact_replicas']} |"
           for r in worst]
    write_markdown(args.out / "gap.md", "\n".join(md) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(gaps * 100, bins=30, color="tab:blue")
    ax.set_xlabel("SPP's gap to the exact optimum (%)")
    ax.set_ylabel("instances")
    ax.set_title(f"{len(rows)} random small instances: median {summary['median_gap']:.1%}, "
                 f"worst {summary['worst_gap']:.1%}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, args.out / "gap.png")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
