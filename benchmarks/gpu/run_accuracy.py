"""The GPU path end to end: profile on a GPU, calibrate the GPUs, plan, train each plan on
them (NCCL, one GPU a process, CUDA-event timeline) with ``--check``, prediction error per
plan, and bf16 autocast against fp32.

The model is a Llama from a transformers config (random weights, no download), profiled on
``cuda:0`` with CUDA events; ``calibrate --device cuda`` measures every visible GPU with its
training step. Plans: the whole model on one GPU (a single process: the CUDA path without
NCCL), and with two or more GPUs a 2-stage pipeline cut where forward+backward time
balances, under gpipe, 1f1b and zb-h1, plus data parallelism over two GPUs; with four, two
pipelines of two stages. Each plan trains ``--steps`` steps after 2 warm-up steps in fp32
(the profile's precision: what the prediction is for), checked against the same training in
one process on the GPU; then the fastest plan again with bf16 autocast, checked against
bf16 training in one process. Reported per plan: predicted and measured seconds, the error,
the check's verdict and largest difference, the per-action error by kind. Needs CUDA
(``device`` lends a GPU; without one it says so and writes nothing):

    python benchmarks/gpu/run_accuracy.py [--steps N] [--out DIR]

``--cpu-smoke --out DIR`` runs the same script on 2 CPU processes with a small Llama, to
check the script itself where no GPU is lent (its figures say nothing about GPUs).

Writes benchmarks/results/gpu/run_accuracy_<gpu>.json.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import torch

from pipeplan.plan import Plan, Stage
from pipeplan.runtime.calibrate import calibrate
from pipeplan.runtime.check import check_run
from pipeplan.runtime.executor import RunConfig, run_plan
from pipeplan.runtime.profiler import profile_model
from pipeplan.runtime.timing import side_by_side
from pipeplan.sim import predicted_s, simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, write_json  # noqa: E402

SMOKE = ("hf:llama?hidden_size=64&num_hidden_layers=4&num_attention_heads=4&num_key_value_heads=2"
         "&intermediate_size=128&vocab_size=512&seq=32&microbatch=2")
SPEC = ("hf:llama?hidden_size=1024&num_hidden_layers=8&num_attention_heads=16&num_key_value_heads=4"
        "&intermediate_size=2816&vocab_size=32000&seq=512&microbatch=4")
MICROBATCHES = 8


def _cut(graph) -> int:
    cost = np.cumsum(graph.fwd + graph.bwd)
    return int(np.argmin(np.abs(cost[:-1] - cost[-1] / 2))) + 1


def plans_for(graph, cluster) -> dict[str, Plan]:
    names, dev, cut = graph.ids, cluster.names, _cut(graph)
    out = {"1 GPU": Plan(graph, cluster, [Stage(names, dev[:1])], MICROBATCHES, schedule="1f1b")}
    if len(dev) >= 2:
        for s in ("gpipe", "1f1b", "zb-h1"):
            out[f"2 stages, {s}"] = Plan(graph, cluster, [Stage(names[:cut], dev[:1]), Stage(names[cut:], dev[1:2])],
                                         MICROBATCHES, schedule=s)
        out["data parallel x2"] = Plan(graph, cluster, [Stage(names, dev[:2])], MICROBATCHES, schedule="1f1b",
                                       replicas="round-robin")
    if len(dev) >= 4:
        out["2 pipelines of 2 stages"] = Plan(graph, cluster, [Stage(names[:cut], dev[:2]), Stage(names[cut:], dev[2:4])],
                                              MICROBATCHES, schedule="1f1b", replicas="round-robin")
    return out


def run_one(plan: Plan, spec: str, device: str, precision: str, steps: int) -> dict:
    cfg = RunConfig(spec, steps=steps, warmup=2, device=device, precision=precision, timeout_s=600)
    out = run_plan(plan, cfg, predicted_s(plan))
    check = check_run(plan, spec, out.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr, seed=cfg.seed, threads=1,
                      microbatch=out.microbatch, device=out.device, precision=out.precision)
    return {"precision": precision, "processes": out.processes, "device": out.device,
            "predicted_s": out.predicted_s, "measured_s": out.measured_s, "error": out.error,
            "per_step_s": out.per_step_s, "check": check.to_dict(),
            "action_error": side_by_side(simulate(plan).timeline, out.timeline)[1]["summary"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cpu-smoke", action="store_true", help="check the script on 2 CPU processes")
    add_out_argument(parser, "gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu_smoke:  # make bench without one: the last GPU run stays
        print("run_accuracy: no CUDA device here; skipped (benchmarks/results/gpu keeps the last GPU run)")
        return
    spec, device = (SMOKE, "cpu") if args.cpu_smoke else (SPEC, "cuda")
    gpus = 2 if args.cpu_smoke else torch.cuda.device_count()
    graph = profile_model(spec, device=device, reps=10)
    cluster, _ = calibrate(workers=gpus, device=device, model_spec=spec, predict=predicted_s)
    rows = {}
    plans = plans_for(graph, cluster)
    for label, plan in plans.items():
        rows[label] = run_one(plan, spec, device, "fp32", args.steps)
        r = rows[label]
        print(f"{label:<26} predicted {r['predicted_s'] * 1e3:8.2f} ms  measured {r['measured_s'] * 1e3:8.2f} ms  "
              f"error {r['error']:6.1%}  check {r['check']['verdict']} ({r['check']['max_rel_diff']:.1e})", flush=True)
    fastest = min(rows, key=lambda k: rows[k]["measured_s"])
    bf16 = run_one(plans[fastest], spec, device, "bf16", args.steps)
    print(f"{fastest} in bf16: {bf16['measured_s'] * 1e3:.2f} ms (fp32 {rows[fastest]['measured_s'] * 1e3:.2f} ms), "
          f"check {bf16['check']['verdict']}")
    name = "cpu-smoke" if args.cpu_smoke else torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    write_json(args.out / f"run_accuracy_{slug}.json", {
        "gpu": name, "gpus": gpus, "torch": torch.__version__, "cuda": torch.version.cuda, "model": spec,
        "microbatches": MICROBATCHES, "plans": rows, "bf16": {"plan": fastest, **bf16},
        "median_abs_error": float(np.median([abs(r["error"]) for r in rows.values()]))})


if __name__ == "__main__":
    main()
