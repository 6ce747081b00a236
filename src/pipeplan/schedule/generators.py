"""Schedule generators: plan shape (stages, replicas, M, replica mode) -> per-device programs.

- ``gpipe``: all forwards, then all backwards (GPipe, Huang et al. 2019).
- ``1f1b``: PipeDream-flush / DAPPLE: a device runs w warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards; the iteration ends with a
  flush. w = S-s-1 on stage s of S (also when replicas split each microbatch); a
  round-robin replica of stage s keeps ceil(W_s / k_s) microbatches in flight, W_s being
  the devices of stages s..S-1 and k_s its stage's replicas (PipeDream's NOAM, §3.2).
With ``split`` replicas every replica runs every microbatch (an even share); with
``round-robin`` replica r of k runs whole microbatches r, r+k, r+2k, ...
- ``spp-pe``: SPP's PE order (Alg. 1, ``pe.py``), run as soon as ready.
All end with the stage's all-reduce when it has more than one device.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import PipeplanError
from .ir import ALLREDUCE, BWD, FWD, Program, Schedule
from .pe import pe_orders


def _program(stage: int, seq: list[tuple[int, int]], replicated: bool) -> Program:
    if replicated:
        seq = seq + [(ALLREDUCE, -1)]
    arr = np.array(seq, dtype=np.int64).reshape(-1, 2)
    return Program(stage, arr[:, 0].astype(np.int8), arr[:, 1].copy())


def gpipe_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> list[tuple[int, int]]:
    return [(FWD, m) for m in micros] + [(BWD, m) for m in micros]


def pe_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> list[tuple[int, int]]:
    """SPP's PE order of the stage (Alg. 1), restricted to the replica's microbatches."""
    mine = set(micros)
    return [(op, m) for op, m in pe_orders(num_stages, m_total)[stage] if m in mine]


def one_f_one_b_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> list[tuple[int, int]]:
    n = len(micros)
    warm = min(warmup, n)
    seq = [(FWD, m) for m in micros[:warm]]
    for i in range(n - warm):
        seq.append((FWD, micros[warm + i]))
        seq.append((BWD, micros[i]))
    seq += [(BWD, m) for m in micros[n - warm:]]
    return seq


OrderFn = Callable[[list[int], int, int, int, int], list[tuple[int, int]]]
ORDERS: dict[str, tuple[str, OrderFn]] = {
    "gpipe": ("all forwards then all backwards (GPipe)", gpipe_order),
    "1f1b": ("one-forward-one-backward with a flush (PipeDream-flush / DAPPLE)", one_f_one_b_order),
    "spp-pe": ("SPP's pipeline execution order (Alg. 1), run as soon as ready", pe_order),
}


def _warmups(devices: list[list[int]], replicas: str) -> list[int]:
    """Warm-up forwards per device of each stage: S-s-1 when replicas split every
    microbatch (they move in lockstep, like one device); ceil(W_s / k_s) - 1 for round-robin
    replicas (W_s devices in stages s.., k_s in stage s)."""
    if replicas == "split":
        return [len(devices) - s - 1 for s in range(len(devices))]
    sizes = [len(g) for g in devices]
    below = np.cumsum(sizes[::-1])[::-1]
    return [int(-(-int(w) // k)) - 1 for w, k in zip(below, sizes)]


def make_schedule(name: str, stage_devices: list[list[int]], microbatches: int,
                  replicas: str = "split", allreduce: bool = True) -> Schedule:
    entry = ORDERS.get(name)
    if entry is None:
        known = [*ORDERS, "async-1f1b", "fb-parallel"]
        raise PipeplanError(f"unknown schedule {name!r} (known: {', '.join(known)})")
    order = entry[1]
    warm = _warmups(stage_devices, replicas)
    progs, devs = [], []
    for s, group in enumerate(stage_devices):
        k = len(group)
        if replicas == "split":
            prog = _program(s, order(list(range(microbatches)), warm[s], s, len(stage_devices), microbatches),
                            allreduce and k > 1)
            for d in group:  # replicas share one program object: they run in lockstep
                devs.append(d)
                progs.append(prog)
        else:
            for r, d in enumerate(group):
                devs.append(d)
                seq = order(list(range(r, microbatches, k)), warm[s], s, len(stage_devices), microbatches)
                progs.append(_program(s, seq, allreduce and k > 1))
    sched = Schedule(name, microbatches, devs, progs)
    sched.check(len(stage_devices), [len(g) for g in stage_devices])
    return sched
