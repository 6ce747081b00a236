"""DRL-PP, honestly: against pipeplan's non-learned planners and two search baselines given the
same number of evaluations and the same wall-clock, over seeds, and on models it never
trained on.

1. **Equal budgets, held-out-style cases.** Large graphs (PipeDream's GNMT profile, the zoo's
   BERT-48 and ResNet-152) on 8 GPUs over 2 servers, and GNMT on 16 heterogeneous GPUs over 4
   servers.
   For each seed DRL-PP trains from scratch for ``--evaluations`` plans scored (training is
   planning time) and samples 32 schemes; its action space is the full one: Algorithm 1's
   partitions, the placement, and the execution (schedule among gpipe / 1f1b / zb-h1 /
   spp-pe, replicas split or round-robin). Random search and simulated annealing over the same
   action space (``learn/search.py``, the same scorer and executions, weighing the same
   trivial plans DRL-PP weighs before its first update) then get DRL-PP's
   evaluation count, and separately its wall-clock. ``dp``, ``pipedream`` (its partitioner
   under the 1F1B flush), ``spp`` and ``joint`` plan once, each with its own schedule choice.
   Each method's gap is to the best plan any method found on that instance; the table gives
   the median and the range over seeds. A collapse column gives the share of the trained
   policy's 32 final schemes that are data parallelism (one partition).
2. **Generalization.** DRL-PP trained on VGG-16 (4 GPUs, ``--train-evaluations``) plans
   AlexNet, ResNet-50, ResNeXt-101 and GNMT-4 without retraining (zero-shot: 32 schemes) and
   after a short fine-tune (``--tune-evaluations``), against training from scratch for the
   same evaluations, and against the best non-learned plan.

Everything is scored by the same simulator with synchronous schedules only (the asynchronous
pipeline changes what training computes). Writes benchmarks/results/drlpp/evaluate.md and .json.

    python benchmarks/drlpp/evaluate.py [--seeds 5] [--evaluations 1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
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
from pipeplan.learn.found import trivial_under
from pipeplan.learn.harness import Budget
from pipeplan.learn.partition import Ancestors
from pipeplan.learn.search import random_search, simulated_annealing
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.drlpp.ppo import Best, Config, new_agent, sample_best, sample_schemes
from pipeplan.planners.drlpp.run import instance, train_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import PROFILES, add_out_argument, profiles_absent, write_json, write_markdown  # noqa: E402

MICROBATCHES = 8
#: each non-learned planner with the schedule it plans for (None: its own choice)
NON_LEARNED = {"dp": None, "pipedream": "1f1b", "spp": None, "joint": None}
SAMPLES = 32


def hetero(servers: int) -> Cluster:
    """Half the servers V100, half GTX 1080 Ti, 4 GPUs each, 128 Gbps inside, 10 Gbps between."""
    kinds = ["V100", "1080Ti"] * (servers // 2)
    return cluster_from_dict({"name": f"hetero-{4 * servers}", "inter": "10Gbps", "servers": [
        {"name": f"s{i}", "gpus": 4, "kind": k, "intra": "128Gbps"} for i, k in enumerate(kinds)]})


def clusters() -> dict[str, Cluster]:
    return {"8 x V100 (2 servers)": load_cluster("hier:servers=2,gpus=4,intra=128Gbps,inter=10Gbps,kind=V100"),
            "16 hetero (4 servers)": hetero(4)}


MODELS = {"gnmt (48 layers)": str(PROFILES / "gnmt"), "bert-48": "zoo:bert-48", "resnet152": "zoo:resnet152"}


def instances() -> list[tuple[str, Graph, str, Cluster]]:
    """Every model on 8 GPUs; GNMT also on 16 heterogeneous GPUs (a run with every model on 16
    GPUs had not finished BERT-48's row after 33 minutes)."""
    cs = clusters()
    pairs = [(m, "8 x V100 (2 servers)") for m in MODELS] + [("gnmt (48 layers)", "16 hetero (4 servers)")]
    return [(m, load_graph(MODELS[m]), c, cs[c]) for m, c in pairs if m in MODELS]


def options(schedule: str | None = None) -> PlanOptions:
    return PlanOptions(microbatches=MICROBATCHES, schedule=schedule)


def non_learned(graph: Graph, cluster: Cluster) -> dict[str, dict]:
    out = {}
    for name, schedule in NON_LEARNED.items():
        t0 = time.perf_counter()
        try:
            plan, result = run_planner(name, graph, cluster, options(schedule))
        except (PipeplanError, Infeasible) as e:
            out[name] = {"error": str(e)}
            continue
        out[name] = {"iteration_s": result.iteration_s if not result.over_memory else np.inf,
                     "seconds": time.perf_counter() - t0, "complete": plan.search_complete,
                     "execution": f"{plan.schedule}, {plan.replicas}"}
    return out


def trivial_floor(scorer, graph: Graph, devices: int) -> float:
    """The best trivial plan's iteration (data parallelism and the equal-compute splits under
    every execution): DRL-PP weighs them before its first update, so the searches do too,
    as the ``random`` and ``anneal`` planners do."""
    res = scorer.score(*trivial_under(graph, devices, len(scorer.executions)))
    return float(np.min(np.where(res.fits, res.iteration_s, np.inf)))


def one_seed(graph: Graph, cluster: Cluster, seed: int, evaluations: int) -> dict[str, dict]:
    """DRL-PP, then the two searches at its evaluations and at its wall-clock."""
    trained = train_agent(graph, cluster, options(), Budget(evaluations=evaluations), seed)
    t0 = time.perf_counter()
    best = sample_best(trained.agent, trained.instance, SAMPLES, trained.best)
    evals = trained.instance.scorer.evaluations  # training and sampling
    seconds = trained.checkpoint["trained_on"]["seconds"] + time.perf_counter() - t0
    final = sample_schemes(trained.agent, trained.instance, SAMPLES, torch.Generator().manual_seed(seed))
    schedule, replicas = trained.instance.scorer.executions[best.execution]
    out = {"drl-pp": {"iteration_s": best.iteration_s, "evaluations": evals, "seconds": seconds,
                      "dp_share": float(np.mean([s.part.max() == 0 for s in final])),
                      "execution": f"{schedule}, {replicas}", "stages": int(best.part.max()) + 1}}
    anc = Ancestors(graph)
    floor = trivial_floor(instance(graph, cluster, options()).scorer, graph, len(cluster))
    for label, budget in (("same evaluations", lambda: Budget(evaluations=evals)),
                          ("same wall-clock", lambda: Budget(seconds=seconds))):
        for name, search in (("random search", random_search), ("simulated annealing", simulated_annealing)):
            scorer = instance(graph, cluster, options()).scorer  # the agent's executions
            res = search(scorer, graph, len(cluster), budget(), np.random.default_rng(seed), ancestors=anc)
            out[f"{name}, {label}"] = {"iteration_s": min(res.iteration_s if res.fits else np.inf, floor),
                                       "evaluations": res.evaluations, "seconds": res.seconds}
    return out


def equal_budgets(seeds: int, evaluations: int) -> list[dict]:
    rows = []
    for model, graph, cname, cluster in instances():
        fixed = non_learned(graph, cluster)
        runs = [one_seed(graph, cluster, seed, evaluations) for seed in range(seeds)]
        found = [v["iteration_s"] for v in fixed.values() if "iteration_s" in v] + \
            [v["iteration_s"] for r in runs for v in r.values()]
        best = min(found)
        methods = {m: [r[m] for r in runs] for m in runs[0]}
        summary = {m: _spread([v["iteration_s"] / best - 1 for v in vs]) |
                   {"evaluations": statistics.median(v["evaluations"] for v in vs),
                    "seconds": statistics.median(v["seconds"] for v in vs)} for m, vs in methods.items()}
        drl = methods["drl-pp"]
        summary["drl-pp"] |= {"dp_share": statistics.median(v["dp_share"] for v in drl),
                              "executions": dict(collections.Counter(v["execution"] for v in drl)),
                              "stages": [v["stages"] for v in drl]}
        for name, v in fixed.items():
            summary[name] = {"error": v["error"]} if "error" in v else \
                _spread([v["iteration_s"] / best - 1]) | {"seconds": v["seconds"], "complete": v["complete"],
                                                          "execution": v["execution"]}
        rows.append({"model": model, "cluster": cname, "devices": len(cluster), "best_s": best, "methods": summary})
        print(f"{model:24s} {cname:26s} best {best:.4f} s  drl-pp median gap "
              f"{summary['drl-pp']['median']:+.1%}, dp share {summary['drl-pp']['dp_share']:.0%}", flush=True)
    return rows


def _spread(gaps: list[float]) -> dict:
    return {"median": statistics.median(gaps), "min": min(gaps), "max": max(gaps), "gaps": gaps}


TARGETS = ["alexnet", "resnet50", "resnext101", "gnmt"]


def _sampled(agent, graph: Graph, cluster: Cluster, best: Best | None = None) -> float:
    best = sample_best(agent, instance(graph, cluster, options()), SAMPLES, best)
    return best.iteration_s


def generalization(seeds: int, train_evals: int, tune_evals: int) -> list[dict]:
    """Zero-shot and fine-tuned plans of an agent trained on VGG-16, against training from
    scratch for the fine-tune's time and the best non-learned plan (gaps to the latter)."""
    from copy import deepcopy

    from pipeplan.planners.drlpp.ppo import train

    cluster = load_cluster("drlpp-4gpu")
    from_cut = {t: load_graph(str(PROFILES / t)) for t in TARGETS}
    fixed = {t: min(v.get("iteration_s", np.inf) for v in non_learned(g, cluster).values()) for t, g in from_cut.items()}
    per_target: dict[str, dict[str, list[float]]] = {t: {"zero-shot": [], "fine-tuned": [], "from scratch": []}
                                                     for t in TARGETS}
    for seed in range(seeds):
        source = train_agent(load_graph(str(PROFILES / "vgg16")), cluster, options(), Budget(evaluations=train_evals),
                             seed)
        for t in TARGETS:
            graph, ref = from_cut[t], fixed[t]
            per_target[t]["zero-shot"].append(_sampled(source.agent, graph, cluster) / ref - 1)
            tuned = deepcopy(source.agent)
            best, _ = train(tuned, instance(graph, cluster, options()), Budget(evaluations=tune_evals))
            per_target[t]["fine-tuned"].append(_sampled(tuned, graph, cluster, best) / ref - 1)
            scratch = new_agent(Config(seed=seed), len(cluster))
            best, _ = train(scratch, instance(graph, cluster, options()), Budget(evaluations=tune_evals))
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


#: the settings before the anti-collapse measures: the constant T and entropy bonus DRL-PP used
BEFORE = {"temperature": 3.0, "entropy_coef": 0.01, "entropy_final": 0.01}


def collapse(seeds: int, evaluations: int, eq: list[dict]) -> list[dict]:
    """On the 8-GPU instances, the agent trained with the settings before the anti-collapse
    measures (``BEFORE``) against the defaults (from ``eq``): the DP share of the final
    policy and the gap of the best plan, same action space, same budget."""
    from pipeplan.planners.drlpp.ppo import train

    rows = []
    for model, graph, cname, cluster in instances():
        if len(cluster) != 8:
            continue
        row = next(r for r in eq if r["model"] == model and r["cluster"] == cname)
        shares, gaps = [], []
        for seed in range(seeds):
            inst = instance(graph, cluster, options())
            agent = new_agent(Config(seed=seed, **BEFORE), len(cluster))
            best, _ = train(agent, inst, Budget(evaluations=evaluations))
            best = sample_best(agent, inst, SAMPLES, best)
            final = sample_schemes(agent, inst, SAMPLES, torch.Generator().manual_seed(seed))
            shares.append(float(np.mean([s.part.max() == 0 for s in final])))
            gaps.append(best.iteration_s / row["best_s"] - 1)
        now = row["methods"]["drl-pp"]
        rows.append({"model": model, "cluster": cname, "before": {"dp_share": statistics.median(shares),
                                                                  "shares": shares, **_spread(gaps)},
                     "now": {"dp_share": now["dp_share"], **{k: now[k] for k in ("median", "min", "max", "gaps")}}})
        print(f"collapse {model}: before DP share {statistics.median(shares):.0%}, gap {statistics.median(gaps):+.1%}",
              flush=True)
    return rows


def _drl_detail(r: dict) -> str:
    d = r["methods"]["drl-pp"]
    chosen = ", ".join(f"{k} ({v})" for k, v in sorted(d["executions"].items(), key=lambda kv: -kv[1]))
    return (f"| {r['model']} | {r['cluster']} | {d['dp_share']:.0%} | {chosen} | "
            f"{', '.join(map(str, d['stages']))} | {r['methods']['joint'].get('execution', '-')} |")


def markdown(eq: list[dict], gen: list[dict], col: list[dict], args) -> str:
    methods = list(eq[0]["methods"])
    lines = ["# DRL-PP against equal budgets, over seeds", "",
             f"Gap to the best plan any method found on the instance (median [min, max] over {args.seeds} seeds; "
             f"one figure for deterministic planners); {MICROBATCHES} microbatches, synchronous schedules. DRL-PP "
             f"trains from scratch for {args.evaluations:,} plans scored per seed (planning time), then samples "
             f"{SAMPLES} schemes; it chooses the partition, the placement, the schedule (gpipe, 1f1b, zb-h1, spp-pe) "
             "and the replica mode. The searches walk the same action space and get its evaluations or its seconds. "
             "pipedream plans for the 1F1B flush; dp, spp and joint choose their schedules. A plan that does not fit "
             "counts as infinitely slow.",
             "", "| model | cluster | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for r in eq:
        lines.append(f"| {r['model']} | {r['cluster']} | " + " | ".join(_cell(r["methods"][m]) for m in methods) + " |")
    d = [r["methods"]["drl-pp"] for r in eq]
    lines += ["", f"DRL-PP used a median of {statistics.median(x['evaluations'] for x in d):,.0f} evaluations and "
              f"{statistics.median(x['seconds'] for x in d):.1f} s per run; spp planned in "
              f"{statistics.median(r['methods']['spp'].get('seconds', np.nan) for r in eq):.3f} s and joint in "
              f"{statistics.median(r['methods']['joint'].get('seconds', np.nan) for r in eq):.2f} s (medians).", "",
              "What DRL-PP chose: the share of data parallelism (one partition) among the trained policy's "
              f"{SAMPLES} final schemes (median over seeds: 100% is a collapse), the execution of its best plan "
              "per seed, its best plan's stage count per seed, and joint's execution.", "",
              "| model | cluster | DP share | execution (seeds) | stages | joint's |", "|---|---|---|---|---|---|"]
    lines += [_drl_detail(r) for r in eq]
    lines += ["", "## Collapse", "",
              f"The same agent, budget and action space with the settings before the anti-collapse measures "
              f"(T = {BEFORE['temperature']:g}, entropy bonus {BEFORE['entropy_coef']:g} throughout) against the "
              "defaults (T = ln(nodes / accelerators), entropy bonus 0.05 annealed to 0.005): DP share of the final "
              "policy (median over seeds) and the gap of the best plan.", "",
              "| model | cluster | DP share before | DP share now | gap before | gap now |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['cluster']} | {r['before']['dp_share']:.0%} | {r['now']['dp_share']:.0%} | "
              f"{_cell(r['before'])} | {_cell(r['now'])} |" for r in col]
    lines += ["", "## Generalization (4 x V100)", "",
              f"An agent trained on VGG-16 for {args.train_evaluations:,} plans scored plans each model without "
              f"retraining (zero-shot), after fine-tuning for {args.tune_evaluations:,}, or an agent trained from "
              f"scratch for {args.tune_evaluations:,} does. Gap to the best non-learned plan (negative: better).", "",
              "| model | zero-shot | fine-tuned | from scratch |", "|---|---|---|---|"]
    for r in gen:
        lines.append(f"| {r['model']} | {_cell(r['zero-shot'])} | {_cell(r['fine-tuned'])} | {_cell(r['from scratch'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--evaluations", type=int, default=1000, help="DRL-PP's plans scored per instance and seed")
    ap.add_argument("--train-evaluations", type=int, default=2000, help="training on VGG-16 (generalization)")
    ap.add_argument("--tune-evaluations", type=int, default=300, help="fine-tune / from-scratch plans scored")
    ap.add_argument("--quick", action="store_true", help="one instance, 2 seeds, small budgets: checks the script")
    add_out_argument(ap, "drlpp")
    args = ap.parse_args()
    if profiles_absent():
        return
    torch.set_num_threads(1)
    if args.quick:
        for name in ("bert-48", "resnet152"):
            MODELS.pop(name)
        del TARGETS[1:]
        args.seeds, args.evaluations, args.train_evaluations, args.tune_evaluations = 2, 64, 64, 32
    eq = equal_budgets(args.seeds, args.evaluations)
    col = collapse(args.seeds, args.evaluations, eq)
    gen = generalization(args.seeds, args.train_evaluations, args.tune_evaluations)
    write_json(args.out / "evaluate.json", {"seeds": args.seeds, "evaluations": args.evaluations,
                                            "equal_budgets": eq, "collapse": col, "generalization": gen})
    write_markdown(args.out / "evaluate.md", markdown(eq, gen, col, args))


if __name__ == "__main__":
    main()
