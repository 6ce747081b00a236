"""SPP Table III in simulation: 7 models (Table II) on 1080ti-4x2 and v100x4, SPP vs DP, GPipe,
PipeDream and HetPipe. Speed-up as in the paper: (baseline - SPP) / SPP.

Models are pipeplan's analytic zoo at Table II's microbatch counts and sizes (BERT-48: 4
samples per microbatch on 1080Ti x 8, 2 on V100 x 4). Writes
benchmarks/results/spp/table3.md and .json.

    python benchmarks/spp/table3.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions
from pipeplan.planners.compare import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

# (label, zoo spec, microbatches, {cluster: microbatch size}) — SPP Table II
MODELS = [
    ("VGG19", "vgg19", 8, {"1080ti-4x2": 32, "v100x4": 32}),
    ("ResNet152", "resnet152", 4, {"1080ti-4x2": 4, "v100x4": 4}),
    ("Inception-V3", "inception-v3", 8, {"1080ti-4x2": 32, "v100x4": 32}),
    ("Transformer", "transformer", 8, {"1080ti-4x2": 32, "v100x4": 32}),
    ("BERT-large", "bert-large", 4, {"1080ti-4x2": 4, "v100x4": 4}),
    ("XLNet-large", "xlnet-large", 4, {"1080ti-4x2": 4, "v100x4": 4}),
    ("BERT-48", "bert-48", 4, {"1080ti-4x2": 4, "v100x4": 2}),
]
# The paper's measured seconds (SPP, DP, GPipe, PipeDream, HetPipe); None = OOM or not run.
PAPER = {
    ("VGG19", "1080ti-4x2"): (1.799, 2.882, 2.120, 1.949, 2.696), ("VGG19", "v100x4"): (0.983, 1.245, 1.004, 1.024, None),
    ("ResNet152", "1080ti-4x2"): (0.732, 0.896, 1.214, None, 0.843), ("ResNet152", "v100x4"): (0.832, 1.209, 1.041, 0.873, None),
    ("Inception-V3", "1080ti-4x2"): (0.303, 0.420, 0.551, 0.656, 0.408), ("Inception-V3", "v100x4"): (0.357, 0.663, 0.587, 0.919, None),
    ("Transformer", "1080ti-4x2"): (0.640, 0.944, 1.234, 1.118, 0.766), ("Transformer", "v100x4"): (1.065, 2.533, 1.487, 1.830, None),
    ("BERT-large", "1080ti-4x2"): (0.409, 0.524, 0.472, 0.421, 0.525), ("BERT-large", "v100x4"): (0.952, 2.269, 1.665, 1.084, None),
    ("XLNet-large", "1080ti-4x2"): (1.299, 1.388, 1.696, 1.384, 1.628), ("XLNet-large", "v100x4"): (1.437, 1.842, 1.720, 1.690, None),
    ("BERT-48", "1080ti-4x2"): (0.762, None, 1.885, 1.266, 1.377), ("BERT-48", "v100x4"): (0.855, 1.656, 1.199, 1.160, None),
}
BASELINES = ["dp", "gpipe", "pipedream", "hetpipe"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(ap, "spp")
    args = ap.parse_args()
    out, md = [], ["# SPP Table III, simulated", "",
                   "Seconds per iteration from pipeplan's simulator; "
                   "in brackets SPP's speed-up over the baseline, (baseline - SPP) / SPP; OOM = no plan of "
                   "that planner fits in memory (re-materialization included). The paper's measured figures follow each row.", "",
                   "| model | cluster | SPP | DP | GPipe | PipeDream | HetPipe | SPP never slower |",
                   "|---|---|---|---|---|---|---|---|"]
    for label, spec, m, sizes in MODELS:
        for cname, mb in sizes.items():
            g = load_graph(f"zoo:{spec}?microbatch={mb}")
            rows = {r.planner: r.to_dict() for r in compare(g, load_cluster(cname), ["spp", *BASELINES],
                                                            PlanOptions(microbatches=m))}
            spp = rows["spp"]["iteration_s"] if rows["spp"].get("fits") else None
            cells, ok = [], True
            for b in BASELINES:
                r = rows[b]
                if not r.get("fits"):
                    cells.append("OOM")
                    continue
                t = r["iteration_s"]
                cells.append(f"{t:.3f} ({(t - spp) / spp:+.1%})" if spp else f"{t:.3f}")
                ok &= spp is None or spp <= t * (1 + 1e-9)
            md.append(f"| {label} | {cname} | {spp:.3f} | " + " | ".join(cells) + f" | {'yes' if ok else '**no**'} |"
                      if spp else f"| {label} | {cname} | OOM | " + " | ".join(cells) + " | - |")
            paper = PAPER[(label, cname)]
            md.append(f"| *paper* | | *{paper[0]}* | " + " | ".join(
                f"*{x}*" if x is not None else "*-*" for x in paper[1:]) + " | |")
            out.append({"model": label, "cluster": cname, "microbatches": m, "microbatch_size": mb,
                        "spp_s": spp, "spp_never_slower": ok,
                        "spp_plan": {"replication": rows["spp"].get("replication"),
                                     "search_s": rows["spp"].get("search_s")},
                        "baselines": {b: rows[b]["iteration_s"] if rows[b].get("fits") else None
                                      for b in BASELINES},
                        "paper": dict(zip(["spp", *BASELINES], paper))})
            print(f"{label:>12} on {cname:<10}: spp={spp if spp is None else round(spp, 3)} "
                  + " ".join(f"{b}={rows[b].get('iteration_s', float('nan')):.3f}" for b in BASELINES)
                  + ("" if ok else "  <-- SPP slower"))
    write_markdown(args.out / "table3.md", "\n".join(md) + "\n")
    write_json(args.out / "table3.json", {"cases": out})


if __name__ == "__main__":
    main()
