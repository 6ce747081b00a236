"""Prediction error of the simulator against real runs on this machine.

For each built-in example: profile it (one process, 1 thread), calibrate 2 worker
processes with its own training step (gloo over loopback, 1 thread each), build several plans (a 2-stage pipeline
under gpipe, 1f1b and spp-pe; data parallelism with split and round-robin replicas; the
plan `pipeplan plan --planner best` picks), run each for real and compare the measured
iteration time (median of the steps after warm-up) with the simulator's prediction on the
calibrated cluster. Processes <= cores (2), so the measurement is honest. Writes
benchmarks/results/runtime/accuracy.{md,json}.

    python benchmarks/runtime/accuracy.py [--steps N] [--microbatches M] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from pipeplan.plan import Plan, Stage
from pipeplan.planners import PlanOptions
from pipeplan.planners.compare import compare
from pipeplan.runtime.calibrate import calibrate
from pipeplan.runtime.executor import RunConfig, run_plan
from pipeplan.runtime.profiler import profile_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

MODELS = ["example:mlp", "example:transformer", "example:cnn"]


def balanced_cut(graph) -> int:
    """The cut of the chain that best balances forward+backward time over two stages."""
    cost = np.cumsum(graph.fwd + graph.bwd)
    return int(np.argmin(np.abs(cost[:-1] - cost[-1] / 2))) + 1


def plans_for(graph, cluster, m: int) -> dict[str, Plan]:
    names = graph.ids
    cut = balanced_cut(graph)
    d = cluster.names
    out = {}
    for sched in ("gpipe", "1f1b", "spp-pe"):
        out[f"2 stages, {sched}"] = Plan(graph, cluster, [Stage(names[:cut], d[:1]), Stage(names[cut:], d[1:2])],
                                         m, schedule=sched)
    out["data parallel, split"] = Plan(graph, cluster, [Stage(names, d[:2])], m, schedule="1f1b", replicas="split")
    out["data parallel, round-robin"] = Plan(graph, cluster, [Stage(names, d[:2])], m, schedule="1f1b",
                                             replicas="round-robin")
    rows = [r for r in compare(graph, cluster, ["spp", "pipedream", "gpipe", "dp"], PlanOptions(microbatches=m))
            if r.fits]
    best = next((r.plan for r in rows if len({len(s.devices) for s in r.plan.stages}) == 1), None)
    if best is not None:
        out[f"best ({best.planner})"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    add_out_argument(ap, "runtime")
    args = ap.parse_args()
    rows, calibrations = [], {}
    for spec in MODELS:
        graph = profile_model(spec, reps=20, threads=1)
        cluster, _ = calibrate(workers=2, threads=1, seconds=3.0, model_spec=spec, overhead=True)
        calibrations[spec] = {"speeds": [d.speed for d in cluster.devices],
                              "action_overhead_s": cluster.meta.get("action_overhead_s"),
                              "allreduce_efficiency": cluster.meta.get("allreduce_efficiency"),
                              "bandwidth_Bps": float(cluster.bandwidth[0, 1]), "latency_s": float(cluster.latency[0, 1])}
        for label, plan in plans_for(graph, cluster, args.microbatches).items():
            out = run_plan(plan, RunConfig(spec, steps=args.steps, warmup=2, threads=1))
            rows.append({"model": spec, "plan": label, "stages": [len(s.devices) for s in plan.stages],
                         "schedule": plan.schedule, "replicas": plan.replicas,
                         "measured_s": out["measured_s"], "predicted_s": out["predicted_s"],
                         "error": out["error"], "signed_error": (out["predicted_s"] - out["measured_s"]) / out["measured_s"]})
            print(f"{spec:>20} {label:<28} measured {out['measured_s'] * 1e3:7.2f} ms  predicted "
                  f"{out['predicted_s'] * 1e3:7.2f} ms  error {out['error']:6.1%}")
    med = statistics.median(r["error"] for r in rows)
    print(f"median |predicted - measured| / measured: {med:.1%} over {len(rows)} cases")
    write_json(args.out / "accuracy.json", {"steps": args.steps, "microbatches": args.microbatches,
                                            "median_error": med, "cases": rows, "calibration": calibrations})
    md = ["# Prediction error on this machine", "",
          f"{args.steps} steps of {args.microbatches} microbatches per plan; "
          "2 worker processes (gloo, 1 thread each) on the machine named above; measured = median iteration "
          "after 2 warm-up steps.", "",
          "Each model is calibrated with its own training step (`calibrate --model`): speeds with both "
          "workers busy (1.0 alone by construction), all-reduce efficiency, loopback link:", "",
          *[f"- {spec}: speeds {', '.join(f'{x:.2f}' for x in c['speeds'])}, runtime overhead "
            f"{c['action_overhead_s'] * 1e3:.2f} ms per action, all-reduce efficiency "
            f"{c['allreduce_efficiency']:.2f}, {c['bandwidth_Bps'] * 8 / 1e9:.1f} Gbps, "
            f"{c['latency_s'] * 1e6:.0f} us" for spec, c in calibrations.items()], "",
          "| model | plan | measured (ms) | predicted (ms) | error (predicted - measured) |", "|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['plan']} | {r['measured_s'] * 1e3:.2f} | {r['predicted_s'] * 1e3:.2f} | "
           f"{r['signed_error']:+.1%} |" for r in rows]
    md += ["", f"**Median |error|: {med:.1%}** over {len(rows)} cases."]
    write_markdown(args.out / "accuracy.md", "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
