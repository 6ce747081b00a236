"""pipeplan's own executor for what torch's pipelining cannot express: stages on different
numbers of devices (SPP's 3-1, PipeDream's 2-1-1). It runs each device's program from the
schedule IR with torch.distributed's point-to-point and collective operations.

Rank r is one device of the plan, stage by stage (stage 0's devices first). The devices of a
stage that list a microbatch's forward share it: one runs all of its samples; several split
them as evenly as whole samples allow, in the order the stage lists its devices (the
simulator splits by speed). A forward receives, from each device of the previous stage that
holds samples it needs, exactly those rows of every tensor that crosses the cut, and sends
each device of the next stage the rows it needs (SPP §III: |F(s)| x |F(s+1)| transfers);
its backward does the same with the gradients, the other way. Sends are asynchronous and
receives block, so a rank waits only for data the schedule says comes first; messages are
matched by a tag made of the microbatch, stage, direction and tensor. After the programs,
each stage's gradients are summed over its devices (one flattened all-reduce), then the
optimizer steps. Input-gradient/weight-gradient splits (I, W) are not run here. Messages
are matched by tags, which NCCL ignores: this executor runs on CPU processes over gloo
(``device.py``), in fp32 or bf16 autocast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..plan import Plan
from ..schedule import Kind, Program, make_schedule
from .data import global_batch, split_rows, squared_error
from .device import Target
from .models import load_model
from .split import Recomputed, split_model, stage_examples
from .steps import MOMENTUM, allreduce_gradients, program_micro, run_steps, state_arrays
from .timing import Timed


def stage_major_ranks(plan: Plan) -> list[tuple[int, str]]:
    """(stage, device) of every rank."""
    return [(s, d) for s, st in enumerate(plan.stages) for d in st.devices]


@dataclass
class _Layout:
    """Who holds which rows of every (stage, microbatch)."""
    rows: dict[tuple[int, int], list[tuple[int, int, int]]]  # (s, m) -> [(rank, start, end)]
    programs: dict[int, Program]  # rank -> its device's program

    @classmethod
    def of(cls, plan: Plan, z: int) -> "_Layout":
        ranks = stage_major_ranks(plan)
        sched = make_schedule(plan.schedule, plan.stage_devices(), plan.microbatches, plan.replicas)
        by_device = dict(zip(sched.devices, sched.programs))
        programs = {r: by_device[plan.cluster.index[d]] for r, (_, d) in enumerate(ranks)}
        holders: dict[tuple[int, int], list[int]] = {}
        for r, (s, _) in enumerate(ranks):
            for m in program_micro(programs[r])[0]:
                holders.setdefault((s, m), []).append(r)
        rows = {}
        for (s, m), rs in holders.items():
            rs = sorted(rs, key=lambda r: plan.stages[s].devices.index(ranks[r][1]))
            rows[(s, m)] = [(r, a, b) for r, (a, b) in zip(rs, split_rows(z, len(rs)))]
        return cls(rows, programs)

    def mine(self, s: int, m: int, rank: int) -> tuple[int, int]:
        return next((a, b) for r, a, b in self.rows[(s, m)] if r == rank)

    def overlaps(self, s: int, m: int, span: tuple[int, int]):
        """(rank, start, end) of stage s's holders of m whose rows meet ``span``."""
        for r, a, b in self.rows[(s, m)]:
            lo, hi = max(a, span[0]), min(b, span[1])
            if lo < hi:
                yield r, lo, hi


def _tag(m: int, s: int, backward: bool, j: int, s_count: int) -> int:
    return ((m * s_count + s) * 2 + int(backward)) * 64 + j


class _Stage:
    """One rank's stage: runs its program's actions on its rows of each microbatch."""

    def __init__(self, rank: int, s: int, plan: Plan, part: nn.Module, layout: _Layout, shapes: list,
                 xs: torch.Tensor, ys: torch.Tensor, z: int) -> None:
        self.rank, self.s, self.last = rank, s, s == plan.num_stages - 1
        self.s_count, self.part, self.layout, self.z = plan.num_stages, part, layout, z
        self.in_shapes, self.xs, self.ys = shapes, xs, ys
        self.denom = float(ys.numel())
        self.saved: dict[int, tuple] = {}
        self.pending: list = []

    def _recv(self, m: int, s_from: int, span: tuple[int, int], backward: bool, like: list) -> list[torch.Tensor]:
        start = time.perf_counter()
        parts: list[list[torch.Tensor]] = [[] for _ in like]
        for r, lo, hi in self.layout.overlaps(s_from, m, span):
            for j, (shape, dtype) in enumerate(like):
                buf = torch.empty((hi - lo, *shape), dtype=dtype)
                dist.recv(buf, src=r, tag=_tag(m, min(s_from, self.s), backward, j, self.s_count))
                parts[j].append(buf)
        self.part.received(backward, m, start, time.perf_counter(), f"ch:{s_from}-{self.s}")
        return [torch.cat(p) for p in parts]

    def _send(self, m: int, s_to: int, span: tuple[int, int], backward: bool, tensors: list) -> None:
        for r, lo, hi in self.layout.overlaps(s_to, m, span):
            for j, t in enumerate(tensors):
                piece = t[lo - span[0]:hi - span[0]].detach().contiguous()
                self.pending.append((dist.isend(piece, dst=r, tag=_tag(m, min(s_to, self.s), backward, j,
                                                                        self.s_count)), piece))

    def forward(self, m: int) -> None:
        span = self.layout.mine(self.s, m, self.rank)
        if self.s == 0:
            inputs = [self.xs[m * self.z + span[0]:m * self.z + span[1]]]
        else:
            inputs = [t.requires_grad_(t.is_floating_point())
                      for t in self._recv(m, self.s - 1, span, False, self.in_shapes)]
        out = self.part(*inputs)
        outs = list(out) if isinstance(out, tuple) else [out]
        if self.last:
            target = self.ys[m * self.z + span[0]:m * self.z + span[1]]
            outs = [squared_error(outs[0].float(), target, self.denom)]
        else:
            self._send(m, self.s + 1, span, False, outs)
        self.saved[m] = (inputs, outs, span)

    def backward(self, m: int) -> None:
        inputs, outs, span = self.saved.pop(m)
        if self.last:
            outs[0].backward()
        else:
            like = [(o.shape[1:], o.dtype) for o in outs]
            grads = self._recv(m, self.s + 1, span, True, like)
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if self.s > 0:
            self._send(m, self.s - 1, span, True,
                       [t.grad if t.grad is not None else torch.zeros_like(t) for t in inputs])

    def finish(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def train_direct(rank: int, plan: Plan, cfg: dict, progress) -> tuple[list[dict], dict | None]:
    """Train ``warmup + steps`` iterations on this rank; (its steps, ``steps.run_steps``, and
    {stage: its state} if this rank is its first device). ``progress(label)`` after each action."""
    ranks = stage_major_ranks(plan)
    s, device = ranks[rank]
    groups = [dist.new_group([r for r, (st, _) in enumerate(ranks) if st == q]) for q in range(plan.num_stages)]
    model, x = load_model(cfg["spec"], cfg["microbatch"], cfg["seed"])
    parts = split_model(model, [st.nodes for st in plan.stages], cfg["spec"])
    xs, ys = global_batch(model, x, plan.microbatches, cfg["seed"])
    z = x.shape[0]
    target = Target("cpu", cfg["precision"])
    with target.autocast():  # the dtypes a stage receives are those of the run
        inp, _ = stage_examples(model, parts, s, xs[:z])
    shapes = [(t.shape[1:], t.dtype) for t in inp]
    part = parts[s]
    layout = _Layout.of(plan, z)
    timed = Timed(Recomputed(part) if plan.recomputes(s) else part, *program_micro(layout.programs[rank]), progress,
                  autocast=target.autocast)
    stage = _Stage(rank, s, plan, timed, layout, shapes, xs, ys, z)
    opt = torch.optim.SGD(part.parameters(), lr=cfg["lr"], momentum=MOMENTUM)

    def step() -> None:
        program = layout.programs[rank]
        for kind, m in zip(program.kinds.tolist(), program.micro.tolist()):
            if kind == Kind.F:
                stage.forward(m)
            elif kind == Kind.B:
                stage.backward(m)
        stage.finish()
        if len(plan.stages[s].devices) > 1:
            allreduce_gradients(part, groups[s], timed)

    steps = run_steps(step, timed, opt, cfg["warmup"] + cfg["steps"], progress)
    return steps, ({s: state_arrays(part)} if plan.stages[s].devices[0] == device else None)
