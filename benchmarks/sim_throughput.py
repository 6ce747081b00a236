"""Simulator throughput: simulated tasks per second on one core.

Cases: 8 stages x 32 microbatches and 32 stages x 128 microbatches (1F1B, one device per
stage, transfers between every pair of stages). "tasks" are compute actions, transfers and
all-reduces. Reports the full simulate() (with timeline) and the search path (no timeline).

    python benchmarks/sim_throughput.py [--json] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.sim import simulate

RESULTS = Path(__file__).resolve().parent / "results"


def make_plan(stages: int, micro: int, schedule: str = "1f1b") -> Plan:
    rng = np.random.default_rng(0)
    layers = stages * 2
    g = Graph.chain("bench", rng.uniform(1e-3, 2e-3, layers), rng.uniform(2e-3, 4e-3, layers),
                    params=rng.uniform(1e6, 2e6, layers), act=rng.uniform(1e6, 4e6, layers))
    c = hierarchical("bench", max(1, stages // 4), min(4, stages), 16e9, 4e9)
    st = [Stage([g.ids[2 * s], g.ids[2 * s + 1]], [c.devices[s].name]) for s in range(stages)]
    return Plan(g, c, st, micro, schedule=schedule)


def measure(stages: int, micro: int, timeline: bool, repeat: int) -> dict:
    plan = make_plan(stages, micro)
    best = float("inf")
    tasks = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = simulate(plan, timeline=timeline)
        best = min(best, time.perf_counter() - t0)
        tasks = r.num_tasks
    return {"stages": stages, "microbatches": micro, "timeline": timeline, "tasks": tasks,
            "seconds": best, "tasks_per_second": tasks / best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cases = [measure(s, m, tl, args.repeat) for s, m in ((8, 32), (32, 128)) for tl in (False, True)]
    search = [c for c in cases if not c["timeline"]]
    out = {"tasks_per_second": min(c["tasks_per_second"] for c in search),
           "tasks_per_second_with_timeline": min(c["tasks_per_second"] for c in cases if c["timeline"]),
           "target": 500_000, "cases": cases}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_throughput.json").write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out))
    else:
        for c in cases:
            print(f"{c['stages']:>3} stages x {c['microbatches']:>4} microbatches, timeline={c['timeline']!s:5}: "
                  f"{c['tasks']:>6} tasks in {c['seconds'] * 1e3:7.2f} ms = {c['tasks_per_second']:,.0f} tasks/s")
        print(f"minimum (search path): {out['tasks_per_second']:,.0f} tasks/s (target 500,000)")


if __name__ == "__main__":
    main()
