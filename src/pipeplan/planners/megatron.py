"""The configuration a practitioner writes for Megatron-LM (Narayanan et al. 2021, §2-3).

A decoder LLM on GPUs with bf16 rates gets tensor x pipeline x data parallelism by Megatron's
rules of thumb, any dimension pinned with ``-O`` (``llm3d.rule_of_thumb``, docs/llm.md).

Any other graph, tensor parallelism left out: a pipeline of p stages with equal numbers of layers, replicated
d = V / p times for data parallelism (identical pipelines, each taking whole microbatches in
turn), ranks laid out as Megatron does (data-parallel rank fastest, pipeline rank slowest:
pipeline position s on devices s*d ... s*d + d - 1 of the cluster's order), 1F1B or the
interleaved 1F1B of §2.2 (v model chunks per device: the layers cut into v p equal chunks,
chunk j on position j mod p), activation recomputation only when the model does not fit
otherwise.

What a practitioner sweeps: every depth p dividing V (at most the number of layers) and, for
p >= 2, every v from 2 to 8 with the layers divisible by v p (Megatron's rule), with
recomputation where the plan does not fit without it; the fastest plan that fits is kept. Stages get equal numbers of
layers as Megatron counts them (``layer_mask``: the repeated blocks; embeddings, poolers and
heads are extras that ride with the first or last chunk); where the layers do not divide
evenly (1F1B's depths), stages differ by one layer.
An explicit ``--schedule`` narrows the sweep to the layouts that schedule runs: one stage
per device (``1f1b``, ``zb-h1``, ...), chunks in a loop (``interleaved-1f1b``), or a V of
two chunks (``zb-v``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph, linearize
from ..graph.linearize import Linearization
from ..plan import Plan, Stage, is_decoder
from ..schedule import SCHEDULES
from ..schedule.layout import placement_positions
from ..sim import simulate
from ..sim.tensor_groups import has_rates
from . import llm3d
from .base import PlanOptions, register

#: The most model chunks per device the sweep tries.
MAX_CHUNKS = 8
#: A node under this share of the median node's forward + backward time is no layer of its own.
LIGHT = 0.25


def layer_mask(graph: Graph, lin: Linearization) -> np.ndarray:
    """Which nodes (in ``lin``'s order) are layers as Megatron counts them: the repeated
    blocks (nodes sharing a description) that are not light (under ``LIGHT`` x the median
    node's forward + backward); embeddings, poolers and heads are extras. A graph without
    repeated blocks counts every node that is not light."""
    t = np.diff(lin.fwd_cum) + np.diff(lin.bwd_cum)
    heavy = t >= LIGHT * np.median(t)
    desc = [graph.desc[u] for u in lin.order]
    repeated = np.array([bool(d) and desc.count(d) > 1 for d in desc])
    return heavy & repeated if np.count_nonzero(heavy & repeated) >= 2 else heavy


def layer_bounds(graph: Graph, lin: Linearization, count: int) -> np.ndarray:
    """Cut positions of ``count`` chunks with equal numbers of layers (``layer_mask``; extras
    ride with their neighbours: a first embedding with the first chunk, a last head with the
    last); with fewer layers than chunks, the nodes split as evenly as they go."""
    cum = np.concatenate([[0], np.cumsum(layer_mask(graph, lin))])
    if cum[-1] < count:
        return np.linspace(0, lin.n, count + 1).round().astype(int)
    bounds = np.searchsorted(cum, np.round(np.arange(count + 1) * cum[-1] / count) - 0.5)
    bounds[0], bounds[-1] = 0, lin.n
    return bounds


def megatron_plan(graph: Graph, cluster: Cluster, options: PlanOptions, depth: int, recompute: bool,
                  chunks: int = 1) -> Plan:
    """Megatron's plan of pipeline depth ``depth`` (a divisor of the device count) with
    ``chunks`` model chunks per device (1: 1F1B; more: interleaved 1F1B unless
    ``options.schedule`` names another)."""
    lin = linearize(graph)
    d = len(cluster) // depth
    schedule = options.schedule or ("1f1b" if chunks == 1 else "interleaved-1f1b")
    placement = SCHEDULES[schedule].placement if schedule in SCHEDULES else "single"
    count = depth * chunks
    bounds = layer_bounds(graph, lin, count)
    names = cluster.names
    stages = []
    for (a, b), s in zip(zip(bounds[:-1], bounds[1:]), placement_positions(placement, count, depth)):
        stages.append(Stage([graph.ids[u] for u in lin.interval(a, b)], names[s * d:(s + 1) * d]))
    return Plan(graph, cluster, stages, options.microbatches, schedule=schedule,
                optimizer=options.optimizer, replicas="round-robin",
                recompute=[True] * count if recompute else None)


def depths(layers: int, devices: int) -> list[int]:
    """Pipeline depths a practitioner tries: divisors of the device count, at most the layers."""
    return [p for p in range(1, min(layers, devices) + 1) if devices % p == 0]


def chunk_counts(layers: int, depth: int, schedule: str | None) -> list[int]:
    """Model chunks per device to try at pipeline depth ``depth`` for ``schedule`` (None:
    1F1B's one and interleaved 1F1B's 2..MAX_CHUNKS): v >= 2 needs a pipeline (depth >= 2)
    and the ``layers`` divisible by depth x v, as Megatron requires."""
    placement = SCHEDULES[schedule].placement if schedule in SCHEDULES else "single"
    interleaved = [v for v in range(2, MAX_CHUNKS + 1) if depth >= 2 and layers % (depth * v) == 0]
    if schedule is None:
        return [1] + interleaved
    return {"single": [1], "loop": interleaved, "v": [2] if layers % (2 * depth) == 0 else []}[placement]


@dataclass(frozen=True)
class MegatronOptions(llm3d.LLMOptions):
    """Pinned dimensions of a decoder LLM's 3D configuration (``llm3d.LLMOptions``); unpinned
    ones follow Megatron-LM's rules of thumb. Other graphs take only ``recompute`` none/full
    (not pinned: only where the plan does not fit)."""


def _decoder_plan(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """Megatron-LM's configuration of a decoder LLM: the pinned dimensions, the rest by its
    rules of thumb (``llm3d.rule_of_thumb``)."""
    pins = llm3d.pins_of(options.settings_of(MegatronOptions), options.schedule)
    batch = llm3d.global_batch_of(graph, options.global_batch, options.microbatches)
    cfg = llm3d.rule_of_thumb(llm3d.spec_of(graph), cluster, batch, pins, options.optimizer)
    return llm3d.plan_of(graph, cluster, cfg, batch, options.optimizer)


def _refuse_llm_options(graph: Graph, options: PlanOptions) -> bool | None:
    """The old graphs' recomputation setting: True/False pinned, None swept; a decoder-only
    option on another graph (or on GPUs without bf16 rates) is one line."""
    o = options.settings_of(MegatronOptions)
    only = [f.name for f in fields(llm3d.LLMOptions) if f.name != "recompute" and getattr(o, f.name) is not None]
    if only or o.recompute == "selective":
        what = (f"needs GPUs with bf16 rates (A100-40GB, A100-80GB, H100-SXM) for {graph.name!r}"
                if is_decoder(graph) else f"is for decoder LLM graphs (zoo:gpt, zoo:llama3-*, hf:), not {graph.name!r}")
        raise PipeplanError(f"planner 'megatron': option {(only or ['recompute=selective'])[0]} {what}")
    return None if o.recompute is None else o.recompute == "full"


@register("megatron", "Megatron-LM as practitioners configure it: on decoder LLMs tensor x pipeline x data "
          "parallelism by its rules of thumb (-O tp= pp= vpp= microbatch= recompute= zero= pin them); on other "
          "graphs equal layers per stage, identical data-parallel pipelines, 1F1B or interleaved 1F1B, depth and "
          "chunks swept", "1f1b", options=MegatronOptions, own_batch=True)
def plan_megatron(graph: Graph, cluster: Cluster, options: PlanOptions) -> Plan:
    """A decoder LLM: ``_decoder_plan``. Another graph: ``_plan_layers``."""
    if is_decoder(graph) and has_rates(cluster):
        return _decoder_plan(graph, cluster, options)
    return _plan_layers(graph, cluster, options, _refuse_llm_options(graph, options))


def _plan_layers(graph: Graph, cluster: Cluster, options: PlanOptions, pinned: bool | None = None) -> Plan:
    """The fastest fitting plan over the depths of ``depths`` x the chunks of ``chunk_counts``,
    each with recomputation only when it does not fit without (the fastest overall when none
    fits); ``pinned``: recomputation fixed on (True) or off (False) by ``-O recompute``."""
    best, best_key = None, None
    lin = linearize(graph)
    layers = int(np.count_nonzero(layer_mask(graph, lin)))
    for p in depths(lin.n, len(cluster)):
        for v in chunk_counts(layers, p, options.schedule):
            for recompute in ((False, True) if pinned is None else (pinned,)):
                plan = megatron_plan(graph, cluster, options, p, recompute, v)
                r = simulate(plan, timeline=False)
                over = bool(r.over_memory) and not options.allow_over_memory
                key = (over, r.iteration_s, recompute, v)
                if best_key is None or key < best_key:
                    best, best_key = plan, key
                if not over:  # recomputation only when the model does not fit otherwise
                    break
    if best is None:
        raise PipeplanError(f"megatron: schedule {options.schedule} needs a pipeline of at least 2 devices whose "
                            f"number times the chunks divides the {layers} layers; {len(cluster)} device(s)")
    return best
