"""DualPipeV (DeepSeek-V3 technical report, arXiv 2412.19437 §3.2.1, DualPipe; its V-shaped
variant from github.com/deepseek-ai/DualPipe), in the per-rank order of torch's
``ScheduleDualPipeV`` (torch 2.13, ``torch/distributed/pipelining/schedules.py``).

2p stages in a V as in ZB-V (device d holds stages d and 2p-1-d). Device d runs
2(p-d-1) forwards of chunk 0, d+1 pairs of forwards (chunk 0, chunk 1), p-d-1 rounds of
chunk 1's I, a pending W and F; then the main phase of overlapped pairs, a forward of one
chunk with a full backward of the other (F0 with B1, F1 with B0); then p-d-1 rounds of B1 and
(F1 with B0), and a cool-down whose second half splits the backward into I and W (the W's
queued, oldest first, into the remaining slots). torch runs a pair as one ``OVERLAP_F_B``
action whose ``sub_actions`` are the forward then the backward; here the pair is those two
actions one after the other, and the schedule's ``overlap_pairs`` tells the simulator to
price them as one overlapped pair (one microbatch's all-to-alls behind the other's compute,
``sim.durations``). Every device keeps at most 2p + 1 chunk-microbatches' activations.
"""

from __future__ import annotations

from collections import deque

from .interleaved import DeviceOrder
from .ir import Kind

_F, _B, _I, _W = int(Kind.F), int(Kind.B), int(Kind.I), int(Kind.W)


class _Actions:
    """torch's counters: the next forward and backward microbatch of each chunk, the W's the
    I's left pending (oldest first), and the order so far."""

    def __init__(self, stages: tuple[int, ...]) -> None:
        self.stages, self.seq, self.paired = stages, [], []
        self.next = {(k, c): 0 for k in (_F, _B) for c in (0, 1)}
        self.weights: deque[tuple[int, int]] = deque()

    def __call__(self, kind: int, chunk: int) -> None:
        """F, B or I of the chunk's next microbatch (B and I share one counter, as in torch)."""
        key = (_F if kind == _F else _B, chunk)
        m, stage = self.next[key], self.stages[chunk]
        self.next[key] += 1
        self.seq.append((kind, stage, m))
        self.paired.append(False)
        if kind == _I:
            self.weights.append((stage, m))

    def overlap(self, f_chunk: int, b_chunk: int) -> None:
        """torch's OVERLAP_F_B, expanded into its sub-actions: F of one chunk, then B of the other."""
        self(_F, f_chunk)
        self(_B, b_chunk)
        self.paired[-2:] = [True, True]

    def weight(self) -> None:
        """The oldest pending W, if any."""
        if self.weights:
            stage, m = self.weights.popleft()
            self.seq.append((_W, stage, m))
            self.paired.append(False)


def _dualpipe_v_local(n: int, pos: int, p: int, stages: tuple[int, ...]) -> _Actions:
    """torch's ``ScheduleDualPipeV._calculate_single_rank_operations`` for rank ``pos`` over
    local microbatches 0..n-1 (n >= 2p), its steps 1-8 in turn."""
    act = _Actions(stages)
    for _ in range(2 * (p - pos - 1)):
        act(_F, 0)
    for _ in range(pos + 1):
        act(_F, 0), act(_F, 1)
    for _ in range(p - pos - 1):  # chunk 1 turns the V: zero bubble
        act(_I, 1), act.weight(), act(_F, 1)
    for i in range(n - 2 * p + pos + 1):  # main phase (torch runs the last rank's first F0, B1 apart)
        if i == 0 and pos == p - 1:
            act(_F, 0), act(_B, 1)
        else:
            act.overlap(0, 1)
        act.overlap(1, 0)
    for _ in range(p - pos - 1):
        act(_B, 1), act.overlap(1, 0)
    half = (pos + 1) // 2  # cool-down: from the middle on, I's instead of B's
    for i in range(pos + 1):
        act(_I if i > half or (i == half and pos % 2) else _B, 1)
        act(_I if i >= half else _B, 0)
    for _ in range(p - pos - 1):
        act.weight(), act(_I, 0)
    for _ in range(pos + 1):
        act.weight()
    return act


def dualpipe_v_order(micros: list[int], pos: int, p: int, stages: tuple[int, ...]) -> DeviceOrder:
    """Device ``pos``'s DualPipeV actions over its two chunks for the microbatches ``micros``.
    torch refuses fewer microbatches than stages (2p); here, as ``zb_v_order`` does, the order
    for 2p with the missing ones left out, so that a round-robin replica's share and a search's
    small M still run (leaving whole microbatches out of a valid order keeps it valid)."""
    n = len(micros)
    if n == 0:  # a round-robin replica left without a microbatch
        return []
    local = _dualpipe_v_local(max(n, 2 * p), pos, p, stages).seq
    return [(k, s, micros[m]) for k, s, m in local if m < n]


def dualpipe_v_paired(micros: list[int], pos: int, p: int, stages: tuple[int, ...]) -> list[bool]:
    """Which of ``dualpipe_v_order``'s actions torch runs inside an ``OVERLAP_F_B``."""
    act = _dualpipe_v_local(max(len(micros), 2 * p), pos, p, stages)
    return [paired for (_, _, m), paired in zip(act.seq, act.paired) if m < len(micros)]
