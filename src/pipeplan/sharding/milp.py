"""The exact yardstick: the same sharding choice as an integer program (HiGHS via
``scipy.optimize.milp``; pipeplan's addition to Auto-MAP §3.2, docs/opp.md).

One binary per op and placement tuple its rule allows (``y``), one per tensor and placement
(``x``); each op runs exactly one tuple, each tensor holds exactly one placement, and an op's
tuple puts on each of its tensors the placement that tensor holds (``sum_k y[o,k] [tuple k
puts c on slot s] = x[t,c]``). All-reduces are binaries per tensor (through its views) forced
to 1 by any tuple that needs them, so a tensor is all-reduced once however many ops need it.

Objectives: ``cost`` (the predicted step time of ``cost.CostModel``, with the devices' memory
as a constraint) or ``paper`` (Auto-MAP's reward summed over the plan, maximized: the caller
gives each (tensor, placement) its reward, ``decisions.placement_rewards``). The program is exact
for the rule book: any plan it returns propagates without conflict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import coo_matrix

from ..errors import PipeplanError
from .cost import CostModel
from .propagate import Domains, bit, codes


@dataclass(frozen=True)
class MilpResult:
    """The optimum: each tensor's placement code, the objective, HiGHS's status and time."""

    placement: dict[int, int]
    objective: float
    optimal: bool
    seconds: float
    variables: int
    constraints: int
    message: str


class _Builder:
    """Sparse rows of the program, one variable block at a time."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def row(self, entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lb)
        for c, v in entries:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lb.append(lo)
        self.ub.append(hi)


def solve(model: CostModel, dom: Domains, objective: str = "cost", time_limit: float | None = None,
          memory: bool = True, rewards: dict[tuple[int, int], float] | None = None,
          node_limit: int | None = None) -> MilpResult:
    """The best plan among those ``dom`` allows (``rewards``: the ``paper`` objective's), HiGHS
    stopping after ``node_limit`` branch-and-bound nodes (reproducible) or ``time_limit``
    seconds (a cap), if given; ``optimal`` says whether it proved the plan best."""
    prop = model.prop
    xs = {(t, c): i for i, (t, c) in enumerate((t, c) for t in range(len(dom)) for c in codes(dom[t]))}
    n = len(xs)
    cost: list[float] = [0.0] * n
    b = _Builder()
    for t in range(len(dom)):
        b.row([(xs[(t, c)], 1.0) for c in codes(dom[t])], 1, 1)
    ar_var: dict[tuple[str, int], int] = {}
    floor = 0.0  # the cheapest tuple of every op, no communication: a lower bound of the cost
    for o, table in enumerate(prop.tables):
        alive = table.alive(dom)
        ys = list(range(n, n + len(alive)))
        n += len(alive)
        tc = model.tuples[o]
        cost += [tc.compute[k] + tc.extra_comm[k] for k in alive]
        floor += min(cost[-len(alive):]) if alive else 0.0
        b.row([(y, 1.0) for y in ys], 1, 1)
        for s, t in enumerate(table.slots):
            if all(table.tuples[k][s].bit_count() > 1 for k in alive):
                continue  # the op reads only this tensor's shape
            for c in codes(dom[t]):
                entries = [(y, 1.0) for y, k in zip(ys, alive) if table.tuples[k][s] == bit(c)]
                b.row(entries + [(xs[(t, c)], -1.0)], 0, 0)
        for y, k in zip(ys, alive):
            for kind, tensors in tc.comm_sets(k):
                for r in tensors:
                    if (kind, r) not in ar_var:
                        ar_var[(kind, r)] = n
                        cost.append(float(model.price[kind][r]))
                        n += 1
                    b.row([(ar_var[(kind, r)], 1.0), (y, -1.0)], 0, np.inf)
    c = np.zeros(n)
    if objective == "cost":
        c[:len(cost)] = cost
    elif objective == "paper" and rewards is not None:
        for key, r in rewards.items():
            c[xs[key]] = -r
    else:
        raise ValueError(f"objective {objective!r}: 'cost', or 'paper' with rewards")
    if memory and objective == "cost" and np.isfinite(model.memory):
        entries = [(i, (model.param_mem[t] + model.act_mem[t]) / (model.n if code >= 2 else 1))
                   for (t, code), i in xs.items() if model.param_mem[t] + model.act_mem[t] > 0]
        b.row(entries, -np.inf, float(model.memory))
    A = coo_matrix((b.vals, (b.rows, b.cols)), shape=(len(b.lb), n)).tocsr()
    # an objective of at least 1: HiGHS also stops on an absolute gap (1e-6)
    scale = 1.0 / floor if objective == "cost" and floor > 0 else 1.0
    t0 = time.perf_counter()
    res = milp(c * scale, integrality=np.ones(n), bounds=(0, 1), constraints=LinearConstraint(A, b.lb, b.ub),
               options={"disp": False, "mip_rel_gap": 1e-9,
                        **({"time_limit": time_limit} if time_limit is not None else {}),
                        **({"node_limit": node_limit} if node_limit is not None else {})})
    seconds = time.perf_counter() - t0
    if res.status == 2:
        raise PipeplanError("no sharding plan fits the devices' memory (the integer program is infeasible)")
    if res.x is None:
        raise PipeplanError(f"the integer program found no plan within its budget ({res.message}): give it more "
                            "--nodes or --budget")
    placement = {t: code for (t, code), i in xs.items() if res.x[i] > 0.5}
    value = float(res.fun) / scale * (1 if objective == "cost" else -1)
    return MilpResult(placement, value, res.status == 0, seconds, n, len(b.lb), res.message)
