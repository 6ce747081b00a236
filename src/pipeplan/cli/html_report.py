"""One self-contained HTML page of plans (``pipeplan report PLAN --html FILE``, docs/report.md).

For the first plan: its summary (the text ``pipeplan simulate`` prints), its timeline (the
Gantt chart, a PNG inlined as a data URI), memory per GPU against the usable limit, and where
its iteration goes (``sim.explain``'s terms); with ``--compare``, one row a plan and the
difference term by term against the first. No script, no style sheet, image or font fetched:
the page opens offline and prints as it shows.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape

from ..plan import Plan
from ..sim import SimResult
from ..sim.explain import TERM_TEXT, clean, difference
from ..units import fmt_bytes, fmt_time
from ..viz.gantt import gantt_png

#: a term's colour in the breakdown bar (the Gantt chart's where the term is a kind of task)
TERM_COLOUR = {"forward": "#a6cee3", "backward": "#1f78b4", "recompute": "#fb9a99", "tp_comm": "#ff7f00",
               "cp_comm": "#fdbf6f", "ep_comm": "#e31a1c", "pipeline_sends": "#b2df8a", "dp_comm": "#33a02c", "optimizer": "#6a3d9a", "bubble": "#d9d9d9",
               "other": "#8c8c8c"}
MEMORY_COLOUR, OVER_COLOUR, HEADER_COLOUR = "#4c9f70", "#d62728", "#dbe8f5"
_STYLE = f"""
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.15em; margin-top: 1.6em; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
th, td {{ border: 1px solid #bbb; padding: 3px 8px; text-align: right; }}
th {{ background: {HEADER_COLOUR}; }} td.name, th.name {{ text-align: left; }}
pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }}
.bar {{ height: 14px; background: {MEMORY_COLOUR}; }} .over {{ background: {OVER_COLOUR}; }}
.frame {{ width: 320px; border: 1px solid #999; position: relative; }}
.limit {{ position: absolute; top: 0; bottom: 0; border-left: 2px solid #000; }}
.stack {{ display: flex; width: 640px; height: 22px; border: 1px solid #999; }}
.note {{ color: #555; }} img {{ max-width: 100%; border: 1px solid #ccc; }}
"""


@dataclass
class Entry:
    """One plan of the page: its name (the file), the plan, its simulation, the text summary,
    and its breakdown (``sim.explain``) or why there is none."""

    name: str
    plan: Plan
    result: SimResult
    summary: str
    explained: dict | None
    why_no_breakdown: str = ""


def page(entries: list[Entry]) -> str:
    """The page (module docstring): the first entry in full, the others in the comparison."""
    first = entries[0]
    title = f"{first.plan.planner} / {first.plan.schedule}: {first.plan.graph.name} on {first.plan.cluster.name}"
    parts = [f"<h1>pipeplan plan: {escape(title)}</h1>",
             f"<p>{escape(first.name)}: iteration <b>{fmt_time(first.result.iteration_s)}</b>, "
             f"{len(first.plan.cluster)} GPUs, schedule {escape(first.plan.schedule)}</p>",
             '<h2 id="summary">Plan</h2>', f"<pre>{escape(first.summary)}</pre>",
             '<h2 id="timeline">Timeline</h2>', _timeline(first, title),
             '<h2 id="memory">Memory per GPU</h2>', _memory(first.result),
             '<h2 id="breakdown">Where the iteration goes</h2>', _breakdown(entries)]
    if len(entries) > 1:
        parts += ['<h2 id="comparison">Comparison</h2>', _comparison(entries)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


def _timeline(entry: Entry, title: str) -> str:
    tl = entry.result.timeline
    if tl is None:
        return '<p class="note">no timeline: the schedule runs as a steady state</p>'
    data = base64.b64encode(gantt_png(tl, title)).decode("ascii")
    return f'<img id="gantt" alt="timeline of {escape(title)}" src="data:image/png;base64,{data}">'


def _memory(result: SimResult) -> str:
    """A row a GPU: its stage, peak memory and limit, a bar (red over the limit)."""
    top = max(float(result.memory_bytes.max()), float(result.memory_limit.max()), 1.0)
    rows = []
    for d, s, m, lim in zip(result.devices, result.stage_of_device, result.memory_bytes, result.memory_limit):
        over = m > lim
        bar = (f'<div class="frame"><div class="bar{" over" if over else ""}" style="width:{100 * m / top:.1f}%">'
               f'</div><div class="limit" style="left:{100 * lim / top:.1f}%"></div></div>')
        rows.append(f'<tr><td class="name">{escape(str(d))}</td><td>{s}</td><td>{fmt_bytes(float(m))}</td>'
                    f"<td>{fmt_bytes(float(lim))}</td><td>{m / lim:.0%}{' OVER' if over else ''}</td>"
                    f"<td class=\"name\">{bar}</td></tr>")
    return ('<table id="memory-table"><tr><th class="name">GPU</th><th>stage</th><th>peak</th><th>usable</th>'
            '<th>of usable</th><th class="name">peak (bar) against the limit (line)</th></tr>'
            + "".join(rows) + "</table>")


def _breakdown(entries: list[Entry]) -> str:
    """Each plan's terms in seconds and share, a stacked bar of the first, and what each other
    plan saves against the first, term by term (``sim.explain.difference``)."""
    found = [e for e in entries if e.explained is not None]
    notes = "".join(f'<p class="note">{escape(e.name)}: {escape(e.why_no_breakdown)}</p>'
                    for e in entries if e.explained is None)
    if not found:
        return notes
    first = found[0].explained
    stack = "".join(f'<div title="{escape(TERM_TEXT[k])}" style="width:{100 * v / first["iteration_s"]:.2f}%;'
                    f'background:{TERM_COLOUR[k]}"></div>'
                    for k, v in first["terms"].items() if clean(v, first["iteration_s"]) > 0)
    diffs = [difference(first, e.explained) for e in found[1:]]
    head = "".join(f"<th>{escape(e.name)} s</th><th>share</th>" for e in found) + "".join(
        f"<th>{escape(e.name)} saves s</th>" for e in found[1:])
    rows = []
    for key, text in TERM_TEXT.items():
        cells = ""
        for e in found:
            x = clean(e.explained["terms"][key], e.explained["iteration_s"])
            cells += f"<td>{x:.4g}</td><td>{x / e.explained['iteration_s']:.1%}</td>"
        cells += "".join(f"<td>{clean(d['saved_s'][key], first['iteration_s']):+.4g}</td>" for d in diffs)
        swatch = f'<span style="color:{TERM_COLOUR[key]}">&#9632;</span> '
        rows.append(f'<tr><td class="name">{swatch}{escape(text)}</td>{cells}</tr>')
    total = "".join(f"<td>{e.explained['iteration_s']:.4g}</td><td>100%</td>" for e in found) + "".join(
        f"<td>{d['iteration_saved_s']:+.4g}</td>" for d in diffs)
    return (f'<p>the bottleneck group: {escape(first["device"])}</p><div class="stack" id="breakdown-bar">{stack}'
            f'</div><table id="breakdown-table"><tr><th class="name">term</th>{head}</tr>{"".join(rows)}'
            f'<tr><td class="name">iteration</td>{total}</tr></table>{notes}')


def _comparison(entries: list[Entry]) -> str:
    """A row a plan: planner, schedule, GPUs, iteration, speed against the first, bubble,
    peak memory against the limit, MFU where the plan is a decoder's."""
    base = entries[0].result.iteration_s
    rows = []
    for e in entries:
        r = e.result
        peak, lim = float(r.memory_bytes.max()), float(r.memory_limit.min())
        mfu = r.extra.get("mfu")
        rows.append(f'<tr><td class="name">{escape(e.name)}</td><td class="name">{escape(e.plan.planner)}</td>'
                    f'<td class="name">{escape(e.plan.schedule)}</td><td>{len(e.plan.cluster)}</td>'
                    f"<td>{fmt_time(r.iteration_s)}</td><td>{base / r.iteration_s:.3g}x</td>"
                    f"<td>{max(r.bubble_fraction, 0.0):.1%}</td><td>{fmt_bytes(peak)} / {fmt_bytes(lim)}"
                    f"{' OVER' if r.over_memory else ''}</td><td>{'' if mfu is None else f'{mfu:.1%}'}</td></tr>")
    return ('<table id="comparison-table"><tr><th class="name">plan</th><th class="name">planner</th>'
            '<th class="name">schedule</th><th>GPUs</th><th>iteration</th><th>speed vs first</th><th>bubble</th>'
            '<th>peak / usable memory</th><th>MFU</th></tr>' + "".join(rows) + "</table>")
