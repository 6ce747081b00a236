"""``pipeplan dynamic bench|train|eval``: parse, call ``dynamic.experiment``, print."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .argtypes import names, seed, threads
from ..errors import PipeplanError
from ..outputs import Outputs


def add_parser(sub, positive_int) -> None:
    sp = sub.add_parser("dynamic", help="DynPartition: place the nodes of dynamic tree networks (TreeLSTM, MathFunc) "
                                        "on CPU and GPUs for inference, by DQN or by algorithm")
    sp.add_argument("action", choices=["bench", "train", "eval"],
                    help="bench: the baselines; train: the DQN, then held-out evaluation; eval: a checkpoint's policy")
    sp.add_argument("--net", default="treelstm", choices=["treelstm", "mathfunc"])
    where = sp.add_mutually_exclusive_group()
    where.add_argument("--devices", type=names, help="real devices, measured: cpu, cpu:K (a logical CPU device), cuda:K")
    where.add_argument("--simulated", help="a machine on the cost model, e.g. cpu+4gpu (the default), 2cpu+2gpu")
    sp.add_argument("--machine", help="with the simulated machine: the file of its CPU's model (JSON: the calibration, "
                                      "when and where it was measured); default out/dynamic-machine.json, measured and "
                                      "written there on first use and shared by later runs; eval: the checkpoint's own")
    sp.add_argument("--width", type=positive_int, default=None,
                    help="each node's size: TreeLSTM hidden size (default 150), MathFunc vector length (default 1)")
    sp.add_argument("--episodes", type=positive_int, default=10_000, help="training episodes (default 10000, §8.2)")
    sp.add_argument("--budget", default=None, help="train: stop after this long too, e.g. 90s, 5m")
    sp.add_argument("--seed", type=seed, default=0)
    sp.add_argument("--normalized", action="store_true",
                    help="reward = -(time / all-CPU time of the same tree) (§9.3) instead of -ms")
    sp.add_argument("--mode", default="devices", choices=["devices", "threads", "sequential"],
                    help="with --devices: the executor (devices: a worker per device; threads: a thread per node, "
                         "the paper's; sequential: one thread)")
    sp.add_argument("--repeats", type=positive_int, default=10, help="with --devices: runs averaged (default 10)")
    sp.add_argument("--train-trees", type=positive_int, default=1000, help="training inputs (default 1000)")
    sp.add_argument("--test-trees", type=positive_int, default=50, help="held-out inputs (default 50)")
    sp.add_argument("--threads", type=threads, default=1,
                    help="torch intra-op threads (default 1: one core per logical CPU device)")
    sp.add_argument("--checkpoint", help="eval: the checkpoint to evaluate")
    sp.add_argument("--out", help="train: write the checkpoint here (.pt; the curve goes beside it as .csv, .png)")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_dynamic)


def cmd_dynamic(args: argparse.Namespace) -> int:
    import torch

    from ..dynamic import agent as dqn
    from ..dynamic.experiment import Setup, baselines, build, describe, report, strip, train
    from ..learn.harness import Budget, save_bytes
    from .progress import training_progress
    from ..units import parse_duration

    if args.action == "eval" and not args.checkpoint:
        raise PipeplanError("dynamic eval: --checkpoint is required")
    if args.action != "eval" and args.checkpoint:
        raise PipeplanError(f"dynamic {args.action}: --checkpoint goes with eval")
    if args.action != "train" and (args.out or args.budget):
        raise PipeplanError(f"dynamic {args.action}: --out and --budget go with train")
    outs = Outputs()
    stem = args.out[:-3] if args.out and args.out.endswith(".pt") else None
    outs.want("--out", args.out, "checkpoint")
    outs.want("curve CSV", stem and stem + ".csv", "csv")
    outs.want("curve PNG", stem and stem + ".png", "figure")
    seconds = parse_duration(args.budget, "--budget") if args.budget else None
    if args.devices and args.machine:
        raise PipeplanError("dynamic: --machine goes with the simulated machine; real --devices are measured")
    setup = Setup(net=args.net, width=args.width, devices=args.devices,
                  simulated=None if args.devices else (args.simulated or "cpu+4gpu"), mode=args.mode,
                  repeats=args.repeats, normalized=args.normalized, seed=args.seed, train_trees=args.train_trees,
                  test_trees=args.test_trees)
    setup.check()
    agent = dqn.Agent.load(args.checkpoint) if args.action == "eval" else None
    if setup.simulated:
        setup.machine_model = _machine_model(args, agent, outs)
    torch.set_num_threads(args.threads)
    bench = build(setup)
    if agent is not None and agent.devices != len(bench.names):
        raise PipeplanError(f"checkpoint {args.checkpoint!r} places on {agent.devices} devices, "
                            f"this machine has {len(bench.names)} ({', '.join(bench.names)})")
    base = baselines(bench, args.seed)
    result = None
    if args.action == "train":
        config = dqn.Config(episodes=args.episodes, seed=args.seed)
        with training_progress(f"training dynpartition ({args.net})") as progress:
            result = train(bench, config, Budget(seconds=seconds, evaluations=args.episodes), progress)
        agent = result.agent
        title = f"DynPartition on {args.net} (width {bench.env.width}), {', '.join(bench.names)} (seed {args.seed})"
        trained_on = dqn.trained_on(bench.env, setup.machine_model)
        outs.set("--out", lambda p: Path(p).write_bytes(save_bytes(agent.checkpoint(trained_on))))
        outs.set("curve CSV", lambda p: Path(p).write_text(result.curve.csv_text()))
        outs.set("curve PNG", lambda p: result.curve.figure(title).savefig(p, format="png"))
    outs.write_all()
    if agent is not None:
        out = report(bench, agent, base, result)
    else:
        sub = base["optimal_subset"]
        out = {"baselines": strip(base), "optimal_subset": sub and strip(sub), **describe(bench)}
    if args.json:
        print(json.dumps(out, default=float))
    else:
        _print(out, args)
    return 0


def _machine_model(args: argparse.Namespace, agent, outs: Outputs) -> dict:
    """The simulated machine's model: ``--machine``'s file, else the checkpoint's (eval), else
    the default file. A file that does not exist yet is measured now and written with the
    command's outputs (its target checked first), so that later runs share it."""
    from ..dynamic.machines import DEFAULT_MACHINE, machine_model, model_cpu, model_text

    if args.machine is None and agent is not None and "machine_model" in agent.trained_on:
        model = agent.trained_on["machine_model"]
        model_cpu(model, f"checkpoint {args.checkpoint!r}: its machine model")
        return model
    path = args.machine or str(DEFAULT_MACHINE)
    outs.want("--machine", None if os.path.lexists(path) else path, "json")
    model, new = machine_model(path)
    if new:
        outs.set("--machine", lambda p: Path(p).write_text(model_text(model)))
        print(f"pipeplan: note: this CPU calibrated for the simulated machine; its model goes to {path}, "
              "which later runs share (--machine)", file=sys.stderr)
    return model


def _print(out: dict, args: argparse.Namespace) -> None:
    base = out["baselines"]
    print(f"{out['net']} (width {out['width']}) on {', '.join(out['devices'])}: {out['reward']}, "
          f"mean over {out['test_trees']} held-out trees ({out['machine']})")
    rows = [("learned policy (DQN)", out["policy_ms"])] if "policy_ms" in out else []
    rows += [(k, v) for k, v in base.items() if k not in ("optimal", "gpu") and v is not None]
    cpu = base["cpu"]
    for name, ms in rows:
        print(f"  {name:<22} {ms:10.3f} ms   {cpu / ms:5.2f}x the CPU's speed")
    sub = out.get("optimal_subset")
    if sub:
        extra = f", policy {sub['policy_ms']:.3f}" if "policy_ms" in sub else ""
        print(f"  exact optimum on {len(sub['nodes'])} small held-out trees ({min(sub['nodes'])}-{max(sub['nodes'])} "
              f"nodes): {sub['optimal_ms']:.3f} ms (HEFT {sub['heft_ms']:.3f}{extra}, CPU {sub['cpu_ms']:.3f})")
    if "episodes" in out:
        print(f"  trained {out['episodes']} episodes in {out['train_s']:.1f} s"
              + (f"; checkpoint {args.out}" if args.out else ""))
