"""Loader for PipeDream profiles (``graph.txt``, see ../shared/profiles/README.md).

One node per line ``ID -- DESCRIPTION -- forward_compute_time=MS, backward_compute_time=MS,
activation_size=BYTES, parameter_size=BYTES``, then one tab-indented edge per line
``SRC -- DST``. Times are milliseconds for one (micro)batch as profiled; sizes are bytes.

The profiles give each node's output size, not what autograd keeps for backward. The layer
type in the description (PyTorch's module repr) tells that (docs/memory.md, measured with
``torch.autograd.graph.saved_tensors_hooks``): :func:`memory_of_layers` sets ``inplace`` and
``saved`` per node.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from ..errors import PipeplanError
from ..readers import read_text
from .model import Graph, NodeSpec

_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def _number(value: str) -> float:
    """A number, or a bracketed list ``[a; b; c]`` (a node with several outputs): its sum."""
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        return sum(float(v) for v in value[1:-1].split(";") if v.strip())
    return float(value)


def _parse_attrs(text: str, where: str) -> dict[str, float]:
    attrs: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise PipeplanError(f"{where}: expected key=value, got {item.strip()!r}")
        if key.strip() in attrs:
            raise PipeplanError(f"{where}: {key.strip()} is given twice")
        try:
            attrs[key.strip()] = _number(value)
        except ValueError:
            raise PipeplanError(f"{where}: {key.strip()} is not a number ({value.strip()!r})") from None
    missing = [f for f in _FIELDS if f not in attrs]
    if missing:
        raise PipeplanError(f"{where}: missing {', '.join(missing)}")
    return attrs


#: Layer kinds (the class name less a "1d"/"2d"/"3d"/"Nd" suffix) by what autograd saves.
SAVES_INPUT = frozenset({"Conv", "ConvTranspose", "Linear", "Bilinear", "BatchNorm", "LayerNorm",
                         "GroupNorm", "InstanceNorm", "MaxPool", "AdaptiveMaxPool", "AvgPool",
                         "GELU", "Softplus", "LeakyReLU", "ELU", "CELU", "SELU", "ReLU6",
                         "Hardtanh", "Hardsigmoid", "Hardswish", "SiLU", "Mish", "Threshold",
                         "RReLU", "Embedding"})
SAVES_OUTPUT = frozenset({"ReLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax"})
SAVES_NEITHER = frozenset({"Input", "Dropout", "Add", "Concat", "Size", "AdaptiveAvgPool",
                           "Identity", "View", "Flatten", "Reshape", "__getitem__"})
#: Kinds whose output is a view of (or an element of) their input.
VIEWS = frozenset({"View", "Flatten", "Reshape", "__getitem__"})
#: In-place kinds that save a copy of their input (autograd clones it: their backward needs
#: the input the op overwrites); in-place ReLU/LeakyReLU/ELU/CELU/SELU save their result.
INPLACE_CLONES = frozenset({"ReLU6", "Hardtanh", "Hardsigmoid", "Hardswish", "SiLU", "Mish",
                            "Threshold"})
#: Bytes kept beside the output, per output byte (fp32 outputs, CUDA kernels as profiled):
#: max-pooling's int64 indices; dropout's 1-byte mask (its in-place form keeps a float noise).
EXTRA = {"MaxPool": 2.0, "AdaptiveMaxPool": 2.0, "Dropout": 0.25}
_INPLACE = re.compile(r"\binplace\s*(=\s*True\s*)?[,)]")


def layer_kind(desc: str) -> str:
    """``"MaxPool2d(kernel_size=2, ...)"`` -> ``"MaxPool"``; ``"Input0"`` -> ``"Input"``."""
    head = desc.split("(", 1)[0].strip()
    return "Input" if head.startswith("Input") else re.sub(r"(\dd|Nd)$", "", head)


def is_aliasing(desc: str) -> bool:
    """The layer's output aliases its input: an in-place module (``inplace=True`` or the older
    repr ``(inplace)`` among its own arguments) or a view; composite modules are not."""
    kind = layer_kind(desc)
    args = desc[len(desc.split("(", 1)[0]):]
    if "):" in args:  # a composite module's repr lists its children
        return False
    return kind in VIEWS or bool(_INPLACE.search(args))


def _keeps_input(j: int, kinds: list[str], alias: list[bool], succ: list[list[int]]) -> bool:
    """Does node j (or, through the views and in-place ops that follow it, a later node) keep
    the tensor it reads? A node of unknown kind is assumed to; a sink's loss keeps its output."""
    k = kinds[j]
    if k in SAVES_INPUT or (k not in SAVES_OUTPUT and k not in SAVES_NEITHER):
        return not (alias[j] and k in INPLACE_CLONES) or any(
            _keeps_input(v, kinds, alias, succ) for v in succ[j])
    if alias[j]:
        return k in SAVES_OUTPUT or not succ[j] or any(_keeps_input(v, kinds, alias, succ) for v in succ[j])
    return False


def memory_of_layers(desc: list[str], act: list[float], succ: list[list[int]]) -> tuple[list[bool], list[float]]:
    """Per node: aliasing flag and bytes saved for backward that the node allocated (its
    output if anything keeps it, plus what its kind keeps beside it); unknown kinds: ``act``."""
    kinds = [layer_kind(d) for d in desc]
    alias = [is_aliasing(d) for d in desc]
    saved = []
    for i, k in enumerate(kinds):
        known = k in SAVES_INPUT or k in SAVES_OUTPUT or k in SAVES_NEITHER
        if not known:
            saved.append(0.0 if alias[i] else act[i])
            continue
        kept = not alias[i] and (k in SAVES_OUTPUT or not succ[i]
                                 or any(_keeps_input(j, kinds, alias, succ) for j in succ[i]))
        extra = 1.0 if alias[i] and k in (INPLACE_CLONES | {"Dropout"}) else EXTRA.get(k, 0.0)
        saved.append((act[i] if kept else 0.0) + extra * act[i])
    return alias, saved


def parse_pipedream(text: str, name: str, source: str = "graph.txt") -> Graph:
    """Parse the text of a PipeDream ``graph.txt``. Nodes keep the file's order, as PipeDream's
    own tools read them (its optimizer starts from the first source in that order)."""
    nodes: list[NodeSpec] = []
    edges: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{source}:{lineno}"
        if not raw.strip():
            continue
        if raw[0] in " \t":
            parts = [p.strip() for p in raw.strip().split(" -- ")]
            if len(parts) != 2 or not all(parts):
                raise PipeplanError(f"{where}: malformed edge line {raw.strip()!r} (expected 'SRC -- DST')")
            edges.append((parts[0], parts[1]))
            continue
        parts = raw.split(" -- ")
        if len(parts) < 3:
            raise PipeplanError(f"{where}: malformed node line (expected 'ID -- DESCRIPTION -- key=value, ...')")
        attrs = _parse_attrs(parts[-1], where)
        node_id = parts[0].strip()
        values = [attrs[f] for f in _FIELDS]
        if any(not (v >= 0) or v == float("inf") for v in values):
            raise PipeplanError(f"{where}: node {node_id!r} has a negative or non-finite value")
        nodes.append(NodeSpec(id=node_id, desc=" -- ".join(parts[1:-1]).strip(),
                              fwd=values[0] * 1e-3, bwd=values[1] * 1e-3,
                              act=values[2], params=values[3]))
    if not nodes:
        raise PipeplanError(f"{source}: no nodes found")
    # An Input source's time is data loading, which runs in data-loader workers beside the
    # device (PipeDream's optimizer zeroes it too); keep the measured figure in ``meta``.
    sources = {nd.id for nd in nodes} - {b for _, b in edges}
    input_load = {nd.id: nd.fwd + nd.bwd for nd in nodes if nd.id in sources and nd.desc.startswith("Input")}
    nodes = [NodeSpec(nd.id, 0.0, 0.0, nd.params, nd.act, nd.desc, nd.flops) if nd.id in input_load else nd
             for nd in nodes]
    g = Graph.from_nodes(name, nodes, edges, meta={"source": "pipedream", "input_load_s": input_load})
    _check_connected(g, source)
    inplace, saved = memory_of_layers(g.desc, g.act.tolist(), g.succ)
    return dataclasses.replace(g, inplace=np.array(inplace, dtype=bool), saved=np.array(saved))


def _check_connected(g: Graph, source: str) -> None:
    """A profile is one model: its nodes connected (edges taken both ways). A file cut short
    (nodes without their edges, edges missing at the end) leaves nodes connected to nothing
    or to a part of the model only; planning on what survived would be silently wrong."""
    component = list(range(len(g)))

    def root(i: int) -> int:
        while component[i] != i:
            component[i] = component[component[i]]
            i = component[i]
        return i

    for u, v in g.edges:
        component[root(u)] = root(v)
    roots = {root(i) for i in range(len(g))}
    if len(roots) > 1:
        alone = next(g.ids[i] for i in range(len(g)) if root(i) != root(0))
        raise PipeplanError(f"{source}: the graph falls apart into {len(roots)} pieces (node {alone!r} is not "
                            f"connected to node {g.ids[0]!r}); is the file cut short?")


def load_pipedream(path: Path) -> Graph:
    name = path.parent.name if path.name == "graph.txt" else path.stem
    return parse_pipedream(read_text(path, "model"), name=name, source=str(path))
