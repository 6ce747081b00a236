"""Timeline -> Chrome/Perfetto trace-event JSON (open in ui.perfetto.dev or chrome://tracing).

One process holds one track (tid) per resource: the devices first, then the channels.
Tasks are complete events (``"ph": "X"``) with ``ts``/``dur`` in microseconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..schedule import Kind
from ..schedule.timeline import KIND_NAMES, Timeline

_PID = 1
_TID0 = 10  # tids start here so that no track is taken for the process's main thread (tid == pid)
_PREFIX = {Kind.F: "F", Kind.B: "B", Kind.I: "I", Kind.W: "W", Kind.SEND_F: "send F", Kind.SEND_B: "send B"}
_COMPUTE = (Kind.F, Kind.B, Kind.I, Kind.W)


def _us(seconds: np.ndarray) -> np.ndarray:
    """Seconds -> microseconds, rounded to the nanosecond; equal times stay equal."""
    return np.round(np.asarray(seconds, dtype=float) * 1e6, 3)


def _task_name(kind: int, stage: int, micro: int, chunks: bool = False) -> str:
    """``F3``; ``F3 s5`` on a device that holds several stages (model chunks)."""
    if kind == Kind.AR:
        return f"allreduce s{stage}"
    if kind == Kind.UPDATE:
        return f"update s{stage}"
    return f"{_PREFIX[kind]}{micro}" + (f" s{stage}" if chunks and kind in _COMPUTE else "")


def _resource_order(tl: Timeline) -> list[int]:
    """Resource indices, devices first then channels, each in their given order."""
    n = len(tl.resources)
    return ([r for r in range(n) if tl.resource_is_device[r]]
            + [r for r in range(n) if not tl.resource_is_device[r]])


def _lanes(starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Greedy lane per task (tasks sorted by start): 0 unless it partially overlaps an
    earlier task of lane 0. Trace viewers only nest slices of one track, so overlapping
    tasks of one resource (which a simulator should not produce) go to extra tracks."""
    lane_end: list[float] = []
    out = []
    for a, b in zip(starts, ends):
        for i, e in enumerate(lane_end):
            if a >= e:
                lane_end[i] = b
                out.append(i)
                break
        else:
            lane_end.append(b)
            out.append(len(lane_end) - 1)
    return out


def to_trace(tl: Timeline, title: str = "") -> dict:
    """The timeline as a trace-event JSON object (``{"traceEvents": [...], ...}``)."""
    ts_all, end_all = _us(tl.start), _us(tl.end)
    meta: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": 0,
         "args": {"name": title or "pipeplan"}},
        {"name": "process_sort_index", "ph": "M", "pid": _PID, "tid": 0,
         "args": {"sort_index": 0}},
    ]
    slices: list[dict] = []
    tid = _TID0
    for r in _resource_order(tl):
        idx = tl.tasks_on(r)
        lanes = _lanes(ts_all[idx], end_all[idx])
        n_lanes = max(lanes, default=0) + 1
        for lane in range(n_lanes):
            name = tl.resources[r] if lane == 0 else f"{tl.resources[r]} #{lane + 1}"
            meta.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid + lane,
                         "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": tid + lane,
                         "args": {"sort_index": tid + lane - _TID0}})
        chunks = tl.resource_is_device[r] and np.unique(tl.stage[idx][np.isin(tl.kind[idx], _COMPUTE)]).size > 1
        for t, lane in zip(idx, lanes):
            k, s, m = int(tl.kind[t]), int(tl.stage[t]), int(tl.micro[t])
            ts = float(ts_all[t])
            slices.append({
                "name": _task_name(k, s, m, chunks), "cat": KIND_NAMES[k], "ph": "X",
                "ts": ts, "dur": max(round(float(end_all[t]) - ts, 3), 0.0),
                "pid": _PID, "tid": tid + lane,
                "args": {"stage": s, "microbatch": m, "kind": KIND_NAMES[k],
                         "resource": tl.resources[r]},
            })
        tid += n_lanes
    slices.sort(key=lambda e: (e["ts"], -e["dur"]))
    return {
        "traceEvents": meta + slices,
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "iteration_s": float(tl.iteration_s)},
    }


def write_trace(tl: Timeline, path: str | os.PathLike, title: str = "") -> Path:
    """Write :func:`to_trace` as JSON to ``path`` (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        json.dump(to_trace(tl, title), f, separators=(",", ":"), allow_nan=False)
    return path
