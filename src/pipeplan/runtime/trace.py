"""The model as layers: a ``torch.fx`` trace of ``forward`` in which every submodule is a
leaf, so each module called is one node of pipeplan's graph (its id the module's FQN).
The profiler writes this graph and the executor splits the same trace into stages."""

from __future__ import annotations

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


def layer_graph(model: nn.Module) -> tuple[list[str], list[tuple[str, str]]]:
    """Node ids (module FQNs, in execution order) and data-flow edges between them; values
    computed between modules (``x + y``, ``torch.cat``) pass their dependencies through."""
    graph = trace(model)
    ids: list[str] = []
    edges: list[tuple[str, str]] = []
    producers: dict[Any, set[str]] = {}  # fx node -> the layers whose outputs flow into it
    for node in graph.nodes:
        srcs = set().union(*(producers.get(a, set()) for a in node.all_input_nodes))
        if node.op == "call_module":
            if node.target in ids:
                raise PipeplanError(f"module {node.target!r} is called more than once in forward; "
                                    "pipeplan needs each layer to run once per microbatch")
            edges += [(s, node.target) for s in ids if s in srcs]
            ids.append(node.target)
            srcs = {node.target}
        producers[node] = srcs
    if not ids:
        raise PipeplanError("the model's forward calls no submodules: nothing to split into layers")
    return ids, edges
