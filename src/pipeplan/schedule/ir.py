"""The schedule IR, shared by the simulator and the runtime.

For each device, an ordered list of actions: forward or backward of its stage on microbatch m,
or the all-reduce of its (replicated) stage's gradients. Each device holds exactly one stage,
so an action is (op, microbatch) and the stage is the device's. This maps one-to-one onto
torch.distributed.pipelining's per-rank action lists (``_Action(stage, FORWARD|BACKWARD, mb)``);
transfers are implied by the data dependencies and are placed by the simulator or runtime.

If several devices of a stage list the same (op, m), that microbatch is split evenly over
them (SPP's replication); if one device lists it, it processes the whole microbatch
(PipeDream-style round-robin replicas, and data parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PipeplanError
#: Action codes (the simulator adds its transfer kinds 2 and 3 to these).
FWD, BWD, ALLREDUCE = 0, 1, 4

OP_CODES = {"F": FWD, "B": BWD, "AR": ALLREDUCE}
OP_NAMES = {FWD: "F", BWD: "B", ALLREDUCE: "AR"}


@dataclass(frozen=True, eq=False)
class Program:
    """One device's actions: ``ops[i]`` in {FWD, BWD, ALLREDUCE}, ``micro[i]`` (-1 for AR)."""

    stage: int
    ops: np.ndarray
    micro: np.ndarray

    def __len__(self) -> int:
        return int(self.ops.size)

    def same_as(self, other: "Program") -> bool:
        return self is other or (self.stage == other.stage and np.array_equal(self.ops, other.ops)
                                 and np.array_equal(self.micro, other.micro))

    def actions(self) -> list[str]:
        """Human-readable: ``["F0", "F1", "B0", ..., "AR"]``."""
        return [OP_NAMES[int(o)] + ("" if o == ALLREDUCE else str(int(m)))
                for o, m in zip(self.ops, self.micro)]

    @classmethod
    def from_actions(cls, stage: int, actions: list[str]) -> "Program":
        ops, micro = [], []
        for a in actions:
            if a == "AR":
                ops.append(ALLREDUCE)
                micro.append(-1)
            elif a[:1] in ("F", "B") and a[1:].isdigit():
                ops.append(OP_CODES[a[0]])
                micro.append(int(a[1:]))
            else:
                raise PipeplanError(f"schedule: cannot read action {a!r} (expected F<m>, B<m> or AR)")
        return cls(stage, np.array(ops, dtype=np.int8), np.array(micro, dtype=np.int64))


@dataclass
class Schedule:
    """``programs[k]`` runs on cluster device ``devices[k]``."""

    name: str
    microbatches: int
    devices: list[int]
    programs: list[Program]

    def check(self, num_stages: int, replication: list[int]) -> None:
        """Each microbatch runs forward and backward exactly once per stage, on one device or
        split over replicas that then run the same program; a device runs backward of exactly
        the microbatches it ran forward, each after its forward."""
        m_count = self.microbatches
        for s in range(num_stages):
            progs = [p for p in self.programs if p.stage == s]
            if len(progs) != replication[s]:
                raise PipeplanError(f"schedule {self.name}: stage {s} has {len(progs)} programs "
                                    f"for {replication[s]} devices")
            unique = list({id(p): p for p in progs}.values())
            owner = np.full(m_count, -1)
            for k, p in enumerate(unique):
                f_at = np.flatnonzero(p.ops == FWD)
                b_at = np.flatnonzero(p.ops == BWD)
                mf, mb = p.micro[f_at], p.micro[b_at]
                if mf.size and (mf.min() < 0 or mf.max() >= m_count):
                    raise PipeplanError(f"schedule {self.name}: stage {s} names a microbatch outside 0..{m_count - 1}")
                if np.unique(mf).size != mf.size:
                    raise PipeplanError(f"schedule {self.name}: stage {s} lists a microbatch twice on one device")
                if not np.array_equal(np.sort(mf), np.sort(mb)):
                    raise PipeplanError(f"schedule {self.name}: a device of stage {s} runs backward of "
                                        "other microbatches than it ran forward")
                pos_f = np.empty(m_count, dtype=np.int64)
                pos_f[mf] = f_at
                late = np.flatnonzero(pos_f[mb] > b_at)
                if late.size:
                    m = int(mb[late[0]])
                    raise PipeplanError(f"schedule {self.name}: stage {s} runs B{m} before F{m}")
                clash = np.flatnonzero((owner[mf] >= 0) & ~np.array(
                    [unique[o].same_as(p) if o >= 0 else True for o in owner[mf].tolist()], dtype=bool))
                if clash.size:
                    raise PipeplanError(f"schedule {self.name}: stage {s} splits microbatch {int(mf[clash[0]])} "
                                        "over devices whose programs differ (replicas that share a "
                                        "microbatch must run the same program)")
                owner[mf] = k
            if np.any(owner < 0):
                raise PipeplanError(f"schedule {self.name}: stage {s} never runs F{int(np.flatnonzero(owner < 0)[0])}")
