"""Schedule generators: plan shape (stages' devices, M, replica mode) -> Schedule (the IR).

- ``gpipe``: all forwards, then all backwards (GPipe, Huang et al. 2019).
- ``1f1b``: PipeDream-flush / DAPPLE: w warm-up forwards, then one forward one backward,
  then drain; the iteration ends with a flush. w = S-s-1 on stage s of S (also when
  replicas split each microbatch); a round-robin replica of stage s keeps ceil(W_s / k_s)
  microbatches in flight, W_s being the devices of stages s..S-1 and k_s its stage's
  replicas (PipeDream's NOAM, §3.2).
- ``spp-pe``: SPP's PE order (Alg. 1, ``pe.py``), run as soon as ready.
- ``async-1f1b``: PipeDream's original pipeline (no flush, weight stashing): 1F1B over a
  stream of 3M microbatches with no flush, evaluated in its steady state of M; a replicated
  stage synchronizes its replicas' gradients once a round (``sim/steady.py``).
- ``fb-parallel``: the same stream with forward and backward in two lanes side by side
  (resalloc.txt §III-B).
- ``zb-h1``: zero-bubble ZB-H1 (Qi et al. ICLR'24 §3.1): 1F1B with the backward split into I
  and W, W's delayed to fill the drain, 1F1B's peak memory (``zerobubble.py``).
- ``interleaved-1f1b``: Megatron-LM's interleaved 1F1B over v >= 2 model chunks per device
  (Narayanan et al. SC'21 §2.2; ``interleaved.py``).
- ``zb-v``: zero-bubble ZB-V over two chunks per device in a V (Qi et al. §6; ``zerobubble.py``).
- ``dualpipe-v``: DeepSeek's DualPipeV in torch's order, a forward and a backward of the other
  chunk overlapped as a pair (``dualpipe.py``; priced in ``sim.durations``).
A schedule's ``placement`` says which stages a device holds (``layout.py``): one, chunks in a
loop, or a V; a plan of another shape is refused with one line.
With ``split`` replicas every replica runs every microbatch (a share of it); with
``round-robin`` replica r of k runs whole microbatches r, r+k, r+2k, ... A program of a stage
with more than one device ends with the stage's all-reduce: once an iteration in a synchronous
schedule; in a stream (``steady_state``) it stands for the all-reduce each round repeats, which
the steady state charges per round (``sim/steady.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from ..errors import PipeplanError
from .check import check_schedule
from .dualpipe import dualpipe_v_order, dualpipe_v_paired
from .interleaved import DeviceOrder, interleaved_order
from .ir import Kind, Program, Schedule
from .layout import Layout, layout
from .pe import pe_orders
from .zerobubble import zb_h1_order, zb_v_order

Order = list[tuple[int, int]]  # (kind, microbatch)
OrderFn = Callable[[list[int], int, int, int, int], Order]
#: (microbatches, pipeline position, depth p, the position's stages in chunk order) -> actions
DeviceOrderFn = Callable[[list[int], int, int, tuple[int, ...]], DeviceOrder]


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
    """``order`` orders one stage's actions; a chunked schedule (``placement`` loop or v)
    orders a device's actions over all its stages with ``device_order`` instead."""

    description: str
    order: OrderFn | None
    stream: int = 1  # the programs run stream x M microbatches (a steady state when > 1)
    lanes: bool = False
    placement: str = "single"  # layout.PLACEMENTS
    device_order: DeviceOrderFn | None = None
    #: the backward split into input and weight gradients, the latter free to run last: after a
    #: device's last task no backward need follow on the stages before it
    split_backward: bool = False
    #: which of ``device_order``'s actions run as overlapped forward/backward pairs
    #: (``Schedule.overlap_pairs``), same arguments; None: none
    paired: Callable[[list[int], int, int, tuple[int, ...]], list[bool]] | None = None


SCHEDULES: dict[str, ScheduleKind] = {
    "gpipe": ScheduleKind("all forwards then all backwards (GPipe)", gpipe_order),
    "1f1b": ScheduleKind("one-forward-one-backward with a flush (PipeDream-flush / DAPPLE)", one_f_one_b_order),
    "spp-pe": ScheduleKind("SPP's pipeline execution order (Alg. 1), run as soon as ready", pe_order),
    "async-1f1b": ScheduleKind("PipeDream's asynchronous 1F1B (no flush, weight stashing), steady state",
                               one_f_one_b_order, stream=3),
    "fb-parallel": ScheduleKind("forward and backward side by side on split resources (resalloc), steady state",
                                one_f_one_b_order, stream=3, lanes=True),
    "zb-h1": ScheduleKind("zero bubble ZB-H1: 1F1B with the backward split into input and weight gradients, "
                          "weight gradients delayed into the bubbles, 1F1B's peak memory (Qi et al. ICLR'24)",
                          zb_h1_order, split_backward=True),
    "interleaved-1f1b": ScheduleKind("Megatron-LM's interleaved 1F1B over v >= 2 model chunks per device "
                                     "(stage j on the devices of stage j mod p; Narayanan et al. SC'21)", None,
                                     placement="loop", device_order=interleaved_order),
    "zb-v": ScheduleKind("zero bubble ZB-V: two model chunks per device in a V (device d holds stages d and "
                         "2p-1-d), backward split into input and weight gradients (Qi et al. ICLR'24 §6)", None,
                         placement="v", device_order=zb_v_order, split_backward=True),
    "dualpipe-v": ScheduleKind("DualPipeV: two chunks per device in a V, a forward of one chunk paired with a "
                               "backward of the other (DeepSeek-V3, arXiv 2412.19437 §3.2.1; torch's "
                               "ScheduleDualPipeV; the pair overlapped: one's all-to-alls behind the other's compute)",
                               None, placement="v", device_order=dualpipe_v_order, split_backward=True,
                               paired=dualpipe_v_paired),
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
    lay = layout(name, stage_devices, kind.placement, replicas)
    m_count = kind.stream * microbatches
    synchronous = kind.stream == 1
    if kind.device_order is not None:
        devs, progs = _chunked_programs(kind, lay, m_count, replicas)
    else:
        devs, progs = _stage_programs(kind, stage_devices, m_count, replicas)
    sched = Schedule(name, m_count, devs, progs, steady_state=None if synchronous else microbatches,
                     lanes=kind.lanes, overlap_pairs=kind.paired is not None)
    check_schedule(sched, len(stage_devices))
    return sched


def _stage_programs(kind: ScheduleKind, stage_devices: tuple[tuple[int, ...], ...], m_count: int,
                    replicas: str) -> tuple[list[int], list[Program]]:
    """One program per device of each stage, from the stage's order."""
    warm = warmups([list(g) for g in stage_devices], replicas)
    s_count = len(stage_devices)
    progs, devs = [], []
    for s, group in enumerate(stage_devices):
        k = len(group)
        if replicas == "split":
            prog = _program(s, kind.order(list(range(m_count)), warm[s], s, s_count, m_count), k > 1)
            for d in group:  # replicas share one program object: they run in lockstep
                devs.append(d)
                progs.append(prog)
        else:
            for r, d in enumerate(group):
                devs.append(d)
                order = kind.order(list(range(r, m_count, k)), warm[s], s, s_count, m_count)
                progs.append(_program(s, order, k > 1))
    return devs, progs


def _chunked_programs(kind: ScheduleKind, lay: Layout, m_count: int,
                      replicas: str) -> tuple[list[int], list[Program]]:
    """One program per device over all the stages of its group (model chunks), each
    replicated stage all-reduced at the end."""
    progs, devs = [], []
    for pos, (group, stages) in enumerate(zip(lay.groups, lay.stages)):
        k = len(group)
        tail = [(int(Kind.AR), s, -1) for s in stages] if k > 1 else []
        shared = None
        for r, d in enumerate(group):
            if replicas == "split" and shared is not None:
                prog = shared  # lockstep replicas share one program object
            else:
                micros = list(range(m_count)) if replicas == "split" else list(range(r, m_count, k))
                paired = kind.paired(micros, pos, lay.depth, stages) if kind.paired else None
                prog = shared = Program.of(kind.device_order(micros, pos, lay.depth, stages) + tail, paired)
            devs.append(d)
            progs.append(prog)
    return devs, progs
