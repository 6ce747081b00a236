"""The tensor-level IR: pipeplan's counterpart of Auto-MAP's HLO module (auto-map.txt §2, §3.1).

``torch.export`` of a model, decomposed to core ATen ops (``run_decompositions()``), read into
plain Python: every value is a :class:`TensorInfo` (shape, and what it is: a trainable
parameter with its ``state_dict`` name, a buffer, a user input, or a value computed in the
program), every call a :class:`OpInfo` (the ATen op's name, its tensor arguments in order, its
other arguments as literals, its tensor outputs). Views, reshapes and transposes stay ops of
their own: sharding propagation needs them to follow a dimension through the model.

Auto-MAP's SourceNodes are the parameters, buffers and inputs; a trainable variable is a
parameter (``TensorInfo.kind == "param"``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from ..errors import PipeplanError
from ..runtime.torch_export import op_name, quiet_export

PARAM, BUFFER, INPUT, CONST, VALUE = "param", "buffer", "input", "const", "value"


@dataclass(frozen=True)
class TensorInfo:
    """One value of the program."""

    id: int
    name: str                 # the FX node's name (getitem outputs: ``node.name[i]``)
    shape: tuple[int, ...]
    kind: str                 # param | buffer | input | const | value
    source: str | None = None  # state_dict name of a parameter or buffer, or the input's name
    dtype: str = "float32"
    itemsize: int = 4

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class OpInfo:
    """One ATen call: ``target`` is the op's name (``addmm``, ``view``...), ``inputs`` the ids of
    its tensor arguments in the order they appear, ``args`` its positional arguments with
    tensors replaced by their input index (``("t", i)``), ``outputs`` the ids it produces."""

    id: int
    target: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    module: str = ""

    def arg(self, i: int, default: Any = None) -> Any:
        return self.args[i] if i < len(self.args) else default


@dataclass
class TensorProgram:
    """The IR of one model: tensors, ops in program order, and where each tensor is used."""

    name: str
    tensors: list[TensorInfo]
    ops: list[OpInfo]
    outputs: list[int]
    producer: dict[int, int] = field(default_factory=dict)
    users: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for op in self.ops:
            for t in op.outputs:
                self.producer[t] = op.id
            for t in dict.fromkeys(op.inputs):
                self.users.setdefault(t, []).append(op.id)

    def of_kind(self, kind: str) -> list[TensorInfo]:
        return [t for t in self.tensors if t.kind == kind]

    @property
    def params(self) -> list[TensorInfo]:
        """The trainable variables, each once (a tied parameter read under two names is one)."""
        return self.of_kind(PARAM)

    @property
    def inputs(self) -> list[TensorInfo]:
        return self.of_kind(INPUT)

    def by_source(self, source: str) -> TensorInfo:
        for t in self.tensors:
            if t.source == source:
                return t
        raise PipeplanError(f"model {self.name!r} has no parameter or input named {source!r}")


def _module(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    for value in reversed(list(stack.values())):
        path = value[0] if isinstance(value, (tuple, list)) else str(value)
        path = path[len("L['self']"):].lstrip(".") if path.startswith("L['self']") else path
        if path:
            return path
    return ""


class _Reader:
    """Walk an exported program's FX graph into tensors and ops."""

    def __init__(self, ep: "torch.export.ExportedProgram", input_names: tuple[str, ...] | None) -> None:
        sig = ep.graph_signature
        self.params, self.buffers = dict(sig.inputs_to_parameters), dict(sig.inputs_to_buffers)
        self.constants = dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
        self.user_inputs = list(sig.user_inputs)
        self.input_names = input_names
        self.tensors: list[TensorInfo] = []
        self.ops: list[OpInfo] = []
        self.ids: dict[Any, int] = {}   # fx node (or (node, i)) -> tensor id
        self.alias: dict[str, int] = {}  # state_dict name -> tensor id (tied parameters)
        self.ep = ep

    def _new(self, key: Any, name: str, val: Any, kind: str, source: str | None = None) -> int:
        if not isinstance(val, torch.Tensor):
            return -1
        if not all(isinstance(s, int) for s in val.shape):
            raise PipeplanError(f"{name}: a tensor whose shape depends on the data ({tuple(val.shape)}); "
                                "sharding needs every shape fixed by the example inputs")
        if kind == PARAM and source is not None:
            ident = id(self.ep.state_dict.get(source))
            for other, tid in self.alias.items():
                if id(self.ep.state_dict.get(other)) == ident:
                    self.ids[key] = tid
                    return tid
            self.alias[source] = len(self.tensors)
        tid = len(self.tensors)
        self.tensors.append(TensorInfo(tid, name, tuple(val.shape), kind, source,
                                       str(val.dtype).removeprefix("torch."), val.element_size()))
        self.ids[key] = tid
        return tid

    def placeholder(self, node: fx.Node) -> None:
        val = node.meta.get("val")
        if node.name in self.params:
            self._new(node, node.name, val, PARAM, self.params[node.name])
        elif node.name in self.buffers:
            self._new(node, node.name, val, BUFFER, self.buffers[node.name])
        elif node.name in self.constants:
            self._new(node, node.name, val, CONST, self.constants[node.name])
        else:
            i = self.user_inputs.index(node.name) if node.name in self.user_inputs else -1
            name = self.input_names[i] if self.input_names and 0 <= i < len(self.input_names) else node.name
            self._new(node, node.name, val, INPUT, name)

    def call(self, node: fx.Node) -> None:
        if node.target is operator.getitem:
            src, i = node.args
            key = (src, i)
            if key in self.ids:
                self.ids[node] = self.ids[key]
            return
        inputs: list[int] = []

        def lit(a: Any) -> Any:
            if isinstance(a, fx.Node):
                tid = self.ids.get(a, -1)
                if tid < 0:
                    return None
                inputs.append(tid)
                return ("t", len(inputs) - 1)
            if isinstance(a, (list, tuple)):
                return type(a)(lit(x) for x in a)
            return a
        args = tuple(lit(a) for a in node.args)
        kwargs = {k: lit(v) for k, v in node.kwargs.items()}
        val = node.meta.get("val")
        outs: list[int] = []
        if isinstance(val, torch.Tensor):
            outs.append(self._new(node, node.name, val, VALUE))
        elif isinstance(val, (list, tuple)):
            for i, v in enumerate(val):
                tid = self._new((node, i), f"{node.name}[{i}]", v, VALUE)
                if tid >= 0:
                    outs.append(tid)
        if not outs:
            return  # asserts, prints: nothing computed
        self.ops.append(OpInfo(len(self.ops), op_name(node), tuple(inputs), tuple(outs), args, kwargs,
                               _module(node)))

    def read(self, name: str) -> TensorProgram:
        outputs: list[int] = []
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                flat: list[fx.Node] = []
                fx.node.map_arg(node.args[0], lambda n: flat.append(n) or n)
                outputs = [self.ids[a] for a in flat if a in self.ids]
        return TensorProgram(name, self.tensors, self.ops, outputs)


def program_from_export(ep: "torch.export.ExportedProgram", name: str,
                        input_names: tuple[str, ...] | None = None) -> TensorProgram:
    """The IR of an exported, decomposed program."""
    return _Reader(ep, input_names).read(name)


def export_module(module: nn.Module, inputs: tuple[torch.Tensor, ...], name: str,
                  input_names: tuple[str, ...] | None = None) -> TensorProgram:
    """The IR of ``module(*inputs)`` in training mode; an export failure is a one-line
    :class:`PipeplanError`."""
    try:
        ep = quiet_export(module.train(), inputs)
    except Exception as e:  # torch.export's many error types
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipeplanError(f"model {name!r}: torch.export failed ({type(e).__name__}: {reason[:300]})") from None
    try:
        return program_from_export(ep, name, input_names)
    except PipeplanError as e:
        raise PipeplanError(f"model {name!r}: {e}") from None
