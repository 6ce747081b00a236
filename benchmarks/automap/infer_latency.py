"""How fast ``automap-infer`` plans, measured from the command line: the millisecond planner.

Cold: a fresh process runs ``pipeplan plan --model M --cluster C --planner automap-infer
--json`` (Python's start, the imports, the shipped agent's numpy twin, the plan, its
simulation and the JSON), wall-clock from outside and CPU seconds (the child's user +
system time), ``--runs`` times per row after one unmeasured run (the file cache warm, as on
a machine that has run pipeplan before). Warm: the same command run twice in one process
(``pipeplan.cli.main``); the second's wall and CPU time and its ``search_s``; planning: the
planner's function alone, called again on the loaded model (CPU). Rows: the zoo's
BERT, T5 and VGG, and PipeDream's profiles (``../shared``, where present) on Auto-MAP's 32-GPU
cluster C. Targets (issue 44: CPU seconds): a cold command under 1 s of CPU, warm planning
under 100 ms of CPU (medians; exit 1 if missed), on
the rows whose plan fits in memory: a plan that overflows sends ``plan`` on to its memory
rework (``variants.fit_memory``, a search over the plan's variants that loads the compiled
simulator), which is reported in its row but is not the planner's time. Also reported:
which heavy modules a cold plan loaded (none of torch, numba, gymnasium, scipy, networkx is
needed for the planner).

    python benchmarks/automap/infer_latency.py [--runs N] [--out DIR]

Writes benchmarks/results/automap/infer_latency.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import PROFILES, add_out_argument, write_json, write_markdown  # noqa: E402

ROWS = [("zoo:bert-48", "automap-b"), ("zoo:t5-11b", "automap-c"), ("zoo:vgg16", "automap-a"),
        ("zoo:t5-3b?granularity=op", "automap-c"), ("zoo:bert-48?granularity=op", "automap-c")] + \
    [(str(PROFILES / name), "automap-c") for name in ("alexnet", "vgg16", "resnet50", "inception_v3", "resnext101",
                                                      "gnmt") if (PROFILES / name).is_dir()]
COLD_LIMIT_S, WARM_LIMIT_S = 1.0, 0.1
HEAVY = ("torch", "numba", "gymnasium", "scipy", "networkx")
PROBE = ("import json, sys; from pipeplan.cli import main; code = main({argv!r}); "
         "print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr); raise SystemExit(code)")


def argv(model: str, cluster: str) -> list[str]:
    return ["plan", "--model", model, "--cluster", cluster, "--planner", "automap-infer", "--json"]


def cold(model: str, cluster: str, runs: int) -> dict:
    """Wall seconds of fresh processes (the first, unmeasured, warms the file cache)."""
    cmd = [sys.executable, "-m", "pipeplan", *argv(model, cluster)]
    subprocess.run(cmd, capture_output=True, check=True)
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    probe = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv(model, cluster), heavy=HEAVY)],
                           capture_output=True, text=True, check=True)
    plan = json.loads(out)
    return {"cold_s": times, "cold_median_s": statistics.median(times), "cold_cpu_s": cpu,
            "cold_cpu_median_s": statistics.median(cpu), "iteration_s": plan["iteration_s"],
            "fits": not plan["prediction"]["over_memory"],
            "heavy_modules_loaded": json.loads(probe.stderr.strip().splitlines()[-1])}


def warm(model: str, cluster: str, runs: int) -> dict:
    """The command again in this process, after a first run: wall and search seconds."""
    import contextlib
    import io

    from pipeplan.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        main(argv(model, cluster))
    walls, cpu, searches = [], [], []
    for _ in range(runs):
        buf = io.StringIO()
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(buf):
            main(argv(model, cluster))
        walls.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        searches.append(json.loads(buf.getvalue())["search_s"])
    return {"warm_s": walls, "warm_median_s": statistics.median(walls), "warm_cpu_s": cpu,
            "warm_cpu_median_s": statistics.median(cpu), "search_median_s": statistics.median(searches),
            **planning(model, cluster, runs)}


def planning(model: str, cluster: str, runs: int) -> dict:
    """CPU seconds of the planner alone, warm (its function called again in this process on
    the loaded model and cluster): no simulation of the plan, no report."""
    from pipeplan.cluster import load_cluster
    from pipeplan.graph import load_graph
    from pipeplan.planners import PlanOptions, get_planner

    graph, cl, fn = load_graph(model), load_cluster(cluster), get_planner("automap-infer").fn
    fn(graph, cl, PlanOptions())
    cpu = []
    for _ in range(runs):
        c0 = time.process_time()
        fn(graph, cl, PlanOptions())
        cpu.append(time.process_time() - c0)
    return {"planning_cpu_s": cpu, "planning_cpu_median_s": statistics.median(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    add_out_argument(parser, "automap")
    args = parser.parse_args()
    rows = []
    for model, cluster in ROWS:
        r = {"model": model, "cluster": cluster, **cold(model, cluster, args.runs), **warm(model, cluster, args.runs)}
        rows.append(r)
        print(f"{Path(model).name:<28} {cluster:<10} {'fits' if r['fits'] else 'OVER MEMORY'}  cold {r['cold_median_s'] * 1e3:6.0f} ms "
              f"({r['cold_cpu_median_s'] * 1e3:.0f} ms CPU)  warm {r['warm_median_s'] * 1e3:5.1f} ms "
              f"({r['warm_cpu_median_s'] * 1e3:.1f} ms CPU; planning {r['planning_cpu_median_s'] * 1e3:.1f} ms CPU) "
              f"(search {r['search_median_s'] * 1e3:5.1f} ms)  heavy modules loaded: {r['heavy_modules_loaded'] or 'none'}",
              flush=True)
    fitting = [r for r in rows if r["fits"]]
    cold_ok = bool(fitting) and all(r["cold_cpu_median_s"] < COLD_LIMIT_S for r in fitting)
    warm_ok = bool(fitting) and all(r["planning_cpu_median_s"] < WARM_LIMIT_S for r in fitting)
    verdict = {"cold_cpu_under_1s": cold_ok, "warm_planning_cpu_under_100ms": warm_ok}
    print(f"cold < {COLD_LIMIT_S:g} s of CPU: {'met' if cold_ok else 'MISSED'}; warm planning < {WARM_LIMIT_S * 1e3:g} ms of CPU: "
          f"{'met' if warm_ok else 'MISSED'}")
    write_json(args.out / "infer_latency.json", {"runs": args.runs, "rows": rows, **verdict})
    lines = ["# automap-infer planning latency, from the command line", "",
             f"`python benchmarks/automap/infer_latency.py --runs {args.runs}`: medians of {args.runs} runs "
             "(cold: a fresh `pipeplan plan ... --planner automap-infer --json` process, timed from outside, and "
             "its CPU seconds; warm: the same command again in one process; planning: the planner's function "
             "alone, called again in one process, in CPU seconds).", "",
             "| model | cluster | plan | cold (ms) | cold CPU (ms) | warm (ms) | warm CPU (ms) | search (ms) | "
             "planning CPU (ms) | heavy modules loaded |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {Path(r['model']).name if r['model'].startswith('/') else r['model']} | {r['cluster']} | "
              f"{'fits' if r['fits'] else 'over memory: reworked'} | "
              f"{r['cold_median_s'] * 1e3:.0f} | {r['cold_cpu_median_s'] * 1e3:.0f} | {r['warm_median_s'] * 1e3:.1f} | "
              f"{r['warm_cpu_median_s'] * 1e3:.1f} | {r['search_median_s'] * 1e3:.1f} | "
              f"{r['planning_cpu_median_s'] * 1e3:.1f} | {', '.join(r['heavy_modules_loaded']) or 'none'} |"
              for r in rows]
    lines += ["", f"Targets (CPU seconds), on the {len(fitting)} rows whose plan fits: a cold command under "
              f"{COLD_LIMIT_S:g} s {'met' if cold_ok else 'missed'}, warm planning under "
              f"{WARM_LIMIT_S * 1e3:g} ms {'met' if warm_ok else 'missed'}."]
    write_markdown(args.out / "infer_latency.md", "\n".join(lines) + "\n")
    if not (cold_ok and warm_ok):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
