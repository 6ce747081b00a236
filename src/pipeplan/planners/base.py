"""What every planner takes and the registry that names them.

A planner is ``plan(graph, cluster, options) -> Plan``; the caller simulates the plan for its
prediction (``evaluate``), so every planner is judged by the same simulator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from typing import Callable

from ..cluster import Cluster
from ..errors import PipeplanError
from ..graph import Graph
from ..plan import Plan
from ..sim import SimResult, simulate
from ..units import fmt_bytes
from .variants import fit_memory, plan_for_global_batch


@dataclass(frozen=True)
class PlanOptions:
    microbatches: int = 32
    schedule: str | None = None  # None: the planner's own default
    optimizer: str = "adam"
    seed: int = 0
    time_budget_s: float = 60.0
    allow_over_memory: bool = False  # keep a plan that overflows (what-if runs)
    global_batch: int | None = None  # samples per iteration: the planner layer picks microbatch size and M
    extra: tuple[tuple[str, str], ...] = ()  # planner-specific KEY=VALUE options (-O)

    def option(self, key: str, default: str | None = None) -> str | None:
        return dict(self.extra).get(key, default)

    def float_option(self, key: str) -> float | None:
        v = self.option(key)
        if v is None:
            return None
        try:
            return float(v)
        except ValueError:
            raise PipeplanError(f"planner option {key}={v!r}: expected a number") from None


@dataclass(frozen=True)
class PlannerInfo:
    name: str
    description: str
    default_schedule: str
    fn: Callable[[Graph, Cluster, PlanOptions], Plan]
    memory_variants: bool = True  # False: the plan is kept as its program returns it, flagged


REGISTRY: dict[str, PlannerInfo] = {}


def register(name: str, description: str, default_schedule: str, memory_variants: bool = True):
    def deco(fn: Callable[[Graph, Cluster, PlanOptions], Plan]):
        REGISTRY[name] = PlannerInfo(name, description, default_schedule, fn, memory_variants)
        return fn
    return deco


def get_planner(name: str) -> PlannerInfo:
    from . import ALL  # noqa: F401  (imports every planner module so that it registers)

    info = REGISTRY.get(name)
    if info is None:
        raise PipeplanError(f"unknown planner {name!r} (known: {', '.join(sorted(REGISTRY))})")
    return info


def run_planner(name: str, graph: Graph, cluster: Cluster, options: PlanOptions) -> tuple[Plan, SimResult]:
    """Plan, time the search, simulate, and store the prediction in the plan. With
    ``options.global_batch`` the microbatch size and count are chosen too (every split the
    planner is run on counts as search time)."""
    if options.microbatches < 1:
        raise PipeplanError(f"--microbatches must be >= 1, got {options.microbatches}")
    info = get_planner(name)
    t0 = time.perf_counter()
    if options.global_batch is not None:
        plan = plan_for_global_batch(info.fn, graph, cluster, options, options.global_batch,
                                     memory_variants=info.memory_variants)
        plan.planner = name
        return plan, evaluate(plan)
    plan = info.fn(graph, cluster, options)
    plan.search_s = time.perf_counter() - t0
    plan.planner = name
    result = evaluate(plan)
    if result.over_memory and info.memory_variants and not options.allow_over_memory:  # its plan,
        fitted = fit_memory(plan)  # or its fastest variant that fits (planning time too)
        if fitted is not plan:
            fitted.search_s, fitted.planner = time.perf_counter() - t0, name
            plan, result = fitted, evaluate(fitted)
    return plan, result


def overflow_text(result: SimResult) -> str:
    """Which device overflows most, by how much (or that every device fits)."""
    if not result.over_memory:
        return "fits in memory"
    over = result.memory_bytes - result.memory_limit
    i = int(np.argmax(over))
    return (f"{result.devices[i]} (stage {result.stage_of_device[i]}) needs {fmt_bytes(result.memory_bytes[i])} "
            f"of its {fmt_bytes(result.memory_limit[i])} (over by {fmt_bytes(over[i])})")


def fits(plan: Plan) -> bool:
    return not simulate(plan, timeline=False).over_memory


def evaluate(plan: Plan) -> SimResult:
    result = simulate(plan)
    plan.prediction = result.summary()
    return result
