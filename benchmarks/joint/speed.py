"""The joint planner's planning time and memory from 8 to 4,096 GPUs.

Each size is a fresh process running ``pipeplan plan --planner joint`` on a 96-layer BERT
(``zoo:bert-large?layers=96``) over ``hier:`` clusters of 8-GPU servers (300 GB/s inside a
server, 200 Gbps between), M = 32: the wall time of the whole command (loading, the seed
planners, the search, the final simulation, writing the plan), the planner's own search
time, and the process's peak resident memory. Targets: 1,024 GPUs under 10 s, 4,096 under a
minute, memory under 4 GiB. Writes benchmarks/results/joint/speed.{md,json}.

    python benchmarks/joint/speed.py [--sizes 8 64 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

MODEL = "zoo:bert-large?layers=96"
SIZES = [8, 32, 64, 128, 256, 512, 1024, 2048, 4096]
TARGETS_S = {1024: 10.0, 4096: 60.0}
MEMORY_TARGET = 4 * 2**30
#: Runs the command in-process and reports its peak memory (ru_maxrss, KiB on Linux).
RUNNER = ("import resource, sys; from pipeplan.cli import main; code = main(sys.argv[1:]); "
          "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)")


def cluster_spec(gpus: int) -> str:
    return f"hier:servers={max(gpus // 8, 1)},gpus={min(gpus, 8)},intra=300GB/s,inter=200Gbps"


def run_size(gpus: int, microbatches: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        argv = ["plan", "--model", MODEL, "--cluster", cluster_spec(gpus), "--planner", "joint",
                "--microbatches", str(microbatches), "--out", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{gpus} GPUs: {proc.stderr.strip()}")
        plan = json.loads(out.read_text())
    rss = next(int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("MAXRSS")) * 1024
    facts = plan["joint"]
    return {"gpus": gpus, "wall_s": wall, "search_s": plan["search_s"], "peak_memory_bytes": rss,
            "iteration_s": plan["iteration_s"], "stages": len(plan["stages"]),
            "replicas_per_stage": len(plan["stages"][0]["devices"]), "replicas": plan["replicas"],
            "schedule": plan["schedule"], "from": facts["from"], "complete": facts["complete"],
            "seeds": facts["seeds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    ap.add_argument("--microbatches", type=int, default=32)
    add_out_argument(ap, "joint")
    args = ap.parse_args()
    rows = []
    for gpus in args.sizes:
        rows.append(run_size(gpus, args.microbatches))
        print(json.dumps({k: rows[-1][k] for k in ("gpus", "wall_s", "search_s", "peak_memory_bytes")}), flush=True)
    met = {str(g): next(r["wall_s"] for r in rows if r["gpus"] == g) < t
           for g, t in TARGETS_S.items() if any(r["gpus"] == g for r in rows)}
    memory_ok = all(r["peak_memory_bytes"] < MEMORY_TARGET for r in rows)
    write_json(args.out / "speed.json", {"model": MODEL, "microbatches": args.microbatches, "rows": rows,
                                         "targets_s": TARGETS_S, "time_targets_met": met,
                                         "memory_target_bytes": MEMORY_TARGET, "memory_target_met": memory_ok})
    md = ["# Joint planner: planning time by cluster size", "",
          f"`pipeplan plan --planner joint` on {MODEL}, M = {args.microbatches}, `hier:` clusters of 8-GPU servers; "
          "one fresh process per size (wall = the whole command).", "",
          "| GPUs | wall (s) | search (s) | peak memory (MiB) | iteration (s) | plan | from | complete |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['gpus']} | {r['wall_s']:.2f} | {r['search_s']:.2f} | {r['peak_memory_bytes'] / 2**20:.0f} | "
           f"{r['iteration_s']:.4f} | {r['stages']} stages x {r['replicas_per_stage']} {r['replicas']}, "
           f"{r['schedule']} | {r['from']} | {r['complete']} |" for r in rows]
    md += ["", "Targets: " + ", ".join(f"{g} GPUs under {TARGETS_S[int(g)]:g} s: {'met' if ok else 'NOT met'}"
                                       for g, ok in met.items())
           + f"; memory under 4 GiB: {'met' if memory_ok else 'NOT met'}."]
    write_markdown(args.out / "speed.md", "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
