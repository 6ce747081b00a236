"""A simulated iteration's timeline (``schedule.timeline.Timeline``) from the simulator's
task graph."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..schedule import Kind
from ..schedule.timeline import Timeline


def build_timeline(cl: Cluster, tg, start: np.ndarray, end: np.ndarray, iteration: float,
                   plan_devs: list[int], stage_devs: list[list[int]], lanes: bool = False,
                   period: tuple[float, float] | None = None) -> Timeline:
    """Expand group tasks to each device, all-reduces to each device of the stage. With
    lanes each device has a forward and a backward row."""
    pos = {d: i for i, d in enumerate(plan_devs)}
    res_parts, idx_parts = [], []
    for gi, g in enumerate(tg.groups):
        ids = np.flatnonzero(tg.owner == gi)
        for d in g.devices:
            idx_parts.append(ids)
            res_parts.append(2 * pos[d] + (tg.kind[ids] != Kind.F) if lanes else np.full(ids.size, pos[d]))
    for t in np.flatnonzero(tg.kind == Kind.AR).tolist():
        devs = stage_devs[int(tg.stage[t])]
        idx_parts.append(np.full(len(devs), t))
        res_parts.append(np.array([pos[d] for d in devs]))
    comm = np.flatnonzero(tg.chan >= 0)
    idx_parts.append(comm)
    rows = 2 * len(plan_devs) if lanes else len(plan_devs)
    res_parts.append(rows + tg.chan[comm])
    idx = np.concatenate(idx_parts)
    res = np.concatenate(res_parts)
    dev_names = [cl.devices[d].name for d in plan_devs]
    if lanes:
        dev_names = [f"{n}/{lane}" for n in dev_names for lane in ("fwd", "bwd")]
    return Timeline(resources=dev_names + list(tg.channels),
                    resource_is_device=[True] * rows + [False] * len(tg.channels),
                    kind=tg.kind[idx], stage=tg.stage[idx], micro=tg.micro[idx], resource=res,
                    start=start[idx], end=end[idx], iteration_s=iteration, period=period)
