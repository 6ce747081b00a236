"""Tests for pipeplan.viz: the Perfetto trace and the Gantt PNG."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeplan.schedule import Kind
from pipeplan.schedule.timeline import KIND_NAMES, Timeline
from pipeplan.viz import draw_gantt, to_trace, write_trace

ALLREDUCE, BWD, COMM_B, COMM_F, FWD = Kind.AR, Kind.B, Kind.SEND_B, Kind.SEND_F, Kind.F

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def gpipe_timeline(stages: int, micros: int, tf: float = 1e-3, tb: float = 2e-3,
                   tc: float = 0.5e-3, tar: float = 3e-3, replicas: int = 1) -> Timeline:
    """A synthetic GPipe iteration: all forwards, then all backwards, a transfer on the
    channel between consecutive stages after each compute, an all-reduce per device at
    the end. Stage s has ``replicas`` devices when s is 0 (to test replication)."""
    devs = [(s, i) for s in range(stages) for i in range(replicas if s == 0 else 1)]
    resources = [f"gpu{s}.{i}" if replicas > 1 and s == 0 else f"gpu{s}" for s, i in devs]
    resources += [f"ch:{s}-{s + 1}" for s in range(stages - 1)]
    is_dev = [True] * len(devs) + [False] * (stages - 1)
    dev_of = {s: [d for d, (ds, _) in enumerate(devs) if ds == s] for s in range(stages)}
    rows: list[tuple[int, int, int, int, float, float]] = []
    step_f, step_b = tf + tc, tb + tc
    t_fwd_end = (micros + stages - 1) * step_f
    for m in range(micros):
        for s in range(stages):
            a = (m + s) * step_f
            rows += [(FWD, s, m, d, a, a + tf) for d in dev_of[s]]
            if s < stages - 1:
                rows.append((COMM_F, s, m, len(devs) + s, a + tf, a + step_f))
            b = t_fwd_end + (m + stages - 1 - s) * step_b
            rows += [(BWD, s, m, d, b, b + tb) for d in dev_of[s]]
            if s > 0:
                rows.append((COMM_B, s, m, len(devs) + s - 1, b + tb, b + step_b))
    t_bwd_end = t_fwd_end + (micros + stages - 1) * step_b
    rows += [(ALLREDUCE, s, -1, d, t_bwd_end, t_bwd_end + tar)
             for s in range(stages) for d in dev_of[s]]
    k, st, mi, r, a, b = (np.array(c) for c in zip(*rows))
    return Timeline(resources=resources, resource_is_device=is_dev,
                    kind=k.astype(np.int64), stage=st.astype(np.int64),
                    micro=mi.astype(np.int64), resource=r.astype(np.int64),
                    start=a.astype(float), end=b.astype(float),
                    iteration_s=float(t_bwd_end + tar))


@pytest.fixture
def small() -> Timeline:
    return gpipe_timeline(stages=2, micros=3, replicas=2)


def _slices(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_trace_is_valid_json(small: Timeline) -> None:
    trace = to_trace(small, title="2x3")
    again = json.loads(json.dumps(trace, allow_nan=False))
    assert again == trace
    assert trace["displayTimeUnit"] == "ms"
    for e in trace["traceEvents"]:
        assert {"name", "ph", "pid", "tid"} <= e.keys()


def test_trace_one_named_sorted_track_per_resource(small: Timeline) -> None:
    events = to_trace(small)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    sort = {e["tid"]: e["args"]["sort_index"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_sort_index"}
    assert sorted(names.values()) == sorted(small.resources)
    assert sort.keys() == names.keys()
    by_sort = [names[t] for t in sorted(sort, key=sort.get)]
    assert by_sort == ["gpu0.0", "gpu0.1", "gpu1", "ch:0-1"]
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    used = {e["tid"] for e in _slices(to_trace(small))}
    assert used == set(names)


def test_trace_has_every_task_once(small: Timeline) -> None:
    trace = to_trace(small)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    got = sorted((names[e["tid"]], e["args"]["kind"], e["args"]["stage"],
                  e["args"]["microbatch"], e["ts"], e["dur"]) for e in _slices(trace))
    want = sorted((small.resources[r], KIND_NAMES[k], s, m, a * 1e6, (b - a) * 1e6)
                  for k, s, m, r, a, b in zip(small.kind, small.stage, small.micro,
                                              small.resource, small.start, small.end))
    assert len(got) == len(want) == len(small)
    for g, w in zip(got, want):
        assert g[:4] == w[:4]
        assert g[4] == pytest.approx(w[4], abs=1e-3) and g[5] == pytest.approx(w[5], abs=2e-3)


def test_trace_names_and_categories(small: Timeline) -> None:
    slices = _slices(to_trace(small))
    names = {e["name"] for e in slices}
    assert {"F0", "F2", "B1", "send F0", "send B2", "allreduce s0", "allreduce s1"} <= names
    assert {e["cat"] for e in slices} == {KIND_NAMES[k] for k in (FWD, BWD, COMM_F, COMM_B, ALLREDUCE)}  # the synthetic timeline has no update
    assert sum(e["name"] == "allreduce s0" for e in slices) == 2   # one per replica
    assert sum(e["name"] == "F1" for e in slices) == 3             # 2 replicas + stage 1


def test_trace_overlapping_tasks_get_an_extra_track() -> None:
    tl = Timeline(resources=["gpu0"], resource_is_device=[True],
                  kind=np.array([FWD, ALLREDUCE]), stage=np.array([0, 0]),
                  micro=np.array([0, -1]), resource=np.array([0, 0]),
                  start=np.array([0.0, 0.5e-3]), end=np.array([1e-3, 2e-3]), iteration_s=2e-3)
    events = to_trace(tl)["traceEvents"]
    names = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert names == ["gpu0", "gpu0 #2"]
    assert len({e["tid"] for e in events if e["ph"] == "X"}) == 2


def test_write_trace_creates_dirs(small: Timeline, tmp_path) -> None:
    out = write_trace(small, tmp_path / "a" / "b" / "trace.json", title="t")
    data = json.loads(out.read_text())
    assert len(_slices(data)) == len(small)


def test_gantt_small(small: Timeline, tmp_path) -> None:
    out = tmp_path / "sub" / "gantt.png"
    draw_gantt(small, out, title="2 stages x 3 microbatches")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_gantt_empty(tmp_path) -> None:
    empty = np.array([], dtype=np.int64)
    tl = Timeline(resources=["gpu0"], resource_is_device=[True], kind=empty, stage=empty,
                  micro=empty, resource=empty, start=empty.astype(float),
                  end=empty.astype(float), iteration_s=0.0)
    draw_gantt(tl, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_gantt_large(tmp_path) -> None:
    tl = gpipe_timeline(stages=32, micros=64)
    assert sum(tl.resource_is_device) == 32 and len(tl.resources) == 63
    out = tmp_path / "large.png"
    draw_gantt(tl, out, title="32 stages x 64 microbatches")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_gantt_labels_stages_and_channels(small: Timeline) -> None:
    """Device rows name their stage, channel rows the stages they join; the legend explains
    the channel rows."""
    from pipeplan.viz.gantt import gantt_figure

    ax = gantt_figure(small, "t").axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert "gpu0.0 · stage 0" in ticks and "gpu1 · stage 1" in ticks
    assert "ch:0-1 (stage 0 → 1)" in ticks
    assert any("link from stage a to b" in t.get_text() for t in ax.get_legend().get_texts())


def test_gantt_keeps_short_bars_visible_and_draws_one_period_of_a_steady_state() -> None:
    """A 1 us all-reduce in a 1 s chart is drawn >= 3 px wide; a steady state's chart spans
    its period only."""
    from pipeplan.viz.gantt import _MIN_PX, gantt_figure

    tl = Timeline(["gpu0"], [True], np.array([FWD, ALLREDUCE], dtype=np.int8), np.zeros(2, dtype=np.int64),
                  np.array([0, -1]), np.zeros(2, dtype=np.int64), np.array([0.0, 1.0]), np.array([1.0, 1.0 + 1e-6]),
                  1.0)
    fig = gantt_figure(tl)
    ax = fig.axes[0]
    bars = [c for c in ax.collections if c.get_label() == "all-reduce"][0]
    x = bars.get_paths()[0].vertices[:, 0]
    px = (x.max() - x.min()) * ax.bbox.width / (ax.get_xlim()[1] - ax.get_xlim()[0])
    assert px >= _MIN_PX[ALLREDUCE] - 1e-6
    steady = Timeline(["gpu0"], [True], np.array([FWD] * 3, dtype=np.int8), np.zeros(3, dtype=np.int64),
                      np.arange(3), np.zeros(3, dtype=np.int64), np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0]),
                      1.0, period=(1.0, 2.0))
    lo, hi = gantt_figure(steady, "s").axes[0].get_xlim()
    assert lo == pytest.approx(1.0) and 2.0 <= hi <= 2.05


def test_simulated_steady_state_has_its_period() -> None:
    """The simulator marks an asynchronous schedule's period: the last backward of stage 0's
    microbatch N-1 to that of 2N-1 (PipeDream §3), whose length is at most the iteration."""
    from pipeplan.cluster import hierarchical
    from pipeplan.graph import Graph
    from pipeplan.plan import Plan, Stage
    from pipeplan.sim import simulate

    g = Graph.chain("c", [1.0] * 4, [2.0] * 4)
    c = hierarchical("two", 1, 2, 1e9, 1e9)
    plan = Plan(g, c, [Stage(g.ids[:2], c.names[:1]), Stage(g.ids[2:], c.names[1:])], 4, schedule="async-1f1b")
    r = simulate(plan)
    t0, t1 = r.timeline.period
    b0 = (r.timeline.kind == BWD) & (r.timeline.stage == 0)
    ends = {int(m): e for m, e in zip(r.timeline.micro[b0], r.timeline.end[b0])}
    assert t0 == pytest.approx(ends[3]) and t1 == pytest.approx(ends[7]) and t1 - t0 <= r.iteration_s + 1e-9


def test_model_chunks_are_drawn_apart(tmp_path) -> None:
    """A device of several stages (interleaved 1F1B) names them on its row, labels its bars
    m.c (microbatch m of chunk c), draws later chunks darker; its trace names the stage;
    a channel row names every cut it carries."""
    from pipeplan.cluster import hierarchical
    from pipeplan.graph import Graph
    from pipeplan.plan import Plan, Stage
    from pipeplan.sim import simulate
    from pipeplan.viz.gantt import chunks_of, gantt_figure

    g = Graph.chain("c", [1.0] * 4, [2.0] * 4, act=[1e6] * 4)
    c = hierarchical("two", 1, 2, 1e9, 1e9)
    plan = Plan(g, c, [Stage([g.ids[j]], [c.names[j % 2]]) for j in range(4)], 4, schedule="interleaved-1f1b")
    tl = simulate(plan).timeline
    assert set(chunks_of(tl).tolist()) == {-1, 0, 1}
    ax = gantt_figure(tl, "interleaved").axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert "s0g0 · stages 0,2" in ticks and "s0g1 · stages 1,3" in ticks
    assert any(t.startswith("ch:0-1,") and "(stages 0 → 1, " in t for t in ticks)
    texts = {t.get_text() for t in ax.texts}
    assert {"0.0", "0.1", "3.1"} <= texts
    forward = [col for col in ax.collections if col.get_label() == "forward"][0]
    assert len({tuple(np.round(f, 3)) for f in forward.get_facecolors()}) == 2
    assert any("chunk c" in t.get_text() for t in ax.get_legend().get_texts())
    names = {e["name"] for e in to_trace(tl)["traceEvents"] if e.get("ph") == "X"}
    assert {"F0 s0", "F0 s2", "B3 s3"} <= names
    draw_gantt(tl, tmp_path / "chunks.png")


def _legend_matches_the_drawing(ax) -> set[str]:
    """The legend's labels, after checking each names something drawn: a kind only with a bar
    inside the x range, ``m.c`` only with such a label written, ``ch a-b`` only with channel rows."""
    from pipeplan.viz.gantt import _STYLE

    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    lo, hi = ax.get_xlim()
    drawn = {c.get_label() for c in ax.collections
             if any(p.vertices[:, 0].max() > lo and p.vertices[:, 0].min() < hi for p in c.get_paths())}
    kinds = {style[0] for style in _STYLE.values()}
    assert legend & kinds == drawn & kinds
    chunk_texts = [t for t in ax.texts if "." in t.get_text()]
    assert any(s.startswith("m.c:") for s in legend) == bool(chunk_texts)
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert any(s.startswith("ch a-b") for s in legend) == any(t.startswith("ch:") for t in ticks)
    return legend


def test_gantt_legend_names_only_what_is_drawn() -> None:
    """A steady state's chart spans one period: a kind whose bars all lie outside it is not in
    the legend; chunk labels too narrow (or capped) to be written are not explained."""
    from pipeplan.cluster import hierarchical
    from pipeplan.graph import Graph
    from pipeplan.plan import Plan, Stage
    from pipeplan.sim import simulate
    from pipeplan.viz.gantt import gantt_figure

    steady = Timeline(["gpu0"], [True], np.array([FWD, FWD, FWD, ALLREDUCE], dtype=np.int8),
                      np.zeros(4, dtype=np.int64), np.array([0, 1, 2, -1]), np.zeros(4, dtype=np.int64),
                      np.array([0.0, 1.0, 2.0, 3.5]), np.array([1.0, 2.0, 3.0, 3.6]), 1.0, period=(1.0, 2.0))
    legend = _legend_matches_the_drawing(gantt_figure(steady, "s").axes[0])
    assert "forward" in legend and "all-reduce" not in legend
    g = Graph.chain("c", [1.0] * 4, [2.0] * 4, act=[1e6] * 4)
    c = hierarchical("two", 1, 2, 1e9, 1e9)
    plan = Plan(g, c, [Stage([g.ids[j]], [c.names[j % 2]]) for j in range(4)], 4, schedule="interleaved-1f1b")
    tl = simulate(plan).timeline
    written = _legend_matches_the_drawing(gantt_figure(tl, "labels").axes[0])
    unwritten = _legend_matches_the_drawing(gantt_figure(tl, "no labels", max_labels=0).axes[0])
    assert any(s.startswith("m.c:") for s in written) and "darker: later chunk" in unwritten
    _legend_matches_the_drawing(gantt_figure(gpipe_timeline(stages=2, micros=3, replicas=2), "gpipe").axes[0])
