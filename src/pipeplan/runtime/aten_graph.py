"""Operator-level graphs of PyTorch models through ``torch.export`` (``pipeplan export``).

``torch.export.export(model, (x,))`` then ``run_decompositions()`` (core ATen) gives an FX
graph of ATen ops; every op that computes something becomes one graph node, its costs a
roofline on the zoo's reference device (docs/aten_graph.md has the rules):

* node id ``"<module path>/<aten node name>"``: the innermost module of
  ``node.meta["nn_module_stack"]`` (``"model"`` for ops of the root module's own forward);
* pure views (``view``, ``permute``, ``expand``, ``slice``, ... any op whose schema says its
  output aliases its input, plus ``_unsafe_view``) and the ``getitem`` of multi-output ops are
  folded: a consumer reads the view's source, which is where its edge comes from;
* ``act`` the bytes of the outputs that something uses, ``params`` the bytes of the
  parameters the op reads (through views), each counted once on its first user; buffers are
  model state without gradients and are not counted (``meta["buffer_bytes"]``);
* ``fwd`` = max(FLOPs / (peak x efficiency of the op kind), bytes read+written / (memory
  bandwidth x memory efficiency)); ``bwd`` by the op's kind and which inputs need gradients.

``--measured profile.json`` (a ``pipeplan profile`` graph of the same model and microbatch)
shares each profiled layer's measured forward/backward out over the ops inside it in
proportion to their roofline times (:func:`apply_measured`).

The model is built on the ``meta`` device where its constructor allows (no weights are
allocated, ``meta["materialized"]`` false), else for real.
"""

from __future__ import annotations

import importlib
import operator
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import fx, nn

from ..errors import PipeplanError
from ..graph.model import Graph, NodeSpec
from ..graph.zoo import EFFICIENCY, REFERENCE_DEVICE, REFERENCE_MEM_GBPS, REFERENCE_TFLOPS
from .torch_export import op_name, quiet_export
from .models import failure_reason, load_model

_PEAK = REFERENCE_TFLOPS * 1e12
_MEM_BW = REFERENCE_MEM_GBPS * 1e9 * EFFICIENCY["memory"]
ROOT = "model"

MATMUL = {"mm", "addmm", "bmm", "baddbmm"}
CONV = {"convolution"}
ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "scaled_dot_product_attention"}
GATHER = {"embedding", "index_select", "gather", "index"}  # read only the rows they return
NOT_VIEWS = {"clone", "contiguous", "_to_copy", "lift_fresh_copy"}
#: Read their input's shape only, and pass no gradient back to it.
SHAPE_ONLY = {"full_like", "zeros_like", "ones_like", "empty_like", "rand_like", "randn_like",
              "randint_like", "bernoulli"}
EXTRA_VIEWS = {"_unsafe_view"}


def _full_name(node: fx.Node) -> str:
    t = node.target
    ns = getattr(t, "namespace", None)
    return f"{ns}.{op_name(node)}" if ns else op_name(node)


def _is_view(node: fx.Node) -> bool:
    """A pure view or metadata op: its output shares its input's storage."""
    name = op_name(node)
    if name in NOT_VIEWS:
        return False
    return name in EXTRA_VIEWS or bool(getattr(node.target, "is_view", False))


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _nbytes(val: Any) -> float:
    return float(sum(int(t.numel()) * t.element_size() for t in _tensors(val)))


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    """The FX nodes among the op's arguments (nested lists included), in order, once each."""
    out: dict[fx.Node, None] = {}

    def add(a: fx.Node) -> fx.Node:
        out[a] = None
        return a
    fx.node.map_arg((node.args, node.kwargs), add)
    return list(out)


def module_path(node: fx.Node) -> str:
    """The qualified name of the innermost module that ran ``node`` (``"model"``: the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    for value in reversed(list(stack.values())):
        path = value[0] if isinstance(value, (tuple, list)) else str(value)
        if path.startswith("L['self']"):
            path = path[len("L['self']"):].lstrip(".")
        if path:
            return path
    return ROOT


@dataclass
class _Op:
    """One graph node under construction."""

    node: fx.Node
    id: str
    reads: list[fx.Node]  # the roots of its arguments: compute ops, placeholders (once each)
    args: list[fx.Node]   # its tensor arguments as written (views included)
    used: set[int] = field(default_factory=set)  # indices of a multi-output op's outputs in use


class _Walker:
    """Fold views and getitems into their sources; collect the compute ops in graph order."""

    def __init__(self, ep: "torch.export.ExportedProgram") -> None:
        sig = ep.graph_signature
        self.param_names: dict[str, str] = dict(sig.inputs_to_parameters)
        self.buffer_names: dict[str, str] = dict(sig.inputs_to_buffers)
        self.user_outputs = set(sig.user_outputs)
        self.root: dict[fx.Node, fx.Node] = {}
        self.ops: dict[fx.Node, _Op] = {}
        for node in ep.graph.nodes:
            self._visit(node)
        self.dropped = self._drop_state_updates(ep.graph)

    def _drop_state_updates(self, graph: fx.Graph) -> int:
        """Remove the ops that no user output depends on (buffer bookkeeping such as
        BatchNorm's ``num_batches_tracked += 1``); returns how many."""
        todo = [self.root.get(n, n) for n in graph.nodes if n.name in self.user_outputs]
        live: set[fx.Node] = set()
        while todo:
            n = todo.pop()
            if n in self.ops and n not in live:
                live.add(n)
                todo += self.ops[n].reads
        dead = [n for n in self.ops if n not in live]
        for n in dead:
            del self.ops[n]
        return len(dead)

    def _visit(self, node: fx.Node) -> None:
        if node.op in ("placeholder", "get_attr"):
            self.root[node] = node
        elif node.op != "call_function":
            return
        elif node.target is operator.getitem:
            src = node.args[0]
            self.root[node] = self.root.get(src, src)
            if src in self.ops and (node.name in self.user_outputs
                                    or any(u.op != "output" for u in node.users)):
                self.ops[src].used.add(int(node.args[1]))  # not only a buffer's new value
        elif _is_view(node):
            src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node
            self.root[node] = self.root.get(src, src)
        elif _tensors(node.meta.get("val")):
            args = [a for a in _arg_nodes(node) if a in self.root]
            reads = list(dict.fromkeys(self.root[a] for a in args))
            op = _Op(node, f"{module_path(node)}/{node.name}", reads, args)
            self.ops[node] = op
            self.root[node] = node

    def is_param(self, n: fx.Node) -> bool:
        return n.op == "placeholder" and n.name in self.param_names


# -- costs ------------------------------------------------------------------------------------
def _flops(node: fx.Node) -> tuple[float, str]:
    """Forward FLOPs (a multiply-add is 2) and the efficiency kind of the op."""
    name, out = op_name(node), _tensors(node.meta.get("val"))
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args]
    if name in MATMUL and out:
        a = vals[1] if name in ("addmm", "baddbmm") else vals[0]
        return 2.0 * out[0].numel() * a.shape[-1], "matmul"
    if name in CONV and out:
        x, w = vals[0], vals[1]
        transposed = bool(node.args[6]) if len(node.args) > 6 else False
        per = 1
        for s in w.shape[1:]:
            per *= int(s)
        return 2.0 * (x.numel() if transposed else out[0].numel()) * per, "conv"
    if name in ATTENTION and len(vals) >= 3:
        q, k, v = vals[:3]
        rows = q.numel() // q.shape[-1]
        return 2.0 * rows * k.shape[-2] * (q.shape[-1] + v.shape[-1]), "matmul"
    return 0.0, "memory"


def _bytes_moved(node: fx.Node, args: list[fx.Node], root: dict[fx.Node, fx.Node]) -> float:
    """Bytes read (each argument: its view's size, at most its source's) + bytes written."""
    out = _nbytes(node.meta.get("val"))
    if op_name(node) in SHAPE_ONLY:
        return out
    read = 0.0
    for i, a in enumerate(args):
        own = _nbytes(a.meta.get("val"))
        src = root.get(a, a)
        nbytes = min(own, _nbytes(src.meta.get("val"))) if src is not a else own
        if i == 0 and op_name(node) in GATHER:
            nbytes = min(nbytes, out)
        read += nbytes
    return read + out


def _needs_grad(val: Any) -> bool:
    return any(t.is_floating_point() or t.is_complex() for t in _tensors(val))


@dataclass
class _Cost:
    fwd: float
    bwd: float
    flops: float


def _cost(op: _Op, w: _Walker, grad: dict[fx.Node, bool]) -> _Cost:
    """Roofline forward time and the backward rule (docs/aten_graph.md)."""
    node = op.node
    flops, kind = _flops(node)
    moved = _bytes_moved(node, op.args, w.root)
    fwd = max(flops / (_PEAK * EFFICIENCY[kind]), moved / _MEM_BW)

    def needs(a: Any) -> bool:
        return isinstance(a, fx.Node) and grad.get(w.root.get(a, a), False)

    name = op_name(node)
    if not grad.get(node, False):  # no gradient flows through it (none in, or an integer result)
        return _Cost(fwd, 0.0, flops)
    if kind in ("matmul", "conv"):  # one gradient per operand that needs one (input, weight)
        operands = node.args[1:3] if name in ("addmm", "baddbmm") else node.args[:2]
        count = sum(map(needs, operands))
        if name in ATTENTION:
            count = 2 * any(map(needs, node.args[:3]))
        return _Cost(fwd, max(count, 1) * fwd, flops)
    if name == "embedding":  # scatter-add of the output gradient into a dense table gradient
        table = _nbytes(node.args[0].meta.get("val"))
        bwd = (2 * _nbytes(node.meta.get("val")) + table) / _MEM_BW if needs(node.args[0]) else 0.0
        return _Cost(fwd, bwd, flops)
    has_weight = any(w.is_param(r) for r in op.reads)
    return _Cost(fwd, (2.0 if has_weight else 1.0) * fwd, flops)


def _grad_flags(w: _Walker) -> dict[fx.Node, bool]:
    """Which values carry a gradient: trainable parameters and floating outputs of ops that
    read one (frozen parameters, buffers and the input do not)."""
    grad: dict[fx.Node, bool] = {}
    for node in w.root:
        if node.op == "placeholder":
            val = node.meta.get("val")
            grad[node] = w.is_param(node) and bool(getattr(val, "requires_grad", True))
    for node, op in w.ops.items():
        grad[node] = (op_name(node) not in SHAPE_ONLY and _needs_grad(node.meta.get("val"))
                      and any(grad.get(r, False) for r in op.reads))
    return grad


def _act(op: _Op) -> float:
    """Bytes of the outputs in use: the output of a one-output op, else those read by getitems."""
    val = op.node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return _nbytes(val)
    return float(sum(_nbytes(val[i]) for i in op.used if i < len(val)))


def _desc(node: fx.Node) -> str:
    shapes = []
    for t in _tensors(node.meta.get("val")):
        s = str(list(t.shape))
        shapes.append(s if t.dtype == torch.float32 else f"{s} {str(t.dtype).replace('torch.', '')}")
    return f"{_full_name(node)} {', '.join(shapes)}"


# -- the graph --------------------------------------------------------------------------------
def graph_from_program(ep: "torch.export.ExportedProgram", name: str,
                       meta: dict | None = None) -> Graph:
    """One node per computing op of an exported (decomposed) program; edges follow the data."""
    w = _Walker(ep)
    if not w.ops:
        raise PipeplanError(f"model {name!r}: the exported program computes nothing (only views)")
    grad = _grad_flags(w)
    counted: set[fx.Node] = set()
    nodes, edges = [], []
    for node, op in w.ops.items():
        fresh = [r for r in op.reads if w.is_param(r) and r not in counted]
        counted.update(fresh)
        cost = _cost(op, w, grad)
        nodes.append(NodeSpec(id=op.id, fwd=cost.fwd, bwd=cost.bwd,
                              params=sum(_nbytes(r.meta.get("val")) for r in fresh), act=_act(op),
                              desc=_desc(node), flops=cost.flops))
        edges += [(w.ops[r].id, op.id) for r in op.reads if r in w.ops]
    read = {r for op in w.ops.values() for r in op.reads}
    info = {"state_ops_dropped": w.dropped, "buffer_bytes": sum(_nbytes(r.meta.get("val")) for r in read
                                if r.op == "placeholder" and r.name in w.buffer_names),
            "views": "folded into their consumers (docs/aten_graph.md)",
            "ops": {"matmul": sum(op_name(n) in MATMUL | ATTENTION for n in w.ops),
                    "conv": sum(op_name(n) in CONV for n in w.ops)}}
    return Graph.from_nodes(name, nodes, edges, meta={**info, **(meta or {})})


def _import_factory(spec: str) -> None:
    """Import a ``package.module:factory`` spec's module outside the meta device, so that
    tensors made when it is imported are real (load_model reports a failed import)."""
    mod_name, sep, _ = spec.partition(":")
    if sep and mod_name not in ("example", "hf"):
        try:
            importlib.import_module(mod_name)
        except (Exception, SystemExit):  # noqa: BLE001 (load_model reports it)
            pass


def _build(spec: str, microbatch: int | None,
           on_meta: bool) -> tuple[nn.Module, torch.Tensor, "torch.export.ExportedProgram"]:
    """Build ``spec`` (on the meta device when ``on_meta``) and export it in training mode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if on_meta:
            _import_factory(spec)
            with torch.device("meta"):
                model, x = load_model(spec, microbatch)
        else:
            model, x = load_model(spec, microbatch)
    try:
        return model, x, quiet_export(model.train(), (x,))
    except (Exception, SystemExit) as e:  # torch.export's many error types, the model's sys.exit: one line
        raise PipeplanError(f"model {spec!r}: torch.export failed ({failure_reason(e)[:300]})") from None


def export_program(spec: str, microbatch: int | None = None,
                   meta_device: bool = True) -> tuple[nn.Module, torch.Tensor, Any, bool]:
    """(model, example input, decomposed ExportedProgram, materialized) of ``spec``: on the
    meta device first (no weights allocated) where ``meta_device``; for real if that fails."""
    if meta_device:
        try:
            return (*_build(spec, microbatch, on_meta=True), False)
        except Exception:  # a constructor or factory that needs real tensors: build it for real
            pass
    return (*_build(spec, microbatch, on_meta=False), True)


def _param_bytes(model: nn.Module) -> float:
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


def export_graph(spec: str, microbatch: int | None = None, measured: str | Path | None = None,
                 meta_device: bool = True) -> Graph:
    """The ATen-op graph of ``spec`` (see :func:`pipeplan.runtime.models.load_model`), times
    on the reference device, or scaled to a profile's measured layer times (``measured``)."""
    profile = load_measured(measured, spec) if measured is not None else None
    model, x, ep, materialized = export_program(spec, microbatch, meta_device)
    micro = int(x.shape[0])
    if profile is not None:
        _check_microbatch(profile, micro, measured)
    meta = {"source": "torch.export", "granularity": "op", "spec": spec, "microbatch": micro,
            "reference_device": REFERENCE_DEVICE, "reference_tflops": REFERENCE_TFLOPS,
            "reference_mem_gbps": REFERENCE_MEM_GBPS, "efficiency": dict(EFFICIENCY),
            "times": "roofline", "materialized": materialized, "torch": torch.__version__}
    graph = graph_from_program(ep, spec.rsplit(":", 1)[-1], meta)
    unused = _param_bytes(model) - graph.total_params
    if unused > 0:
        graph.meta["unused_param_bytes"] = unused
    return apply_measured(graph, profile, str(measured)) if profile is not None else graph


# -- measured layer times ---------------------------------------------------------------------
def load_measured(path: str | Path, spec: str) -> Graph:
    """A ``pipeplan profile`` graph JSON for ``spec``, or PipeplanError naming what is wrong."""
    from ..graph import load_graph

    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        raise PipeplanError(f"--measured {path}: expected the .json graph written by 'pipeplan profile --out'")
    try:
        profile = load_graph(str(p))
    except PipeplanError as e:
        reason = str(e).removeprefix(f"{p}: ")
        raise PipeplanError(f"--measured {path}: not a pipeplan graph ({reason})") from None
    profiled = profile.meta.get("spec")
    if profiled is not None and profiled != spec:
        raise PipeplanError(f"--measured {path}: it profiles {profiled!r}, not {spec!r}")
    return profile


def _check_microbatch(profile: Graph, micro: int, path: object) -> None:
    theirs = profile.meta.get("microbatch")
    if theirs is not None and theirs != micro:
        raise PipeplanError(f"--measured {path}: profiled with microbatch {theirs}, the export has {micro} "
                            f"(pass --microbatch {theirs})")


def _layer_of(path: str, layers: Iterable[str]) -> str | None:
    """The longest profiled layer id that is ``path`` or one of its parent modules."""
    best = None
    for lid in layers:
        if (path == lid or path.startswith(lid + ".")) and (best is None or len(lid) > len(best)):
            best = lid
    return best


def _share(values: list[float], total: float, weights: list[float]) -> list[float]:
    """``total`` shared out in proportion to ``values`` (else ``weights``, else evenly)."""
    for base in (values, weights):
        s = sum(base)
        if s > 0:
            return [total * v / s for v in base]
    return [total / len(values)] * len(values)


def apply_measured(graph: Graph, profile: Graph, source: str = "profile") -> Graph:
    """Scale the ops inside each profiled layer so that they sum to its measured times; ops
    outside every profiled layer keep their roofline times."""
    members: dict[str, list[int]] = {}
    for i, nid in enumerate(graph.ids):
        lid = _layer_of(nid.rsplit("/", 1)[0], profile.ids)
        if lid is not None:
            members.setdefault(lid, []).append(i)
    if not members:
        shown = ", ".join(repr(x) for x in profile.ids[:4]) + (", ..." if len(profile) > 4 else "")
        raise PipeplanError(f"--measured {source}: none of its {len(profile)} layers ({shown}) is a module "
                            f"of {graph.meta.get('spec', graph.name)!r}")
    fwd, bwd = graph.fwd.copy(), graph.bwd.copy()
    for lid, idx in members.items():
        j = profile.index[lid]
        new_f = _share([fwd[i] for i in idx], float(profile.fwd[j]), [1.0] * len(idx))
        new_b = _share([bwd[i] for i in idx], float(profile.bwd[j]), new_f)
        for i, f, b in zip(idx, new_f, new_b):
            fwd[i], bwd[i] = f, b
    meta = {**graph.meta, "times": "measured layers shared out over their ops by roofline; others roofline",
            "measured": {"file": source, "device": profile.meta.get("device"),
                         "matched": [lid for lid in profile.ids if lid in members],
                         "unmatched": [lid for lid in profile.ids if lid not in members],
                         "ops_scaled": sum(map(len, members.values())), "ops": len(graph)}}
    return Graph(name=graph.name, ids=list(graph.ids), fwd=fwd, bwd=bwd, params=graph.params.copy(),
                 act=graph.act.copy(), flops=graph.flops.copy(), desc=list(graph.desc),
                 edges=list(graph.edges), meta=meta, inplace=graph.inplace.copy(), saved=graph.saved.copy())
