"""``pipeplan`` command line: plan, simulate, compare, planners, models, clusters, profile,
calibrate, run. It parses, calls the library, and prints.

Errors a user can cause print one line and exit with code 2; nothing is half-written.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

from .argtypes import calibration_seconds, non_negative_int, positive_seconds, seed as _seed, threads
from .argtypes import names as _names, positive_int as _positive_int
from ..errors import Infeasible, PipeplanError, Terminated, from_ctrl_c, interrupted, one_line
from ..budget import time_limit
from ..outputs import Outputs, check_folder
from .progress import planning_progress, training_progress, workers_progress


#: ``profile --timeout``: a model whose profile takes longer is refused (a forward that never returns)
PROFILE_TIMEOUT_S = 600.0
MODEL_SPEC_HELP = ("example:mlp|transformer|cnn|resnet, hf:gpt2?n_layer=4&... or hf:bert?... (transformers "
                   "from a config), or package.module:factory")


def _load_inputs(args):
    from ..cluster import load_cluster
    from ..graph import load_graph
    from ..units import parse_bytes

    graph, cluster = load_graph(args.model), load_cluster(args.cluster)
    if getattr(args, "global_batch", None) and args.microbatches:  # M fixed: scale the microbatch
        from ..graph.scale import with_global_batch

        graph = with_global_batch(graph, args.global_batch, args.microbatches)
    if args.memory_limit is not None:
        limit = parse_bytes(args.memory_limit, "--memory-limit")
        if limit <= 0:
            raise PipeplanError(f"--memory-limit must be > 0, got {args.memory_limit!r}")
        cluster = cluster.with_memory(limit)
    if getattr(args, "memory_reserve", None) is not None:
        cluster = cluster.with_reserve(parse_bytes(args.memory_reserve, "--memory-reserve"))
    return graph, cluster


def _options(args, planners: list[str] = ()):
    """The run's PlanOptions; the -O text parsed, once, into the options of ``planners``."""
    from ..planners import PlanOptions, planner_settings

    pairs = []
    for item in args.planner_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PipeplanError(f"-O/--planner-option: expected KEY=VALUE, got {item!r}")
        pairs.append((key, value))
    return PlanOptions(microbatches=args.microbatches or PlanOptions.microbatches, schedule=getattr(args, "schedule", None),
                       optimizer=args.optimizer, settings=planner_settings(list(planners), pairs) if planners else (),
                       global_batch=_global_batch(args))


def _global_batch(args) -> int | None:
    """``--global-batch N``: the planner picks the microbatch size and count; with
    ``--microbatches M`` too, M is fixed (``_load_inputs`` scaled each microbatch to N / M)."""
    return None if args.microbatches else args.global_batch


def cmd_plan(args) -> int:
    from ..planners import run_planner
    from ..planners.base import overflow_text
    from ..planners.compare import best, default_planners
    from .report import print_plan
    from ..units import fmt_time

    outs = Outputs()
    outs.want("--out", args.out, "json")
    graph, cluster = _load_inputs(args)
    names = default_planners(cluster) if args.planner == "best" else [args.planner]
    options = _options(args, names)
    if args.planner == "best":
        with planning_progress("planning") as progress:
            row = best(graph, cluster, options, progress=progress)
        plan, result = row.plan, row.result
    else:
        plan, result = run_planner(args.planner, graph, cluster, options)
    outs.set("--out", plan.save)
    outs.write_all()
    _note_assumed_split([plan])
    _note_unmeasured_rates([plan])
    _note_linearized([plan])
    if result.over_memory:
        way_out = _way_out(graph, cluster, names, options, [result])
        print(f"pipeplan: warning: the plan does not fit in memory: {one_line(overflow_text(result))} "
              f"({plan.planner}, {fmt_time(result.iteration_s)} per iteration); {way_out}", file=sys.stderr)
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        print_plan(plan, result)
        if args.out:
            print(f"plan written to {args.out}")
    return 0


LEARNING_PLANNERS = ("drl-pp", "automap-infer")
#: ``train``'s budget by default: plans scored (drl-pp, about 5 minutes here) or episodes
#: (automap-infer: what rebuilds the shipped agent, docs/automap.md).
TRAIN_EVALUATIONS = {"drl-pp": 20_000, "automap-infer": 30_000}


def _note_assumed_split(plans: list) -> None:
    """One line on stderr when a plan splits its backward (I, W) on a graph that does not
    say how (a PipeDream profile): the simulator's assumption, stated."""
    from ..schedule import make_schedule
    from ..sim.stage_costs import assumed_input_fraction

    for plan in plans:
        frac = assumed_input_fraction(plan.graph.meta)
        if frac is not None and make_schedule(plan.schedule, plan.stage_devices(), plan.microbatches,
                                              plan.replicas).splits_backward:
            source = plan.graph.meta.get("source", "a graph file")
            print(f"pipeplan: note: model {plan.graph.name!r} ({source}) does not split its backward into input and "
                  f"weight gradients; schedule {plan.schedule} assumes the input gradient takes {frac:.0%} of each "
                  "backward (pipeplan profile measures it; docs/schedules.md)", file=sys.stderr)
            return


def _note_unmeasured_rates(plans: list) -> None:
    """One line on stderr for each GPU kind a decoder LLM plan runs on whose whole-layer rates
    were never timed (``cluster.measured``): what its prediction rests on."""
    from ..cluster.kinds import KINDS
    from ..cluster.measured import is_measured
    from ..plan import is_decoder

    said = set()
    for plan in plans:
        if not is_decoder(plan.graph):
            continue
        for d in {plan.cluster.devices[i].kind.lower() for devs in plan.stage_devices() for i in devs}:
            k = KINDS.get(d)
            if k is not None and k.rates_from and d not in said and not is_measured(k.name):
                said.add(d)
                print(f"pipeplan: note: {k.name}'s layer rates are unmeasured: the prediction rests on {k.rates_from} "
                      "(python benchmarks/gpu/layer_timing.py on one measures them)", file=sys.stderr)


def _note_linearized(plans: list) -> None:
    """One line on stderr for each plan of PipeDream's DP (pipedream, hetpipe) made over one
    topological order of the layers: the model's antichain DAG was too large, even with its
    branches compressed."""
    from ..planners.pipedream import MAX_STATES

    for plan in plans:
        if any(isinstance(v, dict) and v.get("linearized") for v in plan.extra.values()):
            print(f"pipeplan: note: {plan.planner} planned model {plan.graph.name!r} as one chain of its layers (a "
                  f"topological order): its antichain DAG has more than {MAX_STATES} states even with branches "
                  "compressed", file=sys.stderr)


def cmd_train(args) -> int:
    """Train a learning planner; write its checkpoint and learning curve (CSV and PNG beside
    the checkpoint), print the best plan it found."""
    import shlex

    from ..learn.harness import Budget, load_checkpoint, save_bytes
    from ..learn.scoring import executions
    from ..planners.drlpp.run import train_agent
    from .report import print_plan
    from ..sim import simulate
    from ..units import parse_duration

    if args.agent not in LEARNING_PLANNERS:
        raise PipeplanError(f"unknown learning planner {args.agent!r} (known: {', '.join(LEARNING_PLANNERS)})")
    args.out = args.out or f"{args.agent}.pt"
    outs = Outputs()
    outs.want("--out", args.out, "checkpoint")
    stem = args.out[:-3]
    outs.want("curve CSV", stem + ".csv", "csv")
    outs.want("curve PNG", stem + ".png", "figure")
    if args.agent == "automap-infer":
        outs.want("numpy twin", stem + ".npz", "npz")  # what planning loads without torch
    if args.planner_option or args.global_batch:
        raise PipeplanError("train: -O and --global-batch are options of plan and compare, not of train")
    seconds = parse_duration(args.budget, "--budget") if args.budget else None
    evaluations = args.evaluations or (None if seconds else TRAIN_EVALUATIONS[args.agent])
    budget = Budget(seconds=seconds, evaluations=evaluations)
    command = shlex.join(["pipeplan", "train", *(args.argv or [])])
    if args.init:  # a checkpoint to start from is read before any work (its weights again by the agent)
        load_checkpoint(args.init, args.agent)
    if args.agent == "automap-infer":
        if args.measured:
            raise PipeplanError("train automap-infer: --measured is drl-pp's (automap-infer trains on generated "
                                "problems, not on runs)")
        return _train_automap_infer(args, outs, budget, command)
    if args.data is not None:
        raise PipeplanError("train: --data is an option of automap-infer, which trains on generated problems")
    if not args.model or not args.cluster:
        raise PipeplanError(f"train {args.agent}: --model and --cluster are required")
    executions(args.schedule, None)  # a schedule the agent cannot choose: refused before any run or calibration
    graph, cluster, runner = _measured_inputs(args) if args.measured else (*_load_inputs(args), None)
    with training_progress(f"training {args.agent}") as progress:
        trained = train_agent(graph, cluster, _options(args), budget, args.seed, args.init, progress, command,
                              runner=runner)
    title = f"{args.agent} on {graph.name} / {cluster.name} (seed {args.seed})"
    outs.set("--out", lambda p: Path(p).write_bytes(save_bytes(trained.checkpoint)))
    outs.set("curve CSV", lambda p: Path(p).write_text(trained.curve.csv_text()))
    outs.set("curve PNG", lambda p: trained.curve.figure(title).savefig(p, format="png"))
    outs.write_all()
    summary = {k: trained.checkpoint["trained_on"][k] for k in ("evaluations", "seconds", "best_iteration_s")}
    summary["updates"] = len(trained.curve.points)
    summary.update({k: trained.checkpoint["trained_on"][k] for k in ("rewards", "runs") if k in trained.checkpoint["trained_on"]})
    if args.json:
        print(json.dumps({**summary, "checkpoint": args.out, "plan": trained.plan.to_dict()}))
        return 0
    print_plan(trained.plan, simulate(trained.plan, timeline=False), searched=False)
    runs = f" ({summary['runs']:,} distinct plans run for real)" if "runs" in summary else ""
    print(f"trained {summary['updates']} updates, {summary['evaluations']:,} plans scored{runs} in "
          f"{summary['seconds']:.1f} s")
    print(f"checkpoint written to {args.out} (curve: {stem}.csv, {stem}.png); plan with it: pipeplan plan "
          f"--model {shlex.quote(args.model)} --cluster {shlex.quote(args.cluster)} --planner {args.agent} "
          f"-O checkpoint={shlex.quote(args.out)}")
    return 0



def _measured_inputs(args):
    """``train drl-pp --measured``: the model spec profiled on this machine (the graph the
    agent cuts, its nodes the layers the runtime runs), the cluster, and the runner that
    trains a plan for real (``pipeplan run``, CPU processes) and returns its seconds per
    iteration."""
    from ..cluster import load_cluster
    from ..runtime.measure import plan_runner
    from ..runtime.profiler import profile_model

    cluster = load_cluster(args.cluster)
    if args.memory_limit is not None:
        raise PipeplanError("train --measured: --memory-limit is not used (plans run on this machine's workers)")
    return profile_model(args.model, reps=5), cluster, plan_runner(args.model)


def _train_automap_infer(args, outs: Outputs, budget, command: str) -> int:
    """``train automap-infer``: once, on generated problems (no model or cluster)."""
    import shlex

    from ..learn.harness import save_bytes
    from ..planners.automap.infer import train
    from ..planners.automap.policy import twin_bytes

    if args.model or args.cluster:
        raise PipeplanError("train automap-infer: it trains on generated problems; --model and --cluster are "
                            "not used (plan any model with --planner automap-infer)")
    with training_progress("training automap-infer") as progress:
        trained = train(budget, args.seed, args.data or "mix", args.init, progress, command)
    title = f"automap-infer on {args.data or 'mix'} problems (seed {args.seed})"
    data = save_bytes(trained.checkpoint)
    outs.set("--out", lambda p: Path(p).write_bytes(data))
    outs.set("numpy twin", lambda p: Path(p).write_bytes(twin_bytes(trained.checkpoint, data)))
    outs.set("curve CSV", lambda p: Path(p).write_text(trained.curve.csv_text()))
    outs.set("curve PNG", lambda p: trained.curve.figure(title).savefig(p, format="png"))
    outs.write_all()
    last = trained.curve.points[-1] if trained.curve.points else None
    summary = {"episodes": trained.episodes, "seconds": trained.checkpoint["trained_on"]["seconds"],
               "greedy_reward": last.baseline if last else None, "checkpoint": args.out}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"trained {trained.episodes:,} episodes in {summary['seconds']:.1f} s"
          + (f"; greedy reward on held-out problems {last.baseline:.3f} (ideal/L)" if last else ""))
    print(f"checkpoint written to {args.out}; plan with it: pipeplan plan --model MODEL --cluster CLUSTER "
          f"--planner automap-infer -O checkpoint={shlex.quote(args.out)}")
    return 0

def _timeline_outputs(args) -> Outputs:
    """--trace and --gantt, checked before any work."""
    outs = Outputs()
    outs.want("--trace", args.trace, "json")
    outs.want("--gantt", args.gantt, "figure")
    return outs


def _render(outs: Outputs, trace, trace_title: str, gantt, gantt_title: str) -> None:
    """Write the --trace and --gantt asked for (two timelines: a run's Gantt chart may set
    its prediction beside it), together."""
    from ..viz import draw_gantt, write_trace

    outs.set("--trace", lambda p: write_trace(trace, p, title=trace_title))
    outs.set("--gantt", lambda p: draw_gantt(gantt, p, title=gantt_title))
    outs.write_all()


def cmd_simulate(args) -> int:
    from ..plan import load_plan
    from .report import print_plan
    from ..sim import simulate

    outs = _timeline_outputs(args)
    plan = load_plan(args.plan)
    if args.schedule:
        plan.schedule = args.schedule
    result = simulate(plan)
    _note_assumed_split([plan])
    _note_unmeasured_rates([plan])
    plan.prediction = result.summary()
    title = f"{plan.planner} / {plan.schedule}: {plan.graph.name} on {plan.cluster.name}"
    _render(outs, result.timeline, title, result.timeline, title)
    if args.json:
        print(json.dumps(plan.prediction))
    else:
        print_plan(plan, result, searched=False)
        for what, path in (("trace", args.trace), ("gantt", args.gantt)):
            if path:
                print(f"{what} written to {path}")
    return 0


def cmd_explain(args) -> int:
    """A decoder LLM plan's iteration term by term; with a second plan, the difference."""
    from ..plan import load_plan
    from ..sim.explain import difference, explain
    from .report import print_explained

    plans = [load_plan(args.plan)] + ([load_plan(args.plan_b)] if args.plan_b else [])
    found = [explain(p) for p in plans]
    diff = difference(*found) if len(found) == 2 else None
    if args.json:
        print(json.dumps({"plans": found, **({"difference": diff} if diff else {})}))
    else:
        print_explained([args.plan] + ([args.plan_b] if args.plan_b else []), found, diff)
    return 0


def cmd_report(args) -> int:
    """``report PLAN [--compare PLAN ...] --html FILE``: the page of ``html_report``."""
    from rich.console import Console

    from ..plan import load_plan
    from ..sim import simulate
    from ..sim.explain import explain
    from .html_report import Entry, page
    from .report import print_plan

    outs = Outputs()
    outs.want("--html", args.html, "html")
    entries = []
    for name in [args.plan, *args.compare]:
        plan = load_plan(name)
        result = simulate(plan)
        console = Console(record=True, width=120, file=io.StringIO())
        print_plan(plan, result, console, searched=False)
        try:
            explained, why = explain(plan), ""
        except PipeplanError as e:
            explained, why = None, str(e)
        entries.append(Entry(name, plan, result, console.export_text(), explained, why))
    _note_unmeasured_rates([e.plan for e in entries])
    outs.set("--html", lambda p: Path(p).write_text(page(entries)))
    outs.write_all()
    print(f"report written to {args.html}")
    return 0


def cmd_export_plan(args) -> int:
    """A plan as an engine's configuration (docs/engines.md): Megatron-LM's arguments printed,
    or torchtitan's configuration written to a folder."""
    from pathlib import Path

    from ..engines import megatron, torchtitan
    from ..plan import load_plan

    if (args.to != "megatron") != (args.out is not None):
        raise PipeplanError(f"export-plan: --to {args.to} writes a folder (give --out DIR)" if args.to != "megatron"
                            else "export-plan: --to megatron prints its arguments (no --out)")
    if args.out is not None:
        check_folder("--out", args.out)
    outs = Outputs()
    names = (("torchtitan.toml", "launch.sh", "pipeplan_torchtitan.py", "launch-0.3.sh", "pp_schedule.csv")
             if args.to == "torchtitan"
             else ("pp_schedule.csv",))
    for name in names if args.out else ():
        outs.want(f"--out ({name})", str(Path(args.out) / name), name.rsplit(".", 1)[1])
    plan = load_plan(args.plan)
    if args.launch is not None and args.to != "megatron":
        raise PipeplanError("export-plan: --launch writes Megatron-LM's launch script (--to megatron); torchtitan's "
                            "is launch.sh in --out")
    if args.to == "megatron" and args.launch is not None:
        print(megatron.launch_script(plan, args.launch), end="")
        return 0
    if args.to == "megatron":
        lines = megatron.arguments(plan)
        for key, value in megatron.environment(plan).items():
            print(f"export {key}={value}")
        print("pretrain_gpt.py \\\n" + " \\\n".join(f"    {a}" for a in lines))
        print(megatron.note(plan))
        return 0
    files = torchtitan.export(plan, args.out) if args.to == "torchtitan" else torchtitan.export_schedule(plan)
    for name, text in files.items():
        outs.set(f"--out ({name})", lambda p, t=text: Path(p).write_text(t))
    outs.write_all()
    what = "torchtitan configuration" if args.to == "torchtitan" else "torch pipelining schedule"
    print(f"{what} written to {args.out}: {', '.join(files)}")
    return 0


def cmd_compare(args) -> int:
    from ..planners.compare import best_row, compare, default_planners
    from .report import print_compare

    outs = Outputs()
    outs.want("--gantt", args.gantt, "figure")
    outs.want("--out", args.out, "json")
    graph, cluster = _load_inputs(args)
    names = args.planners or default_planners(cluster)
    options = _options(args, names)
    with planning_progress("comparing") as progress:
        rows = compare(graph, cluster, names, options, progress)
    top = best_row(rows) if any(r.result is not None for r in rows) else None
    _note_assumed_split([r.plan for r in rows if r.plan is not None])
    _note_unmeasured_rates([r.plan for r in rows if r.plan is not None])
    _note_linearized([r.plan for r in rows if r.plan is not None])
    if top is not None and top.fits:
        from ..viz import draw_gantt

        plan = top.plan
        outs.set("--gantt", lambda p: draw_gantt(
            top.result.timeline, p, title=f"best: {plan.planner} / {plan.schedule}: {graph.name} on {cluster.name}"))
        outs.set("--out", plan.save)
        outs.write_all()
    dicts = [r.to_dict() for r in rows]
    if args.json:
        print(json.dumps({"model": graph.name, "cluster": cluster.name, "microbatches": options.microbatches,
                          "results": dicts}))
    else:
        what = f"global batch {args.global_batch}" if args.global_batch else f"{options.microbatches} microbatches"
        print_compare(dicts, f"{graph.name} on {cluster.name}, {what}")
        if top is not None and top.fits:
            print(f"to use the best plan: {_reproduce(args, top.planner, options)}")
            for what, path in (("gantt of the best plan", args.gantt), ("best plan", args.out)):
                if path:
                    print(f"{what} ({top.planner}) written to {path}")
    if top is None or not top.fits:
        why = "no planner has a plan that fits in memory" if top is not None else "no planner could plan this"
        results = [r.result for r in rows if r.result is not None]
        print(f"pipeplan: error: {why}; {one_line(_way_out(graph, cluster, names, options, results))}", file=sys.stderr)
        return 2
    return 0


def _reproduce(args, planner: str, options) -> str:
    """The `pipeplan plan` command that makes ``planner``'s plan on these inputs (with the
    -O options that reached it in ``options``: those not at their defaults)."""
    from ..planners import get_planner
    from ..planners.options import option_pairs

    parts = ["pipeplan plan", "--model", repr(args.model) if "?" in args.model else args.model,
             "--cluster", args.cluster, "--planner", planner]
    for flag, value in (("--microbatches", args.microbatches), ("--global-batch", args.global_batch),
                        ("--memory-limit", args.memory_limit), ("--memory-reserve", args.memory_reserve)):
        if value is not None:
            parts += [flag, str(value)]
    if args.optimizer != "adam":
        parts += ["--optimizer", args.optimizer]
    own = options.settings_of(get_planner(planner).options)
    parts += [f"-O {k}={v}" for k, v in option_pairs(own)]
    return " ".join(parts + ["--out", "plan.json"])


def _way_out(graph, cluster, names: list[str], options, results: list) -> str:
    """The smallest change that would make a plan fit, computed (``planners.advice``);
    ``results``: the simulations of the plans that overflow."""
    from ..planners.advice import what_would_fit
    from ..planners.compare import compare
    from ..units import fmt_time

    fix = what_would_fit(lambda g, c, o: compare(g, c, names, o), graph, cluster, options, results)
    if fix is None:
        return "neither SGD, smaller microbatches, more memory nor 4x the devices makes one fit"
    return f"one would with {fix.change}: {fix.flags}, with which {fix.planner} plans {fmt_time(fix.iteration_s)} " \
           "per iteration"


def cmd_profile(args) -> int:
    from ..graph import graph_to_dict, save_graph
    from ..runtime.profiler import profile_model
    from ..units import fmt_bytes, fmt_time

    outs = Outputs()
    outs.want("--out", args.out, "json")
    with time_limit(args.timeout, f"profile: {args.model_spec}"):
        graph = profile_model(args.model_spec, microbatch=args.microbatch, device=args.device,
                              warmup=args.warmup, reps=args.reps, threads=args.threads)
    outs.set("--out", lambda p: save_graph(graph, p))
    outs.write_all()
    if args.json:
        print(json.dumps(graph_to_dict(graph)))
        return 0
    from rich.table import Table

    from .report import make_console

    table = Table(title=f"profile of {args.model_spec} (microbatch {graph.meta.get('microbatch')}, "
                        f"{args.device}, {args.threads} thread(s), median of {args.reps})")
    for col in ("layer", "description", "forward", "backward", "input grad", "params", "output"):
        table.add_column(col, justify="left" if col in ("layer", "description") else "right")
    split = graph.meta.get("backward_split_s", {})
    for i, nid in enumerate(graph.ids):
        i_s, w_s = split.get(nid, (0.0, 0.0))[:2]
        table.add_row(nid, graph.desc[i][:40], fmt_time(graph.fwd[i]), fmt_time(graph.bwd[i]),
                      f"{i_s / (i_s + w_s):.0%}" if i_s + w_s > 0 else "-",
                      fmt_bytes(graph.params[i]), fmt_bytes(graph.act[i]))
    make_console().print(table)
    total = graph.meta.get("total_s")
    if total:
        print(f"sum of layers {fmt_time(graph.total_fwd + graph.total_bwd)}, whole model {fmt_time(total)}")
    print(f"input gradients take {graph.meta['backward_input_fraction']:.0%} of the backward (measured apart from "
          "the weight gradients; zero-bubble schedules run them as I and W)")
    if args.out:
        print(f"graph written to {args.out}")
    return 0


def cmd_export(args) -> int:
    from ..graph import save_graph
    from ..runtime.aten_graph import export_graph
    from ..units import fmt_bytes, fmt_time

    outs = Outputs()
    outs.want("--out", args.out, "json")
    graph = export_graph(args.model_spec, microbatch=args.microbatch, measured=args.measured)
    outs.set("--out", lambda p: save_graph(graph, p))
    outs.write_all()
    measured = graph.meta.get("measured")
    times = (f"{len(measured['matched'])} layers measured" if measured
             else f"roofline on {graph.meta['reference_device']}")
    print(f"{len(graph)} ops, {len(graph.edges)} edges, forward {fmt_time(graph.total_fwd)}, backward "
          f"{fmt_time(graph.total_bwd)} ({times}), params {fmt_bytes(graph.total_params)}; "
          f"graph written to {args.out}")
    return 0


def cmd_calibrate(args) -> int:
    from ..runtime.calibrate import calibrate, cluster_to_yaml, default_workers, worker_steps
    from ..sim import predicted_s
    from ..units import fmt_bandwidth, fmt_time

    outs = Outputs()
    outs.want("--out", args.out, "yaml")
    workers = args.workers if args.workers is not None else default_workers(args.device)
    with workers_progress("calibrating", workers, worker_steps(max(workers, 1))) as progress:
        cluster, data = calibrate(workers=args.workers, device=args.device, threads=args.threads,
                                  seconds=args.seconds, model_spec=args.model,
                                  predict=None if args.no_runtime else predicted_s,
                                  force=args.force, on_progress=progress)
    text = cluster_to_yaml(cluster)
    outs.set("--out", lambda p: Path(p).write_text(text))
    outs.write_all()
    if args.json:
        print(json.dumps({"cluster": text, "speeds": [d.speed for d in cluster.devices]}))
        return 0
    for d in cluster.devices:
        print(f"{d.name}: speed {d.speed:.2f} x the profiling process")
    v = len(cluster)
    for a in range(v):
        for b in range(a + 1, v):
            print(f"{cluster.devices[a].name} <-> {cluster.devices[b].name}: "
                  f"{fmt_bandwidth(cluster.bandwidth[a, b])}, latency {fmt_time(cluster.latency[a, b])}")
    if args.out:
        print(f"cluster written to {args.out}")
    return 0


def cmd_run(args) -> int:
    from ..plan import load_plan
    from ..runtime.check import check_run
    from ..runtime.executor import RunConfig, check_schedule_csv, run_plan
    from ..sim import predicted_s
    from ..units import fmt_time

    outs = _timeline_outputs(args)
    plan = load_plan(args.plan)
    if args.schedule_csv is not None:
        check_schedule_csv(plan, args.schedule_csv)  # before any work
    cfg = RunConfig(spec=args.model, steps=args.steps, warmup=args.warmup, threads=args.threads,
                    hang_s=args.hang_timeout, timeout_s=args.timeout, schedule_csv=args.schedule_csv,
                    device=args.device, precision=args.precision)
    world = len({d for s in plan.stages for d in s.devices})
    with workers_progress("running", world, cfg.warmup + cfg.steps) as progress:
        result = run_plan(plan, cfg, predicted_s(plan), on_progress=progress)
    _note_assumed_split([plan])
    _note_unmeasured_rates([plan])
    _write_measured(outs, args, plan, result)
    check = None
    if args.check:
        check = check_run(plan, args.model, result.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed,
                          threads=cfg.threads, microbatch=result.microbatch, device=result.device,
                          precision=result.precision)
        result.max_rel_diff, result.check = check.max_rel_diff, check.to_dict()
    code = 0 if check is None or check.verdict == "pass" else 1
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr, flush=True)  # before the figures it explains
    if args.json:
        print(json.dumps(result.to_dict()))
        return code
    print(f"{plan.planner} plan, schedule {plan.schedule}, {result.processes} processes, "
          f"{args.steps} steps after {args.warmup} warm-up")
    print(f"measured {fmt_time(result.measured_s)} per iteration (median), predicted "
          f"{fmt_time(result.predicted_s)}: prediction error {result.error:.1%}"
          + (f" ({len(result.warnings)} warning(s) above say why it may not hold here)" if result.warnings else ""))
    if result.action_error is not None:
        print("per-action error against the prediction (median |error|): " + ", ".join(
            f"{kind} {v['median_abs_error']:.1%}" for kind, v in result.action_error["summary"].items()))
    if check is not None:
        print(f"check against one-process training: largest relative difference {check.max_rel_diff:.2e} "
              f"({check.worst}; tolerance {check.tolerance:g}): {check.verdict.upper()}"
              + (f" — {check.note}" if check.note else ""))
    return code


def _write_measured(outs: Outputs, args, plan, result) -> None:
    """--trace / --gantt of the measured step; with --vs-prediction the Gantt chart shows each
    device's predicted row above its measured one, and ``result`` gets the per-action error."""
    title = f"measured (step {result.timeline_step})"
    drawn, gantt_title = result.timeline, title
    if args.vs_prediction:
        from ..runtime.timing import side_by_side
        from ..sim import simulate

        drawn, result.action_error = side_by_side(simulate(plan).timeline, result.timeline)
        gantt_title = f"predicted and measured (step {result.timeline_step})"
    _render(outs, result.timeline, title, drawn, gantt_title)


def cmd_planners(args) -> int:
    from rich.table import Table

    from ..planners.base import planner_catalog
    from .report import make_console

    entries = planner_catalog()
    if args.json:
        print(json.dumps({"planners": entries}))
        return 0
    table = Table(title="planners (use as --planner NAME; options as -O KEY=VALUE"
                        + ("" if args.verbose else "; --verbose describes each option") + ")")
    for col in ("name", "description", "schedule", "options"):
        table.add_column(col)
    for e in entries:
        if args.verbose:
            opts = "\n".join(f"{o['name']} ({o['type']}, default {o['default']}): {o['help']}"
                             + (f" [{'|'.join(o['choices'])}]" if "choices" in o else "") for o in e["options"])
        else:
            opts = ", ".join(o["name"] for o in e["options"])
        table.add_row(e["name"], e["description"],
                      e["default_schedule"], opts or "-")
    make_console().print(table)
    return 0


def cmd_models(args) -> int:
    from rich.table import Table

    from .report import make_console

    from ..graph import llm, zoo

    entries = [{**e, "family": "seed"} for e in zoo.describe()] + llm.describe()
    if args.json:
        print(json.dumps({"models": entries}))
        return 0
    table = Table(title="zoo models (use as --model zoo:NAME[?key=value&...])")
    for col in ("name", "description", "options (defaults)"):
        table.add_column(col)
    for e in entries:
        table.add_row(e["name"], e["description"], ", ".join(f"{k}={v}" for k, v in e["defaults"].items()))
    make_console().print(table)
    return 0


def cmd_clusters(args) -> int:
    from rich.table import Table

    from .report import make_console

    from ..cluster import PRESETS, load_cluster
    from ..cluster.presets import SIZED_PRESETS

    rows = []
    for name, (desc, _) in PRESETS.items():
        c = load_cluster(name)
        rows.append({"name": name, "devices": len(c), "description": desc})
    rows += [{"name": name, "devices": devices, "description": desc} for name, (devices, desc) in SIZED_PRESETS.items()]
    if args.json:
        print(json.dumps({"clusters": rows}))
        return 0
    table = Table(title="cluster presets (or --cluster hier:servers=N,gpus=G,intra=BW,inter=BW, or a YAML file; "
                        "device kinds: docs/cli.md)")
    for col in ("name", "devices", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], str(r["devices"]), r["description"])
    make_console().print(table)
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (exit code 2), like every other user error. An epilog
    that needs work (every planner's options) is made when help is printed (``epilog_of``):
    a command that plans with one planner imports only that planner."""

    epilog_of: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.epilog is None and self.epilog_of is not None:
            self.epilog = self.epilog_of()
        return super().format_help()

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")

    def _get_value(self, action: argparse.Action, arg_string: str):
        """An option given an empty value is refused, never read as its default."""
        if arg_string == "" and action.option_strings:
            raise argparse.ArgumentError(action, "an empty value; give one, or leave the option out")
        return super()._get_value(action, arg_string)


def _add_run_parser(sub) -> None:
    sp = sub.add_parser("run", help="train with a plan on torch.distributed; measured vs predicted time")
    sp.add_argument("plan", help="plan JSON (its nodes must be the model's layers)")
    sp.add_argument("--model", required=True, help=MODEL_SPEC_HELP)
    sp.add_argument("--steps", type=_positive_int, default=5, help="measured iterations (default 5)")
    sp.add_argument("--warmup", type=non_negative_int, default=1, help="iterations before measuring (default 1)")
    sp.add_argument("--threads", type=threads, default=1, help="threads per worker process (default 1)")
    sp.add_argument("--hang-timeout", type=positive_seconds, default=60.0,
                    help="seconds without progress on any rank before the run is ended, naming the rank "
                         "that stopped first (default 60)")
    sp.add_argument("--timeout", type=positive_seconds, default=None, help="optional wall-clock cap in seconds")
    sp.add_argument("--schedule-csv", help="run this compute-only schedule CSV (one row a pipeline rank, as "
                                           "'export-plan --to torchtitan' writes) on torch's pipelining")
    _device_options(sp)
    sp.add_argument("--check", action="store_true",
                    help="also train in one process and compare parameters and buffers; exit 1 unless "
                         "they agree (check.verdict: pass, fail or not comparable)")
    sp.add_argument("--trace", help="write the measured step (the median one) as a Chrome/Perfetto trace")
    sp.add_argument("--gantt", help="draw the measured step as a Gantt chart (PNG, SVG or PDF)")
    sp.add_argument("--vs-prediction", action="store_true",
                    help="with --gantt: each device's predicted row above its measured one; report the "
                         "per-action error (action_error in --json)")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_run)


def _device_options(sp) -> None:
    """``--device`` and ``--precision`` of ``run`` (runtime/device.py)."""
    sp.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto (default): a GPU a process over NCCL when this machine has one for each, else CPU "
                         "processes over gloo")
    sp.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="fp32 (default) or bf16 autocast (matrix products in bf16, the loss and optimizer in fp32)")


def _planner_names() -> list[str]:
    from ..planners.base import MODULES  # the names, without importing every planner

    return sorted(MODULES)


def _schedule_names() -> list[str]:
    from ..schedule.generators import SCHEDULES

    return list(SCHEDULES)


def _planner_epilog() -> str:
    """The planners' -O options, for `plan --help` (all of them: `pipeplan planners`)."""
    from ..planners.base import planner_catalog

    lines = ["planner options (-O KEY=VALUE, or -O PLANNER.KEY=VALUE):"]
    for e in planner_catalog():
        for o in e["options"]:
            extra = o.get("range") or ("|".join(o["choices"]) if "choices" in o else o["type"])
            lines.append(f"  {e['name']}: {o['name']} ({extra}, default {o['default']})")
    return "\n".join(lines)


def _model_cluster(sp, required: bool = True) -> None:
    """The inputs plan, compare and train share."""
    sp.add_argument("--model", required=required, help="graph.txt / folder, graph .json, or zoo:NAME[?k=v&..]")
    sp.add_argument("--cluster", required=required, help="preset name, hier:..., or a YAML/JSON file")
    sp.add_argument("--microbatches", type=_positive_int, default=None,
                    help="microbatches per iteration (default 32, or chosen with --global-batch)")
    sp.add_argument("--global-batch", type=_positive_int, default=None, metavar="N",
                    help="samples per iteration: choose the microbatch size and count (the model's "
                         "profile must say its microbatch size)")
    sp.add_argument("--optimizer", default="adam", choices=["sgd", "momentum", "adam"],
                    help="optimizer whose state counts in memory (default adam)")
    sp.add_argument("--memory-limit", help="memory per device, overriding the cluster's (e.g. 16GiB)")
    sp.add_argument("--memory-reserve", help="memory per device no plan may use (CUDA context, NCCL buffers, "
                                             "fragmentation), overriding the kinds' defaults (e.g. 4GiB, 0)")
    sp.add_argument("-O", "--planner-option", action="append", metavar="KEY=VALUE",
                    help="planner option, e.g. replicas=split for dp ('pipeplan planners' lists them)")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")


def _add_train_parser(sub) -> None:
    sp = sub.add_parser("train", help="train a learning planner (drl-pp on a model and cluster; automap-infer on "
                                      "generated problems); save a checkpoint")
    sp.add_argument("agent", metavar="NAME", help=f"the learning planner: {', '.join(LEARNING_PLANNERS)}")
    _model_cluster(sp, required=False)
    sp.add_argument("--data", choices=["mix", "wide", "generated", "cnn"], default=None,
                    help="automap-infer's training problems: generated and zoo models (mix, the default), the same "
                         "with decoder LLMs, random graphs and clusters of up to 512 GPUs (wide), generated only, or "
                         "the zoo's CNNs (the paper's CNN fine-tuning)")
    sp.add_argument("--schedule", default=None, help=f"{', '.join(_schedule_names())} (default 1f1b)")
    sp.add_argument("--budget", default=None, help="a wall-clock cap, e.g. 90s, 3m, 1h (alone: the only limit; "
                                                   "not reproducible across machines)")
    sp.add_argument("--evaluations", type=_positive_int, default=None,
                    help="the budget: plans scored (drl-pp) or episodes (automap-infer), reproducible on any "
                         f"machine (default {', '.join(f'{v:,} for {k}' for k, v in TRAIN_EVALUATIONS.items())} "
                         "unless --budget alone is given)")
    sp.add_argument("--seed", type=_seed, default=0, help="seed of the weights and samples (default 0)")
    sp.add_argument("--init", help="start from this checkpoint (fine-tune) instead of from scratch")
    sp.add_argument("--measured", action="store_true",
                    help="drl-pp: score plans by running them (DRL-PP §3.4): --model is then a runtime model spec "
                         "(example:NAME, hf:..., module:factory), profiled here, and each distinct plan is trained "
                         "for a few steps on one CPU process per device of --cluster (from pipeplan calibrate)")
    sp.add_argument("--out", help="write the checkpoint (.pt) here, and its learning curve as .csv and .png beside it "
                                  "(default: NAME.pt, e.g. drl-pp.pt, in the current directory)")
    sp.set_defaults(fn=cmd_train)


def _version() -> str:
    """The installed package's version (its metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:
        return version("pipeplan")
    except PackageNotFoundError:
        return __version__


@functools.lru_cache(maxsize=1)
def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, built once a process (argparse keeps no state between
    ``parse_args`` calls; building it is a third of a short command's time)."""
    p = _Parser(prog="pipeplan", description="Plan pipeline-parallel DNN training.")
    p.add_argument("--version", action="version", version=f"pipeplan {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    sp = sub.add_parser("plan", help="plan one model on one cluster", formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.epilog_of = _planner_epilog
    _model_cluster(sp)
    sp.add_argument("--planner", default="best",
                    help=f"{', '.join(_planner_names())}, or 'best': every planner, keep the fastest plan that "
                         "fits (default)")
    sp.add_argument("--schedule", default=None, help=f"{', '.join(_schedule_names())} (default: the planner's)")
    sp.add_argument("--out", help="write the plan JSON here")
    sp.set_defaults(fn=cmd_plan)

    _add_plan_file_parsers(sub)

    sp = sub.add_parser("compare", help="run several planners on the same inputs and rank them")
    _model_cluster(sp)
    sp.add_argument("--planners", type=_names, help="comma-separated planner names (default: all)")
    sp.add_argument("--gantt", help="write the best plan's Gantt chart (PNG, SVG or PDF) here")
    sp.add_argument("--out", help="write the best plan's JSON here (as 'pipeplan plan' would)")
    sp.set_defaults(fn=cmd_compare)

    sp = sub.add_parser("profile", help="measure a PyTorch model's layers on this machine")
    sp.add_argument("model_spec", help=MODEL_SPEC_HELP)
    sp.add_argument("--microbatch", type=_positive_int, help="samples per microbatch (default: the example input's)")
    sp.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    sp.add_argument("--threads", type=threads, default=1, help="threads (use the runtime's, default 1)")
    sp.add_argument("--warmup", type=non_negative_int, default=3, help="repetitions before measuring (default 3)")
    sp.add_argument("--reps", type=_positive_int, default=10, help="repetitions; the median is kept")
    sp.add_argument("--timeout", type=positive_seconds, default=PROFILE_TIMEOUT_S,
                    help=f"give up on a model that takes longer than this, in seconds (default {PROFILE_TIMEOUT_S:g})")
    sp.add_argument("--out", help="write the graph JSON here")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_profile)

    sp = sub.add_parser("export", help="a PyTorch model's ATen-op graph through torch.export (roofline times)")
    sp.add_argument("model_spec", help=MODEL_SPEC_HELP)
    sp.add_argument("--out", required=True, help="write the graph JSON here")
    sp.add_argument("--microbatch", type=_positive_int, help="samples per microbatch (default: the example input's)")
    sp.add_argument("--measured", help="a 'pipeplan profile' graph JSON of the same model and microbatch: scale "
                                       "the ops of each profiled layer to its measured times")
    sp.set_defaults(fn=cmd_export)

    sp = sub.add_parser("calibrate", help="measure this machine's worker processes and links")
    sp.add_argument("--workers", type=_positive_int, help="worker processes (default: the GPUs, else 2)")
    sp.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    sp.add_argument("--threads", type=threads, default=1, help="threads per worker (default 1)")
    sp.add_argument("--seconds", type=calibration_seconds, default=2.0,
                    help="length of each compute measurement in seconds (at most 3600)")
    sp.add_argument("--model", help="benchmark this model's training step (MODEL_SPEC) instead of a fixed MLP")
    sp.add_argument("--no-runtime", action="store_true",
                    help="skip measuring the executor's per-action overhead (a short real run)")
    sp.add_argument("--force", action="store_true",
                    help="start more worker processes than 4 a CPU core (refused otherwise)")
    sp.add_argument("--out", help="write the cluster YAML here")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_calibrate)

    _add_run_parser(sub)

    _add_train_parser(sub)

    _add_ir_parsers(sub)

    sp = sub.add_parser("planners", help="list the planners, their default schedules and options")
    sp.add_argument("--verbose", action="store_true", help="describe every option (default: their names)")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_planners)
    sp = sub.add_parser("models", help="list the zoo models")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_models)
    sp = sub.add_parser("clusters", help="list the cluster presets")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_clusters)
    return p


def _add_plan_file_parsers(sub) -> None:
    """The commands that read a plan file: simulate, explain, export-plan."""
    sp = sub.add_parser("simulate", help="simulate a plan file; export its timeline")
    sp.add_argument("plan", help="plan JSON written by 'pipeplan plan --out'")
    sp.add_argument("--schedule", default=None, help=f"simulate under another schedule: {', '.join(_schedule_names())}")
    sp.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    sp.add_argument("--gantt", help="write a Gantt chart (PNG, SVG or PDF) here")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_simulate)

    sp = sub.add_parser("explain", help="a decoder LLM plan's iteration term by term (compute, recomputation, "
                                        "exposed communication, bubble, ...); with a second plan, the difference")
    sp.add_argument("plan", help="plan JSON written by 'pipeplan plan --out'")
    sp.add_argument("plan_b", nargs="?", default=None, metavar="PLAN_B", help="a second plan to set against the first")
    sp.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    sp.set_defaults(fn=cmd_explain)

    sp = sub.add_parser("report", help="one self-contained HTML page of a plan: summary, timeline, memory per GPU, "
                                       "where the iteration goes; with --compare, other plans set against it")
    sp.add_argument("plan", help="plan JSON written by 'pipeplan plan --out'")
    sp.add_argument("--compare", nargs="+", default=[], metavar="PLAN", help="other plan files for the comparison")
    sp.add_argument("--html", required=True, help="the page to write (.html)")
    sp.set_defaults(fn=cmd_report)

    sp = sub.add_parser("export-plan", help="a plan as an engine's configuration (Megatron-LM's arguments, "
                                            "torchtitan's config)")
    sp.add_argument("plan", help="plan JSON written by 'pipeplan plan --out'")
    sp.add_argument("--to", required=True, choices=("megatron", "torchtitan", "pipelining"),
                    help="the engine (pipelining: torch.distributed.pipelining's schedule CSV alone, any decoder)")
    sp.add_argument("--out", help="torchtitan, pipelining: the folder for the files (0.2.2's TOML, 0.3's config "
                                  "module, launch lines, schedule CSV)")
    sp.add_argument("--launch", choices=("torchrun", "slurm"), help="megatron: print a bash script that launches "
                    "the run on the plan's nodes (torchrun on each, or one Slurm job), data and tokenizer as "
                    "variables it requires")
    sp.set_defaults(fn=cmd_export_plan)


def _add_ir_parsers(sub) -> None:
    """``shard`` (Auto-MAP's operator partitioning) and ``dynamic`` (DynPartition)."""
    from .dynamic import add_parser as add_dynamic_parser
    from .shard import add_parser as add_shard_parser

    add_shard_parser(sub, _positive_int)
    add_dynamic_parser(sub, _positive_int)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run its command; a user error is one line and exit code 2, Ctrl-C
    (from the first import on) one line and 130."""
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[2:] if argv is None else argv[1:])  # the command, for checkpoints to cite
        with _sigterm_unwinds():
            return args.fn(args)
    except (PipeplanError, Infeasible) as e:
        print(f"pipeplan: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted(argv, "Ctrl-C"), file=sys.stderr)
        return 130
    except (ImportError, RuntimeError) as e:  # Ctrl-C inside an extension module's initialization, or
        if not from_ctrl_c(e):  # a class body's __set_name__ (dataclass fields), surfaces as these
            raise
        print(interrupted(argv, "Ctrl-C"), file=sys.stderr)
        return 130
    except Terminated:
        print(interrupted(argv, "SIGTERM"), file=sys.stderr)
        return 128 + signal.SIGTERM


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM raises ``Terminated`` in the main thread, so that a command ends as after
    Ctrl-C (its ``finally`` blocks end worker processes and remove partial outputs)."""
    def handler(signum, frame):
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
