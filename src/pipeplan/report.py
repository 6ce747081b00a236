"""Human-readable tables (rich) for plans, simulations and comparisons."""

from __future__ import annotations

import shutil

from rich.console import Console
from rich.table import Table

from .plan import Plan
from .sim import SimResult
from .sim.costs import stage_costs
from .units import fmt_bytes, fmt_time


def make_console() -> Console:
    """A console at least 120 columns wide, also when output goes to a file or pipe."""
    return Console(width=max(120, shutil.get_terminal_size((120, 24)).columns))


def _node_span(plan: Plan, nodes: list[str]) -> str:
    return nodes[0] if len(nodes) == 1 else f"{nodes[0]} .. {nodes[-1]}"


def bottleneck(plan: Plan, result: SimResult) -> str:
    """The busiest device, in words: what limits this plan."""
    if not len(result.busy_s):
        return "-"
    i = int(result.busy_s.argmax())
    return (f"{result.devices[i]} (stage {result.stage_of_device[i]}) is busy "
            f"{result.utilization[i]:.0%} of the iteration")


def print_plan(plan: Plan, result: SimResult, console: Console | None = None) -> None:
    console = console or make_console()
    costs = stage_costs(plan)
    table = Table(title=f"{plan.planner} plan for {plan.graph.name} on {plan.cluster.name} "
                        f"({plan.microbatches} microbatches, schedule {plan.schedule})")
    for col in ("stage", "layers", "#", "devices", "fwd+bwd / mb", "params", "peak memory", "util"):
        table.add_column(col, justify="right" if col not in ("layers", "devices") else "left")
    by_dev = {d: k for k, d in enumerate(result.devices)}
    for s, st in enumerate(plan.stages):
        ks = [by_dev[d] for d in st.devices]
        mem = max(result.memory_bytes[k] for k in ks)
        over = any(result.memory_bytes[k] > result.memory_limit[k] for k in ks)
        speed = min(plan.cluster.devices[plan.cluster.index[d]].speed for d in st.devices)
        per_mb = (costs.fwd[s] + costs.bwd[s]) / (len(st.devices) * speed)
        table.add_row(str(s), _node_span(plan, st.nodes), str(len(st.nodes)),
                      ",".join(st.devices) if len(st.devices) <= 4 else f"{st.devices[0]} .. ({len(st.devices)})",
                      fmt_time(per_mb), fmt_bytes(costs.params[s]),
                      f"[red]{fmt_bytes(mem)} OVER[/red]" if over else fmt_bytes(mem),
                      f"{max(result.utilization[k] for k in ks):.0%}")
    console.print(table)
    print_prediction(result, console, plan)


def print_prediction(result: SimResult, console: Console, plan: Plan | None = None) -> None:
    console.print(f"iteration time [bold]{fmt_time(result.iteration_s)}[/bold]  "
                  f"lower bound {fmt_time(result.lower_s)}  efficiency {result.efficiency:.1%}  "
                  f"bubble {result.bubble_fraction:.1%}")
    if plan is not None:
        console.print(f"bottleneck: {bottleneck(plan, result)}; search took {fmt_time(plan.search_s)}")
    if result.over_memory:
        console.print(f"[red]over memory:[/red] {', '.join(result.over_memory)}")
    variant = (plan.extra.get("memory_variant") if plan is not None else None)
    if variant:
        console.print(f"to fit in memory: schedule {variant['schedule']}, re-materializing stages "
                      f"{variant['recompute'] or 'none'}")


def _fits_cell(row: dict) -> str:
    """"yes", or "no:" with the device that overflows most, its stage, and by how much."""
    if row["fits"]:
        return "yes"
    over = row["memory_over_bytes"]
    worst = max(over, key=over.get)
    stage = next(k for k, s in enumerate(row["plan"]["stages"]) if worst in s["devices"])
    return f"[red]no: {worst} (stage {stage}) over by {fmt_bytes(over[worst])}[/red]"


def print_compare(rows: list[dict], title: str, console: Console | None = None) -> None:
    """The rows of ``CompareRow.to_dict``: a plan that does not fit names its worst device
    and by how much; a planner that could not plan shows its reason."""
    console = console or make_console()
    table = Table(title=title)
    gap = any(r.get("gap_vs_exact") is not None for r in rows)
    cols = ["rank", "planner", "stages", "replication", "iteration", "speedup vs dp", "efficiency",
            *(["gap to exact"] if gap else []), "search", "fits"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("planner", "replication", "fits") else "right")
    for k, r in enumerate(rows, start=1):
        if "error" in r:
            table.add_row("-", r["planner"], *["-"] * (len(cols) - 3), f"[red]{r['error']}[/red]")
            continue
        rep = r["replication"]
        table.add_row(str(k), f"{r['planner']} ({r['plan']['schedule']})", str(len(rep)),
                      "-".join(map(str, rep)) if len(rep) <= 12 else f"{'-'.join(map(str, rep[:12]))}-..",
                      fmt_time(r["iteration_s"]),
                      "-" if r.get("speedup_vs_dp") is None else f"{r['speedup_vs_dp']:.2f}x",
                      f"{r['efficiency']:.1%}",
                      *([f"{r['gap_vs_exact']:+.1%}"] if gap else []),
                      fmt_time(r["search_s"]),
                      _fits_cell(r))
    console.print(table)
