"""Compare planners on the same inputs, and ``best``: the fastest plan that fits.

Every planner answers (its plan, or its fastest variant that fits, flagged when none does);
a row carries an error only when the planner cannot plan this instance at all (e.g. too
large for ``exact``, or no link to run a pipeline over). ``-O KEY=VALUE`` options go to the
compared planners that declare KEY; a key none of them declares is a user error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..cluster import Cluster
from ..errors import Infeasible, PipeplanError
from ..graph import Graph
from ..plan import Plan
from ..sim.explain import explain
from ..sim.tensor_groups import needs_lowering
from ..sim import SimResult
from .base import PlanOptions, get_planner, load_all, memory_over_bytes, overflow_text, run_planner
from .ranking import rank_key


@dataclass
class CompareRow:
    """One planner's answer: its plan and simulation, or the one-line reason it has none."""

    planner: str
    plan: Plan | None = None
    result: SimResult | None = None
    error: str | None = None
    speedup_vs_dp: float | None = None  # dp's iteration / this one's (dp's plan fits)
    gap_vs_exact: float | None = None  # this iteration / exact's - 1 (exact's plan fits)
    gap_is_bound: bool = False  # exact's search was cut short: the gap to the optimum is at least this

    @property
    def fits(self) -> bool:
        return self.result is not None and not self.result.over_memory

    @property
    def iteration_s(self) -> float:
        return self.result.iteration_s if self.result is not None else float("inf")

    @property
    def search_s(self) -> float | None:
        return self.plan.search_s if self.plan is not None else None

    @property
    def efficiency(self) -> float | None:
        return self.result.efficiency if self.result is not None else None

    @property
    def over_memory(self) -> list[str]:
        """The devices over their memory."""
        return list(self.result.over_memory) if self.result is not None else []

    @property
    def memory_over_bytes(self) -> dict[str, float]:
        """Each device over its memory: by how many bytes."""
        return memory_over_bytes(self.result) if self.result is not None else {}

    @property
    def memory_verdict(self) -> str:
        return self.error or overflow_text(self.result)

    def to_dict(self) -> dict:
        """The JSON row of ``pipeplan compare --json``."""
        if self.result is None:
            return {"planner": self.planner, "error": self.error}
        return {"planner": self.planner, "iteration_s": self.iteration_s, "search_s": self.search_s,
                "efficiency": self.efficiency, "replication": self.plan.replication(), "fits": self.fits,
                "over_memory": self.over_memory, "memory_over_bytes": self.memory_over_bytes,
                "memory": self.memory_verdict, "speedup_vs_dp": self.speedup_vs_dp,
                "gap_vs_exact": self.gap_vs_exact, "gap_is_bound": self.gap_is_bound,
                "search_complete": self.plan.search_complete, "incomplete": self.plan.incomplete,
                **({"terms": explain(self.plan)["terms"]} if needs_lowering(self.plan) else {}),
                "plan": self.plan.to_dict(embed=False)}


def default_planners(cluster: Cluster) -> list[str]:
    """Every planner but those run only when named (the exhaustive yardstick ``exact``, the
    learning agents); ``resalloc`` (an asynchronous forward/backward steady state) where some
    device has several resources."""
    multi = any(len(d.resources) > 1 for d in cluster.devices)
    return sorted(n for n, info in load_all().items() if info.in_best and (n != "resalloc" or multi))


Progress = Callable[[str, int, int, float | None], None]  # (planner about to run, its index, how many,
#                                                     seconds it may take or None)


def _estimate(name: str, graph: Graph, cluster: Cluster, options: PlanOptions) -> float | None:
    estimate = get_planner(name).estimate
    return None if estimate is None else estimate(graph, cluster, options)


def compare(graph: Graph, cluster: Cluster, planners: list[str], options: PlanOptions,
            progress: Progress | None = None) -> list[CompareRow]:
    """One row per planner: plans that fit first, fastest first; then those that overflow,
    least over first (largest memory / limit); then errors (a planner that cannot plan this
    instance). So the first row is ``best_row``'s choice. ``progress`` is told each planner
    before it runs, with its estimate (``PlannerInfo.estimate``). Each planner reads its own
    typed options from ``options.settings`` (``planner_settings``)."""
    for name in planners:
        get_planner(name)  # unknown names first, before any work
    order = sorted(planners, key=lambda n: get_planner(n).after_others)  # stable: the others first
    rows: list[CompareRow] = []
    for i, name in enumerate(order):
        opts = options
        if get_planner(name).after_others:
            opts = replace(opts, known_plans={r.planner: (r.plan, r.result) for r in rows if r.result is not None})
        if progress is not None:
            progress(name, i, len(planners), _estimate(name, graph, cluster, opts))
        try:
            plan, result = run_planner(name, graph, cluster, opts)
            rows.append(CompareRow(name, plan, result))
        except (PipeplanError, Infeasible) as e:
            rows.append(CompareRow(name, error=str(e)))
    ok = [r for r in rows if r.result is not None]
    dp = next((r.iteration_s for r in ok if r.planner == "dp" and r.fits), None)
    exact_row = next((r for r in ok if r.planner == "exact" and r.fits), None)
    exact = exact_row.iteration_s if exact_row else None
    for r in ok:
        r.speedup_vs_dp = dp / r.iteration_s if dp and r.iteration_s > 0 else None
        r.gap_vs_exact = r.iteration_s / exact - 1.0 if exact else None
        # an exact search cut short found a plan no better than the optimum: a gap to it
        # is a lower bound on the gap to the optimum
        r.gap_is_bound = exact_row is not None and not exact_row.plan.search_complete
    ok.sort(key=lambda r: rank_key(r.result))
    return ok + [r for r in rows if r.result is None]


def _reasons(rows: list[CompareRow]) -> str:
    """Each distinct reason once, with the planners that gave it ("dp, gpipe: ...")."""
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        reason = str(r.error)
        prefix = f"{r.planner}: "
        by_reason.setdefault(reason[len(prefix):] if reason.startswith(prefix) else reason, []).append(r.planner)
    return "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())


def best_row(rows: list[CompareRow]) -> CompareRow:
    """The fastest row that fits; if none fits, the one that overflows least (largest memory /
    limit over its devices), flagged by ``fits``. PipeplanError when no planner answered."""
    answered = [r for r in rows if r.result is not None]
    if not answered:
        raise PipeplanError("no planner could plan this: " + _reasons(rows))
    return min(answered, key=lambda r: rank_key(r.result))


def best(graph: Graph, cluster: Cluster, options: PlanOptions, planners: list[str] | None = None,
         progress: Progress | None = None) -> CompareRow:
    """The fastest plan that fits among ``planners`` (default: ``default_planners``); if none
    fits, the one that overflows least, flagged."""
    return best_row(compare(graph, cluster, planners or default_planners(cluster), options, progress))
