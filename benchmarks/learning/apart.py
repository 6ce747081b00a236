"""The learning planners on models kept apart (issue 44's independent check of heldout.py):
zoo models that neither agent trained on and that no choice made for issue 44 was tuned on.

automap-infer's training mix (``planners/automap/training_data.py``) draws BERT-large,
Transformer and XLNet at 6-36 layers, GNMT-4, VGG-16, ResNet-50, AlexNet and GoogLeNet; the
stage share bound and DRL-PP's collapse fixes were chosen on PipeDream's profiles and on
GNMT. Kept apart here: VGG-19, ResNet-152, Inception-v3 (the zoo's, one node a block) and
T5-base, each with its zoo defaults, on the clusters and with the targets of heldout.py,
against ``dp`` and ``spp`` on the same inputs (8 microbatches).

    .venv/bin/python benchmarks/learning/apart.py [--agents automap-infer,drl-pp] [--seeds 5]
        [--evaluations 3000] [--jobs N]

Writes benchmarks/results/learning/apart_<agent>.{json,md}; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import unrecorded, worker_pool, write_json, write_markdown  # noqa: E402
from heldout import CLUSTERS, MICROBATCHES, TARGETS, add_arguments, seconds, table  # noqa: E402

from pipeplan.cluster import load_cluster  # noqa: E402
from pipeplan.graph import load_graph  # noqa: E402

MODELS = ("zoo:vgg19", "zoo:resnet152", "zoo:inception-v3", "zoo:t5-base")


def run(agent: str, model: str, cname: str, seed: int, evaluations: int) -> dict:
    """One seed of ``agent`` on one instance (a worker process's task)."""
    pairs = [("evaluations", str(evaluations)), ("seed", str(seed))] if agent == "drl-pp" else []
    t0 = time.process_time()
    value, extra = seconds(agent, load_graph(model), load_cluster(cname), pairs)
    return {"iteration_s": value, "cpu_s": time.process_time() - t0, "stages": extra["stages"],
            "trivial": extra.get(agent, {}).get("trivial")}


def row(model: str, cname: str, runs: list[dict]) -> dict:
    graph, cluster = load_graph(model), load_cluster(cname)
    dp, spp = seconds("dp", graph, cluster)[0], seconds("spp", graph, cluster)[0]
    values = [r["iteration_s"] for r in runs]
    return {"model": model, "cluster": cname, "devices": len(cluster), "dp_s": dp, "spp_s": spp, "runs": runs,
            "gap_to_spp": statistics.median(v / spp - 1 for v in values),
            "worst_vs_dp": max(v / dp - 1 for v in values)}


def report(agent: str, rows: list[dict], args) -> bool:
    median = statistics.median(r["gap_to_spp"] for r in rows)
    never_below_dp = all(r["worst_vs_dp"] <= 1e-9 for r in rows)
    met = never_below_dp and median <= TARGETS[agent]
    write_json(args.out / f"apart_{agent}.json", {"agent": agent, "seeds": args.seeds, "evaluations": args.evaluations,
                                                  "microbatches": MICROBATCHES, "rows": rows,
                                                  "median_gap_to_spp": median, "never_below_dp": never_below_dp,
                                                  "met": met})
    runs = "one plan an instance" if agent == "automap-infer" else \
        f"{args.seeds} seeds of {args.evaluations:,} evaluations, the median"
    lines = [f"# {agent} on zoo models kept apart", "",
             f"{MICROBATCHES} microbatches; {runs}. Gap > 0: slower. Models neither trained on nor tuned on "
             "(benchmarks/learning/apart.py says which and why).", "",
             *table(rows)]
    lines += ["", f"Median gap to spp {median:+.1%} (target within {TARGETS[agent]:.0%}); never slower than dp: "
              f"{'yes' if never_below_dp else 'NO'}. Targets {'met' if met else 'MISSED'}."]
    write_markdown(args.out / f"apart_{agent}.md", "\n".join(lines) + "\n")
    print(f"{agent} on models kept apart: median gap to spp {median:+.1%}, never below dp {never_below_dp}: "
          f"{'met' if met else 'MISSED'}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args()
    unrecorded(("--jobs",))
    ok = True
    with worker_pool(args.jobs) as pool:
        for agent in args.agents.split(","):
            pairs = [(m, c) for c in CLUSTERS[agent] for m in MODELS]
            seeds = range(args.seeds if agent == "drl-pp" else 1)
            futures = [[pool.submit(run, agent, m, c, s, args.evaluations) for s in seeds] for m, c in pairs]
            rows = []
            for (m, c), runs in zip(pairs, futures):
                rows.append(row(m, c, [f.result() for f in runs]))
                r = rows[-1]
                print(f"{agent:14s} {m:17s} {c:11s} dp {r['dp_s']:8.4f} spp {r['spp_s']:8.4f} gap to spp "
                      f"{r['gap_to_spp']:+.1%}, worst vs dp {r['worst_vs_dp']:+.1%}", flush=True)
            ok &= report(agent, rows, args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
