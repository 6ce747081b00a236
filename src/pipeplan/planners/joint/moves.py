"""The neighbourhood of a candidate (docs/joint.md): every plan one change away.

- shift a cut by 1, 2 or 4 nodes; merge two adjacent stages; split a stage in two at any
  node, its devices divided (or an idle device taking the new stage); exchange the devices
  of two stages; each structural change also with its cuts re-balanced (every stage's work
  in proportion to its devices' summed speed);
- move a device to another stage or leave it idle, put an idle device to work, swap two
  devices of different stages (or a working and an idle one);
- switch one stage's re-materialization; the replica mode; the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from .candidate import Candidate, balanced_bounds, make


@dataclass(frozen=True)
class Space:
    """What the moves need to know: device count and speeds, each order's prefix sums of
    work, the schedules and replica modes searched."""

    devices: int
    speed: np.ndarray
    work_cum: list[np.ndarray]
    schedules: tuple[str, ...]
    modes: tuple[str, ...]

    def rebalanced(self, c: Candidate) -> Candidate:
        weights = np.array([self.speed[list(g)].sum() for g in c.groups])
        return replace(c, bounds=tuple(balanced_bounds(self.work_cum[c.order], weights)))


def _with_groups(c: Candidate, groups: list[list[int]]) -> Candidate:
    return make(c.order, c.bounds, groups, c.recompute, c.schedule, c.replicas)


def cut_moves(c: Candidate) -> Iterator[Candidate]:
    b = list(c.bounds)
    for s in range(1, c.stages):
        for step in (-4, -2, -1, 1, 2, 4):
            x = b[s] + step
            if b[s - 1] < x < b[s + 1]:
                yield replace(c, bounds=tuple(b[:s] + [x] + b[s + 1:]))


def merge_moves(c: Candidate) -> Iterator[Candidate]:
    for s in range(c.stages - 1):
        groups = [list(g) for g in c.groups]
        groups[s:s + 2] = [groups[s] + groups[s + 1]]
        rec = list(c.recompute)
        rec[s:s + 2] = [rec[s] or rec[s + 1]]
        yield make(c.order, c.bounds[:s + 1] + c.bounds[s + 2:], groups, rec, c.schedule, c.replicas)


def split_moves(c: Candidate, idle: list[int], max_points: int = 12) -> Iterator[Candidate]:
    """Split stage s at up to ``max_points`` positions spread over it; its devices divided
    into a prefix and the rest (index order), or an idle device taking the second half."""
    for s, g in enumerate(c.groups):
        lo, hi = c.bounds[s], c.bounds[s + 1]
        if hi - lo < 2:
            continue
        points = np.unique(np.linspace(lo + 1, hi - 1, min(max_points, hi - lo - 1)).round().astype(int))
        halves = [(list(g[:j]), list(g[j:])) for j in range(1, len(g))]
        halves += [(b, a) for a, b in halves] + [(list(g), [d]) for d in idle[:4]]
        for p in points.tolist():
            for first, second in halves:
                groups = [list(x) for x in c.groups]
                groups[s:s + 1] = [first, second]
                rec = list(c.recompute)
                rec[s:s + 1] = [rec[s], rec[s]]
                yield make(c.order, c.bounds[:s + 1] + (p,) + c.bounds[s + 1:], groups, rec, c.schedule,
                           c.replicas)


def device_moves(c: Candidate, devices: int) -> Iterator[Candidate]:
    """Move one device (to another stage or idle; idle ones to a stage) and swap two."""
    where = c.device_stage(devices)
    groups = [list(g) for g in c.groups]
    for d in range(devices):
        a = int(where[d])
        if a >= 0 and len(groups[a]) == 1:
            continue
        for b in range(-1, c.stages):
            if b == a:
                continue
            new = [list(g) for g in groups]
            if a >= 0:
                new[a].remove(d)
            if b >= 0:
                new[b].append(d)
            yield _with_groups(c, new)
    for d in range(devices):
        for e in range(d + 1, devices):
            a, b = int(where[d]), int(where[e])
            if a == b:
                continue
            new = [[e if x == d else d if x == e else x for x in g] for g in groups]
            yield _with_groups(c, new)


def group_swaps(c: Candidate) -> Iterator[Candidate]:
    for a in range(c.stages):
        for b in range(a + 1, c.stages):
            groups = list(c.groups)
            groups[a], groups[b] = groups[b], groups[a]
            yield replace(c, groups=tuple(groups))


def setting_moves(c: Candidate, schedules: tuple[str, ...], modes: tuple[str, ...]) -> Iterator[Candidate]:
    for s in range(c.stages):
        rec = list(c.recompute)
        rec[s] = not rec[s]
        yield replace(c, recompute=tuple(rec))
    for m in modes:
        if m != c.replicas:
            yield replace(c, replicas=m)
    for sch in schedules:
        if sch != c.schedule:
            yield replace(c, schedule=sch)


def neighbours(c: Candidate, space: Space) -> list[Candidate]:
    idle = [d for d in range(space.devices) if all(d not in g for g in c.groups)]
    structural = [*merge_moves(c), *split_moves(c, idle), *group_swaps(c), c]
    out = [*cut_moves(c), *structural, *(space.rebalanced(x) for x in structural),
           *device_moves(c, space.devices), *setting_moves(c, space.schedules, space.modes)]
    return [x for x in dict.fromkeys(out) if x != c]
