"""resalloc.txt §VI in simulation: Fig. 5 (depth 1-8, with and without resource allocation),
Fig. 6 (beta from 0.1 to 0.9 at several depths), Fig. 7 (heterogeneous device sets: local
search vs brute force vs sorting).

Workers are the laptops of §VI (Intel i7 CPU + GTX 1650 GPU, 1 Gbps links; pipeplan's
`laptop-i7-gtx1650` kind); the depth q uses q laptops, as in the paper ("the number of
workers equals the pipeline depth"). Models: the shared AlexNet profile (PipeDream's, batch
256 on a V100) scaled linearly to a microbatch of 32 samples (times and activations x 1/8),
and the zoo's GoogLeNet at microbatch 32. An iteration is M = 32 microbatches in steady
state (the fb-parallel pipeline of Fig. 2). Numbers: AlexNet's per-layer times are
PipeDream's measurements; GoogLeNet's are derived from FLOPs (docs/zoo.md); device speeds
are derived from vendor peak figures, with the CPU's backward/forward ratio measured on this
machine (cluster/kinds.py). Fig. 7 evaluates groupings with the paper's own model (devices of
a worker share their resources without overhead): M x the bottleneck of Eq. (1) from Alg. 1
on the grouped workers. Writes benchmarks/results/resalloc/figures.{md,json} and fig5-7 PNGs.

    python benchmarks/resalloc/figures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pipeplan.cluster import hierarchical
from pipeplan.cluster.presets import mobile_hetero
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions
from pipeplan.planners.resalloc import layer_times, plan_for_depth, rates, resource_types
from pipeplan.planners.resalloc.grouping import brute_force_groups, local_search_groups, sorting_groups
from pipeplan.planners.resalloc.partition import partition
from pipeplan.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import ROOT, add_out_argument, save_figure, write_json, write_markdown  # noqa: E402

PROFILE = ROOT.parent / "shared" / "profiles" / "pipedream" / "alexnet"
M = 32


def models() -> dict:
    alex = load_graph(str(PROFILE)).scaled(time=32 / 256, act=32 / 256, name="alexnet")
    return {"AlexNet": alex, "GoogLeNet": load_graph("zoo:googlenet?microbatch=32")}


def laptops(q: int, gbps: float = 1.0):
    return hierarchical(f"laptops-{q}", q, 1, gbps * 1e9 / 8, gbps * 1e9 / 8, kind="laptop-i7-gtx1650")


def iteration(graph, q: int, beta: float | None, gbps: float = 1.0) -> float:
    plan = plan_for_depth(graph, laptops(q, gbps), q, PlanOptions(microbatches=M, allow_over_memory=True), beta)
    return simulate(plan, timeline=False).iteration_s


def fig5(graphs) -> dict:
    """At the paper's 1 Gbps, and at 10 Gbps (where transfers stop capping the depth)."""
    out = {}
    for gbps in (1.0, 10.0):
        for name, g in graphs.items():
            rows = []
            for q in range(1, 9):
                with_alloc, without = iteration(g, q, None, gbps), iteration(g, q, 0.5, gbps)
                rows.append({"depth": q, "with_s": with_alloc, "without_s": without,
                             "improvement": (without - with_alloc) / without})
            out[f"{name} ({gbps:g} Gbps)"] = rows
    return out


def fig6(graphs) -> dict:
    betas = [round(0.1 * k, 1) for k in range(1, 10)]
    return {name: {q: [iteration(g, q, b) for b in betas] for q in (2, 4, 8)} for name, g in graphs.items()} | \
        {"betas": betas}


def grouped_time(graph, cluster, groups: list[list[int]]) -> float:
    """Paper's model: a worker's resources are the sum of its devices'; Alg. 1 on the weakest."""
    lin, lf, lg = layer_times(graph, cluster, groups, resource_types(cluster))
    comm = 2 * lin.cut_bytes[1:] / (1e9 / 8)  # activations forward and gradients back
    limit, _, _ = partition(lf, lg, comm, len(groups))
    return M * limit


def fig7(graphs, q: int = 4) -> dict:
    out = {}
    sizes = [4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 32]
    for name, g in graphs.items():
        ratio = np.array([1.0 / 0.51, 1.0])  # backward work per type: CPU backward runs at 0.51 x forward
        wf = np.full(2, g.total_fwd)
        wg = g.total_bwd * ratio
        rows = []
        for n in sizes:
            acc = {"ls": [], "bf": [], "sort": []}
            for seed in range(5):
                c = mobile_hetero(n, seed)
                fr, _ = rates(c, resource_types(c))
                if fr.shape[1] == 1:
                    fr = np.c_[fr, np.zeros(len(c))]
                acc["ls"].append(grouped_time(g, c, local_search_groups(fr, q, wf, wg)))
                acc["sort"].append(grouped_time(g, c, sorting_groups(fr, q, wf, wg)))
                if n <= 10:
                    acc["bf"].append(grouped_time(g, c, brute_force_groups(fr, q, wf, wg)))
            rows.append({"devices": n, **{k: float(np.mean(v)) if v else None for k, v in acc.items()}})
        out[name] = rows
    return out


def plots(f5: dict, f6: dict, f7: dict, out: Path) -> None:
    """Fig. 5-7 as PNGs in ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 3.6))
    for ax, (name, rows) in zip(axes, f5.items()):
        d = [r["depth"] for r in rows]
        ax.plot(d, [r["without_s"] for r in rows], "o-", label="without allocation (beta = 0.5)")
        ax.plot(d, [r["with_s"] for r in rows], "s-", label="with allocation (LP)")
        ax.set_title(f"{name}: pipeline depth"), ax.set_xlabel("depth (laptops)"), ax.set_ylabel("s / iteration")
        ax.legend(fontsize=8), ax.grid(alpha=0.3)
    fig.tight_layout(), save_figure(fig, out / "fig5_depth.png"), plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, name in zip(axes, ("AlexNet", "GoogLeNet")):
        for q, ts in f6[name].items():
            ax.plot(f6["betas"], ts, "o-", label=f"depth {q}")
        ax.set_title(f"{name}: forward share beta"), ax.set_xlabel("beta (both resources)"), ax.set_ylabel("s / iteration")
        ax.legend(fontsize=8), ax.grid(alpha=0.3)
    fig.tight_layout(), save_figure(fig, out / "fig6_beta.png"), plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (name, rows) in zip(axes, f7.items()):
        n = [r["devices"] for r in rows]
        ax.plot(n, [r["sort"] for r in rows], "^-", label="sorting")
        ax.plot(n, [r["ls"] for r in rows], "o-", label="local search (Alg. 2)")
        bf = [(r["devices"], r["bf"]) for r in rows if r["bf"] is not None]
        ax.plot([x for x, _ in bf], [y for _, y in bf], "k--", label="brute force")
        ax.set_title(f"{name}: heterogeneous devices, depth 4"), ax.set_xlabel("devices"), ax.set_ylabel("s / iteration")
        ax.legend(fontsize=8), ax.grid(alpha=0.3)
    fig.tight_layout(), save_figure(fig, out / "fig7_heterogeneous.png"), plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(ap, "resalloc")
    args = ap.parse_args()
    t0 = time.perf_counter()
    graphs = models()
    f5, f6, f7 = fig5(graphs), fig6(graphs), fig7(graphs)
    write_json(args.out / "figures.json", {"fig5": f5, "fig6": f6, "fig7": f7})
    plots(f5, f6, f7, args.out)
    md = ["# resalloc §VI in simulation", "", "The setting is in the docstring of benchmarks/resalloc/figures.py. "
          "Seconds per iteration of 32 microbatches.", "", "## Fig. 5: pipeline depth", ""]
    for name, rows in f5.items():
        md += [f"**{name}**", "", "| depth | without allocation | with allocation | improvement |", "|---|---|---|---|"]
        md += [f"| {r['depth']} | {r['without_s']:.3f} | {r['with_s']:.3f} | {r['improvement']:.1%} |" for r in rows]
        md.append("")
    md += ["## Fig. 6: forward share beta (same on CPU and GPU)", ""]
    for name in ("AlexNet", "GoogLeNet"):
        md += [f"**{name}**", "", "| depth | " + " | ".join(f"{b}" for b in f6["betas"]) + " |",
               "|---" * (len(f6["betas"]) + 1) + "|"]
        md += [f"| {q} | " + " | ".join(f"{t:.3f}" for t in ts) + " |" for q, ts in f6[name].items()]
        md.append("")
    md += ["## Fig. 7: heterogeneous devices (depth 4, mean of 5 seeded sets)", ""]
    for name, rows in f7.items():
        md += [f"**{name}**", "", "| devices | local search | brute force | sorting |", "|---|---|---|---|"]
        md += [f"| {r['devices']} | {r['ls']:.3f} | {'-' if r['bf'] is None else format(r['bf'], '.3f')} | "
               f"{r['sort']:.3f} |" for r in rows]
        md.append("")
    write_markdown(args.out / "figures.md", "\n".join(md) + "\n")
    print("\n".join(md))
    print(f"took {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
