"""Auto-MAP's pipeline planning by online inference, measured: Table 8 and generalization.

The agent is the checkpoint shipped with pipeplan (``pipeplan train automap-infer``, see
docs/automap.md), trained once on generated problems and the zoo's training models; every
model here is one it never trained on. For each (model, config):

- the zero-shot plan: boundaries among the 128 points, the positions and layers they cut,
  device cuts, and the time to plan (coarsening + the agent's greedy steps; the checkpoint
  is loaded once beforehand);
- its gap to the optimum of the same coarsened problem (``coarse_optimum``, exact);
- on the real graph: the zero-shot plan simulated against pipeplan's best planner
  (``best``: every non-learned planner, each free to choose anything; for the zoo's operator
  graphs on the same model's layer graph, which holds the same costs and which spp plans in
  seconds rather than minutes).

Table 8 is BERT-48, T5-base and T5-11B on config C (operator granularity). The
generalization table adds PipeDream's profiles and the zoo models left out of training, on
configs A, B and C. Then the paper's remark that CNNs needed a 10^4-episode fine-tune
(§5.2.4): the checkpoint is fine-tuned on the zoo's CNN training models for ``--finetune``
episodes and the CNN rows are planned again. Writes benchmarks/results/automap/infer.md
and .json.

    python benchmarks/automap/infer.py [--finetune 10000] [--configs A,B,C] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeplan.cluster import load_cluster
from pipeplan.graph import linearize, load_graph
from pipeplan.learn.harness import Budget, save_bytes
from pipeplan.planners import PlanOptions
from pipeplan.planners.automap import default_stages
from pipeplan.planners.automap.arrays import from_graph, real_plan
from pipeplan.planners.automap.coarse_optimum import boundary_points, optimum
from pipeplan.planners.automap import InferOptions
from pipeplan.sim.engine import warm_up
from pipeplan.planners.automap.infer import SHIPPED, InferEnv, beam, greedy, load_agent, train
from pipeplan.planners.automap.problem import layer_of
from pipeplan.planners.compare import best
from pipeplan.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import PROFILES, add_out_argument, write_json, write_markdown  # noqa: E402

CONFIGS = {"A": "automap-a", "B": "automap-b", "C": "automap-c"}
MICROBATCHES = 16
TABLE8 = ("bert-48", "t5-base", "t5-11b")
# Table 8 of the paper: boundaries at granularity 128, layers nearby, device cuts (config C)
PAPER8 = {"bert-48": ("34, 66, 98", "layer14, layer27, layer40", "8, 16, 24"),
          "t5-base": ("34, 66, 98", "enc/layer4/conv1, dec/layer3, softmax", "8, 16, 24"),
          "t5-11b": ("34, 66, 98", "enc/layer13, dec/layer3, dec/layer15", "8, 16, 24")}
ZOO_UNSEEN = [(m, f"zoo:{m}?granularity=op&microbatch=16", False) for m in ("bert-48", "t5-base", "t5-3b",
                                                                            "t5-11b")] + \
             [(m, f"zoo:{m}", True) for m in ("vgg19", "resnet152", "inception-v3")]
PIPEDREAM = [("pd/" + m, m, m != "gnmt") for m in ("alexnet", "vgg16", "resnet50", "resnext101", "inception_v3",
                                                    "gnmt")]
TARGET_GAP, TARGET_MS = 0.05, 100.0
BEAM = InferOptions.beam  # the planner's default width


def models() -> list[tuple[str, str, bool]]:
    """(label, spec, is a CNN) of every unseen model; PipeDream's where ../shared has them."""
    out = list(ZOO_UNSEEN)
    for label, name, cnn in PIPEDREAM:
        path = PROFILES / name / "graph.txt"
        if path.is_file():
            out.append((label, str(path), cnn))
    return out


def random_search(inst, seconds: float | None = None, plans: int | None = None, seed: int = 0) -> dict:
    """The yardstick of the same budget: uniformly random plans (K-1 distinct boundary
    positions, K-1 distinct device cuts), scored with V in batches of 64, until ``plans`` are
    scored or ``seconds`` have passed."""
    rng, t0 = np.random.default_rng(seed), time.perf_counter()
    points, k = boundary_points(inst), inst.stages - 1
    best, scored = np.inf, 0
    while (plans is None or scored < plans) and (seconds is None or time.perf_counter() - t0 < seconds):
        n = min(64, plans - scored) if plans else 64
        bounds = np.sort(points[np.argsort(rng.random((n, points.size)), axis=1)[:, :k]], axis=1)
        dcuts = np.sort(1 + np.argsort(rng.random((n, inst.units - 1)), axis=1)[:, :k], axis=1)
        best = min(best, float(inst.values(bounds, dcuts).min()))
        scored += n
    return {"value": best, "plans": scored}


def row(agent, label: str, spec: str, config: str, width: int = BEAM) -> dict:
    graph, cluster = load_graph(spec), load_cluster(CONFIGS[config])
    stages = default_stages(cluster)
    t0 = time.perf_counter()
    inst = from_graph(graph, cluster, MICROBATCHES, stages)
    found = beam(agent, InferEnv(), inst, width)
    plan_ms = (time.perf_counter() - t0) * 1e3
    paper = greedy(agent, InferEnv(), inst)
    same_plans = random_search(inst, plans=width)
    same_time = random_search(inst, seconds=found.seconds)
    opt = optimum(inst)
    plan = real_plan(graph, cluster, inst, found.bounds, found.dcuts, MICROBATCHES)
    real = simulate(plan, timeline=False)
    top = best(load_graph(spec.replace("granularity=op&", "")), cluster, PlanOptions(microbatches=MICROBATCHES))
    order = [graph.ids[int(u)] for u in linearize(graph).order]
    layers = [layer_of(order[int(inst.positions[b]) - 1]) for b in found.bounds]
    return {"model": label, "config": config, "nodes": len(graph), "stages": stages,
            "boundaries": found.bounds, "positions": [int(inst.positions[b]) for b in found.bounds],
            "layers": layers, "device_cuts": found.dcuts, "plan_ms": plan_ms, "agent_ms": found.seconds * 1e3,
            "value": found.value, "optimum": {"boundaries": opt.bounds, "device_cuts": opt.dcuts, "value": opt.value,
                                              "evaluated": opt.evaluated, "seconds": opt.seconds},
            "gap": found.value / opt.value - 1, "greedy_gap": paper.value / opt.value - 1,
            "greedy_ms": paper.seconds * 1e3,
            "random_same_plans_gap": same_plans["value"] / opt.value - 1,
            "random_same_time_gap": same_time["value"] / opt.value - 1, "random_same_time_plans": same_time["plans"],
            "real": {"iteration_s": real.iteration_s, "fits": not real.over_memory},
            "best": {"planner": top.planner, "iteration_s": top.iteration_s},
            "gap_to_best": real.iteration_s / top.iteration_s - 1}


def finetuned(checkpoint: str, episodes: int, seed: int = 0):
    """The checkpoint fine-tuned on the zoo's CNN training models."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        trained = train(Budget(evaluations=episodes), seed, "cnn", checkpoint)
        path = Path(tmp) / "cnn.pt"
        path.write_bytes(save_bytes(trained.checkpoint))
        return load_agent(path), time.perf_counter() - t0


def _line(r: dict) -> str:
    o = r["optimum"]
    return (f"| {r['model']} | {r['config']} | {', '.join(map(str, r['boundaries']))} | {', '.join(r['layers'])} | "
            f"{', '.join(map(str, r['device_cuts']))} | {r['plan_ms']:.1f} | {r['gap']:+.1%} | "
            f"{r['greedy_gap']:+.1%} | "
            f"{r['random_same_plans_gap']:+.1%} | {r['random_same_time_gap']:+.1%} ({r['random_same_time_plans']}) | "
            f"{', '.join(map(str, o['boundaries']))} / {', '.join(map(str, o['device_cuts']))} | "
            f"{r['real']['iteration_s']:.3f}{'' if r['real']['fits'] else ' OOM'} | "
            f"{r['best']['iteration_s']:.3f} ({r['best']['planner']}) | {r['gap_to_best']:+.1%} |")


HEAD = ("| model | config | boundaries (of 128) | layers near the cuts | device cuts | plan (ms) | gap to coarse "
        "optimum | greedy (paper): gap | random, same plans: gap | random, same time: gap (plans) | "
        "coarse optimum: boundaries / device cuts | zero-shot L (s) | best planner L (s) | gap to best |\n|"
        + "---|" * 14)


def summary(rows: list[dict]) -> dict:
    gaps = np.array([r["gap"] for r in rows])
    ms = np.array([r["plan_ms"] for r in rows])
    worst = rows[int(np.argmax(gaps))]
    med = {k: float(np.median([r[k] for r in rows])) for k in ("greedy_gap", "random_same_plans_gap",
                                                                "random_same_time_gap")}
    return {"median_gap": float(np.median(gaps)), "worst_gap": float(gaps.max()), **{"median_" + k: v for k, v in
                                                                                      med.items()},
            "worst": f"{worst['model']} on {worst['config']}", "median_ms": float(np.median(ms)),
            "max_ms": float(ms.max()), "median_gap_to_best": float(np.median([r["gap_to_best"] for r in rows])),
            "target_gap_met": bool(np.median(gaps) <= TARGET_GAP), "target_ms_met": bool(ms.max() < TARGET_MS)}


def markdown(table8: list[dict], rows: list[dict], cnn_before: list[dict], cnn_after: list[dict],
             finetune: dict) -> str:
    s, b, a = summary(rows), summary(cnn_before), summary(cnn_after) if cnn_after else None
    paper = "\n".join(f"| {m} | C | {p[0]} | {p[1]} | {p[2]} |" for m, p in PAPER8.items())
    out = ["# Auto-MAP online inference: Table 8 and generalization (simulated)\n",
           f"The shipped checkpoint, zero-shot, beam {BEAM} (the planner's default: the agent's {BEAM} best partial "
           f"plans kept per step, the complete ones scored with V); {MICROBATCHES} microbatches, one stage per "
           "server. Gaps: the "
           "plan's coarse value over the exact optimum of the same coarsened problem; gap to best: the zero-shot "
           "plan on the real graph against pipeplan's best non-learned planner.\n",
           "## Table 8 (config C)\n", HEAD, *[_line(r) for r in table8],
           "\nThe paper's Table 8:\n\n| model | config | boundaries | layers | device cuts |\n|---|---|---|---|---|",
           paper, "\n## Generalization: every unseen model, configs " + ", ".join(sorted({r['config'] for r in rows})),
           "", HEAD, *[_line(r) for r in rows],
           f"\nMedian gap to the coarse optimum {s['median_gap']:+.1%} (target <= {TARGET_GAP:.0%}: "
           f"{'met' if s['target_gap_met'] else 'NOT met'}); worst {s['worst_gap']:+.1%} ({s['worst']}); planning "
           f"median {s['median_ms']:.1f} ms, at most {s['max_ms']:.1f} ms (target < {TARGET_MS:.0f} ms: "
           f"{'met' if s['target_ms_met'] else 'NOT met'}); median gap to pipeplan's best planner "
           f"{s['median_gap_to_best']:+.1%}. Median gaps of the yardsticks: the greedy plan (beam 1, the paper's "
           f"inference) {s['median_greedy_gap']:+.1%}; random valid plans, as many as the beam scores "
           f"{s['median_random_same_plans_gap']:+.1%}, as many as fit in the beam's time "
           f"{s['median_random_same_time_gap']:+.1%}.\n",
           f"## CNNs before and after a {finetune['episodes']:,}-episode fine-tune on the zoo's CNN training models "
           f"({finetune['seconds']:.0f} s)\n",
           f"Before: median gap {b['median_gap']:+.1%}, worst {b['worst_gap']:+.1%} ({b['worst']}); "
           + (f"after: median gap {a['median_gap']:+.1%}, worst {a['worst_gap']:+.1%} ({a['worst']})." if a else
              "no fine-tune run."), "", HEAD, *[_line(r) for r in cnn_after]]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="A,B,C")
    parser.add_argument("--finetune", type=int, default=10000, help="episodes of CNN fine-tuning (0: none)")
    parser.add_argument("--checkpoint", default=str(SHIPPED), help="the agent (default: the shipped one)")
    parser.add_argument("--models", default=None, help="only these labels (comma-separated)")
    add_out_argument(parser, "automap")
    args = parser.parse_args()
    agent = load_agent(args.checkpoint)
    warm_up()  # the simulator's compiled kernels, as in a process that has planned before
    row(agent, "warm-up", "zoo:bert-large?layers=4", "A")  # first calls pay for imports and allocations
    table8 = [row(agent, m, f"zoo:{m}?granularity=op&microbatch=16", "C") for m in TABLE8]
    for r in table8:
        print(_line(r), flush=True)
    done = {(r["model"], r["config"]): r for r in table8}
    rows, cnn = [], []
    chosen = [m for m in models() if args.models is None or m[0] in args.models.split(",")]
    for label, spec, is_cnn in chosen:
        for config in args.configs.split(","):
            rows.append(done.get((label, config)) or row(agent, label, spec, config))
            print(_line(rows[-1]), flush=True)
            if is_cnn:
                cnn.append((label, spec, config, rows[-1]))
    ft = {"episodes": args.finetune, "seconds": 0.0}
    after = []
    if args.finetune and cnn:
        tuned, ft["seconds"] = finetuned(args.checkpoint, args.finetune)
        after = [row(tuned, label, spec, config) for label, spec, config, _ in cnn]
    before = [r for *_, r in cnn]
    write_json(args.out / "infer.json", {"table8": table8, "rows": rows, "summary": summary(rows),
                                         "cnn_finetune": {**ft, "before": before, "after": after}})
    text = markdown(table8, rows, before, after, ft)
    write_markdown(args.out / "infer.md", text)
    print(text)


if __name__ == "__main__":
    main()
