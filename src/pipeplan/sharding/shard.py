"""``pipeplan shard``: Auto-MAP's operator partitioning or auto data parallelism of a PyTorch
model, by the paper's DQN (``sharding.dqn``), by the integer program (``sharding.milp``), or both; the
plan as JSON (each parameter's and input's partitioned dimension), its predicted step and,
on request, a real run with DTensor (``runtime.tensor_parallel``).

The devices are the first N of the cluster (default ``automap-c``: Auto-MAP's Table 2, 8 V100
a server over NVLink, 25 Gbps between servers), cut along one line as the paper does.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

from ..cluster import Cluster, load_cluster
from ..errors import PipeplanError
from .cost import PlanCost
from .milp import solve
from .program import INPUT, export_module
from .propagate import Domains, bit, cut_dim, is_strided
from ..learn.harness import Budget, Progress
from .dqn import Config, ShardProblem, search

METHODS = ("dqn", "milp", "both")
REWARDS = ("paper", "cost")
MAX_SEED = 2**32 - 1  # numpy's and torch's generators both take it


#: The searches' budgets by default, so that the same command gives the same plan on any machine:
#: DQN episodes (T5-base on 4 devices meets Table 3 within ~450, benchmarks/results/automap/shard-t5.md)
#: and the integer program's branch-and-bound nodes.
DEFAULT_EPISODES = 500
DEFAULT_NODES = 20_000


@dataclass
class ShardRequest:
    """What to shard, on what, and how to search."""

    spec: str
    devices: int
    cluster: "str | Cluster" = "automap-c"  # a spec, or a Cluster (a calibrated one)
    adp: bool = False
    hybrid: bool = False
    method: str = "dqn"
    reward: str = "cost"
    episodes: int = DEFAULT_EPISODES  # the DQN's budget
    nodes: int = DEFAULT_NODES  # the integer program's budget: branch-and-bound nodes
    budget_s: float | None = None  # an optional wall-clock cap on either
    seed: int = 0
    batch: int = 8
    seq: int = 32

    def check(self) -> None:
        if self.devices < 2:
            raise PipeplanError(f"--devices must be >= 2, got {self.devices}")
        if self.method not in METHODS:
            raise PipeplanError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.reward not in REWARDS:
            raise PipeplanError(f"--reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if self.adp and self.hybrid:
            raise PipeplanError("--adp and --hybrid exclude each other (--hybrid decides inputs and parameters)")
        if self.hybrid and self.reward != "cost":
            raise PipeplanError("--hybrid needs --reward cost (the paper's reward does not price the gathers)")
        if not 0 <= self.seed <= MAX_SEED:
            raise PipeplanError(f"--seed must be between 0 and {MAX_SEED}, got {self.seed}")
        if self.episodes < 1 or self.nodes < 1:
            raise PipeplanError(f"--episodes and --nodes must be >= 1, got {self.episodes} and {self.nodes}")
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise PipeplanError(f"--budget must be a finite number of seconds > 0, got {self.budget_s}")


def _entries(problem: ShardProblem, dom: Domains, kind: str, aliases: dict[str, str]) -> list[dict]:
    tensors = problem.prop.prog.of_kind(kind)
    return [{"name": aliases.get(t.source, t.source), "shape": list(t.shape), "partition_dim": cut_dim(dom[t.id]),
             "strided": is_strided(dom[t.id])} for t in tensors]


def check_runnable(out: dict) -> None:
    """Refuse to run a plan the runtime cannot place: a parameter cut strided (block by block,
    GPT-2's fused q | k | v cut by heads) has no DTensor placement yet."""
    strided = [p["name"] for p in out["parameters"] if p["strided"]]
    if strided:
        raise PipeplanError(f"--run: {strided[0]} is cut strided (block by block), which is not runnable yet "
                            f"({len(strided)} such parameter(s)); plan without --run")


def _cost_dict(c: PlanCost | None) -> dict | None:
    """JSON-ready; a plan the cost model cannot price (infinite) reads as null."""
    if c is None:
        return None
    if not math.isfinite(c.step_s):
        return {"step_s": None, "compute_s": None, "comm_s": None, "collectives": None, "by_phase": None,
                "memory_bytes": None, "fits": False}
    return {"step_s": c.step_s, "compute_s": c.compute_s, "comm_s": c.comm_s, "collectives": c.collectives,
            "by_phase": c.by_phase, "memory_bytes": c.memory_bytes, "fits": c.fits}


def exported(spec: str, batch: int, seq: int, seed: int):
    """(the model on the meta device, its exported program): exported once per process (an
    export takes seconds; a sweep over devices, clusters or seeds reuses it). Shared: read-only.
    A built-in model's seed is left out of the cache key: on the meta device it draws nothing;
    a user's factory may size its model from it."""
    return _exported(spec, batch, seq, seed if ":" in spec else 0)


@functools.lru_cache(maxsize=16)
def _exported(spec: str, batch: int, seq: int, seed: int):
    from .models import load_shard_model

    model = load_shard_model(spec, batch=batch, seq=seq, meta=True, seed=seed)
    return model, export_module(model.module, model.inputs, spec, model.input_names)


def build_problem(req: ShardRequest):
    """(the model, its sharding problem, seconds spent building them)."""
    t0 = time.perf_counter()
    cluster = load_cluster(req.cluster) if isinstance(req.cluster, str) else req.cluster
    if len(cluster) < req.devices:  # before the export, which takes seconds
        raise PipeplanError(f"--devices {req.devices}: cluster {cluster.name!r} has only {len(cluster)} devices")
    model, prog = exported(req.spec, req.batch, req.seq, req.seed)
    problem = ShardProblem.build(prog, req.devices, cluster, adp=req.adp, costed=req.hybrid)
    return model, problem, time.perf_counter() - t0


def _milp(problem: ShardProblem, req: ShardRequest) -> tuple[Domains, dict]:
    """The integer program's plan: every tensor's placement (activations too), propagated."""
    objective = "paper" if req.reward == "paper" else "cost"
    res = solve(problem.cost, problem.start, objective, time_limit=req.budget_s, node_limit=req.nodes,
                rewards=problem.rewards() if objective == "paper" else None)
    dom, conflict = problem.prop.narrow(problem.start, {t: bit(c) for t, c in res.placement.items()})
    assert conflict is None, problem.prop.describe_conflict(conflict)  # the same rules: never
    info = {"objective": res.objective, "optimal": res.optimal, "seconds": res.seconds, "variables": res.variables,
            "constraints": res.constraints}
    return dom, info


def shard(req: ShardRequest, progress: Progress | None = None) -> dict:
    """Search a plan as ``req`` says; the JSON-ready result."""
    req.check()
    model, problem, build_s = build_problem(req)
    aliases = model.aliases()
    cluster_name = req.cluster if isinstance(req.cluster, str) else req.cluster.name
    out: dict = {"model": req.spec, "devices": req.devices, "cluster": cluster_name, "mode": "adp" if req.adp else "hybrid" if req.hybrid else "opp",
                 "method": req.method, "reward": req.reward, "build_s": build_s,
                 "positions": len(problem.positions), "undecided_at_start": len(problem.order),
                 "ops_without_rule": problem.prop.unknown,
                 "replicated": _cost_dict(problem.baseline)}
    chosen: Domains | None = None
    if req.method in ("dqn", "both"):
        t0 = time.perf_counter()
        res = search(problem, Budget(req.budget_s, req.episodes), Config(reward=req.reward, adp=req.adp, seed=req.seed),
                     progress)
        chosen = res.domains
        out["dqn"] = {"search_s": time.perf_counter() - t0, "found_s": res.found_s, "stage1_s": res.stage1_s,
                      "episodes": res.episodes, "conflicts": res.conflicts, "paper_score": res.score,
                      "predicted": _cost_dict(problem.cost.evaluate(res.domains))}
        out["search_s"] = out["dqn"]["search_s"]
    if req.method in ("milp", "both"):
        dom, info = _milp(problem, req)
        info["paper_score"] = problem.score(dom)
        info["predicted"] = _cost_dict(problem.cost.evaluate(dom))
        out["milp"] = info
        if chosen is None:
            chosen, out["search_s"] = dom, info["seconds"]
    chosen = _against_replicated(problem, chosen, req.reward, out)
    out["parameters"] = _entries(problem, chosen, "param", aliases)
    out["inputs"] = _entries(problem, chosen, INPUT, aliases)
    out["predicted"] = _cost_dict(problem.cost.evaluate(chosen))
    out["paper_score"] = problem.score(chosen)
    return out


def _better(a: PlanCost, b: PlanCost) -> bool:
    """Whether plan ``a`` is predicted better than ``b``: fitting in memory first, then faster."""
    return (a.fits, -a.step_s) > (b.fits, -b.step_s)


def _against_replicated(problem: ShardProblem, chosen: Domains, reward: str, out: dict) -> Domains:
    """The plan to return: with the cost reward, everything replicated where it is predicted
    better than the search's plan (the search's plan kept as ``out["searched"]``); with the
    paper's reward (partitions, not time) the search's plan, ``out["replicated_better"]``
    saying whether everything replicated is predicted better."""
    searched = problem.cost.evaluate(chosen)
    out["replicated_better"] = _better(problem.baseline, searched)
    out["returned"] = "searched"
    if out["replicated_better"] and reward == "cost":
        out["searched"] = _cost_dict(searched)
        out["returned"] = "replicated"
        return problem.replicated
    return chosen
