"""A simulated iteration's timeline: every task with its resource and start/end times.

Struct-of-arrays (numpy) so that a 32-stage x 128-microbatch timeline stays cheap.
Resources are the devices (compute, and the all-reduce of their stage) followed by the
inter-stage channels ("ch:<stage a>-<stage b>", one transfer at a time, SPP §III-B).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schedule.ir import ALLREDUCE, BWD, FWD

# Task kinds: the schedule's actions plus the transfers the simulator places.
COMM_F, COMM_B, UPDATE = 2, 3, 5
KIND_NAMES = ("forward", "backward", "send-forward", "send-backward", "allreduce", "update")


@dataclass
class Timeline:
    """All tasks of one iteration. Arrays are aligned: task t is
    ``(kind[t], stage[t], micro[t], resource[t], start[t], end[t])``; ``micro`` is -1 for
    an all-reduce. ``resources[r]`` names resource r and ``resource_is_device[r]`` says
    whether it is a device (else a channel)."""

    resources: list[str]
    resource_is_device: list[bool]
    kind: np.ndarray
    stage: np.ndarray
    micro: np.ndarray
    resource: np.ndarray
    start: np.ndarray
    end: np.ndarray
    iteration_s: float

    def __len__(self) -> int:
        return int(self.kind.size)

    def tasks_on(self, r: int) -> np.ndarray:
        """Indices of the tasks on resource r, by start time."""
        idx = np.flatnonzero(self.resource == r)
        return idx[np.argsort(self.start[idx], kind="stable")]

    def to_rows(self) -> list[dict]:
        """One dict per task (for JSON output and people)."""
        return [{"kind": KIND_NAMES[int(k)], "stage": int(s), "microbatch": int(m),
                 "resource": self.resources[int(r)], "start_s": float(a), "end_s": float(b)}
                for k, s, m, r, a, b in zip(self.kind, self.stage, self.micro, self.resource,
                                            self.start, self.end)]
