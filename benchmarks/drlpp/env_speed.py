"""How fast the learning planners' environment scores complete plans (target: at least 5,000
per second through the batched evaluator), and how fast the gymnasium environment steps.

Complete plans are drawn uniformly over the valid actions of the shared action space
(``learn/search.py``'s random search) and scored in batches of ``--batch`` by the scorer
every agent uses; the figure is plans scored per second of the whole loop (walks included).
The gymnasium figure is masked random episodes through ``pipeplan/Partition-v0`` (one plan
scored per episode, as an agent stepping the environment would). Writes
benchmarks/results/drlpp/env_speed.json and .md.

    python benchmarks/drlpp/env_speed.py [--plans 20000] [--batch 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium
import numpy as np

import pipeplan.learn.env  # noqa: F401  (registers the environments)
from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.learn.harness import Budget
from pipeplan.learn.scoring import Scorer
from pipeplan.learn.search import random_search

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import PROFILES, add_out_argument, profiles_absent, write_json, write_markdown  # noqa: E402

MODELS = ("vgg16", "gnmt", "resnext101")
SCHEDULES = ("1f1b", "async-1f1b")
TARGET = 5000.0
MICROBATCHES = 8


def scored_per_second(graph, cluster, schedule: str, plans: int, batch: int) -> float:
    scorer = Scorer(graph, cluster, MICROBATCHES, schedule)
    random_search(scorer, graph, len(cluster), Budget(evaluations=batch), np.random.default_rng(1), batch=batch)
    scorer.evaluations = 0  # the first batch compiled the common plan shapes
    t0 = time.perf_counter()
    random_search(scorer, graph, len(cluster), Budget(evaluations=plans), np.random.default_rng(0), batch=batch)
    return scorer.evaluations / (time.perf_counter() - t0)


def env_episodes_per_second(graph, cluster, schedule: str, episodes: int) -> tuple[float, float]:
    env = gymnasium.make("pipeplan/Partition-v0", graph=graph, cluster=cluster, microbatches=MICROBATCHES,
                         schedule=schedule)
    rng = np.random.default_rng(0)
    steps, t0 = 0, time.perf_counter()
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        done = False
        while not done:
            obs, _, done, _, _ = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
            steps += 1
    seconds = time.perf_counter() - t0
    return episodes / seconds, steps / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--episodes", type=int, default=200)
    add_out_argument(ap, "drlpp")
    args = ap.parse_args()
    if profiles_absent():
        return
    cluster, rows = load_cluster("drlpp-4gpu"), []
    for name in MODELS:
        graph = load_graph(str(PROFILES / name))
        for schedule in SCHEDULES:
            rate = scored_per_second(graph, cluster, schedule, args.plans, args.batch)
            episodes, steps = env_episodes_per_second(graph, cluster, schedule, args.episodes)
            rows.append({"model": name, "nodes": len(graph), "schedule": schedule, "plans_per_s": rate,
                         "env_episodes_per_s": episodes, "env_steps_per_s": steps, "meets_target": rate >= TARGET})
            print(f"{name:11s} {schedule:11s} {rate:9,.0f} plans/s  env {episodes:6,.0f} episodes/s "
                  f"{steps:8,.0f} steps/s", flush=True)
    missed = [f"{r['model']} ({r['schedule']})" for r in rows if not r["meets_target"]]
    lines = ["# Environment speed", "", f"drlpp-4gpu, {MICROBATCHES} microbatches; {args.plans:,} random complete "
             f"plans scored in batches of {args.batch}; {args.episodes} masked random gymnasium episodes.", "",
             "| model | nodes | schedule | plans scored / s | gymnasium episodes / s | steps / s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['nodes']} | {r['schedule']} | {r['plans_per_s']:,.0f} | "
              f"{r['env_episodes_per_s']:,.0f} | {r['env_steps_per_s']:,.0f} |" for r in rows]
    lines += ["", f"Target ({TARGET:,.0f} plans scored per second): "
              + ("met on every row." if not missed else "missed on " + ", ".join(missed) + ".")]
    write_json(args.out / "env_speed.json", {"target_plans_per_s": TARGET, "rows": rows})
    write_markdown(args.out / "env_speed.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
