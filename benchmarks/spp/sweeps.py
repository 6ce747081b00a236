"""SPP's trace-driven simulation sweeps (SPP §V-B, Fig. 5-10) in pipeplan's simulator.

Default setting (SPP §V-B): BERT-large (27 nodes: embeddings, 24 transformer layers, pooler,
SQuAD head) from pipeplan's zoo, microbatch size 6, 32 microbatches, on ``spp_like()`` (the
``spp-sim`` preset: 8 servers x 4 V100; the first 3 servers' intra-server links drawn from
U[96,128] Gbps, the other 5 from U[160,200] Gbps; links between servers from U[32,40] Gbps;
seed 0). Each figure varies one thing and compares DP, GPipe, PipeDream, HetPipe and SPP:

  Fig. 5   number of microbatches M: 8, 16, 32, 64, 128 (microbatch size stays 6)
  Fig. 6   inter-server bandwidth: low U[10,16], medium U[32,40] (default), high U[80,100] Gbps
  Fig. 7   connectivity (servers x GPUs): 6x2, 3x4, 1x8 (the paper's), 8x4 (default), 4x8;
           PCIe servers = round(3/8 x servers), spp_like's default proportion
  Fig. 8   BERT with 24, 48, 72 transformer layers
  Fig. 9   activation sizes x1, x2, x4, x8 (``Graph.scaled(act=k)``)
  Fig. 10  SPP on the default setting: W_PRM(xi) and the simulated iteration time of PRM's
           best xi-stage plan for every xi; the xi SPP picks
  seeds    the default setting on five draws of the random link speeds (seeds 0-4)

Speed-up as in SPP Table III: (baseline - SPP) / SPP. OOM: the planner has no plan that fits
in GPU memory. Writes benchmarks/results/spp/sweeps.md, sweeps.json and fig5_microbatches.png
... fig10_stages.png; ``--quick`` runs a reduced sweep and writes to a temporary directory
unless ``--out`` is given.

    python benchmarks/spp/sweeps.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeplan.cluster.presets import spp_like  # noqa: E402
from pipeplan.graph import load_graph  # noqa: E402
from pipeplan.plan import Plan, Stage  # noqa: E402
from pipeplan.planners import PlanOptions  # noqa: E402
from pipeplan.planners.compare import compare  # noqa: E402
from pipeplan.sim import simulate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import RESULTS, save_figure, write_json, write_markdown  # noqa: E402

PLANNERS = ["dp", "gpipe", "pipedream", "hetpipe", "spp"]
BASELINES = PLANNERS[:-1]
LABEL = {"dp": "DP", "gpipe": "GPipe", "pipedream": "PipeDream", "hetpipe": "HetPipe", "spp": "SPP"}
COLOR = {"dp": "#8c8c8c", "gpipe": "#1f77b4", "pipedream": "#ff7f0e", "hetpipe": "#2ca02c", "spp": "#d62728"}
MODEL = "zoo:bert-large?microbatch=6"
M_DEFAULT = 32
BANDWIDTH = {"low": (10, 16), "medium": (32, 40), "high": (80, 100)}


def figures(quick: bool) -> list[dict]:
    """Each figure: id, title, x-axis label, and its points (label, graph spec, act scale,
    cluster kwargs, microbatches)."""
    def pt(label, model=MODEL, act=1, cluster=None, m=M_DEFAULT):
        return {"label": label, "model": model, "act": act, "cluster": cluster or {}, "microbatches": m}

    ms = [8, 32, 128] if quick else [8, 16, 32, 64, 128]
    bws = ["low", "high"] if quick else ["low", "medium", "high"]
    conns = [(3, 4), (8, 4)] if quick else [(6, 2), (3, 4), (1, 8), (8, 4), (4, 8)]
    layers = [24, 48] if quick else [24, 48, 72]
    acts = [1, 8] if quick else [1, 2, 4, 8]
    return [
        {"id": "fig5", "file": "fig5_microbatches.png", "title": "Fig. 5: number of microbatches M",
         "xlabel": "microbatches per iteration (M), microbatch size 6",
         "points": [pt(f"M={m}", m=m) for m in ms]},
        {"id": "fig6", "file": "fig6_bandwidth.png", "title": "Fig. 6: inter-server bandwidth",
         "xlabel": "inter-server bandwidth (Gbps, uniform per server pair)",
         "points": [pt(f"{k} [{BANDWIDTH[k][0]},{BANDWIDTH[k][1]}]", cluster={"inter": BANDWIDTH[k]})
                    for k in bws]},
        {"id": "fig7", "file": "fig7_connectivity.png", "title": "Fig. 7: inter-GPU connectivity",
         "xlabel": "servers x GPUs per server (servers with PCIe links = round(3/8 x servers), the rest NVLink)",
         "points": [pt(f"{s}x{g} ({round(s * 3 / 8)} PCIe)",
                       cluster={"servers": s, "gpus": g, "pcie_servers": round(s * 3 / 8)})
                    for s, g in conns]},
        {"id": "fig8", "file": "fig8_layers.png", "title": "Fig. 8: BERT with more transformer layers",
         "xlabel": "transformer layers",
         "points": [pt(f"BERT-{n}", model=f"{MODEL}&layers={n}") for n in layers]},
        {"id": "fig9", "file": "fig9_activations.png", "title": "Fig. 9: activation (inter-layer data) sizes",
         "xlabel": "activation size scale",
         "points": [pt(f"x{k}", act=k) for k in acts]},
    ]


def run_point(p: dict) -> dict:
    g = load_graph(p["model"])
    if p["act"] != 1:
        g = g.scaled(act=p["act"])
    c = spp_like(**p["cluster"])
    t0 = time.perf_counter()
    rows = {r.planner: r for r in compare(g, c, PLANNERS, PlanOptions(microbatches=p["microbatches"]))}
    wall = time.perf_counter() - t0
    out = {"label": p["label"], "model": p["model"], "act_scale": p["act"], "microbatches": p["microbatches"],
           "cluster": {"name": c.name, "devices": len(c), **{k: list(v) if isinstance(v, tuple) else v
                                                            for k, v in p["cluster"].items()}},
           "wall_s": wall, "planners": {}}
    for name in PLANNERS:
        r = rows[name]
        if not r.fits:
            out["planners"][name] = {"iteration_s": None, "status": "OOM" if r.error is None else "error",
                                     "error": r.memory_verdict}
            continue
        plan = r.plan
        out["planners"][name] = {"iteration_s": r.iteration_s, "status": "ok", "search_s": plan.search_s,
                                 "stages": plan.num_stages, "replication": plan.replication(),
                                 "efficiency": r.result.efficiency, "schedule": plan.schedule,
                                 "gpu_utilization": 1.0 - r.result.bubble_fraction}
    spp = out["planners"]["spp"]["iteration_s"]
    for name in BASELINES:
        t = out["planners"][name]["iteration_s"]
        out["planners"][name]["spp_speedup"] = (t - spp) / spp if t is not None and spp else None
    if rows["spp"].plan is not None:
        out["spp_per_stage_count"] = rows["spp"].plan.extra["per_stage_count"]
    # diagnostic: pipeplan's DP gives whole microbatches to GPUs in turn, so with M < GPUs
    # some GPUs idle; the same DP plan with every microbatch split over all GPUs
    dp = Plan(g, c, [Stage(list(g.ids), c.names)], p["microbatches"], schedule="1f1b", replicas="split")
    res = simulate(dp, timeline=False)
    out["dp_split_s"] = None if res.over_memory else res.iteration_s
    return out


def point_key(p: dict) -> str:
    return json.dumps([p["model"], p["act"], sorted(p["cluster"].items()), p["microbatches"]], default=str)


def cell(pr: dict) -> str:
    if pr["iteration_s"] is None:
        return pr["status"].upper() if pr["status"] == "OOM" else "n/a"
    sp = pr.get("spp_speedup")
    return f"{pr['iteration_s']:.3f}" + (f" ({sp:+.1%})" if sp is not None else "")


def plan_text(pr: dict) -> str:
    if pr["iteration_s"] is None:
        return "-"
    rep = pr["replication"]
    if len(set(rep)) == 1:
        return f"{pr['stages']} x {rep[0]}"
    return f"{pr['stages']}: " + "-".join(map(str, rep))


def figure_md(fig: dict, res: list[dict]) -> list[str]:
    md = [f"## {fig['title']}", "", f"x: {fig['xlabel']}.", "",
          "| setting | " + " | ".join(LABEL[n] for n in PLANNERS) + " | SPP stages x replicas | GPipe stages |",
          "|---|" + "---|" * (len(PLANNERS) + 2)]
    for r in res:
        pl = r["planners"]
        md.append(f"| {r['label']} | " + " | ".join(cell(pl[n]) for n in PLANNERS)
                  + f" | {plan_text(pl['spp'])} | {pl['gpipe'].get('stages', '-')} |")
    md.append("")
    if fig["id"] == "fig5":
        md += ["SPP's plan per M: mean GPU utilization (compute busy time / iteration time, averaged over "
               "the GPUs; here equal to the simulator's efficiency, lower bound / iteration time, since "
               "the bound is all work spread evenly over the 32 identical GPUs):", "",
               "| M | SPP GPU utilization | DP, microbatches split over all GPUs (s) |",
               "|---|---|---|"]
        for r in res:
            sp = r["planners"]["spp"]
            md.append(f"| {r['microbatches']} | {sp['gpu_utilization']:.1%} | "
                      + (f"{r['dp_split_s']:.3f}" if r.get("dp_split_s") else "-") + " |")
        md += ["", "The last column is a diagnostic, not a planner: pipeplan's `dp` gives whole "
               "microbatches to the GPUs in turn, so with M < 32 some GPUs idle; splitting each "
               "microbatch over all GPUs is what DP with the same mini-batch could do at best.", ""]
    return md


def bar_figure(fig: dict, res: list[dict], path: Path) -> None:
    labels = [r["label"] for r in res]
    n, k = len(labels), len(PLANNERS)
    width = 0.8 / k
    fw = max(7.0, 1.6 * n + 2.5)
    f, ax = plt.subplots(figsize=(fw, 4.6), dpi=110)
    top = max((r["planners"][p]["iteration_s"] or 0) for r in res for p in PLANNERS)
    for j, name in enumerate(PLANNERS):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(n)]
        ys = [r["planners"][name]["iteration_s"] for r in res]
        ax.bar(xs, [y or 0 for y in ys], width, label=LABEL[name], color=COLOR[name],
               edgecolor="black", linewidth=0.4)
        for x, y, r in zip(xs, ys, res):
            if y is None:
                ax.text(x, top * 0.01, r["planners"][name]["status"].upper(), rotation=90, ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks(range(n))
    ax.set_xticklabels(labels)
    ax.set_xlabel(fig["xlabel"])
    ax.set_ylabel("iteration time (s)")
    ax.set_title(fig["title"] + " — BERT-large, simulated" if fig["id"] != "fig8" else fig["title"] + " — simulated")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if fig.get("log"):
        ax.set_yscale("log")
    ax.legend(ncol=len(PLANNERS), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    f.tight_layout()
    save_figure(f, path)
    plt.close(f)


def stages_figure(per: list[dict], picked: int, path: Path) -> None:
    xs = [e["stages"] for e in per]
    f, ax = plt.subplots(figsize=(8.5, 4.6), dpi=110)
    ax.plot(xs, [e["iteration_s"] for e in per], "o-", color=COLOR["spp"], label="simulated iteration time")
    ax.plot(xs, [e["w_prm_s"] for e in per], "s--", color="#1f77b4", label=r"$\mathcal{W}_{PRM}$ (PRM's objective)")
    best = next(e for e in per if e["stages"] == picked)
    ax.plot([picked], [best["iteration_s"]], marker="*", markersize=18, color="gold", markeredgecolor="black",
            linestyle="none", label=f"SPP's pick: {picked} stages ({best['iteration_s']:.3f} s)")
    ax.set_xlabel("number of stages |S| (PRM's best plan with exactly that many stages)")
    ax.set_ylabel("time (s)")
    ax.set_title("Fig. 10: training time and $\\mathcal{W}_{PRM}$ vs number of stages — BERT-large, spp-sim, M=32")
    ax.set_xticks(xs[::2] if len(xs) > 16 else xs)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    f.tight_layout()
    save_figure(f, path)
    plt.close(f)


def cached(p: dict, cache: dict[str, dict]) -> dict:
    """The point's result, run once per distinct setting (the default recurs in several figures)."""
    key = point_key(p)
    if key not in cache:
        cache[key] = run_point(p)
    return cache[key]


def sweep_figures(figs: list[dict], cache: dict[str, dict], out_dir: Path) -> tuple[dict, list[str], list[str]]:
    """Fig. 5-9: their data, Markdown sections and one summary line per point; draws each."""
    data, md, summary = {}, [], []
    for fig in figs:
        res = [{**cached(p, cache), "label": p["label"]} for p in fig["points"]]
        data[fig["id"]] = {"title": fig["title"], "xlabel": fig["xlabel"], "points": res}
        md += figure_md(fig, res)
        bar_figure(fig, res, out_dir / fig["file"])
        for r in res:
            pl = r["planners"]
            best_base = min((pl[b]["iteration_s"], b) for b in BASELINES if pl[b]["iteration_s"] is not None)
            spp = pl["spp"]["iteration_s"]
            summary.append(f"{fig['id']} {r['label']:<20} spp={spp:.3f}s  best baseline {best_base[1]}="
                           f"{best_base[0]:.3f}s ({(best_base[0] - spp) / spp:+.1%})  "
                           + " ".join(f"{b}={cell(pl[b])}" for b in BASELINES))
    return data, md, summary


def stages_section(default: dict, out_dir: Path) -> tuple[dict, list[str], str]:
    """Fig. 10: the default setting's SPP plan per number of stages; data, Markdown, summary."""
    per = default["spp_per_stage_count"]
    picked = default["planners"]["spp"]["stages"]
    w_min = min(e["w_prm_s"] for e in per)
    data = {"title": "Fig. 10: W_PRM and training time vs number of stages", "picked_stages": picked,
            "per_stage_count": per, "argmin_w_prm": next(e["stages"] for e in per if e["w_prm_s"] == w_min)}
    md = ["## Fig. 10: W_PRM and training time vs number of stages (SPP, default setting)", "",
          "For each number of stages xi, PRM's plan minimising 𝒲(xi) (W_PRM, PRM's objective: the largest "
          "time of all M microbatches on one stage or one channel, seconds) and that plan's simulated "
          "iteration time with SPP's PE schedule. **Bold**: the plan SPP picks (shortest simulated "
          "time).", "",
          "| stages | W_PRM (s) | iteration (s) |", "|---|---|---|"]
    for e in per:
        b = "**" if e["stages"] == picked else ""
        md.append(f"| {b}{e['stages']}{b} | {b}{e['w_prm_s']:.3f}{b} | {b}{e['iteration_s']:.3f}{b} |")
    md.append("")
    stages_figure(per, picked, out_dir / "fig10_stages.png")
    summary = (f"fig10 SPP picks {picked} stages ({default['planners']['spp']['iteration_s']:.3f}s); "
               f"W_PRM smallest at {data['argmin_w_prm']} stages; "
               + " ".join(f"{e['stages']}:{e['iteration_s']:.3f}" for e in per[:10]))
    return data, md, summary


def w_argmin(r: dict) -> int:
    """The number of stages whose PRM plan has the smallest W_PRM."""
    return min(r["spp_per_stage_count"], key=lambda e: e["w_prm_s"])["stages"]


def seed_section(seeds: list[int], cache: dict[str, dict]) -> tuple[list[dict], list[str], list[str]]:
    """The default setting on other draws of the cluster's random link speeds."""
    seed_res = [cached({"label": f"seed {s_}", "model": MODEL, "act": 1, "cluster": {"seed": s_} if s_ else {},
                        "microbatches": M_DEFAULT}, cache) for s_ in seeds]
    data = [{"seed": s_, **{n: r["planners"][n]["iteration_s"] for n in PLANNERS},
             "spp_stages": r["planners"]["spp"]["stages"], "argmin_w_prm": w_argmin(r),
             "per_stage_count": r["spp_per_stage_count"]} for s_, r in zip(seeds, seed_res)]
    md = ["## Seed check: the default setting on other draws of the link speeds", "",
          "`spp_like(seed=s)`: the same U[..] ranges, other draws. Seconds per iteration; SPP's "
          "speed-up over each baseline in brackets; SPP's plan; the number of stages whose PRM plan "
          "has the smallest W_PRM, with its simulated time.", "",
          "| seed | " + " | ".join(LABEL[n] for n in PLANNERS) + " | SPP plan | argmin W_PRM |",
          "|---|" + "---|" * (len(PLANNERS) + 2)]
    summary = []
    for s_, r in zip(seeds, seed_res):
        wa = w_argmin(r)
        wt = next(e["iteration_s"] for e in r["spp_per_stage_count"] if e["stages"] == wa)
        pl = r["planners"]
        md.append(f"| {s_} | " + " | ".join(cell(pl[n]) for n in PLANNERS)
                  + f" | {plan_text(pl['spp'])} | {wa} stages, {wt:.3f} s |")
        summary.append(f"seed {s_}: spp={pl['spp']['iteration_s']:.3f}s with {pl['spp']['stages']} stages; "
                       + " ".join(f"{b}={cell(pl[b])}" for b in BASELINES))
    md.append("")
    return data, md, summary


INTRO = ("Seconds per training iteration predicted by pipeplan's simulator for each planner's plan; "
         "in brackets SPP's speed-up over that baseline, (baseline - SPP) / SPP as in SPP Table III "
         "(negative: the baseline is faster). OOM: the planner has no plan that fits in GPU memory. "
         "Default setting: BERT-large (zoo, 27 nodes), microbatch size 6, M = 32, `spp_like()` "
         "(= `spp-sim`: 8 servers x 4 V100, 3 PCIe servers U[96,128] Gbps, 5 NVLink servers "
         "U[160,200] Gbps, U[32,40] Gbps between servers, seed 0). PipeDream and HetPipe run "
         "synchronous 1F1B with a flush, as in the paper. \"SPP stages x replicas\": SPP's plan "
         "(stage count x devices per stage, or the list when uneven).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced sweep (smoke run)")
    ap.add_argument("--out", type=lambda s: Path(s).resolve(), default=None,
                    help="output folder (default: benchmarks/results/spp; --quick: a temporary folder)")
    args = ap.parse_args()
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="spp-sweeps-")) if args.quick else RESULTS / "spp")
    t_start = time.perf_counter()
    figs = figures(args.quick)
    cache: dict[str, dict] = {}
    data = {"model": MODEL, "default_microbatches": M_DEFAULT, "planners": PLANNERS, "quick": args.quick,
            "speedup": "(baseline - spp) / spp"}
    data["figures"], fig_md, summary = sweep_figures(figs, cache, out_dir)
    default = cached({"label": "default", "model": MODEL, "act": 1, "cluster": {}, "microbatches": M_DEFAULT},
                     cache)
    data["figures"]["fig10"], stages_md, stages_line = stages_section(default, out_dir)
    data["seed_check"], seed_md, seed_lines = seed_section([0, 1, 2] if args.quick else [0, 1, 2, 3, 4], cache)
    total = time.perf_counter() - t_start
    data["runtime_s"] = total
    md = ["# SPP §V-B simulation sweeps (Fig. 5-10) in pipeplan", "",
          ("Reduced sweep (`--quick`). " if args.quick else "") + INTRO, "", *fig_md, *stages_md, *seed_md,
          f"Runtime: {total:.1f} s for {len(cache)} settings x {len(PLANNERS)} planners."]
    write_markdown(out_dir / "sweeps.md", "\n".join(md) + "\n")
    write_json(out_dir / "sweeps.json", data)
    print("\n".join([*summary, stages_line, *seed_lines]))
    print(f"{len(cache)} settings in {total:.1f} s; wrote {out_dir}/sweeps.md, sweeps.json and "
          f"{', '.join(f['file'] for f in figs)}, fig10_stages.png")


if __name__ == "__main__":
    main()
