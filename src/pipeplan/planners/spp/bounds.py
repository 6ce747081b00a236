"""SPP's performance bounds (§IV): Lemma 1 (PE's iteration time) and Theorem 1 (SPP's ratio)."""

from __future__ import annotations

import numpy as np

from ...cluster import Cluster
from ...sim.formulas import allreduce_time, transfer_time
from ...graph import Graph
from ...plan import Plan
from ...sim.stage_costs import stage_costs


def lemma1(plan: Plan) -> float | None:
    """(1 + (4|S|-4)/M) M C + max_s A_s, with C the largest per-microbatch time of a stage
    (forward + backward) or of a channel (both directions). Stated for replicas that split
    each microbatch (SPP's model); None for round-robin plans."""
    if plan.replicas != "split":
        return None
    costs = stage_costs(plan)
    c = plan.cluster
    devs = plan.stage_devices()
    s_count, m = plan.num_stages, plan.microbatches
    worst = 0.0
    ar = 0.0
    for s, group in enumerate(devs):
        spd = float(c.speed[group].min())
        fixed = float(costs.fwd_fixed[s] + costs.bwd_fixed[s])  # paid in full by each replica
        worst = max(worst, (float(costs.fwd[s] + costs.bwd[s]) - fixed) / (len(group) * spd) + fixed / spd)
        ar = max(ar, allreduce_time(c, group, float(costs.params[s])))
        if s + 1 < s_count and costs.crossing[s]:
            d = float(costs.boundary[s])
            worst = max(worst, transfer_time(c, group, devs[s + 1], d) + transfer_time(c, devs[s + 1], group, d))
    return (1 + (4 * s_count - 4) / m) * m * worst + ar


def theorem1_ratio(graph: Graph, cluster: Cluster, microbatches: int, cut_bytes: np.ndarray) -> float:
    """(2 + (4V-4)/M)(1 + Phi), Phi = max(p_max b_max, d_max) / Gamma x (1/b_min - 1/b_max)."""
    v = len(cluster)
    off = ~np.eye(v, dtype=bool)
    links = cluster.bandwidth[off] if v > 1 else np.array([np.inf])
    b_min, b_max = float(links.min()), float(links.max())
    p = graph.fwd + graph.bwd
    gamma = float(p.sum()) / v
    d_max = 2.0 * float(cut_bytes[1:-1].max()) if cut_bytes.size > 2 else 0.0
    phi = 0.0
    if v > 1 and gamma > 0 and np.isfinite(b_max):
        phi = max(float(p.max()) * b_max, d_max) / gamma * (1 / b_min - 1 / b_max)
    return (2 + (4 * v - 4) / microbatches) * (1 + phi)


def theorem1_assumptions(graph: Graph, cluster: Cluster) -> str | None:
    """Why Theorem 1 does not apply to this instance, or None when it does. Its proof
    (§IV-C) is for SPP's cost model: link time = bytes / bandwidth with no latency, identical
    work per unit of speed (no per-call fixed times, executor overhead, optimizer step,
    contention or several compute resources per device)."""
    if np.any(cluster.latency > 0):
        return "links have latency"
    if np.any(cluster.bandwidth == 0):
        return "some devices are not linked (zero bandwidth)"
    if graph.meta.get("fixed_s") or graph.meta.get("update_s_per_byte"):
        return "the profile has fixed per-call times or an optimizer step"
    if cluster.meta.get("action_overhead_s"):
        return "the cluster has a per-action overhead"
    if cluster.meta.get("update_s_per_byte"):
        return "the cluster has an optimizer step"
    if any(d.solo_speed is not None or len(d.resources) > 1 for d in cluster.devices):
        return "devices have contention or several compute resources"
    return None


def spp_bounds(plan: Plan, iteration_s: float, cut_bytes: np.ndarray) -> dict:
    """SPP's own bounds for a plan it chose: Lemma 1 (an upper bound on PE's time) and, where
    its assumptions hold, Theorem 1's ratio and the lower bound it implies on any plan."""
    out: dict = {"lemma1_s": lemma1(plan)}
    why_not = theorem1_assumptions(plan.graph, plan.cluster)
    if why_not is None:
        ratio = theorem1_ratio(plan.graph, plan.cluster, plan.microbatches, cut_bytes)
        out["spp_theorem1"] = {"ratio": ratio, "lower_s": iteration_s / ratio}
    else:
        out["spp_theorem1"] = {"not_applicable": why_not}
    return out
