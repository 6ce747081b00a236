"""Schedule generators: plan shape (stages, replicas, M) -> per-device programs.

- ``gpipe``: all forwards, then all backwards (GPipe, Huang et al. 2019).
- ``1f1b``: PipeDream-flush / DAPPLE: stage s of S runs min(S-s-1, M) warm-up forwards, then
  alternates one forward and one backward, then drains the remaining backwards; the
  iteration ends with a flush.
- ``dp``: replicas of a stage take whole microbatches round-robin (replica r gets m = r, r+k,
  ...) and run them one-forward-one-backward, as data parallelism does with one stage.
All end with the stage's all-reduce when it has more than one device.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import PipeplanError
from .ir import ALLREDUCE, BWD, FWD, Program, Schedule


def _program(stage: int, seq: list[tuple[int, int]], replicated: bool) -> Program:
    if replicated:
        seq = seq + [(ALLREDUCE, -1)]
    arr = np.array(seq, dtype=np.int64).reshape(-1, 2)
    return Program(stage, arr[:, 0].astype(np.int8), arr[:, 1].copy())


def gpipe_order(micros: list[int], stage: int, num_stages: int) -> list[tuple[int, int]]:
    return [(FWD, m) for m in micros] + [(BWD, m) for m in micros]


def one_f_one_b_order(micros: list[int], stage: int, num_stages: int) -> list[tuple[int, int]]:
    n = len(micros)
    warm = min(num_stages - stage - 1, n)
    seq = [(FWD, m) for m in micros[:warm]]
    for i in range(n - warm):
        seq.append((FWD, micros[warm + i]))
        seq.append((BWD, micros[i]))
    seq += [(BWD, m) for m in micros[n - warm:]]
    return seq


OrderFn = Callable[[list[int], int, int], list[tuple[int, int]]]


def split_schedule(name: str, order: OrderFn, devices: list[list[int]], m: int) -> Schedule:
    """Every replica of a stage runs every microbatch (each takes an even share)."""
    s_count = len(devices)
    progs, devs = [], []
    for s, group in enumerate(devices):
        prog = _program(s, order(list(range(m)), s, s_count), len(group) > 1)
        for d in group:
            devs.append(d)
            progs.append(prog)  # replicas share one program object: they run in lockstep
    return Schedule(name, m, devs, progs)


def round_robin_schedule(name: str, order: OrderFn, devices: list[list[int]], m: int) -> Schedule:
    """Replica r of a k-way stage runs whole microbatches r, r+k, r+2k, ..."""
    s_count = len(devices)
    progs, devs = [], []
    for s, group in enumerate(devices):
        k = len(group)
        for r, d in enumerate(group):
            devs.append(d)
            progs.append(_program(s, order(list(range(r, m, k)), s, s_count), k > 1))
    return Schedule(name, m, devs, progs)


GENERATORS: dict[str, tuple[str, Callable[[list[list[int]], int], Schedule]]] = {
    "gpipe": ("all forwards then all backwards (GPipe)",
              lambda devs, m: split_schedule("gpipe", gpipe_order, devs, m)),
    "1f1b": ("one-forward-one-backward with a flush (PipeDream-flush / DAPPLE)",
             lambda devs, m: split_schedule("1f1b", one_f_one_b_order, devs, m)),
    "dp": ("whole microbatches round-robin over a stage's replicas, 1F1B order per replica",
           lambda devs, m: round_robin_schedule("dp", one_f_one_b_order, devs, m)),
}


def make_schedule(name: str, stage_devices: list[list[int]], microbatches: int) -> Schedule:
    entry = GENERATORS.get(name)
    if entry is None:
        raise PipeplanError(f"unknown schedule {name!r} (known: {', '.join(GENERATORS)})")
    sched = entry[1](stage_devices, microbatches)
    sched.check(len(stage_devices), [len(g) for g in stage_devices])
    return sched
