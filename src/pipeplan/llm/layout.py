"""Layer layouts of a decoder LLM's pipeline as the engines take them (docs/llm.md,
docs/megatron-rules.md) and the stages they give.

A layout lists the layers of each of the PP x v model chunks in chunk order; chunk j sits on
pipeline position j mod PP (Megatron-LM's interleaving, Narayanan et al. 2021 §2.2), the
embedding rides with chunk 0 and the LM head with the last. Megatron takes equal chunks
(``--num-layers-per-virtual-pipeline-stage``), the first and last stage's layers apart from
equal middle stages (``--decoder-first/last-pipeline-num-layers``) and any layout through
``--pipeline-model-parallel-layout``; torchtitan takes per-stage module lists. ``candidates``
are the layouts the search considers: equal chunks where the layers divide, and middle
stages of m layers with the first and last stage's f and l chosen independently (f, l <= m,
within 2 of each other), as Llama 3 405B ran (Dubey et al. 2024 §3.3.2: one layer fewer on
the first and last of 16 stages, 7 + 8 x 14 + 7); a stage's layers split over its chunks as
evenly as they go, the lighter chunks where the embedding (first stage) or the head (last
stage) ride."""

from __future__ import annotations

from ..errors import PipeplanError
from .parallelism import Parallelism

#: first and last stage layers within this of each other in ``candidates``
SPREAD = 2


def stage_counts(layers: int, pp: int) -> list[tuple[int, ...]]:
    """Layers per pipeline position the search considers (module docstring)."""
    if pp == 1:
        return [(layers,)]
    if layers < pp:
        return []
    out: list[tuple[int, ...]] = []
    if layers % pp == 0:
        out.append((layers // pp,) * pp)
    for m in sorted({layers // pp, -(-layers // pp)}):
        rest = layers - m * (pp - 2)
        for f in range(1, rest):
            last = rest - f
            if pp > 2 and (f > m or last > m):
                continue
            if abs(f - last) <= SPREAD and m >= 1:
                counts = (f,) + (m,) * (pp - 2) + (last,)
                if counts not in out:
                    out.append(counts)
    return out


def chunked(stages: tuple[int, ...], vpp: int) -> tuple[int, ...] | None:
    """The chunk layout (chunk order) of per-position layer counts split over ``vpp`` chunks a
    position (module docstring); None when a position has fewer layers than chunks."""
    pp = len(stages)
    split = []
    for s, n in enumerate(stages):
        q, r = divmod(n, vpp)
        if q == 0 and not (pp > 1 and r == vpp - 1 and s in (0, pp - 1)):
            return None  # only the embedding's first chunk or the head's last may hold no layer
        light_first = s == 0 and pp > 1
        split.append([q] * (vpp - r) + [q + 1] * r if light_first else [q + 1] * r + [q] * (vpp - r))
    return tuple(split[j % pp][j // pp] for j in range(pp * vpp))


def candidates(layers: int, pp: int, vpp: int = 1) -> list[tuple[int, ...]]:
    """Chunk layouts for PP x ``vpp`` chunks (module docstring), equal chunks first."""
    out = []
    if layers % (pp * vpp) == 0:
        out.append((layers // (pp * vpp),) * (pp * vpp))
    for counts in stage_counts(layers, pp):
        lay = chunked(counts, vpp)
        if lay is not None and lay not in out:
            out.append(lay)
    return out


def v_candidates(layers: int, pp: int) -> list[tuple[int, ...]]:
    """Chunk layouts of a V (``parallelism.V_SCHEDULES``: position s holds chunks s and
    2 PP - 1 - s, the embedding's chunk and the head's both on position 0): position 0 holding
    as many layers as the others or up to ``SPREAD`` fewer, the others as even as they go (the
    heavier ones last); a position's layers split over its two chunks as evenly as they go, the
    odd one to its first chunk (on position 0 the embedding's: the head is the heavier end)."""
    out: list[tuple[int, ...]] = []
    if pp < 2:
        return out
    for first in range(layers // pp, max(0, layers // pp - SPREAD - 1), -1):
        q, r = divmod(layers - first, pp - 1)
        if first < 1 or q < 2 or first > q:
            continue
        counts = (first,) + (q,) * (pp - 1 - r) + (q + 1,) * r
        lay = [0] * (2 * pp)
        for s, n in enumerate(counts):
            lay[s], lay[2 * pp - 1 - s] = n - n // 2, n // 2
        out.append(tuple(lay))
    return out


def even(layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """The first candidate layout, or one line when none exists."""
    found = candidates(layers, pp, vpp)
    if not found:
        raise PipeplanError(f"{layers} layers do not split into {pp} pipeline stages"
                            + (f" of {vpp} chunks each" if vpp > 1 else ""))
    return found[0]


def runs_of(counts: tuple[int, ...] | list[int]) -> list[range]:
    """Consecutive runs of ``counts[j]`` layers."""
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def stages(names: list[str], par: Parallelism) -> list[tuple[list[str], list[str], int]]:
    """Each chunk's (nodes, GPUs, TP) for ``par`` over the GPUs ``names`` in Megatron's rank
    order (``parallelism.RANK_ORDER``: position s holds GPUs s·w ... (s+1)·w - 1, w = TP x CP x
    DP, tensor-parallel groups of t consecutive GPUs, a replica's CP groups of them next); a
    plan's stages (``plan.Stage``) take them as they are."""
    if par.world != len(names):
        cp = f" x CP {par.cp}" if par.cp > 1 else ""
        raise PipeplanError(f"parallel configuration TP {par.tp}{cp} x PP {par.pp} x DP {par.dp} needs {par.world} "
                            f"GPUs; the cluster has {len(names)}")
    count, width, out = len(par.layout), par.dp * par.tp * par.cp, []
    for j, run in enumerate(runs_of(par.layout)):
        nodes = (["embed"] if j == 0 else []) + [f"layer{i}" for i in run] + (["head"] if j == count - 1 else [])
        s = par.position(j)
        out.append((nodes, names[s * width:(s + 1) * width], par.tp))
    return out


def agrees(plan) -> None:
    """One line unless ``plan`` is what its ``parallelism`` says: a decoder graph of that
    microbatch, the layout's stages on the plan's GPUs, its schedule, recomputation, sequence
    parallelism, ZeRO stage and overlap, whole microbatches on every replica."""
    from .spec import decoder_of

    par = plan.parallelism
    if "decoder" not in plan.graph.meta:
        raise PipeplanError(f"plan: a parallel configuration is for decoder LLM graphs, not {plan.graph.name!r}")
    spec = decoder_of(plan.graph.meta, f"model {plan.graph.name!r}")
    par.check_model(spec)
    gpus = list(dict.fromkeys(d for s in plan.stages[:par.pp] for d in s.devices))
    want = stages(gpus, par) if len(gpus) == par.world else None
    said = {"schedule": (plan.schedule, par.schedule), "microbatch": (int(plan.graph.meta.get("microbatch", 1)),
                                                                       par.microbatch),
            "recompute": (plan.recompute_mode(0), par.recompute), "sequence_parallel": (plan.sequence_parallel, par.sp),
            "zero": (plan.zero, par.zero), "overlap_grad_reduce": (plan.overlap_grad_reduce, par.overlap_grad_reduce),
            "replicas": (plan.replicas, "round-robin")}
    wrong = [k for k, (a, b) in said.items() if a != b]
    if want is None or want != [(s.nodes, s.devices, s.tp) for s in plan.stages]:
        wrong.insert(0, "stages")
    if len({plan.recompute_mode(k) for k in range(plan.num_stages)}) > 1:
        wrong.append("recompute")
    if wrong:
        raise PipeplanError(f"plan: its {wrong[0]} disagree(s) with its parallelism ({par.as_dict()})")
    par.microbatches(plan.global_batch)
