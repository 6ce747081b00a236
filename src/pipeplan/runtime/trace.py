"""The model as layers: a ``torch.fx`` trace of ``forward`` in which every submodule is a
leaf, so each module call is one node of pipeplan's graph (its id the module's FQN, with
``#k`` for a module's k-th call). The profiler writes this graph and the executor splits the
same trace into stages."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch.fx as fx
from torch import nn

from ..errors import PipeplanError


class _Leaves(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True


def trace(model: nn.Module) -> fx.Graph:
    try:
        return _Leaves().trace(model)
    except Exception as e:  # any tracing failure: tell the user how to fix it
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipeplanError("cannot split the model into layers: wrap the layers in nn.Sequential "
                            f"or make forward traceable by torch.fx ({reason})") from None


def call_ids(graph: fx.Graph) -> dict[fx.Node, str]:
    """Each module call's node id: the module's FQN for its first call in ``forward``,
    ``FQN#k`` for its k-th (k >= 2): a module called several times (one ``nn.ReLU`` used after
    every convolution) is one layer per call."""
    count: Counter[str] = Counter()
    out: dict[fx.Node, str] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            count[node.target] += 1
            out[node] = node.target if count[node.target] == 1 else f"{node.target}#{count[node.target]}"
    return out


def module_name(node_id: str) -> str:
    """The FQN of the module a node id (:func:`call_ids`) calls."""
    return node_id.partition("#")[0]


def calls_by_module(mods: dict[str, nn.Module]) -> list[tuple[nn.Module, list[str]]]:
    """The distinct modules of ``mods`` (node id -> module), each with its calls' ids in order."""
    grouped: dict[int, tuple[nn.Module, list[str]]] = {}
    for nid, m in mods.items():
        grouped.setdefault(id(m), (m, []))[1].append(nid)
    return list(grouped.values())


class Calls:
    """Which call of one module a hook sees: ``start()`` the next call's node id (cycling, so
    a module's calls are counted afresh in every pass), ``current`` the call under way."""

    def __init__(self, nids: list[str]) -> None:
        self.nids, self.k = nids, 0
        self.current = nids[0]

    def start(self) -> str:
        self.current = self.nids[self.k % len(self.nids)]
        self.k += 1
        return self.current


def layer_graph(model: nn.Module) -> tuple[list[str], list[tuple[str, str]]]:
    """Node ids (one per module call, :func:`call_ids`, in execution order) and data-flow
    edges between them; values computed between modules (``x + y``, ``torch.cat``) pass their
    dependencies through."""
    graph = trace(model)
    names = call_ids(graph)
    ids: list[str] = []
    edges: list[tuple[str, str]] = []
    producers: dict[Any, set[str]] = {}  # fx node -> the layers whose outputs flow into it
    for node in graph.nodes:
        srcs = set().union(*(producers.get(a, set()) for a in node.all_input_nodes))
        if node.op == "call_module":
            nid = names[node]
            edges += [(s, nid) for s in ids if s in srcs]
            ids.append(nid)
            srcs = {nid}
        producers[node] = srcs
    if not ids:
        raise PipeplanError("the model's forward calls no submodules: nothing to split into layers")
    return ids, edges
