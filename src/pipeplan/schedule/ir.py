"""The schedule IR, shared by the simulator and the runtime.

For each device, an ordered list of actions ``(kind, stage, microbatch)``: forward (F), full
backward (B), the backward's input-gradient and weight-gradient halves (I and W, as torch's
pipelining splits them for zero-bubble schedules), or the all-reduce (AR) of the stage's
gradients. A device may hold several stages (interleaved schedules). Transfers are not
listed: they follow from the data dependencies, and the simulator or runtime places them.
This maps one-to-one onto torch.distributed.pipelining's per-rank action lists.

If several devices of a stage list the same (stage, microbatch), they split that microbatch
in proportion to their speeds and must run the same program (SPP §III-B replication); if
one device lists it, it processes the whole microbatch (PipeDream's round-robin replicas,
data parallelism).

How an iteration is evaluated is a property of the schedule, not of its name:

- ``steady_state = N``: the programs run a stream of microbatches with no flush (PipeDream's
  asynchronous pipeline, weight stashing); the iteration is the steady-state time of N
  microbatches (``sim/steady.py``).
- ``lanes``: forward and backward run side by side on each device, on the shares of its
  resources the plan allocates to each (resalloc.txt §III-B).
- ``overlap_pairs``: a forward a program marks paired, directly followed by a paired full
  backward (B) of another stage, runs overlapped with it, one's exchanges behind the other's
  compute (DualPipe, DeepSeek-V3 arXiv 2412.19437 §3.2.1; torch's ``OVERLAP_F_B``;
  ``Program.partners``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from ..errors import PipeplanError


class Kind(IntEnum):
    """Action and task kinds. The schedule lists F, B, I, W and AR; the simulator adds the
    transfers (SEND_F, SEND_B) and the optimizer step (UPDATE)."""

    F = 0
    B = 1
    SEND_F = 2
    SEND_B = 3
    AR = 4
    UPDATE = 5
    I = 6  # noqa: E741  (torch's name) backward, input gradient only
    W = 7  # backward, weight gradient only


#: Kinds a program may list; the backward of a microbatch is either B, or I then W.
ACTION_KINDS = (Kind.F, Kind.B, Kind.I, Kind.W, Kind.AR)
BACKWARD_KINDS = (Kind.B, Kind.I)  # the kinds that send the input gradient upstream
_LETTERS = {Kind.F: "F", Kind.B: "B", Kind.I: "I", Kind.W: "W"}
_FROM_LETTER = {v: k for k, v in _LETTERS.items()}


@dataclass(frozen=True, eq=False)
class Program:
    """One device's actions: ``kinds[i]``, ``stages[i]`` and ``micro[i]`` (-1 for AR).
    ``stage`` is the device's first stage (its only one, outside interleaved schedules).
    ``paired[i]``: action i is one of an overlapped forward/backward pair (``partners``)."""

    stage: int
    kinds: np.ndarray
    micro: np.ndarray
    stages: np.ndarray
    paired: np.ndarray | None = None

    @classmethod
    def of(cls, seq: list[tuple[int, int, int]], paired: list[bool] | None = None) -> "Program":
        """From ``[(kind, stage, microbatch), ...]`` (and which actions are paired)."""
        arr = np.array(seq, dtype=np.int64).reshape(-1, 3)
        pairs = None if paired is None else np.array(list(paired) + [False] * (len(arr) - len(paired)), dtype=bool)
        return cls(int(arr[0, 1]) if len(arr) else 0, arr[:, 0].astype(np.int8), arr[:, 2].copy(),
                   arr[:, 1].copy(), pairs)

    def __len__(self) -> int:
        return int(self.kinds.size)

    def partners(self) -> np.ndarray:
        """Per action, the stage of the action it runs overlapped with under ``overlap_pairs``
        (a paired F directly followed by a paired B of another stage, and that B), else -1."""
        out = np.full(len(self), -1, dtype=np.int64)
        if self.paired is None:
            return out
        pair = np.flatnonzero((self.kinds[:-1] == Kind.F) & (self.kinds[1:] == Kind.B) & self.paired[:-1]
                              & self.paired[1:] & (self.stages[:-1] != self.stages[1:]))
        out[pair], out[pair + 1] = self.stages[pair + 1], self.stages[pair]
        return out

    def same_as(self, other: "Program") -> bool:
        return self is other or (np.array_equal(self.kinds, other.kinds) and np.array_equal(self.micro, other.micro)
                                 and np.array_equal(self.stages, other.stages))

    def actions(self) -> list[str]:
        """Human-readable: ``["F0", "F1", "B0", ..., "AR"]`` (``F0@2`` for another stage)."""
        out = []
        for k, s, m in zip(self.kinds.tolist(), self.stages.tolist(), self.micro.tolist()):
            name = "AR" if k == Kind.AR else _LETTERS[Kind(k)] + str(m)
            out.append(name if s == self.stage else f"{name}@{s}")
        return out

    @classmethod
    def from_actions(cls, stage: int, actions: list[str]) -> "Program":
        seq = []
        for a in actions:
            body, _, at = a.partition("@")
            s = int(at) if at.isdigit() else stage
            if at and not at.isdigit():
                raise PipeplanError(f"schedule: cannot read action {a!r} (stage after @ must be a number)")
            if body == "AR":
                seq.append((Kind.AR, s, -1))
            elif body[:1] in _FROM_LETTER and body[1:].isdigit():
                seq.append((_FROM_LETTER[body[0]], s, int(body[1:])))
            else:
                raise PipeplanError(f"schedule: cannot read action {a!r} (expected F<m>, B<m>, I<m>, W<m> or AR)")
        prog = cls.of(seq)
        return cls(stage, prog.kinds, prog.micro, prog.stages)


@dataclass
class Schedule:
    """``programs[k]`` runs on cluster device ``devices[k]``; ``microbatches`` is how many
    the programs list (a steady state lists more than it evaluates)."""

    name: str
    microbatches: int
    devices: list[int]
    programs: list[Program]
    steady_state: int | None = None
    lanes: bool = False
    overlap_pairs: bool = False

    @property
    def splits_backward(self) -> bool:
        """Some backward runs as I then W (zero-bubble schedules)."""
        return any(bool(np.any(p.kinds == Kind.I)) for p in self.programs)
