"""Timeline -> Gantt chart PNG (like Fig. 2(b) of the SPP paper).

One row per device (top, labelled with its stage; every other stage on a shaded band) and
per inter-stage channel (below, on a grey band, labelled with the stages it joins); time on
x in one unit. Transfers, all-reduces and optimizer steps are drawn at least a few pixels
wide, so that they stay visible at any scale. A steady state (asynchronous schedules) is
drawn over the one period its iteration is measured on.
A device that holds several stages (model chunks: interleaved 1F1B, ZB-V) names them on its
row; its bars are labelled ``m.c`` (microbatch m of its chunk c, counted from its first stage)
and each later chunk is drawn a shade darker, so the chunks stay apart at any size.
Bars are batched into one PolyCollection per task kind, so 32 stages x 128 microbatches
render in about 2.5 s. Uses the Agg canvas directly: no pyplot, no global state.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..errors import PipeplanError
from ..outputs import FORMATS
from ..schedule import Kind
from ..schedule.timeline import Timeline

# kind: (legend label, face colour, edge colour, hatch, hatch colour, label text colour).
# Edges are a darker shade of the face so that narrow bars keep their colour.
_STYLE = {
    Kind.F: ("forward", "#a6cee3", "#5b8fb0", "", "", "black"),
    Kind.B: ("backward", "#1f78b4", "#0e3f63", "", "", "white"),
    Kind.I: ("backward (input grad)", "#1f78b4", "#0e3f63", "", "", "white"),
    Kind.W: ("backward (weight grad)", "#6a3d9a", "#3f2260", "", "", "white"),
    Kind.SEND_F: ("send forward", "#eeeeee", "#7a7a7a", "////", "#bbbbbb", "black"),
    Kind.SEND_B: ("send backward", "#bdbdbd", "#555555", "\\\\\\\\", "#8c8c8c", "black"),
    Kind.AR: ("all-reduce", "#e6550d", "#8c2d04", "", "", "white"),
    Kind.UPDATE: ("optimizer step", "#74c476", "#238b45", "", "", "black"),
}
_DPI = 110
_BAR_H = 0.8          # bar height, in rows
_GAP = 0.9            # space between the device rows and the channel rows, in rows
_TOP_IN, _BOTTOM_IN, _RIGHT_IN = 0.8, 0.6, 0.3


def _time_unit(span_s: float) -> tuple[str, float]:
    """(unit name, factor from seconds) that suits a span."""
    if span_s >= 1.0:
        return "s", 1.0
    if span_s >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _row_positions(tl: Timeline) -> tuple[np.ndarray, int, int]:
    """y of each resource (devices first, channels after a gap), #devices, #channels."""
    dev = [r for r, d in enumerate(tl.resource_is_device) if d]
    chan = [r for r, d in enumerate(tl.resource_is_device) if not d]
    y = np.zeros(len(tl.resources))
    y[dev] = np.arange(len(dev))
    y[chan] = len(dev) + (_GAP if dev else 0.0) + np.arange(len(chan))
    return y, len(dev), len(chan)


def _span_in_bars(tl: Timeline, span: float, scale: float) -> float:
    """How many typical (median) compute bars fit in ``span`` (in plot units)."""
    dur = (tl.end - tl.start) * scale
    compute = dur[np.isin(tl.kind, [Kind.F, Kind.B, Kind.I, Kind.W])]
    typical = np.median(compute) if compute.size else (np.median(dur) if dur.size else 0.0)
    return span / typical if typical > 0 else 0.0


def _label_sizes(width_px: np.ndarray, n_chars: np.ndarray, group: np.ndarray,
                 max_fs: float, min_fs: float = 6.0) -> np.ndarray:
    """Font size (pt) of each bar's label, 0 for none. Bars of one group (a row's bars of
    one kind) share the size at which their median bar fits its text (~0.66 em a char);
    a group where fewer than half fit gets no labels, so that rows are labelled
    consistently rather than only on their 1-digit microbatches."""
    fit = (width_px - 3.0) / (np.maximum(n_chars, 1) * 0.66 * _DPI / 72.0)
    sizes = np.zeros(group.size)
    for g in np.unique(group):
        sel = group == g
        fs = float(np.clip(np.median(fit[sel]), min_fs, max_fs))
        ok = sel & (fit >= fs)
        if 2 * np.count_nonzero(ok) >= np.count_nonzero(sel):
            sizes[ok] = fs
    return sizes


_MIN_PX = {Kind.SEND_F: 2.5, Kind.SEND_B: 2.5, Kind.AR: 3.0, Kind.UPDATE: 2.0}  # short bars stay visible


def _row_labels(tl: Timeline) -> tuple[list[str], dict[int, int]]:
    """Each resource's label (a device with its stage, a channel with the stages it joins),
    and the stage of each device row (for the stage bands)."""
    compute = np.isin(tl.kind, [Kind.F, Kind.B, Kind.I, Kind.W])
    labels, stage_of = [], {}
    for r, name in enumerate(tl.resources):
        if tl.resource_is_device[r]:
            stages = sorted(set(tl.stage[compute & (tl.resource == r)].tolist()))
            if stages:
                stage_of[r] = stages[0]
            what = f"stage {stages[0]}" if len(stages) == 1 else f"stages {','.join(map(str, stages))}"
            labels.append(f"{name} · {what}" if stages else name)
        else:
            cuts = re.findall(r"(\d+)-(\d+)", name.split(":")[1]) if re.match(r"ch:\d+-\d+", name) else []
            joined = ", ".join(f"{a} → {b}" for a, b in cuts)
            labels.append(f"{name} (stage{'s' if len(cuts) > 1 else ''} {joined})" if cuts else name)
    return labels, stage_of


def _bar_label(kind: int, micro: int, chunk: int = -1) -> str:
    """A bar's text: its microbatch (``m.c`` on a device of several chunks), AR or U."""
    if kind in (Kind.AR, Kind.UPDATE):
        return "AR" if kind == Kind.AR else "U"
    return f"{micro}.{chunk}" if chunk >= 0 else str(micro)


def chunks_of(tl: Timeline) -> np.ndarray:
    """Each task's chunk on its device (the rank of its stage among the device's stages), -1
    on a device that holds one stage and for tasks without a stage of their own."""
    out = np.full(len(tl), -1, dtype=np.int64)
    compute = np.isin(tl.kind, [Kind.F, Kind.B, Kind.I, Kind.W])
    for r in np.unique(tl.resource[compute]).tolist():
        sel = compute & (tl.resource == r)
        stages = np.unique(tl.stage[sel])
        if stages.size > 1:
            out[sel] = np.searchsorted(stages, tl.stage[sel])
    return out


def _shade(color: str, chunk: np.ndarray) -> np.ndarray:
    """RGBA of ``color`` darkened 18% per chunk after the first (up to 4 steps)."""
    from matplotlib.colors import to_rgba

    base = np.array(to_rgba(color))
    f = 1.0 - 0.18 * np.clip(chunk, 0, 4)[:, None]
    return np.concatenate([base[None, :3] * f, np.full((chunk.size, 1), base[3])], axis=1)


def draw_gantt(tl: Timeline, path: str | os.PathLike, title: str = "",
               max_labels: int = 4000) -> None:
    """Draw the timeline as a Gantt chart and write it to ``path`` (``.png``, ``.svg`` or
    ``.pdf``, by its extension)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS["figure"]:
        raise PipeplanError(f"{path}: a Gantt chart is written as {', '.join(FORMATS['figure'])}, "
                            f"not {path.suffix or 'no extension'}")
    fig = gantt_figure(tl, title, max_labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lower().lstrip("."), dpi=_DPI)
    fig.clear()


def gantt_png(tl: Timeline, title: str = "") -> bytes:
    """The Gantt chart as PNG bytes (for a page that inlines it)."""
    fig = gantt_figure(tl, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    fig.clear()
    return buf.getvalue()


def gantt_figure(tl: Timeline, title: str = "", max_labels: int = 4000) -> Figure:
    """The timeline as a Gantt chart. Microbatch numbers are written on bars wide enough for
    them, at most ``max_labels`` of them (device rows first)."""
    y, n_dev, n_chan = _row_positions(tl)
    labels, stage_of = _row_labels(tl)
    span_rows = max(y.max() + 1 if y.size else 1.0, 1.0)
    if tl.period is not None:  # a steady state: one period of the stream
        t_begin, t_end = tl.period
        title = f"{title + ': ' if title else ''}steady state, one period"
    else:
        t_end = max(float(tl.iteration_s), float(tl.end.max()) if len(tl) else 0.0)
        t_begin = min(0.0, float(tl.start.min()) if len(tl) else 0.0)
    unit, scale = _time_unit(t_end - t_begin)
    x0, x1 = t_begin * scale, (t_end * scale if t_end > t_begin else t_begin * scale + 1.0)
    x1 += 0.01 * (x1 - x0)

    # Layout in inches: width grows with how many typical compute bars the time span
    # holds (capped), height with the number of rows.
    n_bars = _span_in_bars(tl, x1 - x0, scale)
    name_len = max((len(n) for n in labels), default=4)
    left_in = 0.35 + 0.075 * name_len
    width_in = min(24.0, max(9.0, left_in + _RIGHT_IN + 0.14 * n_bars))
    row_in = min(0.35, max(0.18, 16.0 / span_rows), 55.0 / span_rows)
    height_in = _TOP_IN + _BOTTOM_IN + row_in * span_rows
    ax_w_in = width_in - left_in - _RIGHT_IN

    fig = Figure(figsize=(width_in, height_in), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((left_in / width_in, _BOTTOM_IN / height_in,
                       ax_w_in / width_in, row_in * span_rows / height_in))
    ax.set_xlim(x0, x1)
    ax.set_ylim(span_rows - 0.5, -0.5)

    row_pt = row_in * 72.0
    tick_fs = min(9.0, 0.6 * row_pt)
    if n_chan and n_dev:
        ax.axhspan(n_dev - 0.5 + _GAP, span_rows - 0.5, color="#f6f6f6", zorder=0)
        ax.axhline(n_dev - 0.5 + _GAP / 2, color="#555555", lw=0.8, zorder=1)
    for r, s in stage_of.items():  # stage bands: every other stage shaded
        if s % 2:
            ax.axhspan(y[r] - 0.5, y[r] + 0.5, color="#eef3f8", zorder=0)

    px_per_unit = ax_w_in * _DPI / (x1 - x0)
    start, end = _draw_bars(ax, tl, y, scale, px_per_unit)
    visible = (end > x0) & (start < x1)
    labelled = _draw_labels(ax, tl, y, start, end, px_per_unit, min(8.0, 0.5 * row_pt), max_labels, visible)

    it = float(tl.iteration_s) * scale
    ax.axvline(it + (t_begin * scale if tl.period is not None else 0.0), color="crimson", ls="--", lw=1.3, zorder=4)
    it_text = f"{it:.4g} {unit}"

    order = np.argsort(y, kind="stable")
    ax.set_yticks(y[order], [labels[r] for r in order], fontsize=tick_fs)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel(f"time [{unit}]")
    ax.grid(axis="x", color="#dddddd", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    chunk_labels = bool(np.any(chunks_of(tl)[labelled] >= 0))
    _legend_and_heading(fig, ax, tl, visible, chunk_labels, title, it_text, left_in / width_in,
                        (width_in - left_in - 0.1) * 72.0, 1 - 0.12 / height_in)
    return fig


#: bars of a kind above which they are drawn without their hatch (``_draw_bars``)
MAX_HATCHED = 2000


def _draw_bars(ax, tl: Timeline, y: np.ndarray, scale: float, px_per_unit: float) -> tuple[np.ndarray, np.ndarray]:
    """One PolyCollection per kind; short kinds widened to ``_MIN_PX``; hatched where the kind
    has at most ``MAX_HATCHED`` bars (Agg strokes a hatch bar by bar: seconds a thousand bars,
    and the colour tells the kind apart). Returns the bars' start and end in plot units."""
    start, end = tl.start * scale, tl.end * scale
    for k, px in _MIN_PX.items():
        end = np.where(tl.kind == k, np.maximum(end, start + px / px_per_unit), end)
    half = _BAR_H / 2
    chunk = chunks_of(tl)
    for k, (label, face, edge, hatch, hatch_color, _) in _STYLE.items():
        sel = np.flatnonzero(tl.kind == k)
        if not sel.size:
            continue
        a, b, yy = start[sel], end[sel], y[tl.resource[sel]]
        verts = np.stack([np.stack([a, yy - half], 1), np.stack([a, yy + half], 1),
                          np.stack([b, yy + half], 1), np.stack([b, yy - half], 1)], axis=1)
        faces = _shade(face, chunk[sel]) if np.any(chunk[sel] > 0) else face
        bars = PolyCollection(verts, facecolors=faces, edgecolors=edge, linewidths=0.4,
                              zorder=2, label=label)
        if hatch and sel.size <= MAX_HATCHED:
            bars.set_hatch(hatch)
            bars.set_hatchcolor(hatch_color)
        ax.add_collection(bars, autolim=False)
    return start, end


def _draw_labels(ax, tl: Timeline, y: np.ndarray, start: np.ndarray, end: np.ndarray, px_per_unit: float,
                 max_fs: float, max_labels: int, visible: np.ndarray) -> np.ndarray:
    """Microbatch numbers where they fit on visible bars, device rows first, at most
    ``max_labels``. Returns the indices of the bars labelled."""
    texts = [_bar_label(int(k), int(m), int(c)) for k, m, c in zip(tl.kind, tl.micro, chunks_of(tl))]
    sizes = _label_sizes((end - start) * px_per_unit, np.array([len(t) for t in texts]),
                         tl.resource * len(_STYLE) + tl.kind, max_fs=max_fs)
    fits = np.flatnonzero((sizes > 0) & visible)
    fits = fits[np.lexsort((start[fits], y[tl.resource[fits]]))][:max(max_labels, 0)]
    for t in fits:
        ax.text((start[t] + end[t]) / 2, y[tl.resource[t]], texts[t], ha="center",
                va="center", fontsize=sizes[t], color=_STYLE[int(tl.kind[t])][5], zorder=3,
                clip_on=True)
    return fits


def _legend_and_heading(fig: Figure, ax, tl: Timeline, visible: np.ndarray, chunk_labels: bool, title: str,
                        it_text: str, x: float, width_pt: float, top: float) -> None:
    """The legend of what is drawn (the kinds of the ``visible`` bars, the iteration line, the
    channel rows, the ``m.c`` labels when some are written); the heading, shrunk to fit."""
    kinds = set(np.unique(tl.kind[visible]).tolist())
    handles = [Patch(facecolor=f, edgecolor=e, hatch=h or None, hatchcolor=hc or None,
                     label=lab) for k, (lab, f, e, h, hc, _) in _STYLE.items() if k in kinds]
    handles.append(Line2D([], [], color="crimson", ls="--", lw=1.3,
                          label=f"iteration ({it_text})"))
    if not all(tl.resource_is_device):
        handles.append(Patch(facecolor="#f6f6f6", edgecolor="#cccccc",
                             label="ch a-b: link from stage a to b (one row per direction)"))
    if np.any(chunks_of(tl)[visible] > 0):
        label = "m.c: microbatch m, chunk c (darker: later chunk)" if chunk_labels else "darker: later chunk"
        handles.append(Patch(facecolor="#ffffff", edgecolor="#ffffff", label=label))
    _fit_legend(fig, ax, handles)
    heading = f"{title} — iteration time {it_text}" if title else f"Iteration time {it_text}"
    fit = width_pt / (0.62 * max(len(heading), 1))  # bold: ~0.62 em a character
    fig.text(x, top, heading, ha="left", va="top", fontsize=max(7.0, min(12.0, fit)), fontweight="bold")


def _fit_legend(fig: Figure, ax, handles: list) -> None:
    """The legend above the axes, right-aligned on one row, else on two (which still fit
    under the heading), else on two rows from the figure's left edge, its text shrunk to fit."""
    style = dict(frameon=False, handlelength=2.2, borderaxespad=0.2)
    renderer = fig.canvas.get_renderer()
    for ncol in (len(handles), -(-len(handles) // 2)):
        legend = ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=ncol, fontsize=9,
                           **style)
        box = legend.get_window_extent(renderer)
        if box.x0 >= 0:
            return
    size = max(6.0, 9.0 * 0.97 * fig.bbox.width / box.width)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, ax.get_position().y1),
              bbox_transform=fig.transFigure, ncol=ncol, fontsize=size, **style)
