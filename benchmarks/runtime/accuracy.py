"""Prediction error of the simulator against real runs on this machine.

Models: an MLP, a residual CNN written flat (skip connections may cross a cut) and two
Hugging Face models built from configs (GPT-2 and BERT, 4 layers). Each is profiled (one
process, 1 thread) and calibrated with its own training step on 2 and on 3 worker
processes (gloo over loopback, 1 thread each). Plans per model: a 2-stage pipeline cut where
forward+backward time balances, under gpipe, 1f1b and spp-pe; data parallelism with split
and with round-robin replicas; the fastest fitting plan `compare` finds; a 3-process plan
with uneven replication (stage 0 on 2 devices, split, cut at two thirds of the time). Every
plan runs --runs times (measured = the median step after 2 warm-up steps). Reported: each
run's median |error|, the median over all, per model Kendall's tau between predicted and
measured times (does the model rank plans right?), and the worst case with its per-action
error (forward, backward, all-reduce, optimizer step: where the time went), whose
predicted-vs-measured Gantt chart is saved; the spread of one plan's time between its runs
(the machine's noise floor) and each kind's per-action error over all plans. A run is one
pass over a model's plans, so every plan of a run meets the machine in the same state. Writes benchmarks/results/runtime/accuracy.{md,json} and
accuracy_worst.png.

    python benchmarks/runtime/accuracy.py [--steps N] [--runs R] [--microbatches M] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from pipeplan.plan import Plan, Stage
from pipeplan.planners import PlanOptions
from pipeplan.planners.compare import compare
from pipeplan.runtime.calibrate import calibrate
from pipeplan.runtime.executor import RunConfig, run_plan
from pipeplan.runtime.profiler import profile_model
from pipeplan.runtime.timing import side_by_side
from pipeplan.sim import predicted_s, simulate
from pipeplan.viz import gantt_figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, save_figure, write_json, write_markdown  # noqa: E402

MODELS = ["example:mlp", "example:resnet", "hf:gpt2?n_layer=4&n_embd=128&seq=32",
          "hf:bert?num_hidden_layers=4&hidden_size=128&seq=32"]


def cut_at(graph, fraction: float) -> int:
    """The cut of the layer order that puts ``fraction`` of forward+backward time before it."""
    cost = np.cumsum(graph.fwd + graph.bwd)
    return int(np.argmin(np.abs(cost[:-1] - fraction * cost[-1]))) + 1


def crossing_edges(graph, cut: int) -> int:
    return sum(1 for u, v in graph.edges if u < cut <= v)


def plans_for(graph, two, three, m: int) -> dict[str, Plan]:
    names, d2, d3 = graph.ids, two.names, three.names
    cut = cut_at(graph, 0.5)
    out = {f"2 stages, {s}": Plan(graph, two, [Stage(names[:cut], d2[:1]), Stage(names[cut:], d2[1:2])], m, schedule=s)
           for s in ("gpipe", "1f1b", "spp-pe")}
    for rep in ("split", "round-robin"):
        out[f"data parallel, {rep}"] = Plan(graph, two, [Stage(names, d2[:2])], m, schedule="1f1b", replicas=rep)
    rows = [r for r in compare(graph, two, ["spp", "pipedream", "hetpipe", "gpipe", "dp"],
                               PlanOptions(microbatches=m)) if r.fits]
    if rows:
        out[f"best ({rows[0].plan.planner})"] = rows[0].plan
    cut3 = cut_at(graph, 2 / 3)
    out["uneven 2-1, split"] = Plan(graph, three, [Stage(names[:cut3], d3[:2]), Stage(names[cut3:], d3[2:3])], m,
                                    schedule="1f1b", replicas="split")
    return out


def _calibration(cluster) -> dict:
    return {"workers": len(cluster), "speeds": [d.speed for d in cluster.devices],
            "action_overhead_s": cluster.meta.get("action_overhead_s"),
            "allreduce_efficiency": cluster.meta.get("allreduce_efficiency"),
            "update_s_per_byte": cluster.meta.get("update_s_per_byte")}


def measure_model(spec: str, args) -> tuple[list[dict], dict, dict]:
    graph = profile_model(spec, reps=10, threads=1)
    two, _ = calibrate(workers=2, threads=1, seconds=2.0, model_spec=spec, predict=predicted_s)
    three, _ = calibrate(workers=3, threads=1, seconds=2.0, model_spec=spec, predict=predicted_s)
    plans = plans_for(graph, two, three, args.microbatches)
    runs: dict[str, list[dict]] = {label: [] for label in plans}
    for _ in range(args.runs):  # a run = every plan once, so that each run's plans share the machine's state
        for label, plan in plans.items():
            runs[label].append(run_plan(plan, RunConfig(spec, steps=args.steps, warmup=2, threads=1), predicted_s(plan)))
    cases, timelines = [], {}
    for label, plan in plans.items():
        measured = statistics.median(o.measured_s for o in runs[label])
        pick = min(runs[label], key=lambda o: abs(o.measured_s - measured))
        timelines[label] = pick.timeline
        times = [o.measured_s for o in runs[label]]
        case = {"model": spec, "plan": label, "devices": [len(s.devices) for s in plan.stages],
                "schedule": plan.schedule, "replicas": plan.replicas, "predicted_s": runs[label][0].predicted_s,
                "measured_s": times, "spread": [o.spread for o in runs[label]],
                "between_runs": (max(times) - min(times)) / measured,
                "errors": [o.error for o in runs[label]],
                "action_error": side_by_side(simulate(plan).timeline, pick.timeline)[1]["summary"],
                "skip_edges_cut": crossing_edges(graph, len(plan.stages[0].nodes)) if len(plan.stages) > 1 else 0}
        cases.append(case)
        print(f"{spec[:40]:>40} {label:<26} predicted {case['predicted_s'] * 1e3:7.2f} ms  measured "
              + " ".join(f"{t * 1e3:7.2f}" for t in times) + "  error "
              + " ".join(f"{e:5.1%}" for e in case["errors"]), flush=True)
    tau = kendalltau([c["predicted_s"] for c in cases], [statistics.median(c["measured_s"]) for c in cases])
    summary = {"kendall_tau": float(tau.statistic), "calibration": [_calibration(two), _calibration(three)]}
    return cases, summary, {"plans": plans, "timelines": timelines}


def per_kind(cases: list[dict]) -> dict[str, float]:
    """Median over the cases of each kind's median per-action |error| (where time goes wrong)."""
    kinds = sorted({k for c in cases for k in c["action_error"]})
    return {k: statistics.median(c["action_error"][k]["median_abs_error"] for c in cases if k in c["action_error"])
            for k in kinds}


def worst_case(cases: list[dict], context: dict, out_dir: Path) -> dict:
    """The case with the largest median error, its per-action error and Gantt chart."""
    worst = max(cases, key=lambda c: statistics.median(c["errors"]))
    ctx = context[worst["model"]]
    plan = ctx["plans"][worst["plan"]]
    merged, errors = side_by_side(simulate(plan).timeline, ctx["timelines"][worst["plan"]])
    save_figure(gantt_figure(merged, f"{worst['model']}, {worst['plan']}: predicted and measured"),
                out_dir / "accuracy_worst.png")
    return {**worst, "action_error": errors["summary"]}


def table(cases: list[dict]) -> list[str]:
    out = ["| model | plan | devices | predicted (ms) | measured (ms), each run | error, each run |",
           "|---|---|---|---|---|---|"]
    for c in cases:
        skip = f" ({c['skip_edges_cut']} edges cross the cut)" if c["skip_edges_cut"] > 1 else ""
        out.append(f"| {c['model']} | {c['plan']}{skip} | {'-'.join(map(str, c['devices']))} | "
                   f"{c['predicted_s'] * 1e3:.1f} | {', '.join(f'{t * 1e3:.1f}' for t in c['measured_s'])} | "
                   f"{', '.join(f'{e:.1%}' for e in c['errors'])} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--microbatches", type=int, default=4)
    add_out_argument(ap, "runtime")
    args = ap.parse_args()
    cases, models, context = [], {}, {}
    for spec in MODELS:
        got, models[spec], context[spec] = measure_model(spec, args)
        cases += got
    per_run = [statistics.median(c["errors"][i] for c in cases) for i in range(args.runs)]
    overall = statistics.median(e for c in cases for e in c["errors"])
    worst = worst_case(cases, context, args.out)
    noise = statistics.median(c["between_runs"] for c in cases)
    kinds = per_kind(cases)
    print(f"median |error| per run: {', '.join(f'{e:.1%}' for e in per_run)}; over all {overall:.1%}; "
          "Kendall tau: " + ", ".join(f"{k}: {v['kendall_tau']:.2f}" for k, v in models.items()))
    write_json(args.out / "accuracy.json", {"steps": args.steps, "runs": args.runs, "microbatches": args.microbatches,
                                            "median_error_per_run": per_run, "median_error": overall,
                                            "median_between_runs": noise, "action_error_per_kind": kinds,
                                            "models": models, "worst": worst, "cases": cases})
    md = ["# Prediction error on this machine", "",
          f"{len(cases)} plans on {len(MODELS)} models, each run {args.runs} times ({args.steps} steps of "
          f"{args.microbatches} microbatches after 2 warm-up steps; measured = the median step). Worker processes: "
          "gloo, 1 thread each, calibrated per model with its own training step on 2 and on 3 processes.", "",
          f"**Median |error| per run: {', '.join(f'{e:.1%}' for e in per_run)}; over all runs {overall:.1%}** "
          "(target 10% in every run).", "",
          f"The same plan's measured time differs between its runs by {noise:.1%} (median over the plans of "
          "(max - min) / median): the machine's noise floor for any prediction.", "",
          "Per-action median |error| (median over the plans): "
          + ", ".join(f"{k} {v:.1%}" for k, v in kinds.items()) + ".", "",
          "Kendall's tau between predicted and measured times of one model's plans (target 0.8): "
          + ", ".join(f"{k} {v['kendall_tau']:.2f}" for k, v in models.items()) + ".", "",
          f"Worst case: {worst['model']}, {worst['plan']}: median error {statistics.median(worst['errors']):.1%}; "
          "per-action median |error|: " + ", ".join(f"{k} {v['median_abs_error']:.1%}"
                                                     for k, v in worst["action_error"].items())
          + " (accuracy_worst.png: its predicted rows above its measured ones).", "", *table(cases)]
    write_markdown(args.out / "accuracy.md", "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
