"""Discrete-event core: tasks with durations and dependencies; channel tasks queue FIFO.

A device's order is encoded as dependencies (each action waits for the one before it), so
only channels need arbitration: a channel carries one transfer at a time, in the order the
transfers become ready (SPP §IV-A: a communication block runs as soon as its data is ready
and the channel is idle). Events are processed in time order from a binary heap; ties are
broken by task id, so results are deterministic.

This is the inner loop of every search: flat Python lists, no per-task objects.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush


def run_tasks(dur: list[float], ptr: list[int], idx: list[int], npred: list[int], chan: list[int],
              nchan: int) -> tuple[list[float], list[float], int]:
    """Return (start, end, number of tasks completed). Task i's successors are
    ``idx[ptr[i]:ptr[i+1]]`` (CSR); ``chan[i]`` is its channel or -1."""
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * n
    cnt = list(npred)
    busy = [False] * nchan
    queue: list[deque] = [deque() for _ in range(nchan)]
    heap: list[tuple[float, int]] = []
    push, pop = heappush, heappop

    for i in range(n):
        if cnt[i] == 0:
            c = chan[i]
            if c >= 0:
                if busy[c]:
                    queue[c].append(i)
                    continue
                busy[c] = True
            push(heap, (dur[i], i))  # start[i] stays 0.0
    done = 0
    while heap:
        t, i = pop(heap)
        end[i] = t
        done += 1
        c = chan[i]
        if c >= 0:
            q = queue[c]
            if q:
                j = q.popleft()
                start[j] = t
                push(heap, (t + dur[j], j))
            else:
                busy[c] = False
        for j in idx[ptr[i]:ptr[i + 1]]:
            k = cnt[j] - 1
            cnt[j] = k
            if k == 0:
                c = chan[j]
                if c >= 0:
                    if busy[c]:
                        queue[c].append(j)
                        continue
                    busy[c] = True
                start[j] = t
                push(heap, (t + dur[j], j))
    return start, end, done
