"""Where a plan's iteration goes, term by term (``pipeplan explain``, docs/llm.md).

The iteration of the busiest device (of a decoder LLM plan: tensor-parallel group, the
bottleneck) is split into terms that
add up to the simulated iteration: its forward and backward compute, what recomputation runs
again, its exposed tensor-parallel collectives (they are on the critical path of every
layer), its context-parallel key/value exchange and expert all-to-alls as far as exposed, its pipeline sends while it waits for them (Megatron's blocking p2p), the
data-parallel gradient reduction left exposed, the optimizer step, and the time it idles for
other stages (the pipeline bubble). A compute task's seconds are split in the proportions of
its stage's parts (``llm.costs.NodeParts``), as the simulator costed it (other graphs:
forward and backward whole, re-materialization inside the backward). A forward and backward
run as an overlapped pair (DualPipe, ``Schedule.overlap_pairs``) credit their compute whole and
what the pair takes beyond it to the expert all-to-alls: the exchanges left exposed and the
compute slowed by the SMs they hold (``sim.durations.pair_s``). With two
plans, their difference term by term: "plan B is 1.4x faster" read as so many seconds from
recomputation, so many from the bubble, ...
"""

from __future__ import annotations

import numpy as np

from ..errors import PipeplanError
from ..plan import Plan
from ..schedule import Kind
from .simulate import schedule_of, simulate
from .durations import STAGE_STEP_EXTRA_S
from .tensor_groups import STAGE_PARTS, lower, needs_lowering

TERMS = ("forward", "backward", "recompute", "tp_comm", "cp_comm", "ep_comm", "pipeline_sends", "dp_comm", "optimizer", "bubble", "other")
#: each term as the reports name it
TERM_TEXT = {"forward": "forward compute", "backward": "backward compute", "recompute": "recomputation",
             "tp_comm": "tensor-parallel communication", "cp_comm": "context-parallel key/value exchange (exposed)",
             "ep_comm": "expert dispatch and combine (all-to-all)", "pipeline_sends": "pipeline sends (exposed)",
             "dp_comm": "data-parallel reduction (exposed)", "optimizer": "optimizer step",
             "bubble": "pipeline bubble (idle)", "other": "other"}
#: a stage's parts where no family prices them apart (graphs other than decoder LLMs): its
#: forward and backward whole
_WHOLE = {"fwd": 1.0, "fwd_tp": 0.0, "bwd": 1.0, "recompute": 0.0, "bwd_tp": 0.0, "fwd_cp": 0.0, "bwd_cp": 0.0,
          "fwd_ep": 0.0, "bwd_ep": 0.0}
_COMPUTE = {int(Kind.F): (("forward", "fwd"), ("tp_comm", "fwd_tp"), ("cp_comm", "fwd_cp"), ("ep_comm", "fwd_ep")),
            **{int(k): (("backward", "bwd"), ("recompute", "recompute"), ("tp_comm", "bwd_tp"), ("cp_comm", "bwd_cp"),
                        ("ep_comm", "bwd_ep"))
               for k in (Kind.B, Kind.I, Kind.W)}}


def explain(plan: Plan) -> dict:
    """``{"iteration_s", "terms": {term: seconds}, "device", "gpus"}``: the bottleneck group's
    iteration split (module docstring); the terms sum to ``iteration_s``."""
    low = lower(plan).plan if needs_lowering(plan) else plan
    r = simulate(low)
    tl = r.timeline
    if tl is None:
        raise PipeplanError(f"explain: schedule {plan.schedule} of this plan runs as a steady state; no iteration "
                            "to split")
    parts = low.graph.meta.get(STAGE_PARTS) or [_WHOLE] * low.num_stages
    rows = [i for i, dev in enumerate(tl.resource_is_device) if dev]
    d = max(rows, key=lambda i: float(r.busy_s[i]) if i < len(r.busy_s) else 0.0)
    terms = dict.fromkeys(TERMS, 0.0)
    mine = np.flatnonzero(tl.resource == d)
    extra = low.graph.meta.get(STAGE_STEP_EXTRA_S) or [0.0] * low.num_stages
    before_step = sum(extra[s] for s in set(tl.stage[mine].tolist()))  # the tied embedding's reduction
    paired = _paired(tl, mine, low, tl.resources[d])
    for t in mine.tolist():
        seconds = float(tl.end[t] - tl.start[t])
        if int(tl.kind[t]) == int(Kind.UPDATE):
            terms["dp_comm"] += min(before_step, seconds)
            seconds -= min(before_step, seconds)
        _credit(terms, int(tl.kind[t]), parts[int(tl.stage[t])], seconds, t in paired)
    sends = _own_sends(tl, mine)
    for a, b in _gaps(tl, mine, r.iteration_s):
        waited = sum(max(0.0, min(b, float(tl.end[s])) - max(a, float(tl.start[s]))) for s in sends)
        terms["pipeline_sends"] += min(waited, b - a)
        terms["bubble"] += b - a - min(waited, b - a)
    terms["other"] = r.iteration_s - sum(v for k, v in terms.items() if k != "other")
    return {"iteration_s": r.iteration_s, "terms": terms, "device": tl.resources[d],
            "gpus": r.members.get(tl.resources[d], [tl.resources[d]])}


def clean(seconds: float, iteration_s: float) -> float:
    """0 for what is only the floating-point residue of a sum (under 1e-9 of the iteration):
    no "7.1e-14 s" of "other", no -0.0%."""
    return 0.0 if abs(seconds) <= 1e-9 * abs(iteration_s) else seconds


def _paired(tl, mine: np.ndarray, low: Plan, device: str) -> set[int]:
    """The device's tasks that ran as one of an overlapped pair (``Program.partners``): its
    compute tasks in time order are its program's F, B, I and W in order."""
    sched = schedule_of(low)
    if not sched.overlap_pairs or device not in low.cluster.names:
        return set()
    prog = dict(zip(sched.devices, sched.programs))[low.cluster.names.index(device)]
    partner = prog.partners()[prog.kinds != int(Kind.AR)]
    comp = [t for t in mine[np.argsort(tl.start[mine], kind="stable")].tolist() if int(tl.kind[t]) in _COMPUTE]
    return {t for t, p in zip(comp, partner.tolist()) if p >= 0}


def _credit(terms: dict[str, float], kind: int, part: dict[str, float], seconds: float, paired: bool = False) -> None:
    """A task's seconds to its terms: compute in its stage's proportions, else by its kind;
    one of an overlapped pair, its compute whole and the rest to the all-to-alls."""
    if kind in _COMPUTE and paired:
        keys = [(term, key) for term, key in _COMPUTE[kind] if term != "ep_comm"]
        for term, key in keys:
            terms[term] += part[key]
        terms["ep_comm"] += seconds - sum(part[key] for _, key in keys)
    elif kind in _COMPUTE:
        total = sum(part[key] for _, key in _COMPUTE[kind])
        for term, key in _COMPUTE[kind]:
            terms[term] += seconds * (part[key] / total if total > 0 else 1.0 / len(_COMPUTE[kind]))
    elif kind == int(Kind.AR):
        terms["dp_comm"] += seconds
    elif kind == int(Kind.UPDATE):
        terms["optimizer"] += seconds
    else:
        terms["other"] += seconds


def _own_sends(tl, mine: np.ndarray) -> list[int]:
    """The transfers this device sends: forwards of the (stage, microbatch) it ran forward,
    gradients of those it ran backward."""
    ran = {(int(tl.kind[t]), int(tl.stage[t]), int(tl.micro[t])) for t in mine.tolist()}
    out = []
    for t in np.flatnonzero(~np.asarray(tl.resource_is_device)[tl.resource]).tolist():
        k, s, m = int(tl.kind[t]), int(tl.stage[t]), int(tl.micro[t])
        if (k == Kind.SEND_F and (int(Kind.F), s, m) in ran) or (
                k == Kind.SEND_B and any((int(b), s, m) in ran for b in (Kind.B, Kind.I))):
            out.append(t)
    return out


def _gaps(tl, mine: np.ndarray, iteration: float) -> list[tuple[float, float]]:
    """The device's idle intervals within [0, iteration]."""
    spans = sorted((float(tl.start[t]), float(tl.end[t])) for t in mine.tolist())
    out, at = [], 0.0
    for a, b in spans:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if iteration > at:
        out.append((at, iteration))
    return out


def difference(a: dict, b: dict) -> dict:
    """Plan B against plan A term by term: seconds saved (A - B) and each term's share of the
    iteration saved."""
    saved = {k: a["terms"][k] - b["terms"][k] for k in TERMS}
    total = a["iteration_s"] - b["iteration_s"]
    return {"saved_s": saved, "iteration_saved_s": total, "speedup": a["iteration_s"] / b["iteration_s"],
            "share_of_a": {k: v / a["iteration_s"] for k, v in saved.items()}}
