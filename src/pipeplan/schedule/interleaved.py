"""Interleaved 1F1B (Narayanan et al., SC'21 §2.2; Megatron-LM's
``forward_backward_pipelining_with_interleaving``): each of p devices holds v model chunks
(stage d + c p is chunk c of device d), and runs 1F1B over *virtual* microbatches.

Virtual microbatch k of a device is (microbatch, chunk) from the schedule table: microbatches
go in groups of g, each group through chunk 0, then chunk 1, ... (depth first over a group,
SC'21 Fig. 4); backwards walk the same table with the chunks reversed. The warm-up is
Megatron's (and torch's ``ScheduleInterleaved1F1B``): 2 (p - d - 1) + (v - 1) g forwards on
device d, at most all M v of them; then one forward and one backward; then the remaining
backwards.

The group size g is p when p divides M (SC'21 and Megatron require it). Otherwise g is the
smallest divisor of M that is at least p (M itself when M < p): torch's flexible rounds
(g = M / max(1, M // p)) wherever torch accepts M, and a valid order where it refuses it.
Megatron-core's ragged last group (M mod p microbatches) is not used: with it a device can
wait for a chunk whose forward its own order has not reached (the simulator finds
deadlocks, e.g. p = 4, v = 3, M = 5) and it is slower than 1F1B for M = 6, p = 4.
"""

from __future__ import annotations

from .ir import Kind

DeviceOrder = list[tuple[int, int, int]]  # (kind, stage, microbatch)


def schedule_table(n: int, v: int, group: int) -> list[tuple[int, int]]:
    """(microbatch index, chunk) of each virtual microbatch, in forward order."""
    return [(i, c) for lo in range(0, n, group) for c in range(v) for i in range(lo, min(lo + group, n))]


def group_size(n: int, p: int) -> int:
    """Microbatches per group: the smallest divisor of n that is >= p (n when n <= p)."""
    return next((g for g in range(min(p, n), n + 1) if n % g == 0), 1)


def interleaved_warmup(pos: int, p: int, v: int, n: int) -> int:
    """Forwards device ``pos`` runs before its first backward (Megatron's count, capped)."""
    return min(2 * (p - pos - 1) + (v - 1) * group_size(n, p), n * v)


def interleaved_order(micros: list[int], pos: int, p: int, stages: tuple[int, ...]) -> DeviceOrder:
    """Device ``pos``'s actions over its chunks ``stages`` for the microbatches ``micros``."""
    n, v = len(micros), len(stages)
    if n == 0:  # a round-robin replica left without a microbatch
        return []
    table = schedule_table(n, v, group_size(n, p))
    fwd = [(int(Kind.F), stages[c], micros[i]) for i, c in table]
    bwd = [(int(Kind.B), stages[v - 1 - c], micros[i]) for i, c in table]
    warm = interleaved_warmup(pos, p, v, n)
    seq = fwd[:warm]
    for j in range(len(fwd) - warm):
        seq += [fwd[warm + j], bwd[j]]
    return seq + bwd[len(fwd) - warm:]
