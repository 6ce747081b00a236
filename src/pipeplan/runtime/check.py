"""``run --check``: the run's parameters and buffers against the same training in one process.

The reference trains the same model (same seed, global batch, loss and optimizer) one
microbatch share at a time, in the order each pipeline runs them (whole microbatches when
stages have different numbers of devices, where no pipeline runs every stage), so layers that depend on
the batch (BatchNorm) see exactly the batches they saw in the run: pipeline p's share of
microbatch m (all of it, or a 1/k part when split), with pipeline p's own running
statistics, which are kept apart per pipeline as each replica keeps its own. Gradients add up
over shares as over microbatches and replicas: each pipeline's apart, then across pipelines,
as the run's all-reduce sums them. Pipeline 0's state (every stage) is compared, each tensor
within its own tolerance: ``TOLERANCE``, or ``NOISE_FACTOR`` times the rounding measured
between two summation orders of the same training when there are several pipelines (fp32
reordering amplified by BatchNorm over a few steps reaches 1e-4; a lost or repeated
microbatch moves parameters by ~1e-2 and still fails).

The reference trains on the run's device type and in its precision (``device.Target``: the
launching process's current GPU, bf16 autocast). On a GPU the tolerance is always measured,
one pipeline too: GPU kernels need not sum in the same order twice.

What cannot be compared is said, not hidden: random layers (Dropout) draw other numbers in
each process; a re-materialized stage runs its forward twice, so a BatchNorm in it updates
its running statistics twice (its buffers are then left out of the comparison).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import nn

from ..plan import Plan
from .data import equal_replication, global_batch, share, squared_error
from .device import Target
from .steps import MOMENTUM
from .models import load_model
from .translate import microbatches_of

TOLERANCE = 1e-5
#: A tensor's tolerance is at least this many times the rounding measured on it between two
#: summation orders of the same one-process training (``_tolerances``): reordering moves a
#: BatchNorm ResNet's parameters by up to ~1e-4 after a few steps, a lost or repeated
#: microbatch by ~1e-2, hundreds of times more.
NOISE_FACTOR = 10.0
#: Magnitude below which a tensor's differences are taken relative to this (compare_states).
SCALE_FLOOR = 1e-2


@dataclass
class CheckResult:
    verdict: str  # "pass", "fail" or "not comparable"
    max_rel_diff: float
    worst: str  # the tensor with the largest relative difference
    tolerance: float = TOLERANCE
    left_out: list[str] = field(default_factory=list)  # tensors not compared, with the reason in ``note``
    note: str = ""

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "max_rel_diff": self.max_rel_diff, "worst": self.worst,
                "tolerance": self.tolerance, "left_out": self.left_out, "note": self.note}


def _random_layers(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def _batch_dependent(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._NormBase)]


def _twice_updated_buffers(plan: Plan, model: nn.Module) -> list[str]:
    """Running statistics of batch-norm layers inside re-materialized stages."""
    modules = dict(model.named_modules())
    out = []
    for s, stage in enumerate(plan.stages):
        if plan.recomputes(s):
            out += [f"{n}.{b}" for n in _batch_dependent(model)
                    if any(n == nid or n.startswith(nid + ".") for nid in stage.nodes)
                    for b, _ in modules[n].named_buffers()]
    return out


def reference_state(plan: Plan, spec: str, steps: int, lr: float, seed: int, threads: int,
                    microbatch: int, per_pipeline: bool = False, target: Target = Target()) -> dict[str, torch.Tensor]:
    """Pipeline 0's state after ``steps`` iterations trained in one process (module docstring),
    on ``threads`` threads (this process's own count restored after). ``per_pipeline``: the
    same training with each pipeline's gradients summed apart, then across pipelines (as the
    run's all-reduce does); only the rounding differs."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _reference_state(plan, spec, steps, lr, seed, microbatch, per_pipeline, target)
    finally:
        torch.set_num_threads(old)


def _reference_state(plan: Plan, spec: str, steps: int, lr: float, seed: int, microbatch: int, per_pipeline: bool,
                     target: Target) -> dict[str, torch.Tensor]:
    model, x = load_model(spec, microbatch, seed)
    xs, ys = global_batch(model, x, plan.microbatches, seed)
    dev = target.torch_device()
    model, xs, ys = model.to(dev), xs.to(dev), ys.to(dev)
    z, m_count = x.shape[0], plan.microbatches
    # stages on different numbers of devices: whole microbatches (check_run says why)
    k = pipelines_compared(plan)
    denom = float(ys.numel())
    order = sorted((m, p) for p in range(k) for m in microbatches_of(p, k, m_count, plan.replicas))
    buffers = [{n: b.detach().clone() for n, b in model.named_buffers()} for _ in range(k)]
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
    for _ in range(steps):
        opt.zero_grad()
        sums: list[list] = [[None] * len(params) for _ in range(k)]
        for m, p in order:
            with torch.no_grad():
                for n, b in model.named_buffers():
                    b.copy_(buffers[p][n])
            rows = share(m, z, p, k, plan.replicas).to(dev)
            with target.autocast():
                out = model(xs[rows])
            squared_error(out.float(), ys[rows], denom).backward()
            buffers[p] = {n: b.detach().clone() for n, b in model.named_buffers()}
            if per_pipeline:
                _move_gradients(params, sums[p])
        if per_pipeline:
            _sum_gradients(params, sums)
        opt.step()
    state = {n: t.detach().cpu().clone() for n, t in model.state_dict().items()}
    return {**state, **{n: b.cpu() for n, b in buffers[0].items() if n in state}}


def pipelines_compared(plan: Plan) -> int:
    """Pipelines the reference trains apart: the stages' devices when every stage has as many,
    else 1 (whole microbatches)."""
    return len(plan.stages[0].devices) if equal_replication(plan) else 1


def _move_gradients(params: list[nn.Parameter], into: list) -> None:
    """Add each parameter's gradient to ``into`` (None: none yet) and clear it."""
    for i, q in enumerate(params):
        if q.grad is not None:
            into[i] = q.grad.detach().clone() if into[i] is None else into[i] + q.grad
            q.grad = None


def _sum_gradients(params: list[nn.Parameter], sums: list[list]) -> None:
    """Each parameter's gradient: its pipelines' sums added up in pipeline order."""
    for i, q in enumerate(params):
        parts = [s[i] for s in sums if s[i] is not None]
        if parts:
            q.grad = functools.reduce(torch.add, parts)


def relative_diffs(staged: dict[int, dict], ref: dict[str, torch.Tensor],
                   skip: frozenset[str] = frozenset()) -> dict[str, float]:
    """Per tensor, the largest difference relative to the reference tensor's largest
    magnitude, or to ``SCALE_FLOOR`` if that is smaller. A run sums the same gradients in
    another order (per replica, then across replicas); the rounding spreads through the
    network at ~1e-8 absolute, which tensors that stay near zero (a BatchNorm bias, an
    attention key bias whose gradient is zero in exact arithmetic) would turn into large
    ratios. A lost or repeated microbatch moves a parameter by 1e-4 or more."""
    out = {}
    for stage_state in staged.values():
        for name, t in stage_state.items():
            if name in skip:
                continue
            t, r = torch.as_tensor(t).double(), ref[name].double()
            scale = max(float(r.abs().max()), SCALE_FLOOR) if r.numel() else 1.0
            out[name] = float((t - r).abs().max()) / scale if r.numel() else 0.0
    return out


def compare_states(staged: dict[int, dict], ref: dict[str, torch.Tensor],
                   skip: frozenset[str] = frozenset()) -> tuple[float, str]:
    """The largest of ``relative_diffs`` and where."""
    diffs = relative_diffs(staged, ref, skip)
    where = max(diffs, key=diffs.get, default="")
    return diffs.get(where, 0.0), where


def _tolerances(plan: Plan, spec: str, ref: dict[str, torch.Tensor], steps: int, lr: float, seed: int,
                threads: int, microbatch: int, target: Target) -> dict[str, float]:
    """Per tensor, ``TOLERANCE`` or ``NOISE_FACTOR`` times the rounding measured between the
    reference and the same training with the gradients summed in another order (one sum over
    all shares instead of per pipeline); 1 pipeline on a CPU: ``TOLERANCE``."""
    if pipelines_compared(plan) == 1 and target.device == "cpu":
        return {}
    other = reference_state(plan, spec, steps, lr, seed, threads, microbatch, target=target)
    noise = relative_diffs({0: other}, ref)
    return {n: max(TOLERANCE, NOISE_FACTOR * v) for n, v in noise.items()}


def check_run(plan: Plan, spec: str, staged: dict[int, dict], *, steps: int, lr: float, seed: int,
              threads: int, microbatch: int, device: str = "cpu", precision: str = "fp32") -> CheckResult:
    """The verdict on a run's final state (``staged``: stage -> tensor name -> values): each
    tensor against the reference trained as the run sums (per pipeline, then across), on its
    device type and in its precision, within its tolerance (``_tolerances``)."""
    model, _ = load_model(spec, microbatch, seed)
    random = _random_layers(model)
    twice = _twice_updated_buffers(plan, model)
    target = Target(device, precision)
    ref = reference_state(plan, spec, steps, lr, seed, threads, microbatch, per_pipeline=True, target=target)
    tolerance = _tolerances(plan, spec, ref, steps, lr, seed, threads, microbatch, target)
    diffs = relative_diffs(staged, ref, frozenset(twice))
    where = max(diffs, key=lambda n: diffs[n] / tolerance.get(n, TOLERANCE), default="")
    worst, tol = diffs.get(where, 0.0), tolerance.get(where, TOLERANCE)
    note = ""
    if twice:
        note = ("re-materialized stages update their BatchNorm running statistics twice per microbatch "
                "(the forward runs again in the backward); those buffers were not compared")
    if random:
        return CheckResult("not comparable", worst, where, tol, left_out=twice,
                           note=f"random layers ({', '.join(random[:3])}) draw other numbers in each process; "
                                "set their p to 0 to check")
    batch = _batch_dependent(model)
    if batch and not equal_replication(plan):
        return CheckResult("not comparable", worst, where, tol, left_out=twice,
                           note=f"batch-dependent layers ({', '.join(batch[:3])}) see other batches when stages "
                                "split microbatches over different numbers of devices")
    return CheckResult("pass" if worst <= tol else "fail", worst, where, tol, left_out=twice, note=note)
