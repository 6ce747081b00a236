"""DRL-PP's collapse to data parallelism, before and after issue 44's fixes, against random
search and simulated annealing at equal evaluations, over seeds.

The instance of the report: PipeDream's GNMT profile (never trained on) on 8 V100s over 2
servers (128 Gbps inside, 10 Gbps between), 32 microbatches (the CLI's default, as the
collapse was reported; with 8 it did not collapse), the synchronous executions to choose among. For each seed:

- DRL-PP *before*: a scheme worth the mean of its placements (§3.4) and advantages against
  the moving baseline over a spread floored at 1e-6 (``Config(scheme_reward="mean",
  baseline="moving")``); *after*: the defaults (the best placement; the batch's mean, 0 for a
  flat batch, -1 for invalid plans). Both weigh the trivial plans first, as the planner does.
- ``random`` and ``anneal`` over the same action space and scorer, the trivial plans scored
  first too, for the same evaluations.

Reported: the best plan's iteration over evaluations (median over seeds, a PNG, left), what
each finds by itself (right: the median of the plans DRL-PP's policy sampled in each update;
the searches' best without the trivial plans), the final best, and for DRL-PP the share of its final
policy's 32 sampled schemes that are data parallelism (the collapse). References: ``dp``, ``spp`` and ``joint`` on the same inputs.

    .venv/bin/python benchmarks/learning/collapse.py [--seeds 5] [--evaluations 3000]

Writes benchmarks/results/learning/collapse.{json,md,png}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import PROFILES, add_out_argument, profiles_absent, save_figure, write_json, write_markdown  # noqa: E402

from pipeplan.budget import Budget  # noqa: E402
from pipeplan.cluster import load_cluster  # noqa: E402
from pipeplan.graph import load_graph  # noqa: E402
from pipeplan.learn.found import trivial_under  # noqa: E402
from pipeplan.learn.search import random_search, simulated_annealing  # noqa: E402
from pipeplan.planners import PlanOptions, run_planner  # noqa: E402
from pipeplan.planners.drlpp.ppo import Config, new_agent, sample_schemes, train  # noqa: E402
from pipeplan.planners.drlpp.run import instance  # noqa: E402

CLUSTER = "hier:servers=2,gpus=4,intra=128Gbps,inter=10Gbps,kind=V100"
MICROBATCHES = 32  # the CLI's default, as the collapse was reported
VARIANTS = {"drl-pp before": {"scheme_reward": "mean", "baseline": "moving"}, "drl-pp after": {}}


def options() -> PlanOptions:
    return PlanOptions(microbatches=MICROBATCHES)


def drl_pp(graph, cluster, seed: int, evaluations: int, variant: dict) -> dict:
    torch.set_num_threads(1)
    inst = instance(graph, cluster, options())
    agent = new_agent(Config(seed=seed, **variant), len(cluster))
    best, curve = train(agent, inst, Budget(evaluations=evaluations))
    final = sample_schemes(agent, inst, 32, torch.Generator().manual_seed(seed))
    return {"best_s": best.iteration_s, "curve": [(p.evaluations, p.best_iteration_s) for p in curve.points],
            "sampled": [(p.evaluations, p.sampled_s) for p in curve.points],
            "dp_share": float(np.mean([s.part.max() == 0 for s in final]))}


def search(graph, cluster, seed: int, evaluations: int, which) -> dict:
    scorer = instance(graph, cluster, options()).scorer
    res = scorer.score(*trivial_under(graph, len(cluster), len(scorer.executions)))
    floor = float(np.min(np.where(res.fits, res.iteration_s, np.inf)))
    found = which(scorer, graph, len(cluster), Budget(evaluations=evaluations), np.random.default_rng(seed))
    best = min(floor, found.iteration_s if found.fits else np.inf)
    return {"best_s": best, "curve": [(e, min(floor, t)) for e, _, t in found.curve],
            "sampled": [(e, t) for e, _, t in found.curve]}


def median_curve(runs: list[dict], evaluations: int, key: str = "curve") -> tuple[np.ndarray, np.ndarray]:
    """The median over seeds of a run's curve ``key`` at each evaluation count."""
    grid = np.linspace(1, evaluations, 60)
    rows = []
    for r in runs:
        e, t = np.array([c[0] for c in r[key]]), np.array([c[1] for c in r[key]])
        idx = np.searchsorted(e, grid, side="right") - 1
        rows.append(np.where(idx >= 0, t[np.maximum(idx, 0)], np.nan))
    with warnings.catch_warnings():  # before a run's first scored batch: no value yet
        warnings.simplefilter("ignore", RuntimeWarning)
        return grid, np.nanmedian(np.array(rows, dtype=float), axis=0)


def figure(results: dict, refs: dict, evaluations: int):
    """Left: the best plan so far, every method weighing the trivial plans first. Right: what
    each method finds by itself: the median of the plans DRL-PP's policy sampled in each
    update, the searches' best without the trivial plans."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), dpi=110)
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "curve", "best iteration so far (s)"),
                           (axes[1], "sampled", "policy's samples / search alone (s)")):
        for name, runs in results.items():
            ax.plot(*median_curve(runs, evaluations, key), label=name)
        for name, value in refs.items():
            ax.axhline(value, linestyle=":", linewidth=1, color="grey")
            ax.annotate(name, (evaluations, value), fontsize=7, ha="right", va="bottom")
        ax.set_xlabel("evaluations")
        ax.set_ylabel(f"{label}, median of seeds")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle("GNMT on 8 V100s (2 servers): DRL-PP before and after, random search, annealing", fontsize=9)
    fig.tight_layout()
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--evaluations", type=int, default=3000)
    add_out_argument(parser, "learning")
    args = parser.parse_args()
    if profiles_absent():
        return 0
    graph, cluster = load_graph(str(PROFILES / "gnmt")), load_cluster(CLUSTER)
    refs = {name: run_planner(name, graph, cluster, options())[1].iteration_s for name in ("dp", "spp", "joint")}
    results: dict[str, list[dict]] = {}
    for seed in range(args.seeds):
        for name, variant in VARIANTS.items():
            results.setdefault(name, []).append(drl_pp(graph, cluster, seed, args.evaluations, variant))
        for name, which in (("random", random_search), ("anneal", simulated_annealing)):
            results.setdefault(name, []).append(search(graph, cluster, seed, args.evaluations, which))
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]['best_s']:.4f} s" + (f" (DP share {v[-1]['dp_share']:.0%})"
                                                                           if "dp_share" in v[-1] else "")
                                           for k, v in results.items()), flush=True)
    summary = {k: {"median_best_s": statistics.median(r["best_s"] for r in v), "best_s": [r["best_s"] for r in v],
                   **({"median_dp_share": statistics.median(r["dp_share"] for r in v),
                       "dp_share": [r["dp_share"] for r in v]} if "dp_share" in v[0] else {})}
               for k, v in results.items()}
    write_json(args.out / "collapse.json", {"cluster": CLUSTER, "model": "gnmt", "seeds": args.seeds,
                                            "evaluations": args.evaluations, "references": refs, "summary": summary,
                                            "runs": results})
    save_figure(figure(results, refs, args.evaluations), args.out / "collapse.png")
    lines = ["# DRL-PP's collapse, before and after, against random search and annealing", "",
             f"`.venv/bin/python benchmarks/learning/collapse.py --seeds {args.seeds} --evaluations "
             f"{args.evaluations}`: PipeDream's GNMT on 8 V100s over 2 servers (10 Gbps between), "
             f"{MICROBATCHES} microbatches; every method weighs the trivial plans first. References: "
             + ", ".join(f"{k} {v:.4f} s" for k, v in refs.items()) + ".", "",
             "| method | median best (s) | over spp | best per seed (s) | final policy's DP share (median) |",
             "|---|---|---|---|---|"]
    for k, v in summary.items():
        share = f"{v['median_dp_share']:.0%} ({', '.join(f'{x:.0%}' for x in v['dp_share'])})" \
            if "dp_share" in v else "-"
        lines.append(f"| {k} | {v['median_best_s']:.4f} | {v['median_best_s'] / refs['spp'] - 1:+.1%} | "
                     f"{', '.join(f'{x:.4f}' for x in v['best_s'])} | {share} |")
    lines += ["", "![best so far](collapse.png)"]
    write_markdown(args.out / "collapse.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
