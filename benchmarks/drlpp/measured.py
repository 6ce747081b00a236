"""DRL-PP on measured rewards (drl-pp.txt §3.4: plans scored "in a real-world environment")
against DRL-PP on the simulator's rewards and the simulator's best plan, all measured.

For each model (the example MLP and transformer, profiled here) the cluster is a calibration
of 2 worker processes on this machine (``pipeplan calibrate``, the model's own training
step). Two conditions: **quiet** (the machine as calibrated) and **noisy** (a busy-looping
process shares the cores while plans run, a cost the calibrated cluster, and so the
simulator, does not know). In each, for ``--seeds`` seeds: DRL-PP trained on simulated
rewards and on measured ones (``RuntimeScorer``: each distinct plan trained for 3 steps after
1 warm-up on worker processes), both with ``--evaluations`` plans scored; and the best plan of
``compare`` (every non-learned planner) on the simulator. Each final plan is then measured
``--repeats`` times in the same condition (the median is reported). Reported per row: the
measured seconds per iteration of each, the runs measured training made and its wall time
(training is planning time). Where measured training wins, and where it only costs runs, is
in the table either way.

    python benchmarks/drlpp/measured.py [--seeds 3] [--evaluations 40] [--repeats 3] [--out DIR]

Writes benchmarks/results/drlpp/measured.{md,json}.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

from pipeplan.learn.harness import Budget
from pipeplan.planners import PlanOptions, best
from pipeplan.planners.drlpp.run import train_agent
from pipeplan.runtime.calibrate import calibrate
from pipeplan.runtime.measure import plan_runner
from pipeplan.runtime.profiler import profile_model
from pipeplan.sim import predicted_s

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

MODELS = ("example:mlp", "example:transformer")
MICROBATCHES = 8


def _spin(stop) -> None:
    while not stop.is_set():
        pass


@contextlib.contextmanager
def condition(noisy: bool):
    """A busy-looping process beside the runs when ``noisy``."""
    if not noisy:
        yield
        return
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_spin, args=(stop,), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(5)


def measure(runner, plan, repeats: int) -> float:
    return statistics.median(runner(plan) for _ in range(repeats))


def one_seed(spec: str, graph, cluster, seed: int, args) -> dict:
    opts = PlanOptions(microbatches=MICROBATCHES)
    runner = plan_runner(spec)
    sim = train_agent(graph, cluster, opts, Budget(evaluations=args.evaluations), seed=seed)
    t0 = time.perf_counter()
    real = train_agent(graph, cluster, opts, Budget(evaluations=args.evaluations), seed=seed, runner=runner)
    seconds = time.perf_counter() - t0
    return {"seed": seed, "sim_trained_s": measure(runner, sim.plan, args.repeats),
            "measured_trained_s": measure(runner, real.plan, args.repeats),
            "runs": real.checkpoint["trained_on"]["runs"], "training_s": seconds,
            "sim_trained_predicted_s": predicted_s(sim.plan), "measured_trained_predicted_s": predicted_s(real.plan)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--evaluations", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    add_out_argument(parser, "drlpp")
    args = parser.parse_args()
    rows = []
    for spec in args.models:
        graph = profile_model(spec, reps=10)
        cluster, _ = calibrate(workers=2, model_spec=spec, predict=predicted_s)
        planned = best(graph, cluster, PlanOptions(microbatches=MICROBATCHES)).plan
        for noisy in (False, True):
            with condition(noisy):
                sim_best = measure(plan_runner(spec), planned, args.repeats)
                for seed in range(args.seeds):
                    r = {"model": spec, "condition": "noisy" if noisy else "quiet", "simulator_best_planner":
                         planned.planner, "simulator_best_s": sim_best, **one_seed(spec, graph, cluster, seed, args)}
                    rows.append(r)
                    print(f"{spec:<20} {r['condition']:<5} seed {seed}: simulator's best ({planned.planner}) "
                          f"{sim_best * 1e3:6.1f} ms, DRL-PP simulated {r['sim_trained_s'] * 1e3:6.1f} ms, measured "
                          f"{r['measured_trained_s'] * 1e3:6.1f} ms ({r['runs']} runs, {r['training_s']:.0f} s)",
                          flush=True)
    write_json(args.out / "measured.json", {"evaluations": args.evaluations, "repeats": args.repeats, "rows": rows})
    lines = ["# DRL-PP on measured rewards", "",
             f"`python benchmarks/drlpp/measured.py --seeds {args.seeds} --evaluations {args.evaluations} "
             f"--repeats {args.repeats}`: measured seconds per iteration (median of {args.repeats} runs) of the "
             "simulator's best plan, DRL-PP trained on simulated rewards and DRL-PP trained on measured ones "
             f"(both {args.evaluations} plans scored), on 2 worker processes of this machine.", "",
             "| model | condition | seed | simulator's best (ms) | DRL-PP, simulated (ms) | DRL-PP, measured (ms) | "
             "runs | training (s) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['condition']} | {r['seed']} | {r['simulator_best_s'] * 1e3:.1f} "
              f"({r['simulator_best_planner']}) | {r['sim_trained_s'] * 1e3:.1f} | {r['measured_trained_s'] * 1e3:.1f} | "
              f"{r['runs']} | {r['training_s']:.0f} |" for r in rows]
    wins = sum(r["measured_trained_s"] < min(r["simulator_best_s"], r["sim_trained_s"]) for r in rows)
    lines += ["", f"Measured training's plan was the fastest of the three in {wins} of {len(rows)} rows."]
    write_markdown(args.out / "measured.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
