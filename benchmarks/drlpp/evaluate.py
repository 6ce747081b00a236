"""DRL-PP, honestly: against pipeplan's non-learned planners and two search baselines given the
same number of evaluations and the same wall-clock, over seeds, and on models it never
trained on.

1. **Equal budgets.** On each instance (a model on a cluster: PipeDream's VGG-16 and GNMT
   profiles, and a zoo BERT small enough for ``exact``; 4 and 16 GPUs homogeneous, 8 and 16
   heterogeneous) and for each seed, DRL-PP trains from scratch for ``--budget`` seconds
   (training is planning time) and samples 32 schemes. Random search and simulated annealing
   over the same action space (``learn/search.py``) then get DRL-PP's evaluation count, and
   separately its wall-clock. ``spp``, ``pipedream``, ``dp`` and ``exact`` (where it
   completes) plan once. Each method's gap is to the best plan any method found on that
   instance; the table gives the median and the range over seeds.
2. **Generalization.** DRL-PP trained on VGG-16 (4 GPUs, ``--train-budget`` seconds) plans
   AlexNet, ResNet-50, ResNeXt-101 and GNMT-4 without retraining (zero-shot: 32 schemes) and
   after a short fine-tune (``--tune-budget`` seconds), against training from scratch for the
   same short time, and against the best non-learned plan.

Everything is scored by the same simulator, under the same schedule (``1f1b``, flush) and
replica mode (``round-robin``) for the learned and search methods. Writes
benchmarks/results/drlpp/evaluate.md and .json.

    python benchmarks/drlpp/evaluate.py [--seeds 5] [--budget 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pipeplan.cluster import Cluster, load_cluster
from pipeplan.cluster.build import cluster_from_dict
from pipeplan.errors import Infeasible, PipeplanError
from pipeplan.graph import Graph, load_graph
from pipeplan.learn.harness import Budget
from pipeplan.learn.partition import Ancestors
from pipeplan.learn.scoring import Scorer
from pipeplan.learn.search import random_search, simulated_annealing
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.drlpp.ppo import Best, Config, new_agent, sample_best
from pipeplan.planners.drlpp.run import REPLICAS, instance, train_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import PROFILES, add_out_argument, profiles_absent, write_json, write_markdown  # noqa: E402

SCHEDULE, MICROBATCHES = "1f1b", 8
NON_LEARNED = ("dp", "pipedream", "spp", "exact")
SAMPLES = 32


def hetero(servers: int) -> Cluster:
    """Half the servers V100, half GTX 1080 Ti, 4 GPUs each, 128 Gbps inside, 10 Gbps between."""
    kinds = ["V100", "1080Ti"] * (servers // 2)
    return cluster_from_dict({"name": f"hetero-{4 * servers}", "inter": "10Gbps", "servers": [
        {"name": f"s{i}", "gpus": 4, "kind": k, "intra": "128Gbps"} for i, k in enumerate(kinds)]})


def clusters() -> dict[str, Cluster]:
    return {"4 x V100": load_cluster("drlpp-4gpu"),
            "16 x V100 (4 servers)": load_cluster("hier:servers=4,gpus=4,intra=128Gbps,inter=10Gbps,kind=V100"),
            "8 hetero (V100 + 1080 Ti)": hetero(2), "16 hetero": hetero(4)}


def instances() -> list[tuple[str, Graph, str, Cluster]]:
    cs = clusters()
    out = [(m, load_graph(str(PROFILES / m)), c, cs[c]) for m in ("vgg16", "gnmt") for c in cs]
    out.append(("bert-large (8 layers)", load_graph("zoo:bert-large?layers=8"), "4 x V100", cs["4 x V100"]))
    return out


def options() -> PlanOptions:
    return PlanOptions(microbatches=MICROBATCHES, schedule=SCHEDULE)


def non_learned(graph: Graph, cluster: Cluster) -> dict[str, dict]:
    out = {}
    for name in NON_LEARNED:
        t0 = time.perf_counter()
        try:
            plan, result = run_planner(name, graph, cluster, options())
        except (PipeplanError, Infeasible) as e:
            out[name] = {"error": str(e)}
            continue
        out[name] = {"iteration_s": result.iteration_s if not result.over_memory else np.inf, "seconds": time.perf_counter() - t0,
                     "complete": plan.search_complete}
    return out


def one_seed(graph: Graph, cluster: Cluster, seed: int, budget_s: float) -> dict[str, dict]:
    """DRL-PP, then the two searches at its evaluations and at its wall-clock."""
    trained = train_agent(graph, cluster, options(), Budget(seconds=budget_s), seed)
    best = sample_best(trained.agent, trained.instance, SAMPLES, trained.best)
    evals = trained.instance.scorer.evaluations  # training and sampling
    seconds = trained.checkpoint["trained_on"]["seconds"]
    out = {"drl-pp": {"iteration_s": best.iteration_s, "evaluations": evals, "seconds": seconds}}
    anc = Ancestors(graph)
    for label, budget in (("same evaluations", lambda: Budget(evaluations=evals)),
                          ("same wall-clock", lambda: Budget(seconds=seconds))):
        for name, search in (("random search", random_search), ("simulated annealing", simulated_annealing)):
            scorer = Scorer(graph, cluster, MICROBATCHES, SCHEDULE, REPLICAS)
            res = search(scorer, graph, len(cluster), budget(), np.random.default_rng(seed), ancestors=anc)
            out[f"{name}, {label}"] = {"iteration_s": res.iteration_s if res.fits else np.inf,
                                       "evaluations": res.evaluations, "seconds": res.seconds}
    return out


def equal_budgets(seeds: int, budget_s: float) -> list[dict]:
    rows = []
    for model, graph, cname, cluster in instances():
        fixed = non_learned(graph, cluster)
        runs = [one_seed(graph, cluster, seed, budget_s) for seed in range(seeds)]
        found = [v["iteration_s"] for v in fixed.values() if "iteration_s" in v] + \
            [v["iteration_s"] for r in runs for v in r.values()]
        best = min(found)
        methods = {m: [r[m] for r in runs] for m in runs[0]}
        summary = {m: _spread([v["iteration_s"] / best - 1 for v in vs]) |
                   {"evaluations": statistics.median(v["evaluations"] for v in vs),
                    "seconds": statistics.median(v["seconds"] for v in vs)} for m, vs in methods.items()}
        for name, v in fixed.items():
            summary[name] = {"error": v["error"]} if "error" in v else \
                _spread([v["iteration_s"] / best - 1]) | {"seconds": v["seconds"], "complete": v["complete"]}
        rows.append({"model": model, "cluster": cname, "devices": len(cluster), "best_s": best, "methods": summary})
        print(f"{model:24s} {cname:26s} best {best:.4f} s  drl-pp median gap "
              f"{summary['drl-pp']['median']:+.1%}", flush=True)
    return rows


def _spread(gaps: list[float]) -> dict:
    return {"median": statistics.median(gaps), "min": min(gaps), "max": max(gaps), "gaps": gaps}


TARGETS = ("alexnet", "resnet50", "resnext101", "gnmt")


def _sampled(agent, graph: Graph, cluster: Cluster, best: Best | None = None) -> float:
    best = sample_best(agent, instance(graph, cluster, options()), SAMPLES, best)
    return best.iteration_s


def generalization(seeds: int, train_s: float, tune_s: float) -> list[dict]:
    """Zero-shot and fine-tuned plans of an agent trained on VGG-16, against training from
    scratch for the fine-tune's time and the best non-learned plan (gaps to the latter)."""
    from copy import deepcopy

    from pipeplan.planners.drlpp.ppo import train

    cluster = load_cluster("drlpp-4gpu")
    fixed = {t: min(v.get("iteration_s", np.inf) for v in non_learned(load_graph(str(PROFILES / t)), cluster).values())
             for t in TARGETS}
    per_target: dict[str, dict[str, list[float]]] = {t: {"zero-shot": [], "fine-tuned": [], "from scratch": []}
                                                     for t in TARGETS}
    for seed in range(seeds):
        source = train_agent(load_graph(str(PROFILES / "vgg16")), cluster, options(), Budget(seconds=train_s), seed)
        for t in TARGETS:
            graph, ref = load_graph(str(PROFILES / t)), fixed[t]
            per_target[t]["zero-shot"].append(_sampled(source.agent, graph, cluster) / ref - 1)
            tuned = deepcopy(source.agent)
            best, _ = train(tuned, instance(graph, cluster, options()), Budget(seconds=tune_s))
            per_target[t]["fine-tuned"].append(_sampled(tuned, graph, cluster, best) / ref - 1)
            scratch = new_agent(Config(seed=seed), len(cluster))
            best, _ = train(scratch, instance(graph, cluster, options()), Budget(seconds=tune_s))
            per_target[t]["from scratch"].append(_sampled(scratch, graph, cluster, best) / ref - 1)
        print(f"generalization seed {seed}: " + ", ".join(
            f"{t} {per_target[t]['zero-shot'][-1]:+.1%}/{per_target[t]['fine-tuned'][-1]:+.1%}" for t in TARGETS),
            flush=True)
    return [{"model": t, "best_non_learned_s": fixed[t], **{k: _spread(v) for k, v in per_target[t].items()}}
            for t in TARGETS]


def _cell(s: dict) -> str:
    if "error" in s:
        return "no plan"
    if len(s["gaps"]) == 1:
        return f"{s['median']:+.1%}" + ("" if s.get("complete", True) else " (incomplete)")
    return f"{s['median']:+.1%} [{s['min']:+.1%}, {s['max']:+.1%}]"


def markdown(eq: list[dict], gen: list[dict], args) -> str:
    methods = list(eq[0]["methods"])
    lines = ["# DRL-PP against equal budgets, over seeds", "",
             f"Gap to the best plan any method found on the instance (median [min, max] over {args.seeds} seeds; "
             f"one figure for deterministic planners); {MICROBATCHES} microbatches, schedule {SCHEDULE}. DRL-PP "
             f"trains from scratch for {args.budget:g} s per seed (planning time), then samples {SAMPLES} schemes; "
             "the searches get its evaluations or its seconds. A plan that does not fit counts as infinitely slow.",
             "", "| model | cluster | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for r in eq:
        lines.append(f"| {r['model']} | {r['cluster']} | " + " | ".join(_cell(r["methods"][m]) for m in methods) + " |")
    d = [r["methods"]["drl-pp"] for r in eq]
    lines += ["", f"DRL-PP used a median of {statistics.median(x['evaluations'] for x in d):,.0f} evaluations and "
              f"{statistics.median(x['seconds'] for x in d):.1f} s per run; spp planned in "
              f"{statistics.median(r['methods']['spp'].get('seconds', np.nan) for r in eq):.3f} s (median).", "",
              "## Generalization (4 x V100)", "",
              f"An agent trained on VGG-16 for {args.train_budget:g} s plans each model without retraining "
              f"(zero-shot), after {args.tune_budget:g} s of fine-tuning, or an agent trained from scratch for "
              f"{args.tune_budget:g} s does. Gap to the best non-learned plan (negative: better).", "",
              "| model | zero-shot | fine-tuned | from scratch |", "|---|---|---|---|"]
    for r in gen:
        lines.append(f"| {r['model']} | {_cell(r['zero-shot'])} | {_cell(r['fine-tuned'])} | {_cell(r['from scratch'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=10.0, help="DRL-PP training seconds per instance and seed")
    ap.add_argument("--train-budget", type=float, default=30.0, help="training seconds on VGG-16 (generalization)")
    ap.add_argument("--tune-budget", type=float, default=5.0, help="fine-tune / from-scratch seconds per model")
    add_out_argument(ap, "drlpp")
    args = ap.parse_args()
    if profiles_absent():
        return
    torch.set_num_threads(1)
    eq = equal_budgets(args.seeds, args.budget)
    gen = generalization(args.seeds, args.train_budget, args.tune_budget)
    write_json(args.out / "evaluate.json", {"seeds": args.seeds, "budget_s": args.budget, "equal_budgets": eq,
                                            "generalization": gen})
    write_markdown(args.out / "evaluate.md", markdown(eq, gen, args))


if __name__ == "__main__":
    main()
