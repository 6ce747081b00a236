"""pipeplan's native graph JSON (``"format": "pipeplan.graph/1"``); load(save(g)) == g.

Schema::

    {"format": "pipeplan.graph/1", "name": "mlp", "meta": {...},
     "nodes": [{"id": "l0", "fwd_s": 0.001, "bwd_s": 0.002, "params_bytes": 4096,
                "act_bytes": 65536, "desc": "Linear(32, 32)", "flops": 2048}, ...],
     "edges": [["l0", "l1"], ...]}

``desc``, ``flops`` and ``meta`` are optional; times are seconds for one microbatch on the
reference device, sizes are bytes. Optional per node (docs/memory.md): ``"inplace": true``
(the output aliases the input), written only when true, and ``"saved_bytes"`` (bytes kept
for backward), written only when it differs from the default (``act_bytes``, 0 if in-place).
Optional at the top: ``"tied": {"lm_head.weight": ["embed", "lm_head"]}``, parameters shared by
several nodes (their bytes counted on the first; every plan keeps a group in one stage).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import PipeplanError
from ..limits import check_layer_value
from ..readers import check_keys, load_json, name_field
from .model import Graph, NodeSpec, default_saved
from .scale import profiled_microbatch

FORMAT = "pipeplan.graph/1"


def graph_to_dict(g: Graph) -> dict:
    nodes = []
    default = default_saved(g.act, g.inplace)
    for i, nid in enumerate(g.ids):
        node = {"id": nid, "fwd_s": float(g.fwd[i]), "bwd_s": float(g.bwd[i]),
                "params_bytes": float(g.params[i]), "act_bytes": float(g.act[i])}
        if g.desc[i]:
            node["desc"] = g.desc[i]
        if not math.isnan(g.flops[i]):
            node["flops"] = float(g.flops[i])
        if g.inplace[i]:
            node["inplace"] = True
        if g.saved[i] != default[i]:
            node["saved_bytes"] = float(g.saved[i])
        nodes.append(node)
    out = {"format": FORMAT, "name": g.name, "meta": g.meta, "nodes": nodes,
           "edges": [[g.ids[u], g.ids[v]] for u, v in g.edges]}
    if g.tied:
        out["tied"] = {name: list(ids) for name, ids in g.tied.items()}
    return out


_TOP_KEYS = {"format", "name", "meta", "nodes", "edges", "tied"}
#: Each node's numeric keys and their units (limits.LAYER_RANGES).
_UNITS = {"fwd_s": "s", "bwd_s": "s", "params_bytes": "bytes", "act_bytes": "bytes", "saved_bytes": "bytes",
          "flops": "FLOPs"}
_NODE_KEYS = {"id", "desc", "inplace", *_UNITS}


def _numbers(nd: dict, where: str):
    """``num(key[, default])``: the node's number under ``key`` (JSON numbers only: true is
    not 1 s; within ``limits.LAYER_RANGES``), or its default when absent or null."""
    missing = object()

    def num(key: str, default: object = missing) -> float:
        v = nd.get(key)
        if v is None:
            if default is missing:
                raise PipeplanError(f"{where}: missing {key!r}")
            return float(default)  # type: ignore[arg-type]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PipeplanError(f"{where}: {key!r} must be a number, got {v!r}")
        if isinstance(v, int) and v.bit_length() > 64:
            raise PipeplanError(f"{where}: {key!r}: an integer of {v.bit_length()} bits is out of range")
        return check_layer_value(float(v), _UNITS[key], f"{where}: {key!r}")
    return num


def graph_from_dict(d: object, source: str = "graph") -> Graph:
    if not isinstance(d, dict):
        raise PipeplanError(f"{source}: a graph must be a JSON object")
    if d.get("format") != FORMAT:
        raise PipeplanError(f"{source}: expected \"format\": \"{FORMAT}\", got {d.get('format')!r}")
    check_keys(d, _TOP_KEYS, source)
    nodes_in = d.get("nodes")
    if not isinstance(nodes_in, list):
        raise PipeplanError(f"{source}: 'nodes' must be a list")
    nodes = []
    for k, nd in enumerate(nodes_in):
        where = f"{source}: nodes[{k}]"
        if not isinstance(nd, dict) or "id" not in nd:
            raise PipeplanError(f"{where}: each node needs an 'id'")
        check_keys(nd, _NODE_KEYS, where)
        inplace = nd.get("inplace", False)
        if not isinstance(inplace, bool):
            raise PipeplanError(f"{where} ({nd.get('id')!r}): 'inplace' must be true or false, got {inplace!r}")
        num = _numbers(nd, f"{where} ({nd.get('id')!r})")
        nodes.append(NodeSpec(id=name_field(nd, "id", "", where), fwd=num("fwd_s"), bwd=num("bwd_s"),
                              params=num("params_bytes", 0.0), act=num("act_bytes", 0.0),
                              desc=str(nd.get("desc", "")), flops=num("flops", float("nan")), inplace=inplace,
                              saved=None if nd.get("saved_bytes") is None else num("saved_bytes")))
    edges = d.get("edges", [])
    if not isinstance(edges, list) or any(not isinstance(e, (list, tuple)) or len(e) != 2 for e in edges):
        raise PipeplanError(f"{source}: 'edges' must be a list of [src, dst] pairs")
    meta = d.get("meta") or {}
    if not isinstance(meta, dict):
        raise PipeplanError(f"{source}: 'meta' must be an object")
    tied = d.get("tied") or {}
    if not isinstance(tied, dict):
        raise PipeplanError(f"{source}: 'tied' must be an object: parameter name -> [node ids using it]")
    graph = Graph.from_nodes(name_field(d, "name", "model", source), nodes, [(str(a), str(b)) for a, b in edges],
                             meta=meta, tied=tied)
    if meta.get("microbatch") is not None:
        profiled_microbatch(graph)  # a positive integer, or one line
    if "decoder" in meta:
        from ..llm.spec import decoder_of

        decoder_of(meta, source)  # the dimensions a decoder LLM's costs follow from, or one line
    return graph


def save_graph(g: Graph, path: str | Path) -> None:
    Path(path).write_text(json.dumps(graph_to_dict(g), indent=1) + "\n")


def load_native(path: Path) -> Graph:
    return graph_from_dict(load_json(path, "model"), source=str(path))
