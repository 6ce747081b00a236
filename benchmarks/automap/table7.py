"""Auto-MAP Table 7 in simulation: pipeline search by online training (a DQN per model and
cluster) on BERT-48, T5-base, T5-3B and T5-11B at operator granularity (``zoo:NAME?
granularity=op&microbatch=16``: every matmul, softmax, norm and residual add a node), on the
paper's configs A/B/C (2/3/4 servers of 8 V100 over NVLink, 25 Gbps between servers), one
stage per server, 16 microbatches.

For each case: the DQN's cuts (position, the op before it and its layer), device cuts, the
time it took to converge (the greedy policy's value unchanged, within 0.1%, for 8 checks at epsilon's floor) and to
first meet its best plan, whether that plan fits in memory; the optimum of the same pruned
problem (branch and bound, exact) and the gap; exhaustive enumeration of the pruned problem
(run where it holds at most ``--enumerate-up-to`` plans, else its time estimated from the
measured rate over the first 20,000 plans, marked ~); and ``spp`` on the same graph and
cluster (free to use any plan, so it may beat the pruned optimum; where its size guard
refuses the operator graph, on the layer-level graph, marked "(layers)"). T5 is trained with
Adafactor (no momentum, factored second moments), so optimizer state is counted as SGD's
(none); BERT with Adam. Writes benchmarks/results/automap/table7.md and .json.

    python benchmarks/automap/table7.py [--budget 300] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeplan.cluster import load_cluster
from pipeplan.errors import Infeasible, PipeplanError
from pipeplan.graph import load_graph
from pipeplan.learn.harness import Budget
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.automap.enumerate import exhaustive, optimum, plans
from pipeplan.planners.automap.online import online_config, train_online
from pipeplan.planners.automap.problem import CutProblem

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

MODELS = ("bert-48", "t5-base", "t5-3b", "t5-11b")
CONFIGS = {"A": ("automap-a", 2), "B": ("automap-b", 3), "C": ("automap-c", 4)}
MICROBATCHES = 16
# Table 7 of the paper: layers near the cuts, device cuts, time (s); None: out of memory
PAPER = {("bert-48", "A"): ("layer23", "8", 95), ("bert-48", "B"): ("layer17, layer32", "8, 16", 157),
         ("bert-48", "C"): ("layer14, layer27, layer40", "8, 16, 24", 262),
         ("t5-base", "A"): ("dec/layer2", "8", 42), ("t5-base", "B"): ("enc/layer5, dec/layer5", "8, 16", 50),
         ("t5-base", "C"): ("enc/layer4/conv1, dec/layer3, softmax", "8, 16, 22", 198),
         ("t5-3b", "A"): ("dec/layer2", "8", 115), ("t5-3b", "B"): ("enc/layer19, dec/layer11", "8, 16", 202),
         ("t5-3b", "C"): ("enc/layer14, dec/layer5, dec/layer17", "8, 16, 24", 262),
         ("t5-11b", "A"): None, ("t5-11b", "B"): None,
         ("t5-11b", "C"): ("enc/layer13, dec/layer3, dec/layer15", "8, 16, 24", 280)}


def enumeration(problem: CutProblem, up_to: int) -> dict:
    """Exhaustive enumeration's time: run, or estimated from the rate over 20,000 plans."""
    from pipeplan.planners.automap.enumerate import count

    total = count(problem)
    if total <= up_to:
        e = exhaustive(problem)
        return {"plans": total, "seconds": e.seconds, "estimated": False}
    t0, seen = time.perf_counter(), 0
    for rows in plans(problem, 4096):
        problem.values(rows)
        seen += len(rows)
        if seen >= 20000:
            break
    rate = seen / (time.perf_counter() - t0)
    return {"plans": total, "seconds": total / rate, "estimated": True}


def spp_row(model: str, graph, cluster, optimizer: str) -> dict:
    """``spp`` on the operator graph; where its size guard refuses (hundreds of ops on 32
    devices would take it minutes), on the same model's layer-level graph."""
    options = PlanOptions(microbatches=MICROBATCHES, optimizer=optimizer)
    try:
        plan, res = run_planner("spp", graph, cluster, options)
        level = "op"
    except (Infeasible, PipeplanError):
        plan, res = run_planner("spp", load_graph(f"zoo:{model}?microbatch=16"), cluster, options)
        level = "layer"
    return {"iteration_s": res.iteration_s, "fits": not res.over_memory, "stages": len(plan.stages),
            "search_s": plan.search_s, "graph": level}


def case(model: str, config: str, budget: float, seed: int, up_to: int) -> dict:
    spec = f"zoo:{model}?granularity=op&microbatch=16"
    optimizer = "sgd" if model.startswith("t5") else "adam"
    graph, cluster = load_graph(spec), load_cluster(CONFIGS[config][0])
    problem = CutProblem(graph, cluster, CONFIGS[config][1], MICROBATCHES, optimizer=optimizer)
    run = train_online(problem, Budget(seconds=budget), online_config(seed))
    opt = optimum(problem)
    spp = spp_row(model, graph, cluster, optimizer)
    return {"model": model, "config": config, "nodes": len(graph), "candidates": int(problem.pivots.size),
            "dqn": {**problem.describe(run.cuts), "iteration_s": run.iteration_s, "fits": run.fits,
                    "converged_s": run.converged_s, "best_found_s": run.best_found_s, "elapsed_s": run.elapsed_s,
                    "episodes": run.episodes, "evaluations": run.evaluations,
                    "greedy_iteration_s": problem.value(run.greedy)[0] if run.greedy else None},
            "optimum": {**problem.describe(opt.cuts), "iteration_s": opt.iteration_s, "fits": opt.fits,
                        "plans": opt.plans, "evaluated": opt.evaluated, "seconds": opt.seconds},
            "enumeration": enumeration(problem, up_to),
            "spp": spp,
            "paper": PAPER[(model, config)]}


def _fmt_case(r: dict) -> str:
    d, o, e, s = r["dqn"], r["optimum"], r["enumeration"], r["spp"]
    layers = ", ".join(d["layers"]) if d["cuts"] else "-"
    gap = d["iteration_s"] / o["iteration_s"] - 1
    conv = f"{d['converged_s']:.0f}" if d["converged_s"] is not None else f">{d['elapsed_s']:.0f}"
    enum = ("~" if e["estimated"] else "") + f"{e['seconds']:.0f}"
    paper = r["paper"]
    paper_txt = "OOM" if paper is None else f"{paper[0]} / ({paper[1]}) / {paper[2]} s"
    return (f"| {r['model']} | {r['config']} | {', '.join(map(str, d['cuts']))} | {layers} | "
            f"{', '.join(map(str, d['device_cuts']))} | {conv} | {d['best_found_s']:.0f} | "
            f"{'yes' if d['fits'] else 'OOM'} | {d['iteration_s']:.3f} | {o['iteration_s']:.3f} | {gap:+.1%} | "
            f"{o['plans']:,} | {o['seconds']:.1f} | {enum} | {s['iteration_s']:.3f}{'' if s['fits'] else ' OOM'}"
            f"{'' if s['graph'] == 'op' else ' (layers)'} | "
            f"{paper_txt} |")


def markdown(rows: list[dict], budget: float, seed: int) -> str:
    head = ("| model | config | DQN cuts (op position) | layers near the cuts | device cuts | converged (s) | "
            "best found (s) | fits | DQN L (s) | optimum L (s) | gap | plans (pruned) | B&B (s) | "
            "enumeration (s) | spp L (s) | paper: layers / device cuts / time |\n|" + "---|" * 16)
    lines = [_fmt_case(r) for r in rows]
    return (f"# Auto-MAP Table 7: pipeline search by online training (simulated)\n\n"
            f"Operator-level graphs, 16 microbatches of 16, one stage per server, radius 3, DQN seed {seed}, "
            f"budget {budget:g} s per case on this machine's CPU. L = simulated iteration time (1F1B). "
            "`~`: estimated from the measured enumeration rate.\n\n" + head + "\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=300.0, help="seconds of DQN training per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--configs", default="A,B,C")
    parser.add_argument("--enumerate-up-to", type=int, default=50000)
    add_out_argument(parser, "automap")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for config in args.configs.split(","):
            rows.append(case(model, config, args.budget, args.seed, args.enumerate_up_to))
            print(_fmt_case(rows[-1]), flush=True)
    write_json(args.out / "table7.json", {"budget_s": args.budget, "seed": args.seed, "rows": rows})
    write_markdown(args.out / "table7.md", markdown(rows, args.budget, args.seed))
    print(markdown(rows, args.budget, args.seed))


if __name__ == "__main__":
    main()
