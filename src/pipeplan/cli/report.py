"""Human-readable tables (rich) for plans, simulations and comparisons."""

from __future__ import annotations

import shutil

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engines import megatron
from ..errors import PipeplanError
from ..plan import Plan
from ..sim import SimResult
from ..sim.explain import TERM_TEXT, clean
from ..sim.stage_costs import stage_costs
from ..units import fmt_bytes, fmt_time, fmt_time_in, time_unit


def make_console(min_width: int = 120) -> Console:
    """A console at least ``min_width`` columns wide, also when output goes to a file or pipe."""
    return Console(width=max(min_width, shutil.get_terminal_size((min_width, 24)).columns))


def _node_span(plan: Plan, nodes: list[str]) -> str:
    return nodes[0] if len(nodes) == 1 else f"{nodes[0]} .. {nodes[-1]}"


def bottleneck(plan: Plan, result: SimResult) -> str:
    """The busiest device, in words: what limits this plan."""
    if not len(result.busy_s):
        return "-"
    i = int(result.busy_s.argmax())
    return (f"{result.devices[i]} ({result.stage_text(i)}) is busy "
            f"{result.utilization[i]:.0%} of the iteration")


def print_plan(plan: Plan, result: SimResult, console: Console | None = None, searched: bool = True) -> None:
    console = console or make_console()
    costs = stage_costs(plan)
    table = Table(title=f"{plan.planner} plan for {plan.graph.name} on {plan.cluster.name} "
                        f"({microbatch_text(plan)}, schedule {plan.schedule})")
    for col in ("stage", "layers", "#", "devices", "fwd+bwd / mb", "params", "peak memory", "util"):
        table.add_column(col, justify="right" if col not in ("layers", "devices") else "left")
    by_dev = result.device_of()
    grouped = result.extra.get("stage_s_per_microbatch")
    for s, st in enumerate(plan.stages):
        ks = sorted({by_dev[d] for d in st.devices})
        mem = max(result.memory_bytes[k] for k in ks)
        over = any(result.memory_bytes[k] > result.memory_limit[k] for k in ks)
        speed = min(plan.cluster.devices[plan.cluster.index[d]].speed for d in st.devices)
        per_mb = grouped[s] if grouped else (costs.fwd[s] + costs.bwd[s]) / (len(st.devices) * speed)
        devices = ",".join(st.devices) if len(st.devices) <= 4 else f"{st.devices[0]} .. ({len(st.devices)})"
        table.add_row(str(s), _node_span(plan, st.nodes), str(len(st.nodes)),
                      devices + (f" TP {st.tp}" if st.tp > 1 else ""),
                      fmt_time(per_mb), fmt_bytes(costs.params[s] / st.tp),
                      f"[red]{fmt_bytes(mem)} OVER[/red]" if over else fmt_bytes(mem),
                      f"{max(result.utilization[k] for k in ks):.0%}")
    console.print(table)
    cuts = cut_summary(plan)
    if cuts:
        console.print(cuts)
    tied = plan.extra.get("tied")
    merged = tied.get("merged_stages") if isinstance(tied, dict) else None
    if merged:
        console.print("tied parameters kept in one stage: " + "; ".join(
            f"{name} (the planner's stages {lo}-{hi} merged)" for name, (lo, hi) in merged.items()))
    print_prediction(result, console, plan, searched)
    print_parallelism(plan, result, console)


def microbatch_text(plan: Plan) -> str:
    """The microbatches as people count them: per data-parallel replica and in all."""
    par = plan.parallelism
    if par is not None and par.dp > 1:
        return f"{par.microbatches(plan.global_batch)} microbatches a replica x {par.dp} replicas"
    if plan.replicas == "round-robin" and plan.stages and min(len(st.tp_groups) for st in plan.stages) > 1:
        return f"{plan.microbatches} microbatches in all, taken in turn by the replicas"
    return f"{plan.microbatches} microbatches"


def print_parallelism(plan: Plan, result: SimResult, console: Console) -> None:
    """A decoder LLM plan's 3D configuration, per-GPU memory and throughput, and the
    Megatron-LM arguments that run it."""
    par = plan.parallelism
    if "model_tflops_per_gpu" in result.extra:
        x = result.extra
        console.print(f"per GPU: peak memory {fmt_bytes(float(result.memory_bytes.max()))} of "
                      f"{fmt_bytes(float(result.memory_limit.min()))} usable; model {x['model_tflops_per_gpu']:.0f} "
                      f"TFLOP/s (MFU {x['mfu']:.1%}{' of the FP8 peak' if x.get('mfu_peak') == 'fp8 dense' else ''}), hardware {x['hw_tflops_per_gpu']:.0f} TFLOP/s"
                      + (" with recomputation" if _recomputes(plan) else ""))
    if par is None:
        return
    replica = par.microbatches(plan.global_batch)
    stages = par.stage_layers()
    console.print(f"{_dims(par)}"
                  + (f", {par.vpp} virtual stages" if par.vpp > 1 else "")
                  + (f", layers {','.join(map(str, stages))}" if len(set(stages)) > 1 else "")
                  + f"; microbatch {par.microbatch} ({replica} a replica), global batch {plan.global_batch}; "
                  f"recompute {par.recompute}" + ("; sequence parallel" if par.sp else "")
                  + ("; ZeRO-1" if par.zero else "")
                  + ("; gradient reduction overlapped" if par.overlap_grad_reduce else "")
                  + f"; gradients reduced in {par.grad_reduce}"
                  + ("; pipeline sends overlapped" if par.overlap_p2p else "")
                  + f"; schedule {par.schedule}" + ("; GEMMs in FP8" if par.precision == "fp8" else "")
                  + ("; DeepEP dispatch" if par.dispatcher == "deepep" else ""))
    if par.schedule == "dualpipe-v" and par.ep > 1:
        console.print("dualpipe-v: its pairs' all-to-alls priced as hidden as DeepSeek-V3 reports them, an optimistic "
                      "bound on its one published run (docs/llm.md); --schedule zb-v prices the same plan without")
    try:
        console.print(f"Megatron-LM: {escape(' '.join(megatron.parallel_arguments(plan)))}")
    except PipeplanError as e:
        console.print(f"Megatron-LM: {escape(str(e))}")


def _recomputes(plan: Plan) -> bool:
    return any(plan.recompute_mode(s) != "none" for s in range(plan.num_stages))


def cut_summary(plan: Plan) -> str:
    """A planner's cut positions, the node before each cut and its layer, and the device
    cuts (planners that cut one node order, e.g. Auto-MAP's, record them in ``extra``)."""
    for name, info in plan.extra.items():
        if isinstance(info, dict) and info.get("cuts"):
            parts = [f"after #{c} of {info.get('nodes', '?')} ({after}" + (f", in {layer}" if layer != after else "")
                     + f") -> device {d}"
                     for c, after, layer, d in zip(info["cuts"], info["after"], info["layers"], info["device_cuts"])]
            return f"{name} cuts: " + "; ".join(parts) + _inference_time(info)
    return ""


def _inference_time(info: dict) -> str:
    """How long a learned planner's agent took to plan, apart from loading it (torch and the
    weights, once a process), where it records both."""
    if "inference_s" not in info:
        return ""
    setup = info.get("setup_s", 0.0)
    return (f" (planned in {fmt_time(info['inference_s'])}"
            + (f"; set-up {fmt_time(setup)}: the agent, loaded once a process)" if setup >= 1e-3 else ")"))


def print_prediction(result: SimResult, console: Console, plan: Plan | None = None, searched: bool = True) -> None:
    """Times and bounds; the bottleneck, and with ``searched`` (a plan just made, not one
    loaded) how long the search took and whether it finished."""
    console.print(f"iteration time [bold]{fmt_time(result.iteration_s)}[/bold]  "
                  f"lower bound {fmt_time(result.lower_s)}  efficiency {result.efficiency:.1%}  "
                  f"bubble {abs(result.bubble_fraction) if abs(result.bubble_fraction) < 5e-4 else result.bubble_fraction:.1%}")
    if plan is not None:
        search = f"; search took {fmt_time(plan.search_s)}{_setup_text(plan.setup_s)}" if searched else ""
        console.print(f"bottleneck: {bottleneck(plan, result)}{search}"
                      + ("" if plan.search_complete else
                         f" [yellow](search incomplete: {escape(plan.incomplete or '')}; the best plan found, "
                         "not proven best)[/yellow]"))
        trivial = trivial_note(plan)
        if trivial:
            console.print(trivial)
    if result.over_memory:
        console.print(f"[red]over memory:[/red] {', '.join(result.over_memory)}")
    variant = (plan.extra.get("memory_variant") if plan is not None else None)
    if variant:
        console.print(f"to fit in memory: schedule {variant['schedule']}, re-materializing stages "
                      f"{variant['recompute'] or 'none'}")


def trivial_note(plan: Plan) -> str:
    """Where a learning or search planner answered with a trivial plan (``learn.found``:
    data parallelism or an equal-compute split, weighed beside its own), which one."""
    for name, info in plan.extra.items():
        said = info.get("trivial") if isinstance(info, dict) else None
        if said:
            what = said if isinstance(said, str) else "data parallelism or an equal-compute split"
            return f"{name} answers a trivial plan, {what}: none of its own plans beat it"
    return ""


def _setup_text(setup_s: float) -> str:
    """The one-time set-up a search was spared (the simulator's kernels compiled or loaded
    from numba's cache), when there was some."""
    return f" (after {fmt_time(setup_s)} of one-time set-up)" if setup_s > 0 else ""


def _fits_cell(row: dict) -> str:
    """"yes", or "no:" with the device that overflows most, its stage, and by how much over
    its memory (+bytes)."""
    if row["fits"]:
        return "yes"
    over = row["memory_over_bytes"]
    worst = max(over, key=over.get)
    stage = next(k for k, s in enumerate(row["plan"]["stages"]) if worst in s["devices"])
    return f"[red]no: {worst} (stage {stage}) +{fmt_bytes(over[worst])}[/red]"


def _gap_cell(row: dict) -> str:
    """The gap to exact's plan; '>= ' when exact's search was cut short (a bound, not a gap)."""
    if row.get("gap_vs_exact") is None:
        return "-"
    return f"{'>= ' if row.get('gap_is_bound') else ''}{row['gap_vs_exact']:+.1%}"


#: ``explain``'s terms in a compare cell
def _dims(par) -> str:
    """``3D: TP 8 x PP 4 x DP 2``, with CP and EP (and ETP) where the plan uses them."""
    dims = [("TP", par.tp), ("CP", par.cp), ("PP", par.pp), ("DP", par.dp)]
    dims = [(k, v) for k, v in dims if k in ("TP", "PP", "DP") or v > 1]
    text = f"{len(dims)}D: " + " x ".join(f"{k} {v}" for k, v in dims)
    if par.ep > 1 or par.etp > 1:
        text += f", experts over EP {par.ep} x ETP {par.etp} (expert DP {par.expert_dp})"
    return text + (f", CP exchange {par.cp_comm}" if par.cp > 1 else "")


SHORT_TERMS = {"recompute": "recompute", "tp_comm": "TP comm", "cp_comm": "CP comm", "ep_comm": "EP comm",
               "pipeline_sends": "sends", "dp_comm": "DP",
               "optimizer": "optimizer", "bubble": "bubble", "other": "other"}


def _terms_cell(row: dict, iteration: float) -> str:
    """The three largest shares of a decoder plan's iteration beyond forward and backward
    compute (``pipeplan explain`` has them all)."""
    if "terms" not in row:
        return "-"
    top = sorted(((v, k) for k, v in row["terms"].items() if k in SHORT_TERMS and v / iteration >= 0.005),
                 reverse=True)[:3]
    return ", ".join(f"{SHORT_TERMS[k]} {v / iteration:.0%}" for v, k in top) or "-"


def print_compare(rows: list[dict], title: str, console: Console | None = None) -> None:
    """The rows of ``CompareRow.to_dict``, one line each (a time column in one unit): a plan
    that does not fit names its worst device and by how much; a planner that could not plan
    has its reason below the table, as has a search that is incomplete, and the dp column says
    why it is empty."""
    console = console or make_console(170)
    table = Table(title=title)
    gap = any(r.get("gap_vs_exact") is not None for r in rows)
    terms = any("terms" in r for r in rows)
    cols = ["rank", "planner", "stages", "replication", "iteration", "speedup vs dp", "efficiency",
            *(["gap to exact"] if gap else []), *(["beyond compute"] if terms else []), "search", "fits"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("planner", "replication", "fits") else "right",
                         no_wrap=True)
    ok = [r for r in rows if "error" not in r]
    it_unit = time_unit([r["iteration_s"] for r in ok])
    search_unit = time_unit([r["search_s"] for r in ok])
    notes = []
    for k, r in enumerate(rows, start=1):
        if "error" in r:
            reason = str(r["error"])
            notes.append(reason if reason.startswith(f"{r['planner']}: ") else f"{r['planner']}: {reason}")
            table.add_row("-", r["planner"], *["-"] * (len(cols) - 3), f"[red]no plan ({len(notes)})[/red]")
            continue
        rep = r["replication"]
        incomplete = ""
        if not r.get("search_complete", True):
            notes.append(f"{r['planner']}: search incomplete: {r.get('incomplete') or 'its budget ran out'}")
            incomplete = f", incomplete ({len(notes)})"
        mode = f" {r['plan']['replicas']}" if max(rep) > 1 else ""
        tps = [st.get("tp", 1) for st in r["plan"]["stages"]]
        tp = "" if max(tps) == 1 else f"TP {tps[0] if len(set(tps)) == 1 else '-'.join(map(str, tps))} x "
        rep = [n // t for n, t in zip(rep, tps)]  # replicas: tensor-parallel groups
        table.add_row(str(k), f"{r['planner']} ({r['plan']['schedule']}{incomplete})", str(len(rep)),
                      tp + ("-".join(map(str, rep)) if len(rep) <= 12 else f"{'-'.join(map(str, rep[:12]))}-..")
                      + mode,
                      fmt_time_in(r["iteration_s"], it_unit),
                      "-" if r.get("speedup_vs_dp") is None else f"{r['speedup_vs_dp']:.2f}x",
                      f"{r['efficiency']:.1%}",
                      *([_gap_cell(r)] if gap else []),
                      *([_terms_cell(r, r["iteration_s"])] if terms else []),
                      fmt_time_in(r["search_s"], search_unit),
                      _fits_cell(r))
    console.print(table)
    setup_s = sum(r["plan"].get("setup_s", 0.0) for r in ok)
    if setup_s > 0:
        console.print(f"search times exclude {fmt_time(setup_s)} of one-time set-up (the simulator's kernels "
                      "compiled or loaded from the cache)", soft_wrap=True)
    for k, note in enumerate(notes, start=1):
        console.print(f"({k}) {note}", soft_wrap=True)
    if {r["plan"]["replicas"] for r in ok if max(r["replication"]) > 1} == {"split", "round-robin"}:
        console.print("split: a stage's replicas share every microbatch (each holds its share of the "
                      "activations); round-robin: each replica runs whole microbatches in turn (each holds "
                      "whole microbatches' activations)", soft_wrap=True)
    if ok and all(r.get("speedup_vs_dp") is None for r in ok):
        dp = next((r for r in rows if r["planner"] == "dp"), None)
        why = "dp was not compared" if dp is None else "dp has no plan" if "error" in dp else \
            "dp's plan does not fit in memory"
        console.print(f"speedup vs dp: - everywhere because {why}", soft_wrap=True)


#: ``explain``'s terms in words
def print_explained(names: list[str], found: list[dict], diff: dict | None) -> None:
    """``explain``'s table: each plan's seconds and share per term, and the difference."""
    table = Table(title="where the iteration goes (the bottleneck group: " + ", ".join(f["device"] for f in found)
                  + ")")
    table.add_column("term")
    for name in names:
        table.add_column(f"{name} s", justify="right")
        table.add_column("share", justify="right")
    if diff:
        table.add_column("saved s", justify="right")
        table.add_column("of A's iteration", justify="right")
    for key, text in TERM_TEXT.items():
        row = [text]
        for f in found:
            x = clean(f["terms"][key], f["iteration_s"])
            row += [f"{x:.4g}", f"{x / f['iteration_s']:.1%}"]
        if diff:
            x = clean(diff["saved_s"][key], found[0]["iteration_s"])
            row += [f"{x:+.4g}", f"{x / found[0]['iteration_s']:+.1%}"]
        table.add_row(*row)
    row = ["iteration"] + [x for f in found for x in (f"{f['iteration_s']:.4g}", "100%")]
    if diff:
        row += [f"{diff['iteration_saved_s']:+.4g}", f"{diff['iteration_saved_s'] / found[0]['iteration_s']:+.1%}"]
    table.add_row(*row)
    console = Console()
    console.print(table)
    if diff:
        console.print(f"{names[1]} is {diff['speedup']:.3g}x as fast as {names[0]}")
