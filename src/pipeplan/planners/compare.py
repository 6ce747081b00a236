"""Compare planners on the same inputs, and ``best``: the fastest plan that fits.

Every planner answers (its plan, flagged when it does not fit); a row carries an error
only when the planner cannot plan this instance at all (e.g. too large for ``exact``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster import Cluster
from ..errors import Infeasible, PipeplanError
from ..graph import Graph
from ..plan import Plan
from ..sim import SimResult
from .base import REGISTRY, PlanOptions, get_planner, overflow_text, run_planner


@dataclass
class CompareRow:
    planner: str
    plan: Plan | None = None
    result: SimResult | None = None
    error: str | None = None
    speedup_vs_dp: float | None = None
    gap_vs_exact: float | None = None

    @property
    def fits(self) -> bool:
        return self.result is not None and not self.result.over_memory

    @property
    def iteration_s(self) -> float:
        return self.result.iteration_s if self.result is not None else float("inf")

    @property
    def memory_verdict(self) -> str:
        return self.error or overflow_text(self.result)

    def to_dict(self) -> dict:
        """The JSON row of ``pipeplan compare --json``."""
        if self.result is None:
            return {"planner": self.planner, "error": self.error}
        r, p = self.result, self.plan
        over = {d: float(m - lim) for d, m, lim in zip(r.devices, r.memory_bytes, r.memory_limit) if m > lim}
        return {"planner": self.planner, "iteration_s": r.iteration_s, "search_s": p.search_s,
                "efficiency": r.efficiency, "replication": p.replication(), "fits": self.fits,
                "over_memory": r.over_memory, "over_memory_bytes": over, "memory": self.memory_verdict,
                "speedup_vs_dp": self.speedup_vs_dp, "gap_vs_exact": self.gap_vs_exact,
                "plan": p.to_dict(embed=False)}


def default_planners(cluster: Cluster) -> list[str]:
    """Every planner but the exhaustive yardstick (``exact``); ``resalloc`` (an asynchronous
    forward/backward steady state) where some device has several resources."""
    get_planner("dp")  # loads the registry
    multi = any(len(d.resources) > 1 for d in cluster.devices)
    return sorted(n for n in REGISTRY if n != "exact" and (n != "resalloc" or multi))


def compare(graph: Graph, cluster: Cluster, planners: list[str], options: PlanOptions) -> list[CompareRow]:
    """One row per planner: plans that fit first, fastest first; then those that overflow;
    then errors."""
    for name in planners:
        get_planner(name)  # an unknown name is a user error before any work
    rows = []
    for name in planners:
        try:
            plan, result = run_planner(name, graph, cluster, options)
            rows.append(CompareRow(name, plan, result))
        except (PipeplanError, Infeasible) as e:
            rows.append(CompareRow(name, error=str(e)))
    ok = [r for r in rows if r.result is not None]
    dp = next((r.iteration_s for r in ok if r.planner == "dp" and r.fits), None)
    exact = next((r.iteration_s for r in ok if r.planner == "exact" and r.fits), None)
    for r in ok:
        r.speedup_vs_dp = dp / r.iteration_s if dp and r.iteration_s > 0 else None
        r.gap_vs_exact = r.iteration_s / exact - 1.0 if exact else None
    ok.sort(key=lambda r: (not r.fits, r.iteration_s))
    return ok + [r for r in rows if r.result is None]


def best(graph: Graph, cluster: Cluster, options: PlanOptions, planners: list[str] | None = None) -> CompareRow:
    """The fastest plan that fits; if none fits, the fastest one, flagged."""
    rows = compare(graph, cluster, planners or default_planners(cluster), options)
    if rows[0].result is None:
        raise PipeplanError("; ".join(r.error or "" for r in rows))
    return rows[0]
