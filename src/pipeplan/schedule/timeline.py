"""Timelines of an iteration, simulated or measured: every task with its resource and
start/end times (what a schedule's programs did), drawn by viz and compared by the runtime.

Struct-of-arrays (numpy) so that a 32-stage x 128-microbatch timeline stays cheap.
Resources are the devices (compute, and the all-reduce of their stage) followed by the
channels ("ch:<a>-<b>" carries stage a's data to stage b, both directions on a half-duplex
cluster; one transfer at a time, SPP §III-B).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Kind

KIND_NAMES = {Kind.F: "forward", Kind.B: "backward", Kind.SEND_F: "send-forward", Kind.SEND_B: "send-backward",
              Kind.AR: "allreduce", Kind.UPDATE: "update", Kind.I: "backward-input", Kind.W: "backward-weight"}


@dataclass
class Timeline:
    """All tasks of one iteration. Arrays are aligned: task t is
    ``(kind[t], stage[t], micro[t], resource[t], start[t], end[t])``; ``micro`` is -1 for
    an all-reduce or optimizer step. ``resources[r]`` names resource r and
    ``resource_is_device[r]`` says whether it is a device (else a channel)."""

    resources: list[str]
    resource_is_device: list[bool]
    kind: np.ndarray
    stage: np.ndarray
    micro: np.ndarray
    resource: np.ndarray
    start: np.ndarray
    end: np.ndarray
    iteration_s: float
    # a steady state (asynchronous schedules): the stream's period that the iteration is
    # measured over, (start, end); charts draw that window only
    period: tuple[float, float] | None = None

    def __len__(self) -> int:
        return int(self.kind.size)

    def tasks_on(self, r: int) -> np.ndarray:
        """Indices of the tasks on resource r, by start time."""
        idx = np.flatnonzero(self.resource == r)
        return idx[np.argsort(self.start[idx], kind="stable")]

    def to_rows(self) -> list[dict]:
        """One dict per task (for JSON output and people)."""
        return [{"kind": KIND_NAMES[Kind(int(k))], "stage": int(s), "microbatch": int(m),
                 "resource": self.resources[int(r)], "start_s": float(a), "end_s": float(b)}
                for k, s, m, r, a, b in zip(self.kind, self.stage, self.micro, self.resource,
                                            self.start, self.end)]
