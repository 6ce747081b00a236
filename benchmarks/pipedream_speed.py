"""PipeDream planner speed on the shared profiles, against PipeDream's published program.

Cases (one level, N workers, 10 GB/s, as ``optimizer_graph_hierarchical.py -n N -b 1e10``):
inception_v3 / 16, resnet50 / 32, vgg16 / 4. Times cover loading the profile, building the
antichain DAG and solving the DP (best of --repeat runs). The reference times are those of
PipeDream's program, measured on the development machine. Writes
benchmarks/results/pipedream_speed.json.

    python benchmarks/pipedream_speed.py [--json] [--repeat N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time

from pipeplan.graph import load_graph
from pipeplan.planners.pipedream import MAX_STATES, _dag
from pipeplan.planners.pipedream.dp import Level, solve

from _results import PROFILES, add_out_argument, write_json

CASES = [("inception_v3", 16, 267.0), ("resnet50", 32, 10.5), ("vgg16", 4, 0.15)]


def run(model: str, workers: int, repeat: int) -> dict:
    best, out = float("inf"), {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        g = load_graph(str(PROFILES / model))
        dag, groups, _ = _dag(g)
        res = solve(dag, [Level(workers, 1e10)])
        dt = time.perf_counter() - t0
        if dt < best:
            best = dt
            out = {"objective_s": res.objective_s, "replication": [s.workers[0] for s in res.stages],
                   "states": res.work["states"], "antichain_edges": res.work["antichain_edges"],
                   "transitions": res.work["transitions"], "compressed_branches": groups is not None}
    return {"model": model, "workers": workers, "seconds": best, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    add_out_argument(ap)
    args = ap.parse_args()
    if not PROFILES.is_dir():
        raise SystemExit(f"the shared profiles are not at {PROFILES}")
    rows = []
    for model, workers, ref in CASES:
        r = run(model, workers, args.repeat)
        r["pipedream_program_s"] = ref
        r["speedup"] = ref / r["seconds"]
        rows.append(r)
    out = {"cases": rows, "max_states_exact": MAX_STATES}
    write_json(args.out / "pipedream_speed.json", out)
    if args.json:
        print(json.dumps(out))
        return
    for r in rows:
        note = " (branches compressed)" if r["compressed_branches"] else ""
        print(f"{r['model']:>13} / {r['workers']:>2}: {r['seconds'] * 1e3:8.1f} ms vs {r['pipedream_program_s']:6.2f} s "
              f"-> {r['speedup']:7.0f}x; {r['states']} states{note}, {r['transitions']:,} transitions, "
              f"objective {r['objective_s']:.6g} s, replication {r['replication']}")


if __name__ == "__main__":
    main()
