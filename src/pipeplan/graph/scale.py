"""A graph for another microbatch size: ``with_microbatch(graph, samples)``.

A graph's costs are for one microbatch of ``graph.meta["microbatch"]`` samples (the size it
was profiled or built at). For ``samples`` samples, with r = samples / profiled size:

* forward and backward time: ``fixed + r x (t - fixed)``, where ``fixed`` is the node's
  per-call part (``meta["fixed_s"]``: {node: [forward, backward]}, fitted by ``pipeplan
  profile`` from the full and the half microbatch — weights read once per call do not shrink
  with the batch); the rest of the time is per sample (GPipe §2.2 scales microbatches this
  way; SPP §III-A takes per-layer time linear in the samples);
* activation bytes (``act``, ``saved``) and forward FLOPs: x r (per sample);
* parameter bytes, in-place flags: unchanged;
* ``meta``: ``microbatch`` becomes ``samples``, ``input_load_s`` (data loading, per sample)
  x r; ``total_s`` and ``spread`` (measurements of the profiled size, not per node) are
  dropped; ``profiled_microbatch`` keeps the size the figures were measured at.

A zoo graph (``meta["source"] == "zoo"``, unchanged since it was built) is built again from
its hyper-parameters with the new microbatch: exact where a linear rule is not (an
embedding's dense gradient table does not grow with the batch).

Every per-node field of :class:`Graph` is classified below; a field added later is copied
unchanged until it is classified (``tests/test_variants.py`` fails until then).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import PipeplanError
from .model import Graph

#: Per-node times with a per-call fixed part: field -> index in ``meta["fixed_s"]`` pairs.
AFFINE = {"fwd": 0, "bwd": 1}
#: Per-node quantities proportional to the samples in a microbatch.
LINEAR = ("act", "saved", "flops")
#: Per-node quantities that do not depend on the microbatch.
CONSTANT = ("params", "inplace")
#: Fields that are not per-node numbers.
STRUCTURE = ("name", "ids", "desc", "edges", "meta", "tied")
#: Meta entries measured at the profiled size as a whole (no per-sample rule applies).
_MEASURED = ("total_s", "spread")


def profiled_microbatch(graph: Graph) -> int:
    """Samples per microbatch the graph's costs are for; PipeplanError if it does not say."""
    b0 = graph.meta.get("microbatch")
    if b0 is None:
        raise PipeplanError(f"model {graph.name!r}: its costs do not say how many samples a microbatch has "
                            "(meta 'microbatch'), so they cannot be scaled to another microbatch size")
    if isinstance(b0, bool) or not isinstance(b0, (int, float)) or not 1 <= b0 < 2**31 or int(b0) != b0:
        raise PipeplanError(f"model {graph.name!r}: meta 'microbatch' must be a positive integer, got {b0!r}")
    return int(b0)


def fixed_parts(graph: Graph) -> np.ndarray:
    """(2, n) per-call fixed forward/backward seconds from ``meta["fixed_s"]`` (0 where absent)."""
    fixed = np.zeros((2, len(graph)))
    for nid, pair in (graph.meta.get("fixed_s") or {}).items():
        i = graph.index.get(nid)
        if i is None:
            continue
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise PipeplanError(f"model {graph.name!r}: meta 'fixed_s' of node {nid!r} must be "
                                f"[forward, backward] seconds, got {pair!r}")
        fixed[:, i] = [float(pair[0]), float(pair[1])]
    for field, k in AFFINE.items():
        total = getattr(graph, field)
        bad = np.flatnonzero((fixed[k] < 0) | (fixed[k] > total * (1 + 1e-9)))
        if bad.size:
            i = int(bad[0])
            raise PipeplanError(f"model {graph.name!r}: node {graph.ids[i]!r} has a fixed {field} time "
                                f"{fixed[k, i]!r} s outside [0, its {field} time {total[i]!r} s] (meta 'fixed_s')")
    return fixed


def _scaled_meta(meta: dict, b0: int, samples: int) -> dict:
    r = samples / b0
    out = {k: v for k, v in meta.items() if k not in _MEASURED}
    out["microbatch"] = samples
    out.setdefault("profiled_microbatch", b0)
    if isinstance(meta.get("input_load_s"), dict):
        out["input_load_s"] = {k: float(v) * r for k, v in meta["input_load_s"].items()}
    return out


def _zoo_rebuild(graph: Graph, samples: int) -> Graph | None:
    """The zoo model rebuilt at ``samples``, if ``graph`` is that zoo model as built."""
    if graph.meta.get("source") != "zoo":
        return None
    from . import zoo

    spec = next((m for m in zoo.describe() if m["name"] == graph.name), None)
    if spec is None or any(k not in graph.meta for k in spec["defaults"]):
        return None
    options = {k: str(graph.meta[k]) for k in spec["defaults"]}
    try:
        if zoo.build(graph.name, options) != graph:
            return None
    except PipeplanError:
        return None
    return zoo.build(graph.name, {**options, "microbatch": str(samples)})


def _llm_rebuild(graph: Graph, samples: int) -> Graph | None:
    """A decoder LLM graph (``graph.llm``) rebuilt at ``samples``: its costs are a function of
    its dimensions and the microbatch, so nothing is scaled linearly."""
    if graph.meta.get("source") != "llm":
        return None
    from ..llm.spec import decoder_of
    from .llm import build_graph

    spec = decoder_of(graph.meta, f"model {graph.name!r}")
    if build_graph(spec, int(graph.meta["microbatch"])) != graph:  # edited since it was built
        return None
    return build_graph(spec, samples)


def with_microbatch(graph: Graph, samples: int) -> Graph:
    """The graph for microbatches of ``samples`` samples (module docstring for the rules)."""
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise PipeplanError(f"model {graph.name!r}: samples per microbatch must be an integer >= 1, got {samples!r}")
    samples = int(samples)
    b0 = profiled_microbatch(graph)
    fixed = fixed_parts(graph)
    rebuilt = (_zoo_rebuild(graph, samples) or _llm_rebuild(graph, samples)) if samples != b0 else None
    if rebuilt is not None:
        return rebuilt
    r = samples / b0
    fields: dict = {}
    for f in dataclasses.fields(Graph):
        if not f.init:
            continue
        value = getattr(graph, f.name)
        if f.name in STRUCTURE:
            value = list(value) if isinstance(value, list) else value
        elif value is None or r == 1.0:
            value = None if value is None else np.array(value, copy=True)
        elif f.name in AFFINE:
            part = fixed[AFFINE[f.name]]
            value = part + r * (np.asarray(value, dtype=float) - part)
        elif f.name in LINEAR:
            value = np.asarray(value, dtype=float) * r
        else:  # CONSTANT, or a field not classified yet: copied
            value = np.array(value, copy=True)
        fields[f.name] = value
    fields["meta"] = dict(graph.meta) if r == 1.0 else _scaled_meta(graph.meta, b0, samples)
    return Graph(**fields)


def with_global_batch(graph: Graph, global_batch: int, microbatches: int) -> Graph:
    """``graph`` with microbatches of ``global_batch / microbatches`` samples (a PipeplanError
    unless ``microbatches`` divides ``global_batch``)."""
    if global_batch % microbatches:
        raise PipeplanError(f"--global-batch {global_batch} is not a multiple of --microbatches {microbatches}")
    return with_microbatch(graph, global_batch // microbatches)
