"""Megatron-LM's layout of a decoder LLM's plan (Narayanan et al. 2021 §2-3; its
``parallel_state`` rank order, tensor-parallel rank fastest, then data-parallel, then
pipeline): pipeline position s holds GPUs s·d·t ... (s+1)·d·t - 1 of the cluster's order, in
tensor-parallel groups of t consecutive GPUs; model chunk j (of PP x v) sits on position
j mod PP; the embedding rides with the first chunk, the LM head with the last. Shared by the
3D planners (``planners.llm3d``) and the engine exports (``engines``)."""

from __future__ import annotations

from .errors import PipeplanError
from .plan import Stage


def layer_counts(layers: int, pp: int, vpp: int = 1) -> list[int] | None:
    """Layers of each of the PP x v chunks as Megatron-LM can set them (its argument checks,
    docs/engines.md): equal chunks; without interleaving, else the first and last stage
    alike with the middle stages equal (``--decoder-first/last-pipeline-num-layers``), the
    two as near the mean as that allows; None when no split is expressible."""
    count = pp * vpp
    if layers % count == 0:
        return [layers // count] * count
    if vpp > 1 or layers < pp:
        return None
    if pp == 2:
        return [layers - layers // 2, layers // 2]
    mean = layers / pp
    for f in sorted(range(1, layers), key=lambda f: (abs(f - mean), f)):
        middle, rest = divmod(layers - 2 * f, pp - 2)
        if rest == 0 and middle >= 1:
            return [f] + [middle] * (pp - 2) + [f]
    return None


def runs_of(counts: list[int]) -> list[range]:
    """Consecutive runs of ``counts[j]`` layers."""
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def megatron_stages(names: list[str], layers: int, tp: int, pp: int, dp: int, vpp: int = 1,
                    counts: list[int] | None = None) -> list[Stage]:
    """The stages of the layout (module docstring) over the devices ``names``; ``counts``: the
    layers of each of the PP x v chunks (default ``layer_counts``)."""
    if tp * pp * dp != len(names):
        raise PipeplanError(f"3D configuration TP {tp} x PP {pp} x DP {dp} needs {tp * pp * dp} GPUs; "
                            f"the cluster has {len(names)}")
    count = pp * vpp
    counts = counts or layer_counts(layers, pp, vpp)
    if counts is None:
        raise PipeplanError(f"{layers} layers do not split into {pp} pipeline stages"
                            + (f" of {vpp} equal chunks" if vpp > 1 else "") + " as Megatron-LM can set them")
    runs = runs_of(counts)
    width, stages = dp * tp, []
    for j, run in enumerate(runs):
        nodes = (["embed"] if j == 0 else []) + [f"layer{i}" for i in run] + (["head"] if j == count - 1 else [])
        s = j % pp
        stages.append(Stage(nodes, names[s * width:(s + 1) * width], tp))
    return stages
