"""DynPartition's learning curves (dynpartition.txt §8.2, Figs. 12-13) and where the learned
placement stands: the DQN over 5 seeds against the static CPU and GPU placements, random
placement, HEFT, the exact optimum (on small held-out trees), and per-input random search and
simulated annealing given the DQN's training evaluations.

Cases: the simulated 1 CPU + 4 A100 machine of §8.2 (the paper's 10,000 episodes) and this
machine's two logical CPU devices measured for real (fewer episodes: each reward is 10 real
runs), for TreeLSTM and MathFunc at the paper's sizes and at widths where GPUs pay off. The
simulated CPU is out/dynamic-machine.json's (measured on first use, shared with `pipeplan dynamic`).
Writes benchmarks/results/dynpartition/learning.md, .json and a Fig. 12-style PNG per case.

    python benchmarks/dynpartition/learning.py [--seeds 0,1,2,3,4] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pipeplan.dynamic import agent as dqn
from pipeplan.dynamic.experiment import Setup, baselines, build, report, train
from pipeplan.dynamic.machines import shared_model
from pipeplan.dynamic.placers import annealing, heft, random_search
from pipeplan.learn.harness import Budget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, save_figure, write_json, write_markdown  # noqa: E402

#: (label, setup keywords, episodes)
CASES = [
    ("sim-treelstm-150", dict(net="treelstm", width=150, simulated="cpu+4gpu"), 10_000),
    ("sim-treelstm-150-normalized", dict(net="treelstm", width=150, simulated="cpu+4gpu", normalized=True), 10_000),
    ("sim-treelstm-1024", dict(net="treelstm", width=1024, simulated="cpu+4gpu"), 10_000),
    ("sim-mathfunc-1", dict(net="mathfunc", width=1, simulated="cpu+4gpu"), 10_000),
    ("sim-mathfunc-100000", dict(net="mathfunc", width=100_000, simulated="cpu+4gpu"), 10_000),
    ("real-treelstm-150", dict(net="treelstm", width=150, devices=["cpu", "cpu:1"]), 2_000),
    ("real-mathfunc-1", dict(net="mathfunc", width=1, devices=["cpu", "cpu:1"]), 2_000),
    ("real-treelstm-512", dict(net="treelstm", width=512, devices=["cpu", "cpu:1"], repeats=3), 1_000),
]
QUICK = [("sim-treelstm-150", dict(net="treelstm", width=150, simulated="cpu+4gpu"), 300),
         ("real-mathfunc-1", dict(net="mathfunc", width=1, devices=["cpu", "cpu:1"]), 100)]
TEST_TREES = 50


def per_input_search(bench, evaluations: int, seed: int) -> dict:
    """Random search and annealing (from HEFT) on every held-out tree, ``evaluations`` each,
    scored on the cost model, then measured as the policies are."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    rs = [random_search(bench.profile(t), bench.machine, rng, evaluations)[0] for t in bench.test]
    rs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sa = [annealing(bench.profile(t), bench.machine, heft(bench.profile(t), bench.machine), rng, evaluations)[0]
          for t in bench.test]
    sa_s = time.perf_counter() - t0
    return {"evaluations_per_tree": evaluations, "random_search_ms": bench.mean_ms(rs), "random_search_s": rs_s,
            "annealing_ms": bench.mean_ms(sa), "annealing_s": sa_s}


def run_case(label: str, kw: dict, episodes: int, seeds: list[int], model: dict | None = None) -> dict:
    """One case over ``seeds``; a simulated one on the machine ``model`` (``machines.machine_model``)."""
    bench = build(Setup(test_trees=TEST_TREES, machine_model=model, **kw))
    t0 = time.perf_counter()
    base = baselines(bench)
    base_s = time.perf_counter() - t0
    runs = []
    for seed in seeds:
        result = train(bench, dqn.Config(episodes=episodes, seed=seed, eval_every=max(episodes // 10, 1),
                                         eval_trees=10), Budget(evaluations=episodes))
        rep = report(bench, result.agent, base, result)
        runs.append({"seed": seed, "policy_ms": rep["policy_ms"], "train_s": result.elapsed_s,
                     "optimal_subset_policy_ms": (rep["optimal_subset"] or {}).get("policy_ms"),
                     "rewards": result.rewards.tolist()})
        print(f"  {label} seed {seed}: {rep['policy_ms']:.4g} ms in {result.elapsed_s:.0f} s", flush=True)
    search = per_input_search(bench, max(episodes // TEST_TREES, 1), seeds[0]) if "simulated" in kw else None
    stripped = {k: v for k, v in base.items() if k != "optimal_subset"}
    sub = base["optimal_subset"]
    return {"label": label, "setup": {k: v for k, v in kw.items()}, "episodes": episodes, "devices": bench.names,
            "width": bench.env.width, "baselines": stripped, "baselines_s": base_s,
            "optimal_subset": sub and {k: v for k, v in sub.items() if k != "trees"}, "runs": runs, "search": search}


def figure(case: dict):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6))
    ax = fig.add_subplot()
    curves = np.array([r["rewards"] for r in case["runs"]])
    k = max(1, curves.shape[1] // 100)
    smooth = np.array([np.convolve(c, np.ones(k) / k, mode="valid") for c in curves])
    x = np.arange(smooth.shape[1]) + k
    ax.plot(x, smooth.mean(axis=0), label=f"DQN (mean of {len(curves)} seeds, {k}-episode average)")
    ax.fill_between(x, smooth.min(axis=0), smooth.max(axis=0), alpha=0.25, label="min-max over seeds")
    norm = case["setup"].get("normalized")
    cpu = case["baselines"]["cpu"]
    for name in ("cpu", "gpu", "random", "heft"):
        ms = case["baselines"].get(name)
        if ms is not None:
            ax.axhline(-ms / cpu if norm else -ms, ls="--", lw=1, label=f"{name} (held-out mean)",
                       color={"cpu": "C2", "gpu": "C3", "random": "C4", "heft": "C5"}[name])
    ax.set_xlabel("episode")
    ax.set_ylabel("reward (-time / all-CPU time)" if norm else "reward (-ms)")
    ax.set_title(f"{case['label']}: {', '.join(case['devices'])}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def markdown(cases: list[dict]) -> str:
    rows = []
    for c in cases:
        b, pol = c["baselines"], [r["policy_ms"] for r in c["runs"]]
        statics = [v for k, v in b.items() if (k == "cpu" or k.startswith("all on")) and v is not None]
        sub, s = c["optimal_subset"], c["search"]
        opt = (f"{sub['optimal_ms']:.4g} / {sub['heft_ms']:.4g} / "
               f"{np.median([r['optimal_subset_policy_ms'] for r in c['runs']]):.4g} ({len(sub['nodes'])})"
               if sub else "")
        search = f"{s['random_search_ms']:.4g} / {s['annealing_ms']:.4g} ({s['evaluations_per_tree']})" if s else ""
        rows.append(f"| {c['label']} | {c['episodes']} | {np.median(pol):.4g} ({min(pol):.4g}-{max(pol):.4g}) | "
                    f"{b['cpu']:.4g} | {'' if b['gpu'] is None else format(b['gpu'], '.4g')} | "
                    f"{min(statics):.4g} | {b['random']:.4g} | {b['heft']:.4g} | {opt} | {search} | "
                    f"{'yes' if max(pol) < min(statics) else ('median' if np.median(pol) < min(statics) else 'no')} | "
                    f"{np.median([r['train_s'] for r in c['runs']]):.0f} |")
    return ("# DynPartition learning curves (§8.2, Figs. 12-13) and yardsticks\n\n"
            f"Mean forward ms over {TEST_TREES} held-out trees (never trained on); DQN: median (min-max) over seeds of "
            "its greedy policy after training. Simulated: this CPU (calibrated) + 4 A100s (assumed figures); real: "
            "two logical CPU devices of this machine, measured by the device-worker executor, 10 runs a reward "
            "(3 for width 512). Optimum: exact (branch and bound on the cost model) on small held-out trees, shown as "
            "optimum / HEFT / DQN (trees). Per-input search: random search / annealing from HEFT on each held-out "
            "tree with the DQN's training episodes shared out (evaluations per tree), cost model.\n\n"
            "| case | episodes | DQN ms | all-CPU | all-GPU | best static | random | HEFT | optimum / HEFT / DQN "
            "(trees) | random search / annealing (evals) | DQN beats every static | train s (median) |\n"
            "|" + "---|" * 12 + "\n" + "\n".join(rows) + "\n\nCurves: `learning-<case>.png`.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--quick", action="store_true", help="two short cases, two seeds (a smoke test)")
    parser.add_argument("--only", default=None, help="comma-separated case labels to run")
    add_out_argument(parser, "dynpartition")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")][:2 if args.quick else None]
    todo = QUICK if args.quick else CASES
    if args.only:
        todo = [c for c in todo if c[0] in args.only.split(",")]
    cases = []
    for label, kw, episodes in todo:
        print(label, flush=True)
        cases.append(run_case(label, kw, episodes, seeds, shared_model() if "simulated" in kw else None))
        save_figure(figure(cases[-1]), args.out / f"learning-{label}.png")
    write_json(args.out / "learning.json", {"cases": cases, "seeds": seeds})
    text = markdown(cases)
    write_markdown(args.out / "learning.md", text)
    print(text)


if __name__ == "__main__":
    main()
