"""Loader for PipeDream profiles (``graph.txt``, see ../shared/profiles/README.md).

One node per line ``ID -- DESCRIPTION -- forward_compute_time=MS, backward_compute_time=MS,
activation_size=BYTES, parameter_size=BYTES``, then one tab-indented edge per line
``SRC -- DST``. Times are milliseconds for one (micro)batch as profiled; sizes are bytes.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PipeplanError
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
        try:
            attrs[key.strip()] = _number(value)
        except ValueError:
            raise PipeplanError(f"{where}: {key.strip()} is not a number ({value.strip()!r})") from None
    missing = [f for f in _FIELDS if f not in attrs]
    if missing:
        raise PipeplanError(f"{where}: missing {', '.join(missing)}")
    return attrs


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
    return Graph.from_nodes(name, nodes, edges, meta={"source": "pipedream", "input_load_s": input_load})


def load_pipedream(path: Path) -> Graph:
    name = path.parent.name if path.name == "graph.txt" else path.stem
    return parse_pipedream(path.read_text(), name=name, source=str(path))
