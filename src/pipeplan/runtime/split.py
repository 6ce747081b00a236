"""Split a model into the plan's stages: one ``torch.fx.GraphModule`` per stage, cut from the
trace the profiler's graph was made from (``trace.py``), so every plan on that graph can run.

Each fx node is given a stage: a layer (``call_module``, one node per call: ``trace.call_ids``)
the stage that holds it; a value computed between layers (``x + y``, ``torch.cat``, a view)
the latest stage of its inputs, so it runs as soon as they exist; a parameter or buffer read directly (``get_attr``) the stage
that uses it. A value made in a stage before s and used in s or later crosses the cut into
s: stage s receives the values crossing into it and sends those crossing out of it (a value
used two stages on is relayed stage by stage, as the simulator moves it), in trace order, as
a tuple (one value alone as itself). A stage that writes a received tensor in place (a
leaf that requires grad, which autograd forbids writing) works on a copy of it.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn

from ..errors import PipeplanError
from .trace import call_ids, trace

_VIEWS = {"view", "reshape", "flatten", "unsqueeze", "squeeze", "transpose", "permute", "__getitem__",
          "contiguous", "expand", "unflatten"}


def _writes_in_place(node: fx.Node, modules: dict[str, nn.Module], inside: set[fx.Node]) -> bool:
    """Some user of ``node`` in the stage writes it (or a view of it) in place."""
    for u in node.users:
        if u not in inside:
            continue
        if u.op == "call_module":
            m = modules[u.target]
            if getattr(m, "inplace", False):
                return True
            if isinstance(m, (nn.Flatten, nn.Unflatten, nn.Identity)) and _writes_in_place(u, modules, inside):
                return True
        elif u.op in ("call_method", "call_function"):
            name = u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")
            if u.kwargs.get("inplace") or (name.endswith("_") and not name.startswith("_")):
                return True
            if name in _VIEWS and _writes_in_place(u, modules, inside):
                return True
    return False


def _stage_of_nodes(graph: fx.Graph, where: dict[str, int], last: int) -> dict[fx.Node, int]:
    stage: dict[fx.Node, int] = {}
    names = call_ids(graph)
    for node in graph.nodes:
        if node.op == "get_attr":
            continue  # given the stage of its users, below
        if node.op == "placeholder":
            s = 0
        elif node.op == "call_module":
            s = where[names[node]]
        elif node.op == "output":
            s = last
        else:
            s = max((stage[a] for a in node.all_input_nodes if a in stage), default=0)
        for a in node.all_input_nodes:
            if a.op == "get_attr":
                stage.setdefault(a, s)
                if stage[a] != s:
                    raise PipeplanError(f"plan: {a.target!r} is used by stages {stage[a]} and {s}; the runtime "
                                        "does not share a parameter between stages")
            elif stage[a] > s:
                what = repr(names[node]) if node.op == "call_module" else "the model's output"
                raise PipeplanError(f"plan: stage {s} runs {what}, which needs a value computed in stage "
                                    f"{stage[a]} ({a.name}): stages must follow the model's data flow")
        stage[node] = s
    return stage


def _check_layers(graph: fx.Graph, stage_nodes: list[list[str]], spec: str) -> dict[str, int]:
    layers = list(call_ids(graph).values())
    where = {nid: s for s, nodes in enumerate(stage_nodes) for nid in nodes}
    unknown = [nid for nid in where if nid not in layers]
    if unknown:
        raise PipeplanError(f"plan does not match model {spec!r}: node {unknown[0]!r} is not one of its layers "
                            f"({', '.join(layers[:6])}{', ...' if len(layers) > 6 else ''})")
    missing = [nid for nid in layers if nid not in where]
    if missing:
        raise PipeplanError(f"plan does not match model {spec!r}: layer {missing[0]!r} is in no stage")
    return where


def split_model(model: nn.Module, stage_nodes: list[list[str]], spec: str) -> list[fx.GraphModule]:
    """The stages' modules, sharing the model's parameters (module docstring)."""
    graph = trace(model)
    where = _check_layers(graph, stage_nodes, spec)
    last = len(stage_nodes) - 1
    stage = _stage_of_nodes(graph, where, last)
    modules = dict(model.named_modules())
    crossing = [[n for n in graph.nodes if n in stage and n.op != "output"
                 and stage[n] < s <= max((stage[u] for u in n.users), default=-1)] if s else []
                for s in range(last + 2)]
    parts = []
    for s in range(last + 1):
        g = fx.Graph()
        inside = {n for n in graph.nodes if stage[n] == s}
        env: dict[fx.Node, fx.Node] = {}
        for n in crossing[s]:
            env[n] = g.placeholder(n.name)
            if _writes_in_place(n, modules, inside):
                env[n] = g.call_method("clone", (env[n],))
        for node in graph.nodes:
            if node in inside and node.op != "output":
                env[node] = g.node_copy(node, lambda a: env[a])
            elif node.op == "output" and s == last:
                g.output(fx.map_arg(node.args[0], lambda a: env[a]))
        if s < last:
            out = [env[n] for n in crossing[s + 1]]
            g.output(out[0] if len(out) == 1 else tuple(out))
        parts.append(fx.GraphModule(model, g))
    _no_shared_parameters(parts)
    return parts


def _no_shared_parameters(parts: list[fx.GraphModule]) -> None:
    """A parameter held by two stages would get two unsynchronized gradients (tied weights)."""
    owner: dict[int, tuple[int, str]] = {}
    for s, part in enumerate(parts):
        for name, p in part.named_parameters():
            first = owner.setdefault(id(p), (s, name))
            if first[0] != s:
                raise PipeplanError(f"plan: parameter {first[1]!r} of stage {first[0]} is also {name!r} of stage "
                                    f"{s} (tied weights); the runtime does not share a parameter between stages: "
                                    "keep its users in one stage")


class Recomputed(nn.Module):
    """A stage that re-materializes its activations (GPipe §2.3): only its input is kept
    per microbatch; the forward runs again inside the backward (torch.utils.checkpoint)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False)


def _as_tuple(v) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def stage_examples(model: nn.Module, parts: list[nn.Module], stage_index: int,
                   sample: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The stage's inputs and outputs for one local microbatch, computed in eval mode without
    gradients, so torch's pipelining needs no metadata inference (which would run the stage in
    train mode on uninitialized tensors and corrupt its BatchNorm statistics). Whatever
    crosses a cut must be a tensor."""
    model.eval()
    try:
        with torch.no_grad():
            args: tuple = (sample.clone(),)
            for s in range(stage_index + 1):
                inp, args = args, _as_tuple(parts[s](*args))
                bad = [type(v).__name__ for v in args if not isinstance(v, torch.Tensor)]
                if bad and s < len(parts) - 1:
                    raise PipeplanError(f"plan: stage {s} would send a {bad[0]} to stage {s + 1}; only tensors "
                                        "cross stages: move the cut")
    finally:
        model.train()
    # what autograd will see: a received input needs its gradient, every output has one
    inp = tuple(t.requires_grad_(stage_index > 0 and t.is_floating_point()) for t in inp)
    return inp, tuple(t.requires_grad_(t.is_floating_point()) for t in args)
