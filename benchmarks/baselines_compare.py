"""Every planner on every shared profile x every cluster preset x M in {8, 32}.

``pipeplan compare`` for each case (one microbatch = the profile's batch): every planner
must answer with a plan — flagged, with its worst device and by how much, when it does not
fit — and GPipe (re-materializing) must fit where its memory allows. Writes
benchmarks/results/baselines_compare.md and .json; exits 1 if a planner gave no plan or a
named GPipe case does not fit.

    python benchmarks/baselines_compare.py [--microbatches 8 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

from pipeplan.cluster import PRESETS, load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions
from pipeplan.planners.compare import compare, default_planners

from _results import PROFILES, add_out_argument, write_json, write_markdown

MODELS = ["alexnet", "vgg16", "resnet50", "resnext101", "inception_v3", "gnmt"]
#: GPipe with re-materialization fits these (model, cluster, M).
GPIPE_FITS = [("resnet50", "1080ti-4x2", 8), ("inception_v3", "1080ti-4x2", 8), ("vgg16", "v100x4", 8)]


def table(rows: list[dict]) -> list[str]:
    out = ["| planner | schedule | replication | iteration (s) | vs dp | efficiency | memory |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['planner']} | - | - | - | - | - | no plan: {r['error']} |")
            continue
        rep = "-".join(map(str, r["replication"]))
        rep = rep if len(rep) <= 40 else rep[:37] + "..."
        sp = f"{r['speedup_vs_dp']:.2f}x" if r.get("speedup_vs_dp") else "-"
        variant = r["plan"].get("memory_variant")
        mem = "fits" if r["fits"] else f"does not fit: {r['memory']}"
        if variant:
            mem += f" (re-materializing stages {variant['recompute']}, {variant['schedule']})"
        elif r["plan"].get("recompute"):
            mem += " (re-materializing)"
        out.append(f"| {r['planner']} | {r['plan']['schedule']} | {rep} | {r['iteration_s']:.4f} | {sp} | "
                   f"{r['efficiency']:.1%} | {mem} |")
    return out


def run_case(model: str, cname: str, m: int) -> dict:
    g, c = load_graph(str(PROFILES / model)), load_cluster(cname)
    rows = [r.to_dict() for r in compare(g, c, default_planners(c), PlanOptions(microbatches=m))]
    print(f"{model:>13} on {cname:<16} M={m:<3}: " + ", ".join(
        f"{r['planner']}={r['iteration_s']:.3f}{'' if r['fits'] else '!'}" if not r.get("error")
        else f"{r['planner']}=n/a" for r in rows), flush=True)
    return {"model": model, "cluster": cname, "microbatches": m,
            "results": [{k: v for k, v in r.items() if k != "plan"} | {"schedule": r["plan"]["schedule"]}
                        if not r.get("error") else r for r in rows], "_rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 32])
    add_out_argument(ap)
    args = ap.parse_args()
    if not PROFILES.is_dir():
        print(f"no shared profiles at {PROFILES}", file=sys.stderr)
        return 1
    cases = [run_case(model, cname, m) for m in args.microbatches for model in MODELS for cname in PRESETS]
    md = ["# Every planner on the shared profiles", "",
          f"Every shared profile x every cluster preset x M in {args.microbatches}; iteration times in "
          "seconds from pipeplan's simulator; `!` in the log marks a plan that does not fit. "
          "PipeDream's plan is what its program returns (no memory check); the others fit by "
          "re-materialization or fewer microbatches in flight where that is possible.", ""]
    missing, gpipe_over = [], []
    for case in cases:
        md += [f"## {case['model']} on {case['cluster']}, M={case['microbatches']}", "", *table(case["_rows"]), ""]
        missing += [f"{case['model']}/{case['cluster']}/M={case['microbatches']}: {r['planner']}"
                    for r in case["_rows"] if r.get("error")]
        key = (case["model"], case["cluster"], case["microbatches"])
        if key in GPIPE_FITS and not any(r["planner"] == "gpipe" and r.get("fits") for r in case["_rows"]):
            gpipe_over.append("/".join(map(str, key)))
    checks = {"every_planner_answers": not missing, "missing": missing,
              "gpipe_fits_where_expected": not gpipe_over, "gpipe_over": gpipe_over}
    md += ["## Checks", "", f"- every planner gave a plan in every case: {'yes' if not missing else missing}",
           f"- GPipe fits in {', '.join('/'.join(map(str, k)) for k in GPIPE_FITS)}: "
           f"{'yes' if not gpipe_over else gpipe_over}", ""]
    write_markdown(args.out / "baselines_compare.md", "\n".join(md) + "\n")
    write_json(args.out / "baselines_compare.json", {"checks": checks,
                                          "cases": [{k: v for k, v in c.items() if k != "_rows"} for c in cases]})
    print(f"every planner answers: {not missing}; GPipe fits where expected: {not gpipe_over}")
    return 0 if not missing and not gpipe_over else 1


if __name__ == "__main__":
    sys.exit(main())
