"""Do ``joint`` and ``exact`` claim ``complete`` only when nothing is better? Each is checked
against an enumeration that shares none of their code (``benchmarks/_bruteforce.py``: every
contiguous partition of the linearized layers x device subsets x replica mode x round-robin
replica order x schedule, each plan simulated), on seeded random tiny instances
(``_instances.tiny_instance``: 2-5 layers on 2-3 devices or 2-4 on 4, uneven links, latency 0 / 1 / 20 ms,
speeds 0.5-1.5, tight memory in 40%).

Three checks per instance: ``exact`` against the enumeration over its schedules (gpipe, 1f1b,
spp-pe); ``joint -O schedules=gpipe,1f1b,spp-pe`` against the same; default ``joint`` against
the enumeration over its schedules (those plus zb-h1). A planner is *beaten* when the
enumeration finds a fitting plan faster by more than 1e-9 (relative) than the plan it returned;
*beaten while claiming complete* is the failure. Target: 0. Writes
benchmarks/results/joint/optimality.{md,json}; exits 1 on a failure.

    python benchmarks/joint/optimality.py [--instances N] [--seed S] [--jobs J] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np

from pipeplan.errors import PipeplanError
from pipeplan.planners import PlanOptions, planner_settings, run_planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _bruteforce import EXACT_SCHEDULES, brute_force_by_schedule  # noqa: E402
from _instances import tiny_instance  # noqa: E402
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

JOINT_SCHEDULES = EXACT_SCHEDULES + ("zb-h1",)
TOL = 1e-9
#: (name, planner, -O options, schedules of the enumeration it is checked against)
CHECKS = (("exact", "exact", (), EXACT_SCHEDULES),
          ("joint (exact's schedules)", "joint", (("schedules", ",".join(EXACT_SCHEDULES)),), EXACT_SCHEDULES),
          ("joint", "joint", (), JOINT_SCHEDULES))


def check(graph, cluster, m: int, planner: str, extra: tuple, best: dict) -> dict:
    """One planner on one instance against the enumeration's best (``brute_force``)."""
    try:
        plan, result = run_planner(planner, graph, cluster, PlanOptions(microbatches=m, settings=planner_settings([planner], extra)))
    except PipeplanError:
        plan, result = None, None
    fits = result is not None and not result.over_memory
    got = result.iteration_s if fits else np.inf
    complete = plan is not None and plan.search_complete
    beaten = bool(best["time"] < got * (1 - TOL))
    return {"time": got, "fits": fits, "complete": complete, "beaten": beaten,
            "beaten_claiming_complete": beaten and complete, "best": best["time"],
            "gap": (got / best["time"] - 1.0) if np.isfinite(best["time"]) and fits else None}


def run_instance(graph, cluster, m: int) -> dict:
    bests = brute_force_by_schedule(graph, cluster, m, JOINT_SCHEDULES, (EXACT_SCHEDULES,))
    row = {"layers": len(graph), "devices": len(cluster), "microbatches": m,
           "latency_s": float(cluster.latency.max()), "candidates": bests[JOINT_SCHEDULES]["candidates"],
           "none_fits": not np.isfinite(bests[JOINT_SCHEDULES]["time"])}
    for name, planner, extra, schedules in CHECKS:
        row[name] = check(graph, cluster, m, planner, extra, bests[schedules])
    return row


def _run(instance) -> dict:
    return run_instance(*instance)


def summarize(rows: list[dict]) -> dict:
    out: dict = {"instances": len(rows), "none_fits": sum(r["none_fits"] for r in rows)}
    for name, *_ in CHECKS:
        cells = [r[name] for r in rows]
        out[name] = {"claimed_complete": sum(c["complete"] for c in cells),
                     "beaten": sum(c["beaten"] for c in cells),
                     "beaten_claiming_complete": sum(c["beaten_claiming_complete"] for c in cells),
                     "worst_gap": max((c["gap"] for c in cells if c["gap"] is not None), default=0.0)}
    out["failures"] = sum(out[name]["beaten_claiming_complete"] for name, *_ in CHECKS)
    return out


def markdown(s: dict, seed: int) -> str:
    md = ["# Complete only when nothing is better", "",
          f"{s['instances']} random tiny instances (seed {seed}; {s['none_fits']} where no plan fits), each "
          "planner checked against an enumeration of every plan of its space (`benchmarks/_bruteforce.py`).", "",
          "| planner | claimed complete | beaten by the enumeration | beaten while claiming complete | worst gap |",
          "|---|---|---|---|---|"]
    md += [f"| {name} | {s[name]['claimed_complete']} | {s[name]['beaten']} | {s[name]['beaten_claiming_complete']} "
           f"| {s[name]['worst_gap']:.2%} |" for name, *_ in CHECKS]
    md += ["", f"Failures (beaten while claiming complete): {s['failures']} (target 0)."]
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2027)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="instances checked at once (processes)")
    add_out_argument(ap, "joint")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    instances = [tiny_instance(rng) for _ in range(args.instances)]  # drawn in order: the same set at any --jobs
    rows = []
    with multiprocessing.get_context("forkserver").Pool(args.jobs) as pool:
        for k, r in enumerate(pool.imap(_run, instances)):
            rows.append(r)
            print(k + 1, r["layers"], r["devices"], {name: (r[name]["complete"], r[name]["beaten"])
                                                      for name, *_ in CHECKS}, flush=True)
    summary = summarize(rows)
    write_json(args.out / "optimality.json", {"seed": args.seed, "summary": summary, "instances": rows})
    write_markdown(args.out / "optimality.md", markdown(summary, args.seed))
    print(json.dumps(summary))
    sys.exit(1 if summary["failures"] else 0)


if __name__ == "__main__":
    main()
