"""The learning planners on PipeDream's profiles, which neither was trained on (issue 44):
every profile in ``../shared/profiles/pipedream`` on several clusters, against ``dp`` and
``spp`` on the same inputs (8 microbatches, each planner's own schedule choice).

- ``automap-infer``: the shipped agent, zero-shot, one plan an instance. Targets: never
  slower than ``dp``; median gap to ``spp`` within 5%.
- ``drl-pp`` (``--agents drl-pp``): trained on the spot for ``--evaluations`` (3,000) plans
  scored, ``--seeds`` (5) seeds, on the clusters of up to 8 GPUs (a seed takes 1-10 minutes
  of CPU here). Targets: never slower than ``dp`` on any seed; the median over
  instances of its median gap to ``spp`` within 20%.

A plan that overflows memory counts as infinitely slow. The script reports and saves; it
exits 1 when a target is missed.

    .venv/bin/python benchmarks/learning/heldout.py [--agents automap-infer,drl-pp] [--seeds 5]
        [--evaluations 3000] [--jobs N]

Seeds and instances run in ``--jobs`` worker processes (default: one a CPU); each run is
seeded, so the figures do not depend on how many. ``--resume`` keeps the rows of the results
file already written (a run stopped part way) and measures the rest, only where those rows
would come out the same: the same seeds, evaluations and models, and neither ``src/`` nor
this script's row code (``seconds``, ``run``, ``instance``) changed since the commit that
wrote them; the file then says which commit measured which rows. The command it records is
the full run's (what reproduces every row).

Writes benchmarks/results/learning/heldout_<agent>.{json,md}.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import (PROFILES, ROOT, add_jobs_argument, add_out_argument, git_state, worker_pool,  # noqa: E402
                      profiles_absent, unrecorded, write_json, write_markdown)

from pipeplan.cluster import load_cluster  # noqa: E402
from pipeplan.graph import load_graph  # noqa: E402
from pipeplan.planners import PlanOptions, planner_settings, run_planner  # noqa: E402

MICROBATCHES = 8
MODELS = ("alexnet", "vgg16", "resnet50", "inception_v3", "resnext101", "gnmt")
#: DRL-PP's clusters: three distinct ones of up to 8 GPUs (the preset drlpp-4gpu is v100x4's
#: hardware under another name, so it is not among them)
CLUSTERS = {"automap-infer": ("v100x4", "1080ti-4x2", "automap-a", "automap-c"),
            "drl-pp": ("v100x4", "1080ti-4x2", "hier:servers=2,gpus=4,intra=128Gbps,inter=25Gbps,kind=V100")}
TARGETS = {"automap-infer": 0.05, "drl-pp": 0.20}


def seconds(planner: str, graph, cluster, pairs: list[tuple[str, str]] = ()) -> tuple[float, dict]:
    """The planner's iteration (inf when its plan overflows memory) and its plan's extra."""
    opts = PlanOptions(microbatches=MICROBATCHES, settings=planner_settings([planner], pairs))
    plan, res = run_planner(planner, graph, cluster, opts)
    return (np.inf if res.over_memory else res.iteration_s), {"stages": len(plan.stages), **(plan.extra or {})}


def run(agent: str, model: str, cname: str, seed: int, evaluations: int) -> dict:
    """One seed of ``agent`` on one instance (a worker process's task)."""
    graph, cluster = load_graph(str(PROFILES / model)), load_cluster(cname)
    pairs = [("evaluations", str(evaluations)), ("seed", str(seed))] if agent == "drl-pp" else []
    t0 = time.process_time()
    value, extra = seconds(agent, graph, cluster, pairs)
    return {"iteration_s": value, "cpu_s": time.process_time() - t0, "stages": extra["stages"],
            "trivial": extra.get(agent, {}).get("trivial")}


def instance(agent: str, model: str, cname: str, runs: list[dict]) -> dict:
    """An instance's row: ``runs`` (one a seed) against dp and spp on the same inputs."""
    graph, cluster = load_graph(str(PROFILES / model)), load_cluster(cname)
    dp, _ = seconds("dp", graph, cluster)
    spp, _ = seconds("spp", graph, cluster)
    values = [r["iteration_s"] for r in runs]
    row = {"model": model, "cluster": cname, "devices": len(cluster), "dp_s": dp, "spp_s": spp, "runs": runs,
           "gap_to_spp": statistics.median(v / spp - 1 for v in values),
           "worst_vs_dp": max(v / dp - 1 for v in values)}
    print(f"{agent:14s} {model:13s} {cname:11s} dp {dp:8.4f} spp {spp:8.4f} {agent} "
          f"{statistics.median(values):8.4f} (gap to spp {row['gap_to_spp']:+.1%}, worst vs dp "
          f"{row['worst_vs_dp']:+.1%})", flush=True)
    return row


ROW_CODE = ("seconds", "run", "instance")


def _row_code(text: str) -> dict[str, str]:
    """The source of the functions that make a row, in this script's text ``text``."""
    tree = ast.parse(text)
    return {n.name: ast.get_source_segment(text, n) for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name in ROW_CODE}


def resumed_rows(agent: str, args, pairs: list[tuple[str, str]]) -> tuple[list[dict], list[dict]]:
    """(rows kept, where they came from) from the results file ``--resume`` continues; a
    SystemExit naming why when they cannot be kept (module docstring)."""
    path = args.out / f"heldout_{agent}.json"
    if not path.is_file():
        return [], []
    old = json.loads(path.read_text())
    commit = old["provenance"]["commit"]
    script = Path(__file__).resolve().relative_to(ROOT).as_posix()
    if old["provenance"].get("dirty") or (old["seeds"], old["evaluations"]) != (args.seeds, args.evaluations):
        raise SystemExit(f"--resume: {path} was written dirty or with other seeds/evaluations; run without it")
    changed = subprocess.run(["git", "diff", "--quiet", commit, "HEAD", "--", "src"], cwd=ROOT).returncode
    before = subprocess.run(["git", "show", f"{commit}:{script}"], cwd=ROOT, capture_output=True, text=True)
    if changed or before.returncode or _row_code(before.stdout) != _row_code(Path(__file__).read_text()):
        raise SystemExit(f"--resume: src/ or the row code changed since {commit[:12]}; run without it")
    rows = [r for r in old["rows"] if (r["model"], r["cluster"]) in pairs]
    if [(r["model"], r["cluster"]) for r in rows] != pairs[:len(rows)]:
        raise SystemExit(f"--resume: {path} holds other instances than this run's first ones; run without it")
    origin = old.get("rows_from") or [{"commit": commit, "rows": len(old["rows"])}]
    kept, out = len(rows), []
    for o in origin:
        if kept > 0:
            out.append({"commit": o["commit"], "rows": min(o["rows"], kept)})
            kept -= o["rows"]
    return rows, out


def table(rows: list[dict]) -> list[str]:
    """The rows as a markdown table (apart.py's too)."""
    lines = ["| model | cluster | GPUs | dp (s) | spp (s) | agent (s) | gap to spp | worst vs dp | stages | "
             "trivial plan won |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        values = [x["iteration_s"] for x in r["runs"]]
        won = sorted({str(x["trivial"]) for x in r["runs"] if x["trivial"]}) or ["no"]
        lines.append(f"| {r['model']} | {r['cluster']} | {r['devices']} | {r['dp_s']:.4f} | {r['spp_s']:.4f} | "
                     f"{statistics.median(values):.4f} | {r['gap_to_spp']:+.1%} | {r['worst_vs_dp']:+.1%} | "
                     f"{'/'.join(str(x['stages']) for x in r['runs'])} | {', '.join(won)} |")
    return lines


def report(agent: str, rows: list[dict], args, planned: int, rows_from: list[dict]) -> bool:
    """Write what the rows say (again after every instance: a long run leaves its partial
    results, marked so); True when the targets are met on all ``planned`` instances."""
    median = statistics.median(r["gap_to_spp"] for r in rows)
    never_below_dp = all(r["worst_vs_dp"] <= 1e-9 for r in rows)
    complete = len(rows) == planned
    met = complete and never_below_dp and median <= TARGETS[agent]
    write_json(args.out / f"heldout_{agent}.json", {"agent": agent, "seeds": args.seeds, "evaluations": args.evaluations,
                                                    "rows": rows, "instances": len(rows), "planned": planned,
                                                    "rows_from": rows_from,
                                                    "median_gap_to_spp": median, "never_below_dp": never_below_dp,
                                                    "met": met})
    runs = "one plan an instance" if agent == "automap-infer" else \
        f"{args.seeds} seeds of {args.evaluations:,} evaluations, the median"
    lines = [f"# {agent} on PipeDream's profiles (never trained on)", "",
             f"`.venv/bin/python benchmarks/learning/heldout.py --agents {agent}"
             + (f" --seeds {args.seeds} --evaluations {args.evaluations}" if agent == "drl-pp" else "")
             + f"`: {MICROBATCHES} microbatches; {runs}. Gap > 0: slower.", "",
             *table(rows)]
    if len(rows_from) > 1:
        first, said = 1, []
        for o in rows_from:
            said.append(f"rows {first}-{first + o['rows'] - 1} at {o['commit'][:12]}")
            first += o["rows"]
        lines += ["", "Measured in parts (`--resume`; src/ and the row code the same throughout): "
                  + ", ".join(said) + "."]
    lines += ["", f"Median gap to spp {median:+.1%} (target within {TARGETS[agent]:.0%}); never slower than dp: "
              f"{'yes' if never_below_dp else 'NO'}. "
              + (f"Targets {'met' if met else 'MISSED'}." if complete else
                 f"**Partial: {len(rows)} of {planned} instances** (the run was stopped; targets not judged).")]
    write_markdown(args.out / f"heldout_{agent}.md", "\n".join(lines) + "\n")
    print(f"{agent}: median gap to spp {median:+.1%}, never below dp {never_below_dp}: "
          + (('met' if met else 'MISSED') if complete else f"{len(rows)} of {planned} instances so far"))
    return met


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options heldout.py and apart.py share."""
    parser.add_argument("--agents", default="automap-infer", help="comma-separated: automap-infer, drl-pp")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--evaluations", type=int, default=3000)
    add_jobs_argument(parser)
    add_out_argument(parser, "learning")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows already written where they would come out the same (module docstring)")
    args = parser.parse_args()
    if profiles_absent():
        return 0
    unrecorded(("--jobs",), ("--resume",))  # the command recorded: the full run's, which gives every row
    ok = True
    with worker_pool(args.jobs) as pool:
        for agent in args.agents.split(","):
            pairs = [(m, c) for c in CLUSTERS[agent] for m in args.models.split(",")]
            rows, rows_from = resumed_rows(agent, args, pairs) if args.resume else ([], [])
            head = git_state()[0]
            seeds = range(args.seeds if agent == "drl-pp" else 1)
            futures = [[pool.submit(run, agent, m, c, s, args.evaluations) for s in seeds] for m, c in pairs[len(rows):]]
            met = report(agent, rows, args, len(pairs), rows_from) if rows else False
            for (m, c), runs in zip(pairs[len(rows):], futures):
                rows.append(instance(agent, m, c, [f.result() for f in runs]))
                if rows_from and rows_from[-1]["commit"] == head:
                    rows_from[-1]["rows"] += 1
                else:
                    rows_from.append({"commit": head, "rows": 1})
                met = report(agent, rows, args, len(pairs), rows_from)
            ok &= met
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
