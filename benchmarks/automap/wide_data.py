"""Does a wider training mix make a better Auto-MAP inference agent? The shipped agent
(``--data mix``: generated problems and the zoo's training models on 2-32 GPUs) against one
trained the same way on ``--data wide`` (adding decoder LLMs, random graphs and clusters of
64-512 GPUs, where device cuts count whole servers), equal episodes and seed, and random
weights of the same network; each planning at the planner's default beam on fixed instances
of both mixes. Figures: the geometric mean of each agent's iteration over the equal-compute
rule's (K stages of equal compute on equal shares of the devices), overall and for the
instances of more than 32 GPUs. Training counts as the wide agent's cost (its seconds).

    python benchmarks/automap/wide_data.py [--evaluations 30000] [--instances 24] [--out DIR]

Writes benchmarks/results/automap/wide_data.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pipeplan.learn.harness import Budget
from pipeplan.planners.automap import InferOptions
from pipeplan.planners.automap.infer import FEATURES, POINTS, InferEnv, beam, config, load_agent, train
from pipeplan.planners.automap.policy import NumpyQ, Policy, torch_policy
from pipeplan.planners.automap.training_data import generated, zoo_instance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, write_json, write_markdown  # noqa: E402


def instances(count: int, wide: bool) -> list:
    """``count`` fixed instances of one mix, alternating zoo models and generated arrays."""
    out = []
    for seed in range(count):
        rng = np.random.default_rng((2000 if wide else 1000) + seed)
        out.append(generated(rng, wide=wide) if seed % 2 else zoo_instance(rng, wide=wide))
    return out


def geomean(x: np.ndarray) -> float | None:
    return float(np.exp(np.mean(np.log(x)))) if x.size else None


def score(agents: dict, cases: list) -> dict:
    """Per instance: each agent's V and the rule's; the geometric means over the rule's."""
    rows = []
    for inst in cases:
        r = {"name": inst.name, "devices": inst.devices, "unit": inst.unit, "stages": inst.stages,
             "rule": inst.equal_compute()}
        r.update({k: beam(a, InferEnv(), inst, InferOptions.beam).value for k, a in agents.items()})
        rows.append(r)
        print(f"  {inst.name:12s} {inst.devices:4d} GPUs K={inst.stages} " +
              " ".join(f"{k} {r[k] / r['rule']:.3f}" for k in agents), flush=True)
    ok = [r for r in rows if np.isfinite(r["rule"])]
    summary = {}
    for k in agents:
        summary[k] = {"all": geomean(np.array([r[k] / r["rule"] for r in ok])),
                      "over 32 GPUs": geomean(np.array([r[k] / r["rule"] for r in ok if r["devices"] > 32]))}
    return {"rows": rows, "over rule": summary, "instances": len(ok)}


def markdown(res: dict, args) -> str:
    lines = ["# Auto-MAP inference: the shipped training mix against a wider one", "",
             f"Wide agent: `pipeplan train automap-infer --data wide --evaluations {args.evaluations} --seed "
             f"{args.seed}`, trained here in {res['train_s']:,.0f} s (greedy reward on its held-out problems "
             f"{res['greedy_reward']:.3f}). Beam {InferOptions.beam}. Each cell: the geometric mean of the agent's "
             "iteration over the equal-compute rule's (below 1: better than the rule).", "",
             "| instances | n | shipped (mix) | wide | random weights |", "|---|---|---|---|---|"]
    for label, r in res["sets"].items():
        for part in ("all", "over 32 GPUs"):
            n = sum(1 for x in r["rows"] if np.isfinite(x["rule"]) and (part == "all" or x["devices"] > 32))
            cells = [r["over rule"][k][part] for k in ("shipped", "wide", "random")]
            lines.append(f"| {label}, {part} | {n} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evaluations", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--instances", type=int, default=24)
    add_out_argument(ap, "automap")
    args = ap.parse_args()
    import torch

    from pipeplan.learn.dqn import q_network

    budget = Budget(None, args.evaluations)
    trained = train(budget, args.seed, data="wide")
    torch.manual_seed(0)
    wide = Policy(NumpyQ({k: v.float().numpy() for k, v in trained.checkpoint["state"].items()}, POINTS, FEATURES),
                  trained.agent.cfg.gamma)  # the fp16 weights a checkpoint holds, run as planning runs them
    agents = {"shipped": load_agent(), "wide": wide,
              "random": torch_policy(q_network(InferEnv.OBS, POINTS, config()), config().gamma)}
    res = {"train_s": budget.elapsed, "episodes": trained.episodes,
           "greedy_reward": trained.curve.points[-1].baseline if trained.curve.points else None, "sets": {}}
    for label, wide in (("mix", False), ("wide", True)):
        print(label, flush=True)
        res["sets"][label] = score(agents, instances(args.instances, wide))
    write_json(args.out / "wide_data.json", res)
    write_markdown(args.out / "wide_data.md", markdown(res, args))


if __name__ == "__main__":
    main()
