"""Simulator throughput on one core: tasks per second of one simulate() call, and plans per
second of the batched evaluator.

- ``tasks_per_second``: one plan of 32 stages x 128 microbatches (1F1B, one device per stage,
  transfers between every pair of stages), ``simulate(plan, timeline=False)`` of a plan whose
  structure the simulator has not compiled before (its structure cache emptied before each
  call: a search's first plan of a shape); also with the timeline and for 8 x 32, and
  ``cached_tasks_per_second``: the same plan again (a search's later plans of that shape).
  "tasks" are compute actions, transfers and all-reduces.
- ``plans_per_second``: ``BatchEvaluator.evaluate`` on random candidates of 8 stages x 32
  microbatches (random interval partitions of 16 layers, random device permutations), every
  figure of each candidate (iteration, bounds, memory) as simulate() gives it.

    python benchmarks/sim_throughput.py [--json] [--repeat N] [--batch N]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage
from pipeplan.sim import simulate
from pipeplan.sim.simulate import forget_compiled
from pipeplan.sim.batch import BatchEvaluator

from _results import add_out_argument, write_json

TARGETS = {"tasks_per_second": 1_000_000, "plans_per_second": 20_000}


def make_plan(stages: int, micro: int, schedule: str = "1f1b") -> Plan:
    rng = np.random.default_rng(0)
    layers = stages * 2
    g = Graph.chain("bench", rng.uniform(1e-3, 2e-3, layers), rng.uniform(2e-3, 4e-3, layers),
                    params=rng.uniform(1e6, 2e6, layers), act=rng.uniform(1e6, 4e6, layers))
    c = hierarchical("bench", max(1, stages // 4), min(4, stages), 16e9, 4e9)
    st = [Stage([g.ids[2 * s], g.ids[2 * s + 1]], [c.devices[s].name]) for s in range(stages)]
    return Plan(g, c, st, micro, schedule=schedule)


def _best_seconds(plan: Plan, timeline: bool, repeat: int, cold: bool) -> tuple[float, int]:
    best, tasks = float("inf"), 0
    for _ in range(repeat):
        if cold:
            forget_compiled()
        t0 = time.perf_counter()
        r = simulate(plan, timeline=timeline)
        best = min(best, time.perf_counter() - t0)
        tasks = r.num_tasks
    return best, tasks


def measure_single(stages: int, micro: int, timeline: bool, repeat: int) -> dict:
    plan = make_plan(stages, micro)
    simulate(plan, timeline=timeline)  # compile the engine's kernels
    cold, tasks = _best_seconds(plan, timeline, repeat, cold=True)
    cached, _ = _best_seconds(plan, timeline, repeat, cold=False)
    return {"stages": stages, "microbatches": micro, "timeline": timeline, "tasks": tasks,
            "seconds": cold, "tasks_per_second": tasks / cold, "cached_seconds": cached,
            "cached_tasks_per_second": tasks / cached}


def random_candidates(plan: Plan, count: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Interval partitions of the chain into the plan's stage count, devices permuted."""
    rng = np.random.default_rng(seed)
    n, s_count, v = len(plan.graph), plan.num_stages, len(plan.cluster)
    cuts = np.sort(np.stack([rng.choice(np.arange(1, n), s_count - 1, replace=False) for _ in range(count)]), axis=1)
    son = (np.arange(n)[None, :, None] >= cuts[:, None, :]).sum(axis=2)
    dst = np.stack([rng.permutation(np.arange(v) % s_count) for _ in range(count)])
    return son, dst


def measure_batch(stages: int, micro: int, count: int, repeat: int) -> dict:
    plan = make_plan(stages, micro)
    ev = BatchEvaluator(plan.graph, plan.cluster, stages, micro, "1f1b", "split")
    son, dst = random_candidates(plan, count)
    ev.evaluate(son[:8], dst[:8])  # compile the engine
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        ev.evaluate(son, dst)
        best = min(best, time.perf_counter() - t0)
    return {"stages": stages, "microbatches": micro, "candidates": count, "seconds": best,
            "plans_per_second": count / best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    ap.add_argument("--repeat", type=int, default=5, help="best of N runs (default 5)")
    ap.add_argument("--batch", type=int, default=4000, help="candidates per batched call (default 4000)")
    add_out_argument(ap)
    args = ap.parse_args()
    single = [measure_single(s, m, tl, args.repeat) for s, m in ((8, 32), (32, 128)) for tl in (False, True)]
    batch = measure_batch(8, 32, args.batch, args.repeat)
    big = next(c for c in single if c["stages"] == 32 and not c["timeline"])
    out = {"tasks_per_second": big["tasks_per_second"], "plans_per_second": batch["plans_per_second"],
           "targets": TARGETS, "single": single, "batch": batch}
    write_json(args.out / "sim_throughput.json", out)
    if args.json:
        print(json.dumps(out))
        return
    for c in single:
        print(f"{c['stages']:>3} stages x {c['microbatches']:>4} microbatches, timeline={c['timeline']!s:5}: "
              f"{c['tasks']:>6} tasks in {c['seconds'] * 1e3:7.2f} ms = {c['tasks_per_second']:,.0f} tasks/s "
              f"(compiled before: {c['cached_tasks_per_second']:,.0f})")
    print(f"batched, {batch['stages']} stages x {batch['microbatches']} microbatches: {batch['candidates']} "
          f"candidates in {batch['seconds'] * 1e3:.1f} ms = {batch['plans_per_second']:,.0f} plans/s")
    print(f"tasks_per_second {out['tasks_per_second']:,.0f} (target {TARGETS['tasks_per_second']:,}), "
          f"plans_per_second {out['plans_per_second']:,.0f} (target {TARGETS['plans_per_second']:,})")


if __name__ == "__main__":
    main()
