"""The joint planner against every other planner, each run on its own (``pipeplan compare``
with the default planners): the shared profiles x every cluster preset x M in {8, 32}, and
the zoo's seed-paper models on the papers' clusters. In each case joint must fit wherever
another planner fits and be no slower than the fastest fitting one (where nothing fits: no
further over memory than the least overflowing). The table gives the fastest other planner,
joint's time, what joint's plan came from (its search, a chunked variant, or a seed
planner's plan kept as it was) and joint's margin. Writes
benchmarks/results/joint/never_slower.{md,json}; exits 1 if joint loses a case.

    python benchmarks/joint/never_slower.py [--microbatches 8 32] [--set profiles zoo] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeplan.cluster import PRESETS, load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions
from pipeplan.planners.compare import compare, default_planners
from pipeplan.planners.ranking import rank_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import PROFILES, add_out_argument, write_json, write_markdown  # noqa: E402

PROFILE_MODELS = ["alexnet", "vgg16", "resnet50", "resnext101", "inception_v3", "gnmt"]
#: Zoo models of the seed papers, each on the clusters its paper used (SPP: spp-sim and its
#: testbeds; Auto-MAP: automap-a/b/c; DRL-PP: drlpp-4gpu).
ZOO_CASES = [("bert-48", "spp-sim"), ("xlnet-large", "spp-sim"), ("vgg19", "spp-sim"), ("bert-large", "v100x4"),
             ("bert-large", "1080ti-4x2"), ("t5-base", "automap-a"), ("t5-3b", "automap-c"),
             ("transformer", "drlpp-4gpu"), ("gnmt-4", "1080ti-4x2"), ("resnet50", "v100x4")]
TOL = 1e-9


def key(row) -> tuple[int, float, float]:
    return rank_key(row.result)


def run_case(model: str, graph_spec: str, cname: str, m: int) -> dict:
    g, c = load_graph(graph_spec), load_cluster(cname)
    rows = [r for r in compare(g, c, default_planners(c), PlanOptions(microbatches=m)) if r.result is not None]
    joint = next(r for r in rows if r.planner == "joint")
    others = [r for r in rows if r.planner != "joint"]
    rival = min(others, key=key)
    kj, kr = key(joint), key(rival)
    wins = kj[0] < kr[0] or (kj[0] == kr[0] and kj[1] <= kr[1] * (1 + TOL))
    case = {"model": model, "cluster": cname, "microbatches": m, "joint_s": joint.iteration_s,
            "joint_fits": joint.fits, "joint_from": joint.plan.extra["joint"]["from"],
            "joint_schedule": joint.plan.schedule, "joint_search_s": joint.search_s,
            "best_other": rival.planner, "best_other_s": rival.iteration_s, "best_other_fits": rival.fits,
            "speedup_over_best_other": rival.iteration_s / joint.iteration_s, "not_slower": wins,
            "others": {r.planner: r.iteration_s for r in others}}
    print(json.dumps({k: case[k] for k in ("model", "cluster", "microbatches", "joint_s", "best_other",
                                            "best_other_s", "not_slower")}), flush=True)
    return case


def markdown(cases: list[dict]) -> str:
    lost = [c for c in cases if not c["not_slower"]]
    better = [c for c in cases if c["speedup_over_best_other"] > 1 + 1e-6]
    md = ["# Joint against every other planner, each run on its own", "",
          f"{len(cases)} cases; joint is never slower in {len(cases) - len(lost)} of them and strictly faster "
          f"than every other planner in {len(better)}.", "",
          "| model | cluster | M | fastest other | its time (s) | joint (s) | speed-up | joint's plan from | schedule |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {c['model']} | {c['cluster']} | {c['microbatches']} | {c['best_other']} | {c['best_other_s']:.4f}"
           f"{'' if c['best_other_fits'] else ' (over)'} | {c['joint_s']:.4f}{'' if c['joint_fits'] else ' (over)'} | "
           f"{c['speedup_over_best_other']:.3f}x | {c['joint_from']} | {c['joint_schedule']} |" for c in cases]
    return "\n".join(md) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--set", nargs="+", default=["profiles", "zoo"], choices=["profiles", "zoo"])
    add_out_argument(ap, "joint")
    args = ap.parse_args()
    cases = []
    if "profiles" in args.set:
        if not PROFILES.is_dir():
            print(f"no shared profiles at {PROFILES}", file=sys.stderr)
            return 1
        cases += [run_case(model, str(PROFILES / model), cname, m)
                  for m in args.microbatches for model in PROFILE_MODELS for cname in PRESETS]
    if "zoo" in args.set:
        cases += [run_case(model, f"zoo:{model}", cname, m) for m in args.microbatches for model, cname in ZOO_CASES]
    lost = [f"{c['model']}/{c['cluster']}/M={c['microbatches']}" for c in cases if not c["not_slower"]]
    write_json(args.out / "never_slower.json", {"cases": cases, "lost": lost, "all_not_slower": not lost})
    write_markdown(args.out / "never_slower.md", markdown(cases))
    print(f"joint never slower: {not lost} {lost}")
    return 0 if not lost else 1


if __name__ == "__main__":
    sys.exit(main())
