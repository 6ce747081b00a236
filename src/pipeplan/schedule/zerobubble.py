"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24): the
backward splits into the input gradient (I, which the previous stage waits for) and the
weight gradient (W, which nobody waits for), and W's are moved to fill the bubbles.

- ``zb_h1_order`` (§3.1, ZB-H1): 1F1B's warm-up and steady state with each B replaced by I,
  and the W's of stage s delayed by s steps, so that the last stages' W's fill the drain.
  A microbatch's activations are freed at its W, so stage s keeps up to
  (warm-up + 1) + delay = p microbatches: every stage at stage 0's 1F1B peak, none above
  it (the peak memory of 1F1B). Bubble (p-1)(T_F + T_I - T_W) with T_I the input-gradient
  time (the paper's T_B).
- ``zb_v_order`` (§6, ZB-V; torch's ``ScheduleZBVZeroBubble``, whose order this follows):
  2p stages in a V (device d holds stages d and 2p-1-d), so that the first and last stage
  sit on device 0; warm-up forwards of chunk 0, then chunk 1's F-I-W as the V turns, a
  steady F-I-W on both chunks, and a cool-down of I's whose W's come last. Fewer than 2p-1
  microbatches: the order for 2p-1 with the missing ones left out (as torch does).
"""

from __future__ import annotations

from collections import deque

from .interleaved import DeviceOrder
from .ir import Kind

_F, _I, _W = int(Kind.F), int(Kind.I), int(Kind.W)
Order = list[tuple[int, int]]


def zb_h1_order(micros: list[int], warmup: int, stage: int, num_stages: int, m_total: int) -> Order:
    """ZB-H1 on one stage: ``warmup`` forwards (1F1B's), then F, I (and the W of the oldest
    microbatch once ``num_stages - 1 - warmup`` I's are waiting), then the cool-down."""
    n = len(micros)
    warm = min(warmup, n)
    delay = max(num_stages - 1 - warmup, 0)
    seq: Order = [(_F, m) for m in micros[:warm]]
    waiting: deque[int] = deque()
    for i in range(n):
        if i < n - warm:
            seq.append((_F, micros[warm + i]))
        seq.append((_I, micros[i]))
        waiting.append(micros[i])
        if i >= delay:
            seq.append((_W, waiting.popleft()))
    return seq + [(_W, m) for m in waiting]


class _Counts:
    """Next microbatch of each (kind, chunk) on a ZB-V device, and the order so far."""

    def __init__(self, stages: tuple[int, ...]) -> None:
        self.stages, self.seq = stages, []
        self.next = {(k, c): 0 for k in (_F, _I, _W) for c in (0, 1)}

    def __call__(self, kind: int, chunk: int) -> None:
        self.seq.append((kind, self.stages[chunk], self.next[(kind, chunk)]))
        self.next[(kind, chunk)] += 1

    def n(self, kind: int, chunk: int) -> int:
        return self.next[(kind, chunk)]


def _zb_v_local(n: int, pos: int, p: int, stages: tuple[int, ...]) -> DeviceOrder:
    """The ZB-V order of device ``pos`` over local microbatches 0..n-1 (n >= 2p - 1)."""
    act = _Counts(stages)
    for _ in range(2 * (p - pos) - 1):
        act(_F, 0)
    for _ in range(pos):
        act(_F, 1), act(_F, 0)
    for _ in range(p - pos):
        act(_F, 1), act(_I, 1), act(_W, 1)
    while act.n(_F, 1) < act.n(_F, 0) or act.n(_F, 0) < n:  # steady state
        if act.n(_F, 0) < n:
            act(_F, 0)
        act(_I, 0), act(_W, 0), act(_F, 1), act(_I, 1), act(_W, 1)
    for _ in range(pos):  # cool-down: input gradients first, weight gradients after
        act(_I, 0), act(_I, 1)
    for _ in range(p - pos):
        act(_I, 0), act(_W, 0)
    while act.n(_W, 1) < act.n(_I, 1):
        act(_W, 1)
    while act.n(_W, 0) < act.n(_I, 0):
        act(_W, 0)
    return act.seq


def zb_v_order(micros: list[int], pos: int, p: int, stages: tuple[int, ...]) -> DeviceOrder:
    """Device ``pos``'s ZB-V actions over its two chunks for the microbatches ``micros``."""
    n = len(micros)
    if n == 0:  # a round-robin replica left without a microbatch
        return []
    local = _zb_v_local(max(n, 2 * p - 1), pos, p, stages)
    return [(k, s, micros[m]) for k, s, m in local if m < n]
