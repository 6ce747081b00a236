"""What a sharding plan costs on a cluster: pipeplan's addition to Auto-MAP's OPP (docs/opp.md).

Auto-MAP rewards a plan for the number of dimensions it partitions (§4.2), which its own
VGG-19 result shows is not what makes training fast (§5.2.1). This model prices a plan the
way the runtime runs it, on the first N devices of the cluster (one line, as Auto-MAP):

- **compute** of each op: a roofline on the reference device (the zoo's V100: FLOPs over the
  peak at the op kind's efficiency, or bytes moved over the memory bandwidth, whichever is
  longer), forward plus backward (twice the forward), over the device's speed; divided by N
  when the op's placement tuple cuts any of its tensors;
- **forward all-reduces**: a partial sum read whole (``P`` read as ``R``), once per tensor;
- **all-gathers** (only where the propagator allows them, ``gathers=True``): a cut tensor read
  whole, once per tensor, and in the backward a reduce-scatter of its gradient; a cut
  parameter read whole (FSDP) is gathered again for the backward;
- **backward all-reduces**: a tensor read replicated by an op that cuts its work gets a
  partial gradient, all-reduced once per tensor; for a replicated parameter this is the
  gradient synchronization of data parallelism, for an activation Megatron's
  all-reduce of the input gradient;
- **memory** per device: parameters x (weights, gradients, optimizer state), cut by N where
  partitioned, plus the activations kept for backward (the computed floating-point tensors
  that need a gradient, views excluded), cut by N where partitioned.

All-reduces are SPP's ring (``sim.formulas.allreduce_time``: bandwidth and the links' own
latency) over the N devices plus NCCL's latency of a ring collective (``ring_latency``: a base
and a latency per ring step, from NCCL's tuning model; docs/opp.md), so that a collective of
a few bytes is never free; nothing overlaps. The time of an op's tuple is fixed by the tuple alone, so the whole cost is linear
in one-hot choices and the same model is the objective of the integer program (``milp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..sim.formulas import allreduce_time, state_bytes
from ..graph.zoo import EFFICIENCY, REFERENCE_MEM_GBPS, REFERENCE_TFLOPS
from .program import PARAM, OpInfo, TensorProgram
from .propagate import Domains, OpTable, Propagator, bit, codes
from .rules import P, R, dim_of

_PEAK = REFERENCE_TFLOPS * 1e12
_MEM_BW = REFERENCE_MEM_GBPS * 1e9 * EFFICIENCY["memory"]
NO_COMPUTE = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze",
              "slice", "select", "alias", "detach", "split", "split_with_sizes", "unbind", "lift_fresh_copy"}
IDENTITY = {"clone", "_to_copy"}
BACKWARD_FACTOR = 2.0
SOFTMAX = {"_softmax", "_log_softmax"}
BIAS = {"addmm": 0, "convolution": 2}  # the bias added once to a partial product: its gradient is whole
#: NCCL's latency model of a ring collective with its low-latency protocol, the one it picks for
#: small messages (src/graph/tuning.cc: baseLat and hwLat of Ring/LL): a base per collective and
#: a latency per ring step, NVLink's within a server and the network's between servers; seconds
RING_BASE_LATENCY = 3.6e-6
STEP_LATENCY_INTRA = 0.47e-6
STEP_LATENCY_INTER = 2.7e-6


def ring_latency(cluster: Cluster, group: list[int], all_reduce: bool = True) -> float:
    """NCCL's latency term of a ring all-reduce (2(p-1) steps, 2(servers-1) of them between
    servers) or all-gather / reduce-scatter (p-1 steps, servers-1 between servers) over
    ``group``; 0 for fewer than 2 devices."""
    p, servers = len(group), len({cluster.devices[i].server for i in group})
    if p < 2:
        return 0.0
    rounds = 2 if all_reduce else 1
    steps, inter = rounds * (p - 1), rounds * (servers - 1)
    return RING_BASE_LATENCY + (steps - inter) * STEP_LATENCY_INTRA + inter * STEP_LATENCY_INTER


def _flops(op: OpInfo, prog: TensorProgram) -> tuple[float, str]:
    """FLOPs of one forward call and the roofline kind."""
    shp = [prog.tensors[t].shape for t in op.inputs]
    out = prog.tensors[op.outputs[0]].shape
    numel = float(np.prod(out)) if out else 1.0
    if op.target in ("mm", "bmm"):
        return 2.0 * numel * shp[0][-1], "matmul"
    if op.target == "addmm":
        return 2.0 * numel * shp[1][-1] + numel, "matmul"
    if op.target == "convolution":
        w = shp[1]
        return 2.0 * numel * float(np.prod(w[1:])), "conv"
    return 0.0, "memory"


def op_seconds(op: OpInfo, prog: TensorProgram, speed: float = 1.0) -> float:
    """Forward + backward time of the whole op on one device of ``speed``."""
    if op.target in NO_COMPUTE:
        return 0.0
    flops, kind = _flops(op, prog)
    moved = sum(prog.tensors[t].numel * prog.tensors[t].itemsize for t in (*op.inputs, *op.outputs))
    t = max(flops / (_PEAK * EFFICIENCY[kind]) if flops else 0.0, moved / _MEM_BW)
    return t * (1.0 + BACKWARD_FACTOR) / speed


def roots(prog: TensorProgram) -> np.ndarray:
    """Each tensor's source through views and copies: a partial sum, or a partial gradient,
    is all-reduced once for a tensor and all its views."""
    root = np.arange(len(prog.tensors))
    for op in prog.ops:
        if (op.target in NO_COMPUTE or op.target in IDENTITY) and len(op.inputs) == 1:
            root[list(op.outputs)] = root[op.inputs[0]]
    return root


def needs_grad(prog: TensorProgram) -> np.ndarray:
    """Which tensors get a gradient: parameters and the floating values computed from them."""
    out = np.array([t.kind == PARAM for t in prog.tensors])
    for op in prog.ops:
        if any(out[t] for t in op.inputs):
            for t in op.outputs:
                out[t] = prog.tensors[t].dtype.startswith(("float", "bfloat"))
    return out


@dataclass(frozen=True)
class TupleCost:
    """Per op: each tuple's compute seconds, the tensors it all-reduces forward (partials read
    whole) and those whose gradient it leaves partial (read replicated by a cut op)."""

    compute: tuple[float, ...]
    extra_comm: tuple[float, ...]  # softmax along a cut dimension: its row statistics all-reduced
    softmax_ars: tuple[tuple[int, int], ...]  # those all-reduces: (forward, backward) calls
    forward_ar: tuple[tuple[int, ...], ...]
    backward_ar: tuple[tuple[int, ...], ...]
    gather: tuple[tuple[int, ...], ...]  # cut tensors read whole: all-gather (reduce-scatter back)

    def comm_sets(self, k: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Tuple k's collectives by kind: each is paid once per tensor (its root)."""
        return (("f", self.forward_ar[k]), ("b", self.backward_ar[k]), ("g", self.gather[k]))


@dataclass(frozen=True)
class PlanCost:
    """The predicted step: seconds and their parts, and the peak memory of a device."""

    step_s: float
    compute_s: float
    comm_s: float
    collectives: int
    memory_bytes: float
    fits: bool
    by_phase: dict | None = None  # forward/backward -> collective kind -> calls (what a run should issue)


class CostModel:
    """Prices placement tuples and whole plans of one program on N devices of a cluster."""

    def __init__(self, prop: Propagator, cluster: Cluster, optimizer: str = "adam") -> None:
        self.prop, self.prog, self.n = prop, prop.prog, prop.devices
        if len(cluster) < self.n:
            raise ValueError(f"the cluster has {len(cluster)} devices, the plan needs {self.n}")
        self.group = list(range(self.n))
        speed = min(cluster.devices[i].speed for i in self.group)
        self.memory = min(cluster.devices[i].memory for i in self.group)
        self.grad = needs_grad(self.prog)
        self.root = roots(self.prog)
        nbytes = np.array([t.numel * t.itemsize for t in self.prog.tensors], dtype=float)
        self.cluster = cluster
        self.ar = np.array([self.allreduce(b) for b in nbytes])
        # ring all-gather = half a ring all-reduce's traffic and steps; its backward, a reduce-scatter
        # of the gradient; a parameter is gathered again for the backward (FSDP's way: not kept whole)
        is_param = np.array([t.kind == PARAM for t in self.prog.tensors])
        gather = np.array([allreduce_time(cluster, self.group, b) / 2 + ring_latency(cluster, self.group, False)
                           if b > 0 else 0.0 for b in nbytes])
        self.ag = gather * (1.0 + self.grad + is_param)
        self.price = {"f": self.ar, "b": self.ar, "g": self.ag}
        self.param_mem = np.array([state_bytes(b, optimizer) if t.kind == PARAM else 0.0
                                   for t, b in zip(self.prog.tensors, nbytes)])
        kept = np.zeros(len(self.prog.tensors), dtype=bool)
        for op in self.prog.ops:
            if op.target not in NO_COMPUTE:
                kept[list(op.outputs)] = True
        self.act_mem = np.where(kept & self.grad & np.array([t.kind != PARAM for t in self.prog.tensors]), nbytes, 0.0)
        self.tuples = [self._tuple_cost(op, table, speed) for op, table in zip(self.prog.ops, prop.tables)]

    def allreduce(self, nbytes: float) -> float:
        """A ring all-reduce of ``nbytes`` over the plan's devices (0 for nothing)."""
        if nbytes <= 0:
            return 0.0
        return allreduce_time(self.cluster, self.group, nbytes) + ring_latency(self.cluster, self.group)

    def _tuple_cost(self, op: OpInfo, table: OpTable, speed: float) -> TupleCost:
        whole = op_seconds(op, self.prog, speed)
        n_in = len(op.inputs)
        compute, extra, soft, fwd, bwd, gat = [], [], [], [], [], []
        root = self.root
        for masks, flags, gflags in zip(table.tuples, table.allreduce, table.allgather):
            # what the op computes on: a gathered input is whole by then
            used = [bit(R) if i < n_in and gflags >> i & 1 else m for i, m in enumerate(masks)]
            cut = any(m.bit_count() == 1 and m >= bit(2) for m in used)          # some tensor split
            partial = any(m == bit(P) for m in used[n_in:])                         # a partial result
            compute.append(whole / self.n if cut else whole)
            calls, rows = self._softmax_ars(op, used)
            soft.append(calls)
            extra.append(sum(calls) * self.allreduce(rows))
            fwd.append(tuple(int(root[op.inputs[i]]) for i in range(n_in) if flags >> i & 1))
            gat.append(tuple(int(root[op.inputs[i]]) for i in range(n_in) if gflags >> i & 1))
            bias = BIAS.get(op.target) if partial else None
            bwd.append(tuple(int(root[op.inputs[i]]) for i in range(n_in) if (cut or partial) and used[i] == bit(R)
                             and not flags >> i & 1 and not gflags >> i & 1 and self.grad[op.inputs[i]]
                             and i != bias))
        return TupleCost(tuple(compute), tuple(extra), tuple(soft), tuple(fwd), tuple(bwd), tuple(gat))

    def _softmax_ars(self, op: OpInfo, masks: list[int]) -> tuple[tuple[int, int], float]:
        """Softmax along its cut dimension all-reduces each row's max and sum (forward) and one
        row sum (backward): ((forward, backward) all-reduces, bytes of each). A log-softmax read
        only by gathers along that dimension (the NLL loss) has no backward one: the gradient
        of the fused loss is each device's softmax less the target's one-hot, computed locally
        (torch's ``loss_parallel``)."""
        if op.target not in SOFTMAX:
            return (0, 0), 0.0
        x = self.prog.tensors[op.inputs[0]]
        dim = op.arg(1) % x.rank
        code = masks[0].bit_length() - 1
        if masks[0].bit_count() != 1 or code < 2 or dim_of(code)[0] != dim:
            return (0, 0), 0.0
        rows = x.numel // x.shape[dim] * x.itemsize
        return (2, 0 if self._read_by_nll(op, dim) else 1), rows

    def _read_by_nll(self, op: OpInfo, dim: int) -> bool:
        """Whether a log-softmax's output is read only by gathers along ``dim`` (the NLL loss)."""
        out = op.outputs[0]
        users = [self.prog.ops[u] for u in self.prog.users.get(out, [])]
        rank = self.prog.tensors[out].rank
        return op.target == "_log_softmax" and bool(users) and all(
            u.target == "gather" and u.inputs[0] == out and u.arg(1) % rank == dim for u in users)

    def memory_of(self, placement: dict[int, int]) -> float:
        """Peak bytes on a device when tensor t has placement code ``placement[t]``."""
        total = 0.0
        for t, code in placement.items():
            share = 1.0 / self.n if code >= 2 else 1.0
            total += (self.param_mem[t] + self.act_mem[t]) * share
        return total

    def evaluate(self, dom: Domains) -> PlanCost:
        """The cost of a plan whose domains propagation has narrowed. Ops are visited in
        program order; each runs its cheapest tuple still allowed (its compute plus the
        all-reduces it adds: a tensor is all-reduced once however many ops need it), and where
        it had a choice the choice is propagated before the next op, so that every tensor
        holds one placement. Greedy where choices remain (where to all-reduce a partial sum);
        ``milp`` optimizes them exactly."""
        dom = list(dom)
        compute, extra, softmax = 0.0, 0.0, np.zeros(2, dtype=int)
        paid: dict[str, set[int]] = {"f": set(), "b": set(), "g": set()}
        for o, table in enumerate(self.prop.tables):
            tc, n_in = self.tuples[o], len(self.prog.ops[o].inputs)
            alive = table.alive(dom)
            if not alive:
                return PlanCost(np.inf, np.inf, np.inf, 0, np.inf, False)
            price = [tc.compute[k] + tc.extra_comm[k]
                     + sum(self.price[kind][t] for kind, ts in tc.comm_sets(k) for t in ts if t not in paid[kind])
                     + sum(self.ar[t] for t, m in zip(table.slots[n_in:], table.tuples[k][n_in:]) if m == bit(P))
                     for k in alive]  # look ahead: a partial result will be all-reduced
            k = alive[int(np.argmin(price))]
            compute += tc.compute[k]
            extra += tc.extra_comm[k]
            softmax += tc.softmax_ars[k]
            for kind, ts in tc.comm_sets(k):
                paid[kind].update(ts)
            if len(alive) > 1:
                changes = {t: m for t, m in zip(table.slots, table.tuples[k]) if dom[t] & m != dom[t]}
                if changes:
                    dom, conflict = self.prop.narrow(dom, changes)
                    if conflict is not None:
                        return PlanCost(np.inf, np.inf, np.inf, 0, np.inf, False)
        comm = float(sum(self.price[kind][t] for kind, ts in paid.items() for t in ts)) + extra
        mem = self.memory_of({t: self._code(dom[t]) for t in range(len(dom))})
        count = sum(len(ts) for ts in paid.values())
        return PlanCost(compute + comm, compute, comm, count, mem, bool(mem <= self.memory),
                        self._phases(paid, (int(softmax[0]), int(softmax[1]))))

    def _phases(self, paid: dict[str, set[int]], softmax: tuple[int, int]) -> dict:
        """The collectives of a step by phase and kind: forward all-reduces of partial sums and
        all-gathers; backward all-reduces of partial gradients, reduce-scatters of gathered
        tensors' gradients and parameters gathered again; softmaxes along a cut dimension, their
        (forward, backward) all-reduces ``softmax``."""
        gathered = list(paid["g"])
        forward = {"all_reduce": len(paid["f"]) + softmax[0], "all_gather": len(gathered)}
        backward = {"all_reduce": len(paid["b"]) + softmax[1],
                    "reduce_scatter": int(sum(self.grad[t] for t in gathered)),
                    "all_gather": int(sum(self.prog.tensors[t].kind == PARAM for t in gathered))}
        return {phase: {k: n for k, n in kinds.items() if n}
                for phase, kinds in (("forward", forward), ("backward", backward))}

    @staticmethod
    def _code(mask: int) -> int:
        """The placement a (possibly undecided) domain is priced at: its cut if it has one."""
        cs = codes(mask)
        cut = [c for c in cs if c >= 2]
        return cut[0] if len(cut) == 1 and len(cs) == 1 else (P if cs == [P] else R)
