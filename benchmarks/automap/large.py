"""Auto-MAP's train-once agent against spp at equal millisecond budgets, on large graphs.

The one place a learned planner could win is where a search is too slow: graphs of
thousands of operators on many GPUs. For each (model, cluster) every planner plans twice in
this process; the second run's wall time is its warm planning time. The budget is
``automap-infer``'s warm time: a planner whose warm time is over it has no plan at that
budget. Also reported: each plan's simulated iteration time and whether it fits, and the
gap of each plan to the best any planner found (given all the time it took). Clusters: 4
servers of 8 A100s (32 GPUs, where the agent cuts GPU by GPU), 32 and 64 servers of 8 (256
and 512 GPUs, where it cuts by whole servers). A refusal's reason is listed under the table.

    python benchmarks/automap/large.py [--out DIR]

Writes benchmarks/results/automap/large.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeplan.cluster import load_cluster
from pipeplan.errors import Infeasible, PipeplanError
from pipeplan.graph import load_graph
from pipeplan.planners import PlanOptions, run_planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

MODELS = ["zoo:bert-48?granularity=op", "zoo:t5-11b?granularity=op", "zoo:bert-large?layers=192&granularity=op"]
CLUSTERS = {"32 x A100 (4 servers)": "hier:servers=4,gpus=8,intra=2400Gbps,inter=200Gbps,kind=A100",
            "256 x A100 (32 servers)": "hier:servers=32,gpus=8,intra=2400Gbps,inter=200Gbps,kind=A100",
            "512 x A100 (64 servers)": "hier:servers=64,gpus=8,intra=2400Gbps,inter=200Gbps,kind=A100"}
PLANNERS = ("automap-infer", "spp", "gpipe")
MICROBATCHES = 16


def plan_twice(name: str, graph, cluster) -> dict:
    """The planner's second (warm) run: wall seconds, iteration time, fits; or its error."""
    out: dict = {}
    for _ in range(2):
        t0 = time.perf_counter()
        try:
            plan, result = run_planner(name, graph, cluster, PlanOptions(microbatches=MICROBATCHES))
        except (PipeplanError, Infeasible) as e:
            return {"error": str(e).splitlines()[0]}
        out = {"seconds": time.perf_counter() - t0, "iteration_s": result.iteration_s, "fits": not result.over_memory,
               "stages": len(plan.stages), "schedule": plan.schedule}
    return out


def row(spec: str, cname: str) -> dict:
    graph, cluster = load_graph(spec), load_cluster(CLUSTERS[cname])
    runs = {name: plan_twice(name, graph, cluster) for name in PLANNERS}
    found = [r["iteration_s"] for r in runs.values() if "iteration_s" in r and r["fits"]]
    best = min(found) if found else None
    budget = runs["automap-infer"].get("seconds")
    for r in runs.values():
        if "iteration_s" in r:
            r["gap"] = r["iteration_s"] / best - 1 if best and r["fits"] else None
            r["within_budget"] = budget is not None and r["seconds"] <= budget
    print(f"{spec:45s} {cname:24s} " + "  ".join(
        f"{n} {r['seconds'] * 1e3:.0f} ms {r['iteration_s']:.3f} s" if "seconds" in r else f"{n} refused"
        for n, r in runs.items()), flush=True)
    return {"model": spec, "cluster": cname, "nodes": len(graph), "devices": len(cluster), "budget_s": budget,
            "best_s": best, "planners": runs}


def verdict(r: dict) -> str:
    """Who has the better plan at the agent's budget: the agent, spp, or neither has one."""
    agent, spp = r["planners"]["automap-infer"], r["planners"]["spp"]
    if "error" in agent:
        return "agent refuses" + ("; spp plans" if "error" not in spp else "")
    if "error" in spp or not spp["within_budget"]:
        return "agent (spp has no plan in time)" if agent["fits"] else "neither (agent's plan does not fit)"
    return "agent" if agent["iteration_s"] < spp["iteration_s"] else "spp"


def _cell(r: dict) -> str:
    if "error" in r:
        return "refused"
    gap = f"{r['gap']:+.1%}" if r.get("gap") is not None else "over memory"
    return f"{r['seconds'] * 1e3:,.0f} ms, {gap}"


def markdown(rows: list[dict]) -> str:
    lines = ["# automap-infer against spp at equal millisecond budgets, large graphs", "",
             f"Per planner: warm planning time (second run in one process) and the plan's gap to the best plan any "
             f"planner found; {MICROBATCHES} microbatches. The budget is automap-infer's warm time; at it, a planner "
             "slower than the budget has no plan.", "",
             "| model | cluster | nodes | " + " | ".join(PLANNERS) + " | better at the agent's budget |",
             "|---|---|---|" + "---|" * (len(PLANNERS) + 1)]
    for r in rows:
        lines.append(f"| {r['model']} | {r['cluster']} | {r['nodes']:,} | " +
                     " | ".join(_cell(r["planners"][p]) for p in PLANNERS) + f" | {verdict(r)} |")
    lines += ["", "Refusals:", ""]
    lines += [f"- {r['model']} on {r['cluster']}, {p}: {r['planners'][p]['error']}"
              for r in rows for p in PLANNERS if "error" in r["planners"][p]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(ap, "automap")
    args = ap.parse_args()
    rows = [row(m, c) for m in MODELS for c in CLUSTERS]
    for r in rows:
        r["verdict"] = verdict(r)
    write_json(args.out / "large.json", {"rows": rows})
    write_markdown(args.out / "large.md", markdown(rows))


if __name__ == "__main__":
    main()
