"""Validity of a schedule: what every generator must emit and the simulator relies on."""

from __future__ import annotations

import numpy as np

from ..errors import PipeplanError
from .ir import Kind, Program, Schedule

# plain ints: comparing an array with an IntEnum member costs numpy a slow attribute lookup
_F, _B, _I, _W, _AR = (int(k) for k in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.AR))
#: whether a kind (0..max) is an action
_IS_ACTION = np.zeros(max(Kind) + 1, dtype=bool)
_IS_ACTION[[_F, _B, _I, _W, _AR]] = True


def _distinct(progs: list[Program]) -> list[Program]:
    """Programs up to ``same_as`` (replicas splitting microbatches run the same program)."""
    out: dict[bytes, Program] = {}
    for p in progs:
        out.setdefault(p.kinds.tobytes() + p.stages.tobytes() + p.micro.tobytes(), p)
    return list(out.values())


def _has_twice(sorted_ms: np.ndarray) -> bool:
    return bool(sorted_ms.size > 1 and np.any(sorted_ms[1:] == sorted_ms[:-1]))


def _check_program(name: str, s: int, p: Program, m_count: int) -> np.ndarray:
    """The microbatches this program runs of stage s, after checking its order."""
    sel = p.stages == s
    kinds, micro, pos = (p.kinds, p.micro, np.arange(p.kinds.size)) if sel.all() else \
        (p.kinds[sel], p.micro[sel], np.flatnonzero(sel))
    is_f, is_b, is_i, is_w = (kinds == k for k in (_F, _B, _I, _W))
    if np.count_nonzero(kinds == _AR) > 1:
        raise PipeplanError(f"schedule {name}: stage {s} all-reduces twice on one device")
    mf = micro[is_f]
    if mf.size and (mf.min() < 0 or mf.max() >= m_count):
        raise PipeplanError(f"schedule {name}: stage {s} names a microbatch outside 0..{m_count - 1}")
    sorted_f = np.sort(mf)
    if _has_twice(sorted_f):
        raise PipeplanError(f"schedule {name}: stage {s} lists a microbatch twice on one device")
    at_f = np.full(m_count, -1)
    at_f[mf] = pos[is_f]
    mb, mi, mw = micro[is_b], micro[is_i], micro[is_w]
    if not np.array_equal(np.sort(np.concatenate([mb, mi])), sorted_f):
        raise PipeplanError(f"schedule {name}: a device of stage {s} runs backward of other "
                            "microbatches than it ran forward (each needs B, or I and W)")
    if not np.array_equal(np.sort(mi), np.sort(mw)):
        raise PipeplanError(f"schedule {name}: stage {s} splits a backward into I without W or W without I")
    for kind, ms, at in ((Kind.B, mb, is_b), (Kind.I, mi, is_i)):
        late = np.flatnonzero(at_f[ms] > pos[at])
        if late.size:
            raise PipeplanError(f"schedule {name}: stage {s} runs {kind.name}{int(ms[late[0]])} "
                                f"before F{int(ms[late[0]])}")
    if mw.size:
        at_i = np.full(m_count, -1)
        at_i[mi] = pos[is_i]
        late = np.flatnonzero(at_i[mw] > pos[is_w])
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
        k = p.kinds
        if k.size and (k.min() < 0 or k.max() >= _IS_ACTION.size or not _IS_ACTION[k].all()):
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
