"""Profile a PyTorch model into a pipeplan Graph: per-layer times and sizes for one microbatch.

Layers are the module calls of a ``torch.fx`` trace of ``forward`` in which every submodule
is a leaf (``trace.layer_graph``; for an ``nn.Sequential`` its children "0", "1", ...), the
trace the executor splits; node ids are the module FQNs (``relu#2`` for a module's second
call, timed apart from its first) and edges follow the data flow. Functional ops between
modules (``x + y``, ``torch.cat``, ...) pass dependencies through and their cost is attributed
to no node: it appears only in ``meta["total_s"]`` (the whole model's forward+backward),
so ``sum(fwd + bwd) / total_s`` shows how much time lies outside the layers. A layer must
return a tensor or a tuple of tensors (what backward hooks see); one that returns anything
else (a Hugging Face ``ModelOutput``, a dict) is refused, as its backward could not be timed.

Timing, per repetition, in three separate forward+backward passes (so that one kind of hook
does not inflate the other's times): forward hooks time each layer's forward; backward
hooks time each layer's backward; a pass without hooks gives ``total_s``. The loss is the mean
of the squared output. A layer's backward runs from the gradient w.r.t. its output arriving
(full backward pre-hook) to the later of the gradient w.r.t. its input being computed (full
backward hook) and its last parameter gradient being accumulated (post-accumulate-grad
hooks). The input does not require grad, as on a pipeline's first stage, so the first
layer's backward is its weight-gradient work only, measured by the parameter hooks.
A parameter used by several layers (tied input and output embeddings) is counted once, on
the first, and the graph records the group (``Graph.tied``), which every plan keeps in one stage.
Modules with an ``inplace`` flag (``nn.ReLU(inplace=True)``, ...) are timed out of place:
full backward hooks reject in-place changes of a hooked output, and the cost is the same.
The backward's split into input gradient (I) and weight gradient (W), as zero-bubble
schedules run it, is measured layer by layer (``backward_split.py``): ``meta["backward_split_s"]``
per node [I, W, B] (B: its backward in one pass, timed alike), ``meta["backward_input_fraction"]``
the model's I share (the simulator's), ``meta["backward_split_cost"]`` the layers' I + W over
their B (what the split itself costs).
Each time is the median over ``reps``; ``meta["spread"]`` holds per node [min, max] of
forward+backward over the repetitions. The runtime's loss (squared error against a target,
forward and backward, ``meta["loss_s"]``) is in no layer's time: it is added to the last
layer's backward, which runs on the last stage where each microbatch's loss is computed.

The input is recorded as ``meta["input"]`` (one sample's shape and the dtype,
``models.input_signature``): ``run`` warns when the model it runs is fed another.

Memory (docs/memory.md), from one more forward + loss with the modules' own in-place flags:
a node is ``inplace`` when every tensor it returns shares storage with a tensor it was given
(an in-place op or a view); ``saved`` is the bytes of the distinct storages that autograd
saves for backward (``torch.autograd.graph.saved_tensors_hooks``), each counted once, on the
node that allocated it: the first node that returned it, else the node running when it was
saved (a node's internal tensors), else the last node that ran before (functional ops between
modules, the loss). Parameters and buffers (model state) and the model's input (what a stage
receives) are not counted.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from ..errors import PipeplanError
from ..graph.model import Graph, NodeSpec
from .data import squared_error
from .steps import MOMENTUM
from .models import input_signature, load_model, user_code
from .backward_split import input_fraction, measure_split, split_cost
from .clock import Clock as _Clock, tensors as _tensors
from .trace import Calls, calls_by_module, layer_graph, module_name

_HOOK_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"


def _loss(out: Any) -> torch.Tensor:
    parts = [t.float().pow(2).mean() for t in _tensors(out) if t.requires_grad]
    if not parts:
        raise PipeplanError("the model's output does not require grad: nothing to train")
    return sum(parts[1:], parts[0])


def _device(device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise PipeplanError(f"--device {device}: no CUDA device")
        return torch.device(device)
    raise PipeplanError(f"--device must be cpu or cuda[:N], got {device!r}")


def _describe(m: nn.Module) -> str:
    extra = m.extra_repr()
    return f"{type(m).__name__}({extra})" if extra and "\n" not in extra else type(m).__name__


def _nbytes(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of a tensor's storage; None for an empty one or none (sparse, ...)."""
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (st.data_ptr(), st.nbytes()) if st.nbytes() else None


def _storages(obj: Any) -> set[int]:
    return {s[0] for s in map(_storage, _tensors(obj)) if s is not None}


class _SavedTracker:
    """Hooks for one forward: which storages autograd saves and which node allocated each."""

    def __init__(self, model: nn.Module, x: torch.Tensor) -> None:
        self.static = _storages(list(model.parameters()) + list(model.buffers()))
        self.inputs = _storages(x)
        self.producer: dict[int, str] = {}
        self.packed: dict[int, tuple[int, str | None]] = {}
        self.args: dict[str, set[int]] = {}
        self.inplace: dict[str, bool] = {}
        self.running: list[str] = []
        self.last: str | None = None
        self.alive: list = []  # every node's inputs and outputs: no address is reused meanwhile

    def pre(self, calls: Calls, _m: nn.Module, args: Any) -> None:
        nid = calls.start()
        self.alive.append(args)
        self.args[nid] = _storages(args)
        self.running.append(nid)

    def post(self, calls: Calls, _m: nn.Module, _args: Any, out: Any) -> None:
        nid = calls.current
        self.alive.append(out)
        self.running.pop()
        self.last = nid
        outs = _storages(out)
        self.inplace[nid] = bool(outs) and outs <= self.args[nid]
        for ptr in outs - self.inputs - self.static:
            self.producer.setdefault(ptr, nid)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        s = _storage(t)
        if s is not None and s[0] not in self.packed:
            self.packed[s[0]] = (s[1], self.running[-1] if self.running else self.last)
        return t

    def saved_bytes(self, ids: list[str]) -> dict[str, float]:
        out = dict.fromkeys(ids, 0.0)
        for ptr, (nbytes, packed_in) in self.packed.items():
            if ptr in self.static or ptr in self.inputs:
                continue
            owner = self.producer.get(ptr) or packed_in or ids[0]
            out[owner] += float(nbytes)
        return out


def _timeable(out: Any) -> bool:
    """Backward hooks see a layer's output when it is a tensor or a tuple of them: every
    tensor it returns must be one of those, or its backward would go untimed."""
    if isinstance(out, torch.Tensor):
        return True
    direct = [t for t in out if isinstance(t, torch.Tensor)] if isinstance(out, tuple) else []
    return bool(direct) and len(direct) == len(_tensors(out))


def _check_outputs(model: nn.Module, mods: dict[str, nn.Module], x: torch.Tensor, spec: str) -> None:
    """Refuse a layer whose output (a Hugging Face ``ModelOutput``, a dict, a list) hides its
    tensors from the backward hooks: its backward would be timed as zero, silently."""
    bad: list[tuple[str, str]] = []

    def post(calls: Calls, _m: nn.Module, _args: Any, out: Any) -> None:
        if not _timeable(out):
            bad.append((calls.start(), type(out).__name__))

    handles = [m.register_forward_hook(partial(post, Calls(nids))) for m, nids in calls_by_module(mods)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    if bad:
        nid, kind = bad[0]
        raise PipeplanError(f"model {spec!r}: layer {nid!r} returns a {kind}, not a tensor or a tuple of "
                            "tensors, so its backward cannot be timed; return the tensor (e.g. .logits) "
                            "from the module that makes it, or make the model's layers its blocks (nn.Sequential)")


def _parameters(model: nn.Module, mods: dict[str, nn.Module]) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Parameter bytes per node, a parameter shared by several nodes (tied weights) counted on
    the first of them, and the shared ones: parameter name -> the nodes that use it."""
    names = {id(p): n for n, p in model.named_parameters()}
    users: dict[int, list[str]] = {}
    sizes: dict[int, float] = {}
    for nid, m in mods.items():
        for p in m.parameters():
            users.setdefault(id(p), []).append(nid)
            sizes[id(p)] = _nbytes([p])
    owned = dict.fromkeys(mods, 0.0)
    for pid, nids in users.items():
        owned[nids[0]] += sizes[pid]
    return owned, {names[pid]: nids for pid, nids in users.items() if len(set(nids)) > 1}


def _memory_pass(model: nn.Module, mods: dict[str, nn.Module],
                 x: torch.Tensor) -> tuple[dict[str, float], dict[str, bool]]:
    """Saved bytes and in-place flag per node, from one forward + loss (no backward)."""
    tracker = _SavedTracker(model, x)
    handles = []
    try:
        for m, nids in calls_by_module(mods):
            calls = Calls(nids)
            handles += [m.register_forward_pre_hook(partial(tracker.pre, calls)),
                        m.register_forward_hook(partial(tracker.post, calls))]
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
            _loss(model(x))
    finally:
        for h in handles:
            h.remove()
    return tracker.saved_bytes(list(mods)), tracker.inplace


def _step(model: nn.Module, x: torch.Tensor, clock: _Clock) -> None:
    model.zero_grad(set_to_none=True)
    _loss(model(x)).backward()
    clock.sync()


def _hooked_pass(model: nn.Module, x: torch.Tensor, clock: _Clock,
                 install: Callable[[list], None]) -> None:
    """One forward+backward with hooks put in place by ``install`` (which appends handles)."""
    handles: list = []
    try:
        install(handles)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_HOOK_WARNING)
            _step(model, x, clock)
    finally:
        for h in handles:
            h.remove()


def _forward_times(model: nn.Module, mods: dict[str, nn.Module], x: torch.Tensor,
                   clock: _Clock, act: dict[str, float]) -> dict[str, float]:
    marks: dict[str, list] = {}

    def install(handles: list) -> None:
        for m, nids in calls_by_module(mods):
            calls = Calls(nids)

            def pre(_m, _args, calls=calls):
                marks[calls.start()] = [clock.mark()]

            def post(_m, _args, out, calls=calls):
                marks[calls.current].append(clock.mark())
                act[calls.current] = _nbytes(_tensors(out))
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]

    _hooked_pass(model, x, clock, install)
    return {nid: clock.between(*marks[nid]) if nid in marks else 0.0 for nid in mods}


def _backward_times(model: nn.Module, mods: dict[str, nn.Module], x: torch.Tensor,
                    clock: _Clock) -> dict[str, float]:
    start: dict[str, Any] = {}
    ends: dict[str, list] = {nid: [] for nid in mods}

    def install(handles: list) -> None:
        for m, nids in calls_by_module(mods):
            # a module's calls run backward in reverse order (autograd runs the latest first)
            arrived, done = Calls(nids[::-1]), Calls(nids[::-1])

            def pre(_m, _grad_out, calls=arrived):
                start[calls.start()] = clock.mark()

            def post(_m, _grad_in, _grad_out, calls=done):
                ends[calls.start()].append(clock.mark())

            def accumulated(_p, nid=nids[0]):  # once, after every call's gradient is summed
                ends[nid].append(clock.mark())
            handles += [m.register_full_backward_pre_hook(pre), m.register_full_backward_hook(post)]
            handles += [p.register_post_accumulate_grad_hook(accumulated)
                        for p in m.parameters() if p.requires_grad]

    _hooked_pass(model, x, clock, install)
    return {nid: max((clock.between(start[nid], e) for e in ends[nid]), default=0.0)
            if nid in start else 0.0 for nid in mods}


def _loss_time(model: nn.Module, x: torch.Tensor, clock: _Clock, warmup: int, reps: int) -> float:
    """Forward and backward of the runtime's loss (squared error against a target) on the
    model's output, which no layer's time includes: the last stage computes it per microbatch."""
    with torch.no_grad():
        outs = [t for t in _tensors(model(x)) if t.is_floating_point()]
    targets = [torch.randn_like(t) for t in outs]
    times = []
    for r in range(warmup + reps):
        leaves = [t.clone().requires_grad_() for t in outs]
        clock.sync()
        start = clock.mark()
        sum(squared_error(o, y, o.shape[0]) for o, y in zip(leaves, targets)).backward()
        end = clock.mark()
        clock.sync()
        if r >= warmup:
            times.append(clock.between(start, end))
    return statistics.median(times) if times else 0.0


def _update_rate(model: nn.Module, x: torch.Tensor, clock: "_Clock", warmup: int, reps: int) -> float:
    """Seconds per parameter byte of the runtime's optimizer step (SGD with momentum)."""
    params = [p for p in model.parameters() if p.requires_grad]
    nbytes = _nbytes(params)
    if not nbytes:
        return 0.0
    _step(model, x, clock)  # gradients to apply
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1e-3, momentum=MOMENTUM)
    times = []
    for r in range(warmup + reps):
        t0 = time.perf_counter()
        opt.step()
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    with torch.no_grad():  # leave the model as it was
        for p, s in zip(params, saved):
            p.copy_(s)
    return statistics.median(times) / nbytes


def _inplace_off(model: nn.Module) -> dict[nn.Module, bool]:
    """Switch every module's ``inplace`` flag off; returns the flags as they were."""
    flags = {m: m.inplace for m in model.modules() if isinstance(getattr(m, "inplace", None), bool)}
    for m in flags:
        m.inplace = False
    return flags


@dataclass
class _Times:
    """Per node, the times of each measured repetition (full and half microbatch)."""

    fwd: dict[str, list[float]]
    bwd: dict[str, list[float]]
    fwd_half: dict[str, list[float]]
    bwd_half: dict[str, list[float]]
    total: list[float] = field(default_factory=list)
    act: dict[str, float] = field(default_factory=dict)


def _time_layers(model: nn.Module, mods: dict[str, nn.Module], x: torch.Tensor, half: torch.Tensor,
                 clock: _Clock, warmup: int, reps: int) -> _Times:
    ids = list(mods)
    t = _Times(*({nid: [] for nid in ids} for _ in range(4)))
    for r in range(warmup + reps):
        if x.shape[0] >= 2:  # half a microbatch: what a 2-way split replica runs
            fh = _forward_times(model, mods, half, clock, {})
            bh = _backward_times(model, mods, half, clock)
            if r >= warmup:
                for nid in ids:
                    t.fwd_half[nid].append(fh[nid])
                    t.bwd_half[nid].append(bh[nid])
        f = _forward_times(model, mods, x, clock, t.act)
        b = _backward_times(model, mods, x, clock)
        t0 = time.perf_counter()
        _step(model, x, clock)
        total = time.perf_counter() - t0
        if r >= warmup:
            t.total.append(total)
            for nid in ids:
                t.fwd[nid].append(f[nid])
                t.bwd[nid].append(b[nid])
    return t


def _fixed_parts(t: _Times, phi: float) -> dict[str, list[float]]:
    """Time of a share phi of the microbatch: fixed + phi x (t - fixed), fitted from the full
    and the half microbatch (weights read once per call do not shrink with the batch)."""
    med = statistics.median
    fixed = {}
    for nid in t.fwd:
        pair = []
        for full_t, half_t in ((med(t.fwd[nid]), med(t.fwd_half[nid])), (med(t.bwd[nid]), med(t.bwd_half[nid]))):
            c = (half_t - phi * full_t) / (1 - phi)
            pair.append(min(max(c, 0.0), full_t))
        fixed[nid] = pair
    return fixed


def profile_model(spec: str, microbatch: int | None = None, device: str = "cpu", warmup: int = 3,
                  reps: int = 10, threads: int = 1) -> Graph:
    """Measure ``spec`` (see :func:`pipeplan.runtime.models.load_model`) layer by layer."""
    if reps < 1 or warmup < 0 or threads < 1:
        raise PipeplanError(f"profile: need reps >= 1, warmup >= 0, threads >= 1 "
                            f"(got {reps}, {warmup}, {threads})")
    dev = _device(device)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, x = load_model(spec, microbatch, seed=0)
        torch.manual_seed(0)
        # the model's own code runs from here on: whatever it raises (an in-place op that full
        # backward hooks reject, sys.exit) is one line
        with user_code(spec, "profiling"):
            model, x = model.to(dev).train(), x.to(dev)
            flags = _inplace_off(model)
            ids, edges = layer_graph(model)
            mods = {nid: model.get_submodule(module_name(nid)) for nid in ids}
            clock = _Clock(dev)
            half = x[: max(1, x.shape[0] // 2)]
            _check_outputs(model, mods, x, spec)
            times = _time_layers(model, mods, x, half, clock, warmup, reps)
            split = measure_split(model, mods, x, clock, warmup, reps)
            update_rate = _update_rate(model, x, clock, warmup, reps)
            loss_s = _loss_time(model, x, clock, warmup, reps)
            model.zero_grad(set_to_none=True)
            for m, flag in flags.items():
                m.inplace = flag
            saved, inplace = _memory_pass(model, mods, x.clone())
    finally:
        torch.set_num_threads(old_threads)
    med = statistics.median
    params, tied = _parameters(model, mods)
    nodes = [NodeSpec(id=nid, fwd=med(times.fwd[nid]), bwd=med(times.bwd[nid]) + (loss_s if nid == ids[-1] else 0.0),
                      params=params[nid], act=times.act.get(nid, 0.0),
                      desc=_describe(mods[nid]), inplace=inplace.get(nid, False), saved=saved[nid])
             for nid in ids]
    spread = {nid: [min(a + b for a, b in zip(times.fwd[nid], times.bwd[nid])),
                    max(a + b for a, b in zip(times.fwd[nid], times.bwd[nid]))] for nid in ids}
    fixed = _fixed_parts(times, half.shape[0] / x.shape[0]) if x.shape[0] >= 2 else {}
    meta = {"source": "pipeplan profile", "spec": spec, "device": str(dev), "threads": threads,
            "fixed_s": fixed, "update_s_per_byte": update_rate, "loss_s": loss_s,
            "microbatch": int(x.shape[0]), "input": input_signature(x), "torch": torch.__version__, "warmup": warmup, "reps": reps,
            "total_s": med(times.total), "spread": spread, "backward_split_s": split,
            "backward_input_fraction": input_fraction(split, {nid: med(times.bwd[nid]) for nid in ids}, loss_s),
            "backward_split_cost": split_cost(split),
            "reference": f"this machine, one process, {threads} thread{'s' if threads > 1 else ''}"}
    return Graph.from_nodes(spec.rsplit(":", 1)[-1], nodes, edges, meta=meta, tied=tied)
