"""Every plan `pipeplan plan` makes runs, and trains exactly as one process would, or is refused.

For each benchmark model (those of accuracy.py: an MLP, a residual CNN with BatchNorm, GPT-2
and BERT from transformers configs), on a calibrated CPU cluster of 2 and of 3 worker
processes, every planner's plan (and `best`, the default) with the CLI's defaults is run for
2 steps with the check against one-process training (`pipeplan run --check`: parameters
and buffers within 1e-5 relative). Each outcome must be one of: the check passes; the run is
refused before any process starts with one line naming what is missing; or the check says
"not comparable" with its reason (BatchNorm statistics over microbatches that stages split
differently, docs/runtime.md). A failed check, or a run that fails after starting, fails the
benchmark (exit 1). Plans that two planners share are run once. Writes
benchmarks/results/runtime/every_plan.{md,json}.

    python benchmarks/runtime/every_plan.py [--workers 2 3] [--models SPEC ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeplan.errors import PipeplanError
from pipeplan.planners import PlanOptions, run_planner
from pipeplan.planners.base import load_all
from pipeplan.planners.compare import best
from pipeplan.runtime.calibrate import calibrate
from pipeplan.runtime.check import check_run
from pipeplan.runtime.executor import RunConfig, run_plan
from pipeplan.runtime.profiler import profile_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_out_argument, write_json, write_markdown  # noqa: E402
from accuracy import MODELS  # noqa: E402

ALLOWED = ("pass", "refused", "not comparable")


def plans_of(graph, cluster) -> dict[str, object]:
    """Planner name -> the plan it makes with the CLI's defaults (or the reason it made none)."""
    options = PlanOptions()
    out: dict[str, object] = {}
    for name in [*load_all(), "best"]:
        try:
            out[name] = best(graph, cluster, options).plan if name == "best" else \
                run_planner(name, graph, cluster, options)[0]
        except PipeplanError as e:
            out[name] = str(e)
    return out


def fingerprint(plan) -> tuple:
    return (tuple((tuple(s.nodes), tuple(s.devices)) for s in plan.stages), plan.schedule, plan.replicas,
            plan.microbatches, tuple(plan.recompute or ()))


def outcome(plan, spec: str) -> dict:
    """Run the plan 2 steps and check it; or the one-line refusal."""
    cfg = RunConfig(spec, steps=1, warmup=1, threads=1)
    try:
        out = run_plan(plan, cfg)
    except PipeplanError as e:
        refused = "run failed" not in str(e)
        return {"outcome": "refused" if refused else "run failed", "reason": str(e)}
    check = check_run(plan, spec, out.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                      threads=cfg.threads, microbatch=out.microbatch)
    return {"outcome": check.verdict, "max_rel_diff": check.max_rel_diff, "reason": check.note}


def describe(plan) -> str:
    return (f"{'-'.join(str(len(s.devices)) for s in plan.stages)} {plan.schedule}"
            + (f" {plan.replicas}" if any(len(s.devices) > 1 for s in plan.stages) else ""))


def measure(spec: str, workers: int, done: dict) -> list[dict]:
    graph = profile_model(spec, reps=3, threads=1)
    cluster, _ = calibrate(workers=workers, threads=1, seconds=0.5, model_spec=spec)
    rows = []
    for name, plan in plans_of(graph, cluster).items():
        if isinstance(plan, str):
            rows.append({"model": spec, "workers": workers, "planner": name, "plan": "-", "outcome": "no plan",
                         "reason": plan})
            continue
        key = (spec, workers, fingerprint(plan))
        if key not in done:
            done[key] = outcome(plan, spec)
        rows.append({"model": spec, "workers": workers, "planner": name, "plan": describe(plan), **done[key]})
        r = rows[-1]
        diff = f"{r['max_rel_diff']:.1e}" if "max_rel_diff" in r else "-"
        print(f"{spec[:40]:>40} {workers} {name:<10} {r['plan']:<22} {r['outcome']:<15} {diff:>8} {r['reason'][:90]}",
              flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--models", nargs="+", default=MODELS, help="model specs (default: accuracy.py's)")
    add_out_argument(ap, "runtime")
    args = ap.parse_args()
    rows, done = [], {}
    for spec in args.models:
        for w in args.workers:
            rows += measure(spec, w, done)
    bad = [r for r in rows if r["outcome"] not in (*ALLOWED, "no plan")]
    counts = {k: sum(r["outcome"] == k for r in rows) for k in (*ALLOWED, "no plan", "fail", "run failed")}
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
          + ("; every plan passes or is refused" if not bad else f"; {len(bad)} FAILED"))
    write_json(args.out / "every_plan.json", {"workers": args.workers, "counts": counts, "ok": not bad,
                                              "rows": rows})
    md = ["# Every plan runs and checks, or is refused", "",
          f"{len(rows)} planner x model x cluster cases ({len(done)} distinct plans run): "
          + ", ".join(f"{k} {v}" for k, v in counts.items() if v) + ". "
          + ("Every plan passes the check or is refused up front." if not bad else
             f"**{len(bad)} cases failed.**"), "",
          "| model | workers | planner | plan | outcome | max rel. diff | reason |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['workers']} | {r['planner']} | {r['plan']} | {r['outcome']} | "
           f"{r['max_rel_diff']:.1e} | {r['reason']} |" if "max_rel_diff" in r else
           f"| {r['model']} | {r['workers']} | {r['planner']} | {r['plan']} | {r['outcome']} | - | {r['reason']} |"
           for r in rows]
    write_markdown(args.out / "every_plan.md", "\n".join(md) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
