"""What would fit, when no planner's plan fits in memory: the smallest change, computed.

Every planner has already tried re-materialization and a schedule with fewer microbatches in
flight (``variants.fit_memory``). The changes below are tried in order of how little they
ask of the user, each by planning again with the same planners, and the first under which a
plan fits is returned with the options that make it:

1. the optimizer with the least state: SGD (Adam keeps two moments per weight);
2. smaller microbatches, the global batch kept (half the samples, twice the microbatches,
   down to one sample; the graph is rescaled by ``graph.scale``), unless the planners already
   choose the microbatch size (``--global-batch`` alone);
3. more memory per device: the least that the least-overflowing plan needs (computed from
   its memory per device, rounded up in the unit printed, then checked by planning with the
   value printed);
4. more devices of the same kinds: the cluster doubled, then quadrupled (``cluster.scaled``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph
from ..graph.scale import profiled_microbatch, with_microbatch
from ..limits import MAX_MICROBATCHES
from ..sim import SimResult
from ..units import fmt_bytes, fmt_bytes_up, parse_bytes
from .base import PlanOptions


@dataclass(frozen=True)
class Fix:
    """A change under which ``planner`` finds a plan that fits, taking ``iteration_s``."""

    change: str  # what to change, in words
    flags: str  # the command-line options that make it
    planner: str
    iteration_s: float


Compare = Callable[[Graph, Cluster, PlanOptions], list]  # planners.compare bound to the planners


def _first_fit(rows: list) -> object | None:
    return next((r for r in rows if r.result is not None and r.fits), None)


def _try(run: Compare, graph: Graph, cluster: Cluster, options: PlanOptions, change: str, flags: str) -> Fix | None:
    try:
        row = _first_fit(run(graph, cluster, options))
    except PipeplanError:
        return None
    return None if row is None else Fix(change, flags, row.planner, row.iteration_s)


def _smaller_microbatches(run: Compare, graph: Graph, cluster: Cluster, options: PlanOptions) -> Fix | None:
    try:
        b0 = profiled_microbatch(graph)
    except PipeplanError:
        return None
    samples = b0 // 2
    while samples >= 1 and (m := options.microbatches * (b0 // samples)) <= MAX_MICROBATCHES:
        if b0 % samples == 0:
            fix = _try(run, with_microbatch(graph, samples), cluster, replace(options, microbatches=m),
                       f"microbatches of {samples} sample{'s' if samples > 1 else ''} instead of {b0} ({m} per "
                       "iteration, the same global batch)",
                       f"--global-batch {b0 * options.microbatches} --microbatches {m}")
            if fix:
                return fix
        samples //= 2
    return None


def _more_memory(run: Compare, graph: Graph, cluster: Cluster, options: PlanOptions,
                 results: list[SimResult]) -> Fix | None:
    needs = [float(r.memory_bytes.max()) for r in results]
    if not needs:
        return None
    limit = fmt_bytes_up(min(needs) * 1.001)  # the least-overflowing plan's largest device, a hair above
    memory = parse_bytes(limit)  # the value typed, checked
    return _try(run, graph, cluster.with_memory(memory), options, f"devices with {fmt_bytes(memory)} of memory each",
                f"--memory-limit {limit} (on a cluster whose devices have it)")


def what_would_fit(run: Compare, graph: Graph, cluster: Cluster, options: PlanOptions,
                   results: list[SimResult]) -> Fix | None:
    """The first change (module docstring) under which ``run`` finds a plan that fits; None
    if none of them does. ``results``: the simulations of the plans that overflow."""
    if options.optimizer != "sgd":
        fix = _try(run, graph, cluster, replace(options, optimizer="sgd"), "SGD instead of "
                   f"{options.optimizer} (no optimizer state per weight)", "--optimizer sgd")
        if fix:
            return fix
    fix = (None if options.global_batch is not None else _smaller_microbatches(run, graph, cluster, options)) \
        or _more_memory(run, graph, cluster, options, results)
    if fix:
        return fix
    for factor in (2, 4):
        bigger = cluster.scaled(factor)
        fix = _try(run, graph, bigger, options, f"{len(bigger)} devices ({factor}x {cluster.name})",
                   f"--cluster with {factor}x the servers")
        if fix:
            return fix
    return None
