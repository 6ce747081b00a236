"""How enumerating Auto-MAP's pruned pipeline problem grows with the number of stages
(§5.2.3: "the time cost of DQN method is far better than enumeration, especially when we
increase the stage number"): BERT-48 at operator granularity on K servers of 8 V100
(NVLink, 25 Gbps between servers), one stage per server, radius 3, 16 microbatches.

Per K: plans in the pruned problem (counted exactly), the exhaustive enumeration's time (run
where it holds at most ``--enumerate-up-to`` plans, else estimated from the measured rate
over the first 20,000 plans, marked ~), and the branch and bound's time to the same optimum.
The DQN's times are in table7.md. Writes benchmarks/results/automap/enumeration.md and .json.

    python benchmarks/automap/enumeration.py [--stages 2,3,4,5] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeplan.cluster import load_cluster
from pipeplan.graph import load_graph
from pipeplan.planners.automap.enumerate import optimum
from pipeplan.planners.automap.problem import CutProblem

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402
from table7 import enumeration  # noqa: E402

MODEL = "zoo:bert-48?granularity=op&microbatch=16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default="2,3,4,5")
    parser.add_argument("--enumerate-up-to", type=int, default=50000)
    add_out_argument(parser, "automap")
    args = parser.parse_args()
    graph = load_graph(MODEL)
    rows = []
    for k in (int(x) for x in args.stages.split(",")):
        cluster = load_cluster(f"hier:servers={k},gpus=8,intra=400Gbps,inter=25Gbps,kind=V100")
        problem = CutProblem(graph, cluster, k, 16)
        enum = enumeration(problem, args.enumerate_up_to)
        opt = optimum(problem)
        rows.append({"stages": k, "candidates": int(problem.pivots.size), "plans": enum["plans"],
                     "enumeration_s": enum["seconds"], "estimated": enum["estimated"],
                     "branch_and_bound_s": opt.seconds, "evaluated": opt.evaluated, "optimum_s": opt.iteration_s})
        print(rows[-1], flush=True)
    lines = [f"| {r['stages']} | {r['candidates']} | {r['plans']:,} | {'~' if r['estimated'] else ''}"
             f"{r['enumeration_s']:,.0f} | {r['branch_and_bound_s']:.1f} | {r['evaluated']:,} |" for r in rows]
    text = ("# Enumerating Auto-MAP's pruned pipeline problem as stages grow\n\n"
            f"{MODEL}, K servers x 8 V100, one stage per server, radius 3, 16 microbatches. `~`: estimated from "
            "the measured rate.\n\n| stages | candidate pivots | plans | exhaustive enumeration (s) | "
            "branch and bound (s) | plans it evaluated |\n|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    write_json(args.out / "enumeration.json", {"model": MODEL, "rows": rows})
    write_markdown(args.out / "enumeration.md", text)
    print(text)


if __name__ == "__main__":
    main()
