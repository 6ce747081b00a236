"""``pipeplan shard``: parse, call ``planners.automap.shard`` (and the DTensor runner), print."""

from __future__ import annotations

import argparse
import json

from .argtypes import seed
from ..errors import PipeplanError


def add_parser(sub, positive_int) -> None:
    sp = sub.add_parser("shard", help="operator partitioning / auto data parallelism of a PyTorch model "
                                      "(Auto-MAP's DQN or the exact integer program); optionally run it with DTensor")
    sp.add_argument("--model", required=True,
                    help="t5-base, t5-3b, t5-11b, t5-tiny, bert, bert-tiny, gpt2, gpt2-tiny, vgg19, vgg19-tiny, "
                         "or package.module:factory")
    sp.add_argument("--devices", type=positive_int, required=True, help="devices the variables are cut across")
    sp.add_argument("--cluster", default="automap-c",
                    help="whose first N devices the plan is made and priced for, with --run too (default automap-c)")
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument("--adp", action="store_true", help="auto data parallelism: find the inputs' batch dimensions")
    mode.add_argument("--hybrid", action="store_true",
                      help="decide inputs and parameters together, gathers allowed (ours; needs --reward cost)")
    sp.add_argument("--method", default="dqn", choices=["dqn", "milp", "both"],
                    help="the paper's DQN (default), the exact integer program, or both")
    sp.add_argument("--reward", default="cost", choices=["cost", "paper"],
                    help="cost: the predicted step time (default); paper: +0.4 a partitioned, +0.1 a replicated "
                         "dimension")
    sp.add_argument("--episodes", type=positive_int, default=None,
                    help="the DQN's budget in episodes (default 500: the same plan on any machine)")
    sp.add_argument("--nodes", type=positive_int, default=None,
                    help="the integer program's budget in branch-and-bound nodes (default 20000)")
    sp.add_argument("--budget", default=None, help="a wall-clock cap on the search, e.g. 90s, 3m (default none)")
    sp.add_argument("--seed", type=seed, default=0)
    sp.add_argument("--batch", type=positive_int, default=8, help="samples in the example inputs (default 8)")
    sp.add_argument("--seq", type=positive_int, default=32, help="sequence length of T5/BERT inputs (default 32)")
    sp.add_argument("--run", action="store_true", help="train with the plan on --workers gloo processes (DTensor)")
    sp.add_argument("--workers", type=positive_int, default=None, help="with --run: processes (default --devices)")
    sp.add_argument("--steps", type=positive_int, default=3, help="with --run: training steps (default 3)")
    sp.add_argument("--check", action="store_true", help="with --run: compare with one-process training (and time "
                                                          "it, to scale the prediction), and the collectives run with "
                                                          "those priced; exit 1 unless within 1e-5 and the same")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_shard)


def cmd_shard(args: argparse.Namespace) -> int:
    from ..cluster import load_cluster
    from ..sharding.shard import ShardRequest, shard
    from ..units import parse_duration

    if args.run and args.workers is not None and args.workers != args.devices:
        raise PipeplanError(f"--workers {args.workers} must equal --devices {args.devices} (one process a device)")
    if (args.workers is not None or args.check) and not args.run:
        raise PipeplanError("--workers and --check go with --run")
    cluster = load_cluster(args.cluster)  # a bad spec or file is one line before any work
    budgets = {k: v for k, v in (("episodes", args.episodes), ("nodes", args.nodes)) if v is not None}
    req = ShardRequest(args.model, args.devices, cluster=cluster, adp=args.adp, hybrid=args.hybrid,
                       method=args.method, reward=args.reward, **budgets,
                       budget_s=parse_duration(args.budget, "--budget") if args.budget is not None else None,
                       seed=args.seed, batch=args.batch, seq=args.seq)
    out = shard(req)
    code = 0
    if args.run:
        code = _run(args, out)
    if args.json:
        print(json.dumps(out, default=float))
    else:
        _print(out)
    return code


def _run(args, out: dict) -> int:
    from ..sharding.shard import check_runnable
    from ..sharding.tensor_parallel import run_sharded

    check_runnable(out)
    placements = {p["name"]: p["partition_dim"] for p in out["parameters"]}
    inputs = {p["name"]: p["partition_dim"] for p in out["inputs"]}
    ran = run_sharded(args.model, placements, inputs, args.devices, steps=args.steps, check=args.check,
                      seed=args.seed, batch=args.batch, seq=args.seq,
                      expected_collectives=out["predicted"]["by_phase"])
    out["run"] = ran
    out["measured_s"], out["max_rel_diff"] = ran["measured_s"], ran["max_rel_diff"]
    out["predicted_s"] = out["predicted"]["step_s"]
    if ran.get("reference_s"):  # the roofline's compute scaled to this machine by the one-process step
        pred, whole = out["predicted"], out["replicated"]
        out["predicted_s"] = pred["compute_s"] / whole["compute_s"] * ran["reference_s"] + pred["comm_s"]
        out["prediction"] = "compute scaled to the measured one-process step, communication on " + out["cluster"]
    return 1 if args.check and ran["check"]["verdict"] != "ok" else 0


def _print(out: dict) -> None:
    from ..units import fmt_bytes, fmt_time

    if out["ops_without_rule"]:
        print(f"warning: ops without a sharding rule run replicated: {', '.join(out['ops_without_rule'])}")
    cut = [p for p in out["parameters"] if p["partition_dim"] is not None]
    print(f"{out['model']} on {out['devices']} devices of {out['cluster']}: {out['mode']}, {out['method']}, "
          f"{out['reward']} reward; {len(cut)} of {len(out['parameters'])} parameters partitioned")
    for p in out["parameters"]:
        dim = "replicated" if p["partition_dim"] is None else f"partitioned on dim {p['partition_dim']}"
        dim += " (strided: each block cut)" if p["strided"] else ""
        print(f"  {p['name']} {tuple(p['shape'])}: {dim}")
    for p in out["inputs"]:
        dim = "whole" if p["partition_dim"] is None else f"split on dim {p['partition_dim']}"
        print(f"  input {p['name']} {tuple(p['shape'])}: {dim}")
    pred, base = out["predicted"], out["replicated"]
    if pred["step_s"] is None:
        print("the cost model cannot price this plan (a conflict it met choosing the activations)")
        return
    print(f"predicted step {fmt_time(pred['step_s'])} (compute {fmt_time(pred['compute_s'])}, communication "
          f"{fmt_time(pred['comm_s'])}, {pred['collectives']} collectives), {fmt_bytes(pred['memory_bytes'])} a "
          f"device{'' if pred['fits'] else ' (does not fit)'}; everything replicated: {fmt_time(base['step_s'])}")
    _print_replicated(out)
    if "dqn" in out:
        d = out["dqn"]
        print(f"DQN: {d['episodes']} episodes in {d['search_s']:.1f} s, best plan met after {d['found_s']:.1f} s, "
              f"{d['conflicts']} conflicts, Auto-MAP score {d['paper_score']:.1f}")
    if "milp" in out:
        m = out["milp"]
        print(f"MILP: {'optimal' if m['optimal'] else 'not proven optimal'} in {m['seconds']:.1f} s "
              f"({m['variables']:,} variables), Auto-MAP score {m['paper_score']:.1f}")
    if "run" in out:
        r = out["run"]
        print(f"run on {r['workers']} processes: measured {fmt_time(r['measured_s'])} a step against predicted "
              f"{fmt_time(out['predicted_s'])}; check: {r['check']['verdict']}"
              + (f" (largest relative difference {r['max_rel_diff']:.1e})" if r["max_rel_diff"] is not None else ""))
        print(f"collectives run: {_counts(r['collectives'])}; priced: {_counts(out['predicted']['by_phase'])}"
              + ("" if r["check"].get("collectives") != "differ" else " (they differ)"))


def _print_replicated(out: dict) -> None:
    """One line where everything replicated is predicted better than the search's plan."""
    from ..units import fmt_time

    if out["returned"] == "replicated":
        step = out["searched"]["step_s"]
        print(f"everything replicated is returned: predicted better than the best plan the search found "
              f"({'unpriced' if step is None else fmt_time(step)}{'' if out['searched']['fits'] else ', does not fit'})")
    elif out["replicated_better"]:
        print("warning: everything replicated is predicted better than this plan (the paper's reward counts "
              "partitions, not time; --reward cost returns the better one)")


def _counts(by_phase: dict | None) -> str:
    """``forward 2 all_reduce, backward 1 all_reduce`` (or ``none``)."""
    parts = [f"{phase} " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()) if n)
             for phase, kinds in (by_phase or {}).items() if any(kinds.values())]
    return "; ".join(parts) or "none"
