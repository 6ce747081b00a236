"""Serving a stream of trees (ours, beyond DynPartition): Poisson arrivals at several rates,
independent trees sharing the devices; throughput and p50/p99 latency per placement policy.

Policies: every tree on the CPU; every tree on one GPU; whole trees to the device that
would finish them first given the work already sent (join the shortest queue, tree by
tree); HEFT per tree (blind to the other trees); the DQN's learned placement (trained on the
cost model of the same devices, 5,000 episodes). Simulated on the 1 CPU + 4 A100 machine and
run for real on this machine's two logical CPU devices (the device-worker executor).
Writes benchmarks/results/dynpartition/stream.md and .json.

    python benchmarks/dynpartition/stream.py [--trees 400] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from pipeplan.dynamic import agent as dqn
from pipeplan.dynamic.simulator import simulate
from pipeplan.dynamic.env import SchedulerEnv
from pipeplan.dynamic.experiment import Setup, build
from pipeplan.dynamic.machines import shared_model
from pipeplan.dynamic.placers import heft
from pipeplan.dynamic.stream import poisson_arrivals, run_stream, simulate_stream
from pipeplan.dynamic.trees import sample_trees
from pipeplan.learn.harness import Budget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

#: arrival rates as multiples of one device's capacity for HEFT-placed trees (1 / mean HEFT latency)
LOADS = (0.25, 1.0, 4.0, 16.0)


def policies(bench, agent, arrivals: np.ndarray) -> dict:
    """name -> (arrival index, tree) -> (placement, None); the shortest queue keeps, per
    device, when the whole trees it sent there will be done (cost model), from each arrival."""
    m = bench.machine
    gpu = next((k for k, n in enumerate(m.names) if n.startswith("cuda")), 1 if len(m.names) > 1 else 0)
    free = np.zeros(len(m.names))

    def shortest_queue(k, t):
        np.maximum(free, arrivals[k], out=free)
        alone = np.array([simulate(bench.profile(t), [d] * t.n, m) for d in range(len(m.names))])
        d = int(np.argmin(free + alone))
        free[d] += alone[d]
        return [d] * t.n, None

    return {"all on cpu": lambda k, t: ([0] * t.n, None),
            f"all on {m.names[gpu]}": lambda k, t: ([gpu] * t.n, None),
            "shortest queue (whole trees)": shortest_queue,
            "heft per tree": lambda k, t: (heft(bench.profile(t), m), None),
            "dqn": lambda k, t: (agent.policy([t])[0], None)}


def case(label: str, setup: Setup, trees_n: int, real: bool, episodes: int = 5000,
         loads: tuple[float, ...] = LOADS) -> list[dict]:
    """Every policy on streams of ``trees_n`` trees at each of ``loads``; the DQN trained
    ``episodes`` on the cost model."""
    bench = build(setup)
    env = SchedulerEnv(bench.env.net, bench.env.width, setup.seed, len(bench.names), simulate=bench.machine)
    agent = dqn.train(env, dqn.Config(episodes=episodes, eval_every=0), Budget(evaluations=episodes)).agent
    trees = sample_trees(bench.env.net, trees_n, setup.seed + 99)
    profiles = [bench.profile(t) for t in trees]
    heft_s = np.mean([simulate(p, heft(p, bench.machine), bench.machine) for p in profiles[:50]])
    rows = []
    for load in loads:
        rate = load / heft_s
        arrivals = poisson_arrivals(rate, trees_n, np.random.default_rng(1))
        for name, pol in policies(bench, agent, arrivals).items():
            if real:
                out = run_stream(bench.env.executor, trees, arrivals, pol)
            else:
                out = simulate_stream(bench.machine, trees, profiles, arrivals, pol)
            rows.append({"case": label, "load": load, "rate_per_s": rate, "policy": name, **out})
            print(rows[-1], flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [f"| {r['case']} | {r['load']:g} | {r['rate_per_s']:.0f} | {r['policy']} | {r['throughput_per_s']:.0f} | "
             f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} |" for r in rows]
    return ("# Serving a stream of trees (ours)\n\nPoisson arrivals; load = arrival rate x mean HEFT latency of one "
            "tree alone. Latency from arrival to the tree's last part.\n\n| case | load | rate (trees/s) | policy | "
            "throughput (trees/s) | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, default=400, help="trees per stream")
    add_out_argument(parser, "dynpartition")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = shared_model()
    rows = case("simulated treelstm-1024, cpu+4gpu",
                Setup(net="treelstm", width=1024, simulated="cpu+4gpu", machine_model=model), args.trees, real=False)
    rows += case("simulated treelstm-150, cpu+4gpu",
                 Setup(net="treelstm", width=150, simulated="cpu+4gpu", machine_model=model), args.trees, real=False)
    rows += case("real treelstm-512, cpu + cpu:1", Setup(net="treelstm", width=512, devices=["cpu", "cpu:1"]),
                 min(args.trees, 200), real=True)
    write_json(args.out / "stream.json", {"rows": rows, "loads": LOADS})
    text = markdown(rows)
    write_markdown(args.out / "stream.md", text)
    print(text)


if __name__ == "__main__":
    main()
