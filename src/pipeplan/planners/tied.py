"""Tied parameters are a constraint on every plan: the nodes that share a parameter
(``Graph.tied``: tied input and output embeddings, a module called twice) run in one stage,
where the parameter has one gradient and one update. Planners search as if it were not there;
``run_planner`` hands each plan to :func:`keep_tied_together`, which merges the stages a
tied group spans (and those between them, so that stages still follow the data flow) into
one stage on all their devices, or refuses in one line when the merged plan is not a valid one.
"""

from __future__ import annotations

import dataclasses

from ..errors import Infeasible, PipeplanError
from ..plan import Plan, Stage, is_decoder


def _spans(plan: Plan) -> list[tuple[int, int, list[str]]]:
    """Runs of stages [lo, hi] that must become one, each with the tied parameters that cut them."""
    stage_of = {nid: k for k, s in enumerate(plan.stages) for nid in s.nodes}
    cut = sorted((min(ks), max(ks), name) for name, ids in plan.graph.tied.items()
                 if len(ks := {stage_of[nid] for nid in ids}) > 1)
    spans: list[tuple[int, int, list[str]]] = []
    for lo, hi, name in cut:
        if spans and lo <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(hi, spans[-1][1]), spans[-1][2] + [name])
        else:
            spans.append((lo, hi, [name]))
    return spans


def _merged_stages(plan: Plan, spans: list[tuple[int, int, list[str]]]) -> tuple[list[Stage], list[bool] | None]:
    """The plan's stages with each span merged: nodes in order, devices united in order; a
    merged stage re-materializes if any of its parts did."""
    start = {lo: hi for lo, hi, _ in spans}
    stages: list[Stage] = []
    recompute: list[bool] = []
    k = 0
    while k < len(plan.stages):
        hi = start.get(k, k)
        parts = plan.stages[k:hi + 1]
        stages.append(Stage([n for s in parts for n in s.nodes], list(dict.fromkeys(d for s in parts for d in s.devices))))
        recompute.append(any(plan.recomputes(j) for j in range(k, hi + 1)))
        k = hi + 1
    return stages, (recompute if plan.recompute is not None else None)


def keep_tied_together(plan: Plan) -> Plan:
    """``plan`` if no tied group spans two stages; else the plan with those stages merged,
    the merge recorded in ``extra["tied"]`` (parameter -> the stages it joined). A decoder LLM
    runs as Megatron-LM runs it instead: the last stage holds a copy of the tied embedding
    (``sim.tensor_groups``) whose gradient it all-reduces with the first."""
    if is_decoder(plan.graph):
        return plan
    spans = _spans(plan)
    if not spans:
        return plan
    names = ", ".join(repr(n) for _, _, group in spans for n in group)
    if plan.allocation is not None:
        raise PipeplanError(f"plan ({plan.planner}): tied parameter(s) {names} span stages whose resources it "
                            "splits; put the nodes that share them in one stage")
    stages, recompute = _merged_stages(plan, spans)
    merged = {n: [lo, hi] for lo, hi, group in spans for n in group}
    try:
        return dataclasses.replace(plan, stages=stages, recompute=recompute, prediction={},
                                   extra={**plan.extra, "tied": {"merged_stages": merged}})
    except (PipeplanError, Infeasible) as e:
        raise PipeplanError(f"plan ({plan.planner}): tied parameter(s) {names} span stages that cannot be merged "
                            f"into one ({e})") from None
