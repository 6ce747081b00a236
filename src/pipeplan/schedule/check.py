"""Validity of a schedule: what every generator must emit and the simulator relies on."""

from __future__ import annotations

import numpy as np

from ..errors import PipeplanError
from .ir import Kind, Program, Schedule


def _distinct(progs: list[Program]) -> list[Program]:
    """Programs up to ``same_as`` (replicas splitting microbatches run the same program)."""
    out: dict[bytes, Program] = {}
    for p in progs:
        out.setdefault(p.kinds.tobytes() + p.stages.tobytes() + p.micro.tobytes(), p)
    return list(out.values())


def _check_program(name: str, s: int, p: Program, m_count: int) -> np.ndarray:
    """The microbatches this program runs of stage s, after checking its order."""
    sel = p.stages == s
    kinds, micro = p.kinds[sel], p.micro[sel]
    pos = np.flatnonzero(sel)
    if int((kinds == Kind.AR).sum()) > 1:
        raise PipeplanError(f"schedule {name}: stage {s} all-reduces twice on one device")
    mf = micro[kinds == Kind.F]
    if mf.size and (mf.min() < 0 or mf.max() >= m_count):
        raise PipeplanError(f"schedule {name}: stage {s} names a microbatch outside 0..{m_count - 1}")
    if np.unique(mf).size != mf.size:
        raise PipeplanError(f"schedule {name}: stage {s} lists a microbatch twice on one device")
    at_f = np.full(m_count, -1)
    at_f[mf] = pos[kinds == Kind.F]
    mb, mi, mw = (micro[kinds == k] for k in (Kind.B, Kind.I, Kind.W))
    back = np.concatenate([mb, mi])
    if not np.array_equal(np.sort(back), np.sort(mf)):
        raise PipeplanError(f"schedule {name}: a device of stage {s} runs backward of other "
                            "microbatches than it ran forward (each needs B, or I and W)")
    if not np.array_equal(np.sort(mi), np.sort(mw)):
        raise PipeplanError(f"schedule {name}: stage {s} splits a backward into I without W or W without I")
    for kind, ms in ((Kind.B, mb), (Kind.I, mi)):
        late = np.flatnonzero(at_f[ms] > pos[kinds == kind])
        if late.size:
            raise PipeplanError(f"schedule {name}: stage {s} runs {kind.name}{int(ms[late[0]])} "
                                f"before F{int(ms[late[0]])}")
    at_i = np.full(m_count, -1)
    at_i[mi] = pos[kinds == Kind.I]
    late = np.flatnonzero(at_i[mw] > pos[kinds == Kind.W])
    if late.size:
        raise PipeplanError(f"schedule {name}: stage {s} runs W{int(mw[late[0]])} before I{int(mw[late[0]])}")
    return mf


def check_schedule(sched: Schedule, num_stages: int) -> None:
    """Raise PipeplanError unless every stage runs each microbatch's forward and backward
    exactly once (on one device, or split over replicas that run the same program), each
    backward after its forward on the same device, I before W."""
    for p in sched.programs:
        if p.stages.size and (p.stages.min() < 0 or p.stages.max() >= num_stages):
            raise PipeplanError(f"schedule {sched.name}: names a stage outside 0..{num_stages - 1}")
        if np.any(~np.isin(p.kinds, [int(k) for k in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.AR)])):
            raise PipeplanError(f"schedule {sched.name}: a program lists a kind that is not an action")
    by_stage: dict[int, list[Program]] = {s: [] for s in range(num_stages)}
    seen: set[int] = set()
    for p in sched.programs:  # replicas in lockstep share one program object: check it once
        if id(p) not in seen:
            seen.add(id(p))
            for s in np.unique(p.stages).tolist():
                by_stage[s].append(p)
    for s in range(num_stages):
        holders = by_stage[s]
        if not holders:
            raise PipeplanError(f"schedule {sched.name}: no device runs stage {s}")
        owner = np.zeros(sched.microbatches, dtype=np.int64)
        for p in _distinct(holders):
            owner[_check_program(sched.name, s, p, sched.microbatches)] += 1
        if np.any(owner > 1):
            raise PipeplanError(f"schedule {sched.name}: stage {s} splits microbatch {int(np.flatnonzero(owner > 1)[0])} "
                                "over devices whose programs differ (replicas that share a microbatch must "
                                "run the same program)")
        if np.any(owner == 0):
            raise PipeplanError(f"schedule {sched.name}: stage {s} never runs F{int(np.flatnonzero(owner == 0)[0])}")
