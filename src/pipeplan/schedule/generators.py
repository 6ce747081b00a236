"""Schedule generators: plan shape (stages' devices, M, replica mode) -> Schedule (the IR).

- ``gpipe``: all forwards, then all backwards (GPipe, Huang et al. 2019).
- ``1f1b``: PipeDream-flush / DAPPLE: w warm-up forwards, then one forward one backward,
  then drain; the iteration ends with a flush. w = S-s-1 on stage s of S (also when
  replicas split each microbatch); a round-robin replica of stage s keeps ceil(W_s / k_s)
  microbatches in flight, W_s being the devices of stages s..S-1 and k_s its stage's
  replicas (PipeDream's NOAM, §3.2).
- ``spp-pe``: SPP's PE order (Alg. 1, ``pe.py``), run as soon as ready.
- ``async-1f1b``: PipeDream's original pipeline (no flush, weight stashing): 1F1B over a
  stream of 3M microbatches with no all-reduce barrier, evaluated in its steady state of M.
- ``fb-parallel``: the same stream with forward and backward in two lanes side by side
  (resalloc.txt §III-B).
With ``split`` replicas every replica runs every microbatch (a share of it); with
``round-robin`` replica r of k runs whole microbatches r, r+k, r+2k, ... A synchronous
schedule ends with the stage's all-reduce when it has more than one device.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from ..errors import PipeplanError
from .ir import Kind, Program, Schedule
from .pe import pe_orders

Order = list[tuple[int, int]]  # (kind, microbatch)
OrderFn = Callable[[list[int], int, int, int, int], Order]


def gpipe_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> Order:
    return [(Kind.F, m) for m in micros] + [(Kind.B, m) for m in micros]


def pe_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> Order:
    """SPP's PE order of the stage (Alg. 1), restricted to the replica's microbatches."""
    mine = set(micros)
    return [(op, m) for op, m in pe_orders(num_stages, m_total)[stage] if m in mine]


def one_f_one_b_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> Order:
    n = len(micros)
    warm = min(warmup, n)
    seq: Order = [(Kind.F, m) for m in micros[:warm]]
    for i in range(n - warm):
        seq += [(Kind.F, micros[warm + i]), (Kind.B, micros[i])]
    return seq + [(Kind.B, m) for m in micros[n - warm:]]


@dataclass(frozen=True)
class ScheduleKind:
    description: str
    order: OrderFn
    stream: int = 1  # the programs run stream x M microbatches (a steady state when > 1)
    lanes: bool = False


SCHEDULES: dict[str, ScheduleKind] = {
    "gpipe": ScheduleKind("all forwards then all backwards (GPipe)", gpipe_order),
    "1f1b": ScheduleKind("one-forward-one-backward with a flush (PipeDream-flush / DAPPLE)", one_f_one_b_order),
    "spp-pe": ScheduleKind("SPP's pipeline execution order (Alg. 1), run as soon as ready", pe_order),
    "async-1f1b": ScheduleKind("PipeDream's asynchronous 1F1B (no flush, weight stashing), steady state",
                               one_f_one_b_order, stream=3),
    "fb-parallel": ScheduleKind("forward and backward side by side on split resources (resalloc), steady state",
                                one_f_one_b_order, stream=3, lanes=True),
}


def warmups(devices: list[list[int]], replicas: str) -> list[int]:
    """Warm-up forwards per device of each stage: S-s-1 when replicas split every
    microbatch (they move in lockstep, like one device); ceil(W_s / k_s) - 1 for round-robin
    replicas (W_s devices in stages s.., k_s in stage s)."""
    if replicas == "split":
        return [len(devices) - s - 1 for s in range(len(devices))]
    sizes = [len(g) for g in devices]
    below = np.cumsum(sizes[::-1])[::-1]
    return [int(-(-int(w) // k)) - 1 for w, k in zip(below, sizes)]


def _program(stage: int, order: Order, allreduce: bool) -> Program:
    seq = [(int(k), stage, m) for k, m in order] + ([(int(Kind.AR), stage, -1)] if allreduce else [])
    return Program.of(seq)


def make_schedule(name: str, stage_devices: list[list[int]], microbatches: int,
                  replicas: str = "split") -> Schedule:
    """The schedule ``name`` for stages held by ``stage_devices`` (one device list per stage).
    Cached: searches ask for the same shapes again and again; treat it as read-only."""
    return _make_schedule(name, tuple(tuple(int(d) for d in g) for g in stage_devices), int(microbatches), replicas)


@lru_cache(maxsize=4096)
def _make_schedule(name: str, stage_devices: tuple[tuple[int, ...], ...], microbatches: int,
                   replicas: str) -> Schedule:
    kind = SCHEDULES.get(name)
    if kind is None:
        raise PipeplanError(f"unknown schedule {name!r} (known: {', '.join(SCHEDULES)})")
    m_count = kind.stream * microbatches
    synchronous = kind.stream == 1
    warm = warmups(stage_devices, replicas)
    s_count = len(stage_devices)
    progs, devs = [], []
    for s, group in enumerate(stage_devices):
        k = len(group)
        if replicas == "split":
            prog = _program(s, kind.order(list(range(m_count)), warm[s], s, s_count, m_count),
                            synchronous and k > 1)
            for d in group:  # replicas share one program object: they run in lockstep
                devs.append(d)
                progs.append(prog)
        else:
            for r, d in enumerate(group):
                devs.append(d)
                order = kind.order(list(range(r, m_count, k)), warm[s], s, s_count, m_count)
                progs.append(_program(s, order, synchronous and k > 1))
    sched = Schedule(name, m_count, devs, progs, steady_state=None if synchronous else microbatches,
                     lanes=kind.lanes)
    sched.check(s_count)
    return sched
