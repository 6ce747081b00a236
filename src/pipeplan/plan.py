"""A Plan: ordered stages, each a set of graph nodes and the devices that hold it.

More than one device on a stage = the stage is replicated (data-parallel inside the stage;
each microbatch is split evenly over the replicas, or replicas take whole microbatches in
turn: ``Plan.replicas``).
The JSON form (``"format": "pipeplan.plan/1"``) embeds the graph and the cluster, so a plan
file is self-contained: ``pipeplan simulate plan.json`` needs nothing else.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .cluster import Cluster, cluster_from_full_dict, cluster_to_dict
from .errors import PipeplanError
from .limits import check_microbatches
from .readers import load_json
from .graph import Graph, graph_from_dict, graph_to_dict
from .llm.parallelism import Parallelism, parallelism_from_dict

FORMAT = "pipeplan.plan/1"
#: "split": every replica takes an even share of each microbatch (SPP §III-B);
#: "round-robin": replica r of k takes whole microbatches r, r+k, ... (PipeDream, data parallelism).
REPLICA_MODES = ("split", "round-robin")
#: The longest search a plan file may say it took (a year).
MAX_SEARCH_S = 3.2e7


@dataclass
class Stage:
    """Graph nodes and the devices that hold them. ``tp`` > 1: tensor parallelism (Megatron-LM,
    Shoeybi et al. 2019 §3): the devices, in order, form groups of ``tp`` that each hold the
    stage's layers split over their ranks; the groups are the stage's data-parallel replicas."""

    nodes: list[str]
    devices: list[str]
    tp: int = 1

    @property
    def tp_groups(self) -> list[list[str]]:
        """The stage's tensor-parallel groups (its replicas), consecutive devices."""
        return [self.devices[i:i + self.tp] for i in range(0, len(self.devices), self.tp)]


@dataclass
class Plan:
    graph: Graph
    cluster: Cluster
    stages: list[Stage]
    microbatches: int
    schedule: str = "1f1b"
    planner: str = "manual"
    search_s: float = 0.0
    setup_s: float = 0.0  # one-time set-up before the search (compiling the simulator), not in search_s
    optimizer: str = "adam"
    replicas: str = "split"  # how a stage's replicas share microbatches: "split" or "round-robin"
    allocation: list[dict[str, float]] | None = None  # per stage: resource -> forward share (fb-parallel)
    #: per stage: re-materialize activations (GPipe §2.3): keep only the stage inputs of the
    #: microbatches in flight, run the stage's forward again before each backward
    recompute: list[bool] | None = None
    #: decoder LLM graphs: selective recomputation (Korthikanti et al. 2022 §5: the attention
    #: core again in backward) on the stages that do not recompute fully
    selective: bool = False
    #: decoder LLM graphs: sequence parallelism in the tensor-parallel groups (Korthikanti §4.2.2)
    sequence_parallel: bool = False
    #: 1: ZeRO-1 / Megatron's distributed optimizer, the fp32 master weights and Adam states
    #: sharded over a stage's data-parallel replicas (Rajbhandari et al. 2020)
    zero: int = 0
    #: decoder LLM graphs: each stage's data-parallel all-reduce overlaps the backward of its
    #: last microbatch (Megatron-LM's ``--overlap-grad-reduce``)
    overlap_grad_reduce: bool = False
    #: decoder LLM graphs: the one validated parallel configuration a 3D planner chose
    #: (``llm.parallelism``); the stages and the flags above agree with it (``llm.layout.agrees``)
    parallelism: Parallelism | None = None
    prediction: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate(self)

    # -- resolved views -----------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def stage_nodes(self) -> list[list[int]]:
        return [self.graph.node_indices(s.nodes, where=f"plan stage {k}") for k, s in enumerate(self.stages)]

    def stage_devices(self) -> list[list[int]]:
        return [self.cluster.device_indices(s.devices, where=f"plan stage {k}")
                for k, s in enumerate(self.stages)]

    def stage_of_node(self) -> np.ndarray:
        owner = np.full(len(self.graph), -1, dtype=np.int64)
        for k, idx in enumerate(self.stage_nodes()):
            owner[idx] = k
        return owner

    def recomputes(self, stage: int) -> bool:
        return bool(self.recompute and self.recompute[stage])

    def replication(self) -> list[int]:
        return [len(s.devices) for s in self.stages]

    @property
    def global_batch(self) -> int:
        """Samples an iteration: the graph's microbatch x the microbatches (split replicas share
        a microbatch; round-robin ones take whole microbatches in turn)."""
        return int(self.graph.meta.get("microbatch", 1)) * self.microbatches

    def recompute_mode(self, stage: int) -> str:
        """``full``, ``selective`` or ``none`` (``llm.spec.RECOMPUTE``) for ``stage``."""
        return "full" if self.recomputes(stage) else ("selective" if self.selective else "none")

    @property
    def tensor_parallel(self) -> bool:
        """Some stage runs tensor-parallel."""
        return any(s.tp > 1 for s in self.stages)

    # -- JSON ---------------------------------------------------------------------------
    @property
    def search_complete(self) -> bool:
        """False when a planner stopped its search early (its budget ran out): the plan is the
        best found, not the best there is. Planners say so as ``extra[name]["complete"]``."""
        return not any(isinstance(v, dict) and v.get("complete") is False for v in self.extra.values())

    @property
    def incomplete(self) -> str | None:
        """Why the search is incomplete, in words, as the planner says it
        (``extra[name]["incomplete"]``); None when it is complete."""
        if self.search_complete:
            return None
        said = [v.get("incomplete") for v in self.extra.values() if isinstance(v, dict) and v.get("complete") is False]
        return next((str(w) for w in said if w), "its budget ran out")

    def to_dict(self, embed: bool = True) -> dict:
        d: dict[str, Any] = {
            "format": FORMAT, "planner": self.planner, "schedule": self.schedule,
            "microbatches": self.microbatches, "optimizer": self.optimizer, "replicas": self.replicas,
            **({"allocation": self.allocation} if self.allocation else {}),
            **({"recompute": list(self.recompute)} if self.recompute and any(self.recompute) else {}),
            **({"selective_recompute": True} if self.selective else {}),
            **({"sequence_parallel": True} if self.sequence_parallel else {}),
            **({"zero": self.zero} if self.zero else {}),
            **({"overlap_grad_reduce": True} if self.overlap_grad_reduce else {}),
            **({"parallelism": self.parallelism.as_dict(), "global_batch": self.global_batch}
               if self.parallelism else {}),
            "stages": [{"nodes": list(s.nodes), "devices": list(s.devices),
                        **({"tp": s.tp} if self.tensor_parallel or is_decoder(self.graph) else {})}
                       for s in self.stages],
            "iteration_s": self.prediction.get("iteration_s"), "search_s": self.search_s,
            "setup_s": self.setup_s,
        }
        d.update(self.extra)
        if not self.search_complete:
            d["search_complete"] = False
        if self.prediction:
            d["prediction"] = self.prediction
        if embed:
            d["graph"] = graph_to_dict(self.graph)
            d["cluster"] = cluster_to_dict(self.cluster)
        return d

    def save(self, path: str | Path) -> None:
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


_KNOWN_KEYS = {"format", "planner", "schedule", "microbatches", "optimizer", "replicas", "allocation", "recompute", "stages", "iteration_s",
               "search_s", "setup_s", "prediction", "graph", "cluster", "search_complete", "selective_recompute",
               "sequence_parallel", "zero", "overlap_grad_reduce", "parallelism", "global_batch"}


def is_decoder(graph: Graph) -> bool:
    """A decoder LLM graph (``graph.llm``), whose costs follow from its dimensions."""
    return "decoder" in graph.meta


def plan_from_dict(d: Any, source: str = "plan") -> Plan:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise PipeplanError(f"{source}: not a pipeplan plan (expected \"format\": \"{FORMAT}\")")
    for key in ("graph", "cluster", "stages", "microbatches"):
        if key not in d:
            raise PipeplanError(f"{source}: missing {key!r}")
    graph = graph_from_dict(d["graph"], source=f"{source}: graph")
    cluster = cluster_from_full_dict(d["cluster"], source=f"{source}: cluster")
    stages = []
    if not isinstance(d["stages"], list):
        raise PipeplanError(f"{source}: 'stages' must be a list")
    if len(d["stages"]) > len(graph):  # each stage holds a node: limits before any work
        raise PipeplanError(f"{source}: {len(d['stages']):,} stages for a graph of {len(graph):,} nodes")
    for k, s in enumerate(d["stages"]):
        if not isinstance(s, dict) or not isinstance(s.get("nodes"), list) or not isinstance(s.get("devices"), list):
            raise PipeplanError(f"{source}: stages[{k}] needs lists 'nodes' and 'devices'")
        tp = s.get("tp", 1)
        if isinstance(tp, bool) or not isinstance(tp, int):
            raise PipeplanError(f"{source}: stages[{k}].tp must be an integer, got {tp!r}")
        stages.append(Stage([str(x) for x in s["nodes"]], [str(x) for x in s["devices"]], tp))
    field = _typed_fields(d, source)
    microbatches = field("microbatches", int, None, "an integer")
    if microbatches is None:
        raise PipeplanError(f"{source}: microbatches must be an integer, got null")
    search_s, setup_s = (_seconds(field(key, (int, float), 0.0, "a number"), key, source)
                         for key in ("search_s", "setup_s"))
    return Plan(graph=graph, cluster=cluster, stages=stages, microbatches=microbatches,
                schedule=field("schedule", str, "1f1b", "a string"),
                planner=field("planner", str, "manual", "a string"),
                search_s=search_s, setup_s=setup_s,
                optimizer=field("optimizer", str, "adam", "a string"),
                replicas=field("replicas", str, "split", "a string"), allocation=d.get("allocation"),
                recompute=d.get("recompute"), prediction=field("prediction", dict, {}, "an object"),
                selective=_flag(d, "selective_recompute", source),
                sequence_parallel=_flag(d, "sequence_parallel", source),
                overlap_grad_reduce=_flag(d, "overlap_grad_reduce", source),
                zero=field("zero", int, 0, "0 or 1"),
                parallelism=parallelism_from_dict(d["parallelism"], source) if "parallelism" in d else None,
                extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS})


def _flag(d: dict, key: str, source: str) -> bool:
    """A plan's true/false under ``key`` (false when absent)."""
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise PipeplanError(f"{source}: {key} must be true or false, got {v!r}")
    return v


def _seconds(value: float, key: str, source: str) -> float:
    """A plan's recorded seconds: from 0 to ``MAX_SEARCH_S`` (a year), else one line."""
    if not 0 <= value <= MAX_SEARCH_S:  # exact for any integer; false for NaN
        raise PipeplanError(f"{source}: {key} must be a number from 0 to {MAX_SEARCH_S:g}, got {value!r}")
    return float(value)


def _typed_fields(d: dict, source: str):
    """``field(key, types, default, what)``: the plan's value under ``key`` when of ``types``
    (true is not a number), its default when absent or null, else PipeplanError."""
    def field(key: str, types: type | tuple[type, ...], default: Any, what: str) -> Any:
        v = d.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, types):
            raise PipeplanError(f"{source}: {key} must be {what}, got {v!r}")
        return v
    return field


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    if not os.path.lexists(p):
        raise PipeplanError(f"plan file {str(path)!r} not found")
    return plan_from_dict(load_json(p, "plan file"), source=str(path))


def _check_shared_devices(plan: Plan) -> None:
    """A device holds several stages only when those stages have the same device list (virtual
    stages, or model chunks: Narayanan et al. SC'21 §2.2); a device appears once in a stage."""
    c = plan.cluster
    first: dict[int, int] = {}
    for k, st in enumerate(plan.stages):
        idx = c.device_indices(st.devices, where=f"plan stage {k}")
        if len(set(idx)) != len(idx):
            raise PipeplanError(f"plan: stage {k} lists a device twice")
        same: dict[int, bool] = {}  # stage j's device list against this one's, compared once
        for d in idx:
            j = first.setdefault(d, k)
            if j != k and j not in same:
                same[j] = plan.stages[j].devices == st.devices
            if j != k and not same[j]:
                raise PipeplanError(f"plan: device {c.devices[d].name!r} is in stage {j} and stage {k}, whose "
                                    "device lists differ (a device holds several stages only when they have the "
                                    "same devices, in the same order: virtual stages)")


def _check_parallelism(plan: Plan) -> None:
    """Tensor parallelism, selective recomputation, sequence parallelism and ZeRO-1 are
    modelled for decoder LLM graphs; a stage's devices are whole groups of its ``tp``."""
    if plan.zero not in (0, 1):
        raise PipeplanError(f"plan: zero must be 0 or 1, got {plan.zero!r}")
    for k, st in enumerate(plan.stages):
        if isinstance(st.tp, bool) or not isinstance(st.tp, int) or st.tp < 1:
            raise PipeplanError(f"plan: stage {k} has tp {st.tp!r} (must be an integer >= 1)")
        if len(st.devices) % st.tp:
            raise PipeplanError(f"plan: stage {k} has {len(st.devices)} devices, not a multiple of its tp {st.tp}")
    decoder = is_decoder(plan.graph)
    for what, used in (("tensor parallelism (tp > 1)", plan.tensor_parallel),
                       ("selective recomputation", plan.selective),
                       ("sequence parallelism", plan.sequence_parallel), ("zero", bool(plan.zero)),
                       ("overlap_grad_reduce", plan.overlap_grad_reduce)):
        if used and not decoder:
            raise PipeplanError(f"plan: {what} is modelled for decoder LLM graphs only (zoo:gpt, zoo:llama3-*, "
                                f"hf:), not {plan.graph.name!r}")


def validate(plan: Plan) -> None:
    """Every node in exactly one stage; a device in several stages only when they have the same
    device list (``_check_shared_devices``); devices exist; no graph edge from a later stage to
    an earlier one; M >= 1."""
    g = plan.graph
    if not plan.stages:
        raise PipeplanError("plan: no stages")
    if plan.replicas not in REPLICA_MODES:
        raise PipeplanError(f"plan: replicas must be one of {', '.join(REPLICA_MODES)}, got {plan.replicas!r}")
    if plan.allocation is not None:
        if not isinstance(plan.allocation, list) or len(plan.allocation) != len(plan.stages):
            raise PipeplanError("plan: 'allocation' needs one {resource: forward share} per stage")
        for k, a in enumerate(plan.allocation):
            if not isinstance(a, dict) or any(not isinstance(v, (int, float)) or not 0 <= v <= 1 for v in a.values()):
                raise PipeplanError(f"plan: allocation of stage {k} must map resources to shares in [0, 1]")
    if plan.recompute is not None:
        if (not isinstance(plan.recompute, list) or len(plan.recompute) != len(plan.stages)
                or any(not isinstance(r, bool) for r in plan.recompute)):
            raise PipeplanError("plan: 'recompute' needs one true/false per stage")
    if plan.microbatches < 1:
        raise PipeplanError(f"plan: microbatches must be >= 1, got {plan.microbatches}")
    _check_parallelism(plan)
    check_microbatches(plan.microbatches, "plan")
    if plan.parallelism is not None:
        from .llm.layout import agrees

        agrees(plan)
    owner = np.full(len(g), -1, dtype=np.int64)
    for k, st in enumerate(plan.stages):
        if not st.nodes:
            raise PipeplanError(f"plan: stage {k} has no nodes")
        if not st.devices:
            raise PipeplanError(f"plan: stage {k} has no devices")
        for i in g.node_indices(st.nodes, where=f"plan stage {k}"):
            if owner[i] >= 0:
                raise PipeplanError(f"plan: node {g.ids[i]!r} is in stage {owner[i]} and stage {k}")
            owner[i] = k
    _check_shared_devices(plan)
    missing = np.flatnonzero(owner < 0)
    if missing.size:
        raise PipeplanError(f"plan: node {g.ids[int(missing[0])]!r} is in no stage "
                            f"({missing.size} node(s) unassigned)")
    for u, v in g.edges:
        if owner[u] > owner[v]:
            raise PipeplanError(f"plan: edge {g.ids[u]} -> {g.ids[v]} goes from stage {owner[u]} "
                                f"back to stage {owner[v]} (stages must follow the graph's order)")
