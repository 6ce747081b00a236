"""PE ordering — SPP's pipeline execution order (Alg. 1, §IV-A1).

Blocks in dependency order: F_1, c, F_2, c, ..., (F_S+B_S merged), c, B_{S-1}, ..., c, B_1
(4S-3 blocks). Each block has a queue of microbatches; the first holds 1..M. In every pass
over the blocks, each block whose queue was non-empty when the pass began moves its head
microbatch on to the next block (that set is fixed at the start of the pass: "at most one
microbatch per block, microbatches that can be processed about simultaneously"); a
computation block appends (m, block) to its stage's order. Passes repeat until all queues
are empty. The simulator then runs each stage's order as soon as each block is ready
(Alg. 1, lines 9-24), which is exactly how it runs any schedule.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from .ir import Kind


@lru_cache(maxsize=64)
def pe_orders(num_stages: int, microbatches: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """For each stage, its ordered (op, microbatch) actions."""
    s_count = num_stages
    blocks: list[tuple[int, int] | None] = []  # (stage, op) for computation blocks, None for comm
    for s in range(s_count - 1):
        blocks += [(s, Kind.F), None]
    blocks.append((s_count - 1, -1))  # last stage: forward and backward merged
    for s in range(s_count - 2, -1, -1):
        blocks += [None, (s, Kind.B)]
    queues = [deque() for _ in blocks]
    queues[0].extend(range(microbatches))
    orders: list[list[tuple[int, int]]] = [[] for _ in range(s_count)]
    while any(queues):
        ready = [j for j, q in enumerate(queues) if q]
        for j in ready:
            m = queues[j].popleft()
            if j + 1 < len(blocks):
                queues[j + 1].append(m)
            blk = blocks[j]
            if blk is not None:
                s, op = blk
                if op == -1:
                    orders[s] += [(Kind.F, m), (Kind.B, m)]
                else:
                    orders[s].append((op, m))
    return tuple(tuple(o) for o in orders)
