"""Published against predicted: Megatron-LM SC'21 Table 1 (``megatron_sc21.yaml``, GPT models
of 1.7B to 1T parameters on 32 to 3,072 A100s) through pipeplan's simulator.

1. Each row's published configuration (TP, PP, DP, microbatch, virtual stages, full
   recomputation, no sequence parallelism, no distributed optimizer), simulated on
   ``dgx-a100xN``: predicted against published TFLOP/s per GPU (Eq. 3's count, with the
   recomputed forward), the error, and over the rows the median and worst absolute error, the
   rank correlation, and the pairs of rows whose published figures differ by more than 5% and
   10% that the prediction orders the same way. Targets: median <= 10%, worst <= 20%,
   Spearman >= 0.8 and every pair more than 10% apart in order. No constant is fitted here
   (``calibrate.py`` fits the one that is).
2. ``joint`` on the same model, GPUs and global batch, not told the published configuration:
   its plan beside the published one, its predicted model TFLOP/s per GPU (the same global
   batch, so the same FLOPs: faster is more) against the published configuration's predicted,
   and whether it is realizable (memory fits; TP within a server and dividing the heads;
   whole samples per replica). Target: never slower than the published configuration.

    .venv/bin/python benchmarks/published/megatron_sc21.py [--rows N] [--simulations K]

Writes benchmarks/results/published/megatron_sc21.json and .md; exits 1 when a target is
missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_out_argument, write_json, write_markdown  # noqa: E402
from _runs import joint, load_rows, pairs_in_order, predict, spearman  # noqa: E402

from pipeplan.planners.joint import LLM_SIMULATIONS  # noqa: E402
from pipeplan.llm import costs as llm_costs  # noqa: E402

TARGETS = {"median_abs_error": 0.10, "worst_abs_error": 0.20, "spearman": 0.8}


def accuracy(head: dict, rows: list) -> tuple[list[dict], dict]:
    """Part 1: each row's prediction and the summary against the targets."""
    out = []
    for r in rows:
        res = predict(head, r)
        hw = res.extra["hw_tflops_per_gpu"]
        out.append({"model": r.name, "gpus": r.gpus, "tp": r.tp, "pp": r.pp, "dp": r.dp, "microbatch": r.microbatch,
                    "virtual_stages": r.virtual_stages, "global_batch": r.global_batch,
                    "published_tflops_per_gpu": r.tflops_per_gpu, "predicted_tflops_per_gpu": hw,
                    "predicted_model_tflops_per_gpu": res.extra["model_tflops_per_gpu"],
                    "error": hw / r.tflops_per_gpu - 1, "iteration_s": res.iteration_s,
                    "bubble": res.bubble_fraction, "peak_memory_gib": float(res.memory_bytes.max()) / 2**30,
                    "fits": not res.over_memory})
        print(f"{r.name:>7} {r.gpus:5d} GPUs  TP {r.tp} PP {r.pp:2d} DP {r.dp:3d} v {r.virtual_stages}  "
              f"published {r.tflops_per_gpu:5.0f}  predicted {hw:6.1f} TFLOP/s per GPU  "
              f"error {out[-1]['error']:+6.1%}", flush=True)
    pub = [o["published_tflops_per_gpu"] for o in out]
    pred = [o["predicted_tflops_per_gpu"] for o in out]
    errors = [abs(o["error"]) for o in out]
    summary = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "spearman": spearman(pub, pred), "pairs_5pct": pairs_in_order(pub, pred, 0.05),
               "pairs_10pct": pairs_in_order(pub, pred, 0.10)}
    good10, all10 = summary["pairs_10pct"]
    summary["met"] = (summary["median_abs_error"] <= TARGETS["median_abs_error"]
                      and summary["worst_abs_error"] <= TARGETS["worst_abs_error"]
                      and summary["spearman"] >= TARGETS["spearman"] and good10 == all10)
    return out, summary


def versus_joint(head: dict, rows: list, accuracy_rows: list[dict], simulations: int) -> list[dict]:
    """Part 2: joint's plan per row beside the published configuration's prediction."""
    out = []
    for r, a in zip(rows, accuracy_rows):
        cfg, res, facts = joint(head, r, simulations)
        gain = a["iteration_s"] / res.iteration_s - 1
        out.append({"model": r.name, "joint": cfg.as_dict(), "joint_iteration_s": res.iteration_s,
                    "joint_model_tflops_per_gpu": res.extra["model_tflops_per_gpu"],
                    "published_model_tflops_per_gpu": a["predicted_model_tflops_per_gpu"],
                    "gain": gain, "joint_fits": not res.over_memory, "joint_bubble": res.bubble_fraction,
                    "published_bubble": a["bubble"], "configurations": facts["configurations"],
                    "simulated": len(facts["simulated"]), "never_slower": gain >= -1e-9,
                    "realizable": (not res.over_memory and cfg.tp <= head["servers_of"] and r.heads % cfg.tp == 0
                                   and r.global_batch % (cfg.dp * cfg.microbatch) == 0)})
        print(f"{r.name:>7}  joint TP {cfg.tp} PP {cfg.pp:2d} DP {cfg.dp:3d} v {cfg.vpp} mb {cfg.microbatch} "
              f"{cfg.recompute:9s} zero {cfg.zero} sp {int(cfg.sp)}  {out[-1]['joint_model_tflops_per_gpu']:6.1f} vs "
              f"{a['predicted_model_tflops_per_gpu']:6.1f} model TFLOP/s per GPU ({gain:+.1%})", flush=True)
    return out


def markdown(head: dict, acc: list[dict], summary: dict, vs: list[dict]) -> str:
    lines = ["# Megatron-LM SC'21 Table 1: published vs predicted\n", f"Source: {head['source']}.\n",
             f"End-to-end share of the kernel rate (the one calibrated constant): {llm_costs.END_TO_END}.\n",
             "| model | GPUs | TP | PP | DP | v | microbatch | published TFLOP/s | predicted | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a in acc:
        lines.append(f"| {a['model']} | {a['gpus']} | {a['tp']} | {a['pp']} | {a['dp']} | {a['virtual_stages']} | "
                     f"{a['microbatch']} | {a['published_tflops_per_gpu']:.0f} | "
                     f"{a['predicted_tflops_per_gpu']:.1f} | {a['error']:+.1%} |")
    g5, n5 = summary["pairs_5pct"]
    g10, n10 = summary["pairs_10pct"]
    lines += ["", f"Median absolute error {summary['median_abs_error']:.1%}, worst {summary['worst_abs_error']:.1%}, "
              f"Spearman {summary['spearman']:.3f}; pairs more than 5% apart in order: {g5} of {n5}; more than 10% "
              f"apart: {g10} of {n10}. Targets met: {summary['met']}.", ""]
    if vs:
        lines += ["## joint on the same model, GPUs and global batch", "",
                  "| model | joint TP x PP x DP (v) | microbatch | recompute | ZeRO | SP | joint model TFLOP/s | "
                  "published config's | gain | fits |", "|---|---|---|---|---|---|---|---|---|---|"]
        for v in vs:
            j = v["joint"]
            lines.append(f"| {v['model']} | {j['tp']} x {j['pp']} x {j['dp']} ({j['vpp']}) | "
                         f"{j['microbatch']} | {j['recompute']} | {j['zero']} | {int(j['sp'])} | "
                         f"{v['joint_model_tflops_per_gpu']:.1f} | {v['published_model_tflops_per_gpu']:.1f} | "
                         f"{v['gain']:+.1%} | {v['joint_fits']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows (default: all)")
    parser.add_argument("--simulations", type=int, default=LLM_SIMULATIONS,
                        help="joint's simulated configurations (default: joint's own)")
    parser.add_argument("--no-joint", action="store_true", help="part 1 only")
    add_out_argument(parser, "published")
    args = parser.parse_args()
    head, rows = load_rows()
    rows = rows[: args.rows] if args.rows else rows
    acc, summary = accuracy(head, rows)
    print(f"median |error| {summary['median_abs_error']:.1%}  worst {summary['worst_abs_error']:.1%}  "
          f"Spearman {summary['spearman']:.3f}  pairs >5% apart in order {summary['pairs_5pct']}  "
          f">10% {summary['pairs_10pct']}  targets met: {summary['met']}")
    vs = [] if args.no_joint else versus_joint(head, rows, acc, args.simulations)
    never_slower = all(v["never_slower"] and v["realizable"] for v in vs)
    if vs:
        print(f"joint never slower than the published configuration and realizable on every row: {never_slower}")
    data = {"source": head["source"], "end_to_end": llm_costs.END_TO_END, "targets": TARGETS, "rows": acc,
            "summary": summary, "joint": vs, "joint_never_slower": never_slower}
    write_json(args.out / "megatron_sc21.json", data)
    write_markdown(args.out / "megatron_sc21.md", markdown(head, acc, summary, vs))
    return 0 if summary["met"] and never_slower else 1


if __name__ == "__main__":
    sys.exit(main())
