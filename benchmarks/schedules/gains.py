"""Zero-bubble and interleaved schedules against 1F1B: predicted on the zoo's transformers,
measured on this machine's CPU runtime.

Predicted: bert-large, bert-48, xlnet-large, transformer, t5-base, t5-3b and t5-11b (the zoo's
defaults) on p = 2, 4, 8 V100s of one server (300 Gbps NVLink-class links), M = 8 and 32
microbatches, stages of equal layers as Megatron lays them out (``planners/megatron.py``:
repeated blocks counted, embeddings and heads riding along; no recomputation, no data
parallelism): 1f1b and zb-h1 on p stages; interleaved-1f1b with v = 2, 3, 4 chunks per
device where v p divides the layers; zb-v on 2p stages where 2p divides them. Gain =
T(1f1b) / T - 1. Also reported: the peak memory of the busiest device against 1F1B's, and the
balance term (1F1B's busiest device's work over the schedule's, which more, smaller chunks
change as well as the bubble).

Measured: 8 identical transformer blocks (``_blocks.py``, d=128, microbatch 8 of 64 tokens) on
--workers gloo processes of this machine (1 thread each), the same layouts with --workers
devices, M = --microbatches; --runs passes over the schedules (each pass runs every schedule
once, --steps steps after 2 warm-up steps, the median step; a schedule's time is its fastest
pass, as other work on the machine only slows a pass down); each run's parameters checked
against one-process training; beside it the prediction from ``pipeplan profile`` and
``pipeplan calibrate`` of the same model. Writes benchmarks/results/schedules/gains.{json,md}.

    python benchmarks/schedules/gains.py [--workers N] [--runs R] [--steps S] [--microbatches M] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pipeplan.cluster import load_cluster
from pipeplan.graph import Graph, load_graph, linearize
from pipeplan.planners import PlanOptions
from pipeplan.planners.megatron import chunk_counts, layer_mask, megatron_plan
from pipeplan.plan import Plan
from pipeplan.sim import predicted_s, simulate

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/_results.py
sys.path.insert(0, str(HERE))  # _blocks.py, for this process and the workers it spawns
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

MODELS = ["bert-large", "bert-48", "xlnet-large", "transformer", "t5-base", "t5-3b", "t5-11b"]
DEPTHS, MICROBATCHES, CHUNKS = (2, 4, 8), (8, 32), (2, 3, 4)
CLUSTER = "hier:servers=1,gpus={p},intra=300Gbps,inter=100Gbps,kind=V100"
SPEC = "_blocks:blocks"


def layouts(layers: int, p: int) -> list[tuple[str, int]]:
    """(schedule, chunks per device) compared at depth p: 1F1B first."""
    out = [("1f1b", 1), ("zb-h1", 1)]
    out += [("interleaved-1f1b", v) for v in CHUNKS if v in chunk_counts(layers, p, "interleaved-1f1b")]
    return out + [("zb-v", 2)] * bool(chunk_counts(layers, p, "zb-v"))


def label(schedule: str, chunks: int) -> str:
    return f"{schedule} (v={chunks})" if schedule == "interleaved-1f1b" else schedule


def plan_of(graph: Graph, cluster, p: int, m: int, schedule: str, chunks: int) -> Plan:
    return megatron_plan(graph, cluster, PlanOptions(microbatches=m, schedule=schedule), p, False, chunks)


def predicted(models: list[str] = MODELS, depths: tuple[int, ...] = DEPTHS,
              microbatches: tuple[int, ...] = MICROBATCHES) -> list[dict]:
    """One row per model, depth, microbatch count and layout (1F1B's first)."""
    rows = []
    for name in models:
        graph = load_graph(f"zoo:{name}")
        layers = int(np.count_nonzero(layer_mask(graph, linearize(graph))))
        for p in depths:
            cluster = load_cluster(CLUSTER.format(p=p))
            for m in microbatches:
                base = None
                for schedule, chunks in layouts(layers, p):
                    r = simulate(plan_of(graph, cluster, p, m, schedule, chunks), timeline=False)
                    base = base or r
                    rows.append({"model": name, "layers": layers, "p": p, "m": m, "schedule": schedule,
                                 "chunks": chunks, "label": label(schedule, chunks), "iteration_s": r.iteration_s,
                                 "gain": base.iteration_s / r.iteration_s - 1,
                                 "memory_ratio": float(r.memory_bytes.max() / base.memory_bytes.max()),
                                 "balance_gain": float(base.busy_s.max() / r.busy_s.max() - 1),
                                 "bubble_fraction": r.bubble_fraction, "fits": not r.over_memory})
    return rows


def summary(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for lab in dict.fromkeys(r["label"] for r in rows if r["schedule"] != "1f1b"):
        gains = [r["gain"] for r in rows if r["label"] == lab]
        out[lab] = {"cases": len(gains), "median": statistics.median(gains), "min": min(gains), "max": max(gains),
                    "faster": sum(g > 0 for g in gains)}
    return out


def _run(plan: Plan, args, runs: list[dict]) -> None:
    from pipeplan.runtime.check import check_run
    from pipeplan.runtime.executor import RunConfig, run_plan

    out = run_plan(plan, RunConfig(SPEC, steps=args.steps, warmup=2, threads=1, timeout_s=600), predicted_s(plan))
    check = check_run(plan, SPEC, out.params, steps=args.steps + 2, lr=0.05, seed=0, threads=1,
                      microbatch=out.microbatch)
    runs.append({"measured_s": out.measured_s, "predicted_s": out.predicted_s,
                 "check": check.verdict, "max_rel_diff": check.max_rel_diff})


def split_overhead(counts: tuple[int, ...] = (1, 2, 4), reps: int = 15) -> dict[int, float]:
    """(I + W) / B of a stage of n blocks, in this process: torch's split backward
    (``stage_backward_input`` then ``stage_backward_weight``) against one backward pass."""
    import torch
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from pipeplan.runtime.models import load_model

    torch.set_num_threads(1)
    model, x = load_model(SPEC, 8, 0)
    out = {}
    for n in counts:
        stage = torch.nn.Sequential(*list(model)[:n])
        weights = list(stage.parameters())
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(2 * reps):
            split = bool(r % 2)
            inp = x.clone().requires_grad_(True)
            y = stage(inp)
            grad = torch.ones_like(y)
            t0 = time.perf_counter()
            if split:
                stage_backward_weight(iter(weights), stage_backward_input([y], [grad], [inp], iter(weights))[1])
            else:
                torch.autograd.backward([y], [grad])
            times[split].append(time.perf_counter() - t0)
            stage.zero_grad(set_to_none=True)
        out[n] = statistics.median(times[True]) / statistics.median(times[False])
    return out


def measured(args) -> dict:
    """The CPU runtime: profile and calibrate the blocks, then run each layout --runs times."""
    from pipeplan.runtime.calibrate import calibrate
    from pipeplan.runtime.profiler import profile_model

    load = os.getloadavg()[0]  # other work on the machine slows runs down: said in the results
    graph = profile_model(SPEC, reps=10, threads=1)
    cluster, _ = calibrate(workers=args.workers, threads=1, seconds=2.0, model_spec=SPEC, predict=predicted_s)
    layers = int(np.count_nonzero(layer_mask(graph, linearize(graph))))
    plans = {label(s, v): plan_of(graph, cluster, args.workers, args.microbatches, s, v)
             for s, v in layouts(layers, args.workers)}
    runs: dict[str, list[dict]] = {lab: [] for lab in plans}
    for _ in range(args.runs):
        for lab, plan in plans.items():
            _run(plan, args, runs[lab])
            print(f"{lab:<26} measured {runs[lab][-1]['measured_s'] * 1e3:7.1f} ms  predicted "
                  f"{runs[lab][-1]['predicted_s'] * 1e3:7.1f} ms  check {runs[lab][-1]['check']}", flush=True)
    best = {lab: min(r["measured_s"] for r in rs) for lab, rs in runs.items()}
    base = runs["1f1b"][0]["predicted_s"]
    rows = [{"label": lab, "stages": plans[lab].num_stages, "measured_s": [r["measured_s"] for r in rs],
             "best_s": best[lab], "median_s": statistics.median(r["measured_s"] for r in rs),
             "gain": best["1f1b"] / best[lab] - 1, "predicted_s": rs[0]["predicted_s"],
             "predicted_gain": base / rs[0]["predicted_s"] - 1, "checks": [r["check"] for r in rs],
             "max_rel_diff": max(r["max_rel_diff"] for r in rs)} for lab, rs in runs.items()]
    return {"workers": args.workers, "microbatches": args.microbatches, "steps": args.steps, "runs": args.runs,
            "model": SPEC, "layers": layers, "backward_input_fraction": graph.meta["backward_input_fraction"],
            "load_average": [load, os.getloadavg()[0]], "cores": os.cpu_count(),
            "split_cost_per_layer": graph.meta["backward_split_cost"], "split_cost_per_stage": split_overhead(),
            "rows": rows}


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def markdown(pred: list[dict], summ: dict, meas: dict, args) -> str:
    labels = list(dict.fromkeys(r["label"] for r in pred if r["schedule"] != "1f1b"))
    lines = ["# Zero-bubble and interleaved schedules against 1F1B", "",
             "Gain = T(1f1b) / T - 1 at the same depth p and microbatches M (docs/schedules.md). "
             "Predicted by the simulator on the zoo's models, p V100s of one server, equal-layer stages.", "",
             "## Predicted, summary over models x p x M", "",
             "| schedule | cases | faster than 1F1B | median gain | min | max |", "|---|---|---|---|---|---|"]
    lines += [f"| {lab} | {s['cases']} | {s['faster']} | {_pct(s['median'])} | {_pct(s['min'])} | {_pct(s['max'])} |"
              for lab, s in summ.items()]
    lines += ["", "## Predicted, per case (gain; memory of the busiest device / 1F1B's)", "",
              "| model | p | M | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
    cases = dict.fromkeys((r["model"], r["p"], r["m"]) for r in pred)
    for key in cases:
        got = {r["label"]: r for r in pred if (r["model"], r["p"], r["m"]) == key}
        cells = [f"{_pct(got[lab]['gain'])} ({got[lab]['memory_ratio']:.2f}x)" if lab in got else "-"
                 for lab in labels]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    lines += ["", f"## Measured: {meas['model']} ({meas['layers']} blocks) on {meas['workers']} gloo processes "
              f"of this machine, M = {meas['microbatches']}", "",
              f"{meas['runs']} passes over the schedules, {meas['steps']} steps each after 2 warm-up steps (the "
              "median step of a pass); the gain compares each schedule's fastest pass (other work on the machine "
              f"only slows a pass down: load average {meas['load_average'][0]:.1f} before, "
              f"{meas['load_average'][1]:.1f} after, on {meas['cores']} cores). The profile's input-gradient share: "
              f"{meas['backward_input_fraction']:.2f}; check: the trained parameters against one-process training "
              "(largest relative difference).", "",
              "Torch's split backward (I then W) costs more than one backward pass, and the more the larger the "
              "stage (its input pass walks the stage's autograd graph once per parameter): (I + W) / B = "
              + ", ".join(f"{v:.2f} for {n} block{'s' * (int(n) > 1)}" for n, v in meas["split_cost_per_stage"].items())
              + f" ({meas['split_cost_per_layer']:.2f} layer by layer in the profile, which the simulator charges to "
              "every I and W; a whole stage's larger factor it does not see).",
              "",
              "| schedule | stages | measured (ms), each pass | gain (fastest passes) | predicted (ms) | "
              "predicted gain | check |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['stages']} | {', '.join(f'{t * 1e3:.1f}' for t in r['measured_s'])} | "
              f"{_pct(r['gain'])} | {r['predicted_s'] * 1e3:.1f} | {_pct(r['predicted_gain'])} | "
              f"{'pass' if set(r['checks']) == {'pass'} else ', '.join(r['checks'])} "
              f"({r['max_rel_diff']:.1e}) |" for r in meas["rows"]]
    return "\n".join(lines) + "\n"


def check_measured(meas: dict) -> None:
    """The measured runs say what they hold, checked before anything is written: every run
    trained as one process does, gains are the ratios of the best times (SystemExit if not)."""
    rows = {r["label"]: r for r in meas["rows"]}
    base = rows["1f1b"]
    for lab, r in rows.items():
        bad = [why for why, ok in (
            ("a check did not pass", set(r["checks"]) == {"pass"} and r["max_rel_diff"] <= 1e-5),
            ("best is not the least run", min(r["measured_s"]) == r["best_s"] > 0),
            ("gain is not the ratio of best times", math.isclose(r["gain"], base["best_s"] / r["best_s"] - 1)),
            ("predicted gain is not the ratio of predictions",
             math.isclose(r["predicted_gain"], base["predicted_s"] / r["predicted_s"] - 1))) if not ok]
        if bad:
            raise SystemExit(f"gains: {lab}: {'; '.join(bad)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="gloo processes of the measured runs (the pipeline depth)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--microbatches", type=int, default=8)
    add_out_argument(ap, "schedules")
    args = ap.parse_args()
    pred = predicted()
    summ = summary(pred)
    for lab, s in summ.items():
        print(f"predicted {lab:<26} median {_pct(s['median'])}, {s['faster']}/{s['cases']} faster than 1F1B")
    meas = measured(args)
    check_measured(meas)
    write_json(args.out / "gains.json", {"predicted": pred, "summary": summ, "measured": meas})
    write_markdown(args.out / "gains.md", markdown(pred, summ, meas, args))


if __name__ == "__main__":
    main()
