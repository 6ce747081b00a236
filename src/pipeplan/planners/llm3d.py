"""3D parallelism for decoder LLMs (docs/llm.md): tensor x pipeline x data parallelism with the
microbatch size, schedule, recomputation and ZeRO-1 as Megatron-LM runs them (Narayanan et al.
2021 §2-3; Korthikanti et al. 2022), the configurations a user may run, a closed-form estimate
to screen them, and the plan of one.

- Realizable only: TP divides the GPUs of a server and the heads (and key/value heads, or is
  a multiple of them); PP divides the rest and the layers split over it as Megatron can set
  them (``layouts.layer_counts``: equal, or first and last apart); interleaving (v model
  chunks) needs the layers divisible by PP x v and the microbatches of a replica by PP; every
  replica gets whole samples (the global batch = microbatch x microbatches x DP).
- Ranks as Megatron lays them out: TP fastest, then DP, then PP: pipeline position s holds
  GPUs s·d·t ... (s+1)·d·t - 1, in TP groups of t consecutive GPUs; model chunk j sits on
  position j mod PP; the replicas take whole microbatches in turn.
- The estimate (screening only; ``simulate`` decides): per replica, (m + (PP - 1) / v) x the
  slowest position's forward + backward per microbatch (zero-bubble H1: a third of the
  bubble), plus the stage's data-parallel all-reduce; per GPU memory: the state (18 bytes a
  parameter, 6 + 12 / DP with ZeRO-1) / TP plus the activations of the microbatches in flight
  on the first position (PP of them; interleaved, PP (1 + (PP - 1) / (PP v)), §2.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from ..cluster import Cluster
from ..cluster.kinds import KINDS
from ..errors import PipeplanError
from ..graph import Graph
from ..graph.llm import RECOMPUTE, DecoderSpec, decoder_of
from ..graph.scale import with_microbatch
from ..layouts import layer_counts, megatron_stages
from ..plan import Plan
from ..sim.collectives import group_links
from ..sim.formulas import state_bytes
from ..sim.tensor_groups import node_costs

#: Model chunks per GPU tried at most (interleaved 1F1B)
MAX_CHUNKS = 8
#: Samples per microbatch tried at most
MAX_MICROBATCH = 16


@dataclass(frozen=True)
class Config:
    """One 3D configuration (module docstring); ``dp`` follows from the GPUs."""

    tp: int
    pp: int
    dp: int
    vpp: int
    microbatch: int
    recompute: str
    zero: int
    sp: bool
    schedule: str
    overlap: bool = False

    def as_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "virtual_stages": self.vpp,
                "microbatch": self.microbatch, "recompute": self.recompute, "zero": self.zero,
                "sequence_parallel": self.sp, "schedule": self.schedule, "overlap_grad_reduce": self.overlap}


@dataclass(frozen=True)
class Pins:
    """Dimensions a user fixes (None: searched)."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    microbatch: int | None = None
    recompute: str | None = None
    zero: int | None = None
    sp: bool | None = None
    schedule: str | None = None
    overlap: bool | None = None


def spec_of(graph: Graph) -> DecoderSpec:
    return decoder_of(graph.meta, f"model {graph.name!r}")


def server_size(cluster: Cluster) -> int:
    return min(len(s) for s in cluster.servers())


def tp_degrees(spec: DecoderSpec, cluster: Cluster) -> list[int]:
    """TP degrees that divide a server's GPUs and split the heads (module docstring)."""
    per = server_size(cluster)
    return [t for t in range(1, per + 1) if per % t == 0 and len(cluster) % t == 0 and spec.heads % t == 0
            and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def configs(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins = Pins()) -> list[Config]:
    """Every realizable configuration that agrees with ``pins`` (module docstring), less the
    dominated ones unless pinned: without ZeRO-1 where there are replicas (the same time,
    more memory: its reduce-scatter and all-gather move what the all-reduce does), without
    overlapping the gradient all-reduce with the last backward where there are replicas, without
    sequence parallelism under TP (the same collectives' bytes, more memory and memory-bound
    time), zero-bubble H1 on a one-stage pipeline (1F1B's program)."""
    out = []
    pick = lambda pinned, choices: [pinned] if pinned is not None else choices  # noqa: E731
    for t in pick(pins.tp, tp_degrees(spec, cluster)):
        for p in pick(pins.pp, [p for p in _divisors(len(cluster) // t) if p <= spec.layers]):
            if (len(cluster) % (t * p)) or layer_counts(spec.layers, p) is None:
                continue
            d = len(cluster) // (t * p)
            if global_batch % d:
                continue
            for b in pick(pins.microbatch, [b for b in _divisors(global_batch // d) if b <= MAX_MICROBATCH]):
                if (global_batch // d) % b:
                    continue
                m = global_batch // (d * b)
                for v, sched in _schedules(spec, p, m, pins):
                    for rc in pick(pins.recompute, list(RECOMPUTE)):
                        for z in pick(pins.zero, [1] if d > 1 else [0]):
                            sp = (t > 1) if pins.sp is None else (pins.sp and t > 1)
                            ov = (d > 1) if pins.overlap is None else (pins.overlap and d > 1)
                            out.append(Config(t, p, d, v, b, rc, z, sp, sched, ov))
    return out


def _schedules(spec: DecoderSpec, pp: int, m: int, pins: Pins) -> list[tuple[int, str]]:
    """(chunks, schedule) pairs: 1F1B and zero-bubble H1 with one chunk, interleaved 1F1B with
    v >= 2 where the layers divide into PP x v chunks and the replica's microbatches into PP."""
    out = []
    for v in ([pins.vpp] if pins.vpp is not None else range(1, MAX_CHUNKS + 1)):
        if v == 1:
            out += [(1, s) for s in ("1f1b", "zb-h1") if pins.schedule in (None, s) and (pp > 1 or s == "1f1b"
                                                                                          or pins.schedule == s)]
        elif pp >= 2 and spec.layers % (pp * v) == 0 and m % pp == 0 and pins.schedule in (None, "interleaved-1f1b"):
            out.append((v, "interleaved-1f1b"))
    return out


# -- the plan of a configuration ----------------------------------------------------------------
def plan_of(graph: Graph, cluster: Cluster, cfg: Config, global_batch: int, optimizer: str = "adam") -> Plan:
    """The plan Megatron-LM runs for ``cfg`` (``layouts.megatron_stages``), its graph at
    ``cfg.microbatch``."""
    spec = spec_of(graph)
    stages = megatron_stages(cluster.names, spec.layers, cfg.tp, cfg.pp, cfg.dp, cfg.vpp)
    plan = Plan(with_microbatch(graph, cfg.microbatch), cluster, stages, global_batch // cfg.microbatch,
                schedule=cfg.schedule, optimizer=optimizer, replicas="round-robin",
                recompute=[cfg.recompute == "full"] * len(stages), selective=cfg.recompute == "selective",
                sequence_parallel=cfg.sp, zero=cfg.zero, overlap_grad_reduce=cfg.overlap)
    plan.extra["parallelism"] = {**cfg.as_dict(), "global_batch": global_batch}
    return plan


# -- the closed-form estimate -------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    iteration_s: float
    memory_bytes: float  # per GPU, the first pipeline position
    fits: bool


@lru_cache(maxsize=4096)
def _per_microbatch(spec: DecoderSpec, kind_name: str, b: int, t: int, sp: bool, rc: str,
                    links: tuple[float, float]) -> tuple[float, float, float, float, float, float]:
    """(layer f+b seconds, layer bytes kept, embed f+b, head f+b, head bytes kept, layer b) of
    one rank."""
    kind = KINDS[kind_name]
    lf, lb, lkept = node_costs(spec, "layer", kind, b, t, sp, rc, links)
    ef, eb, _ = node_costs(spec, "embed", kind, b, t, sp, rc, links)
    hf, hb, hkept = node_costs(spec, "head", kind, b, t, sp, rc, links)
    return lf + lb, lkept, ef + eb, hf + hb, hkept, lb


def estimate(spec: DecoderSpec, cluster: Cluster, cfg: Config, global_batch: int, optimizer: str = "adam") -> Estimate:
    """The screening estimate of ``cfg`` (module docstring)."""
    kind = cluster.devices[0].kind.lower()
    links = group_links(cluster, list(range(cfg.tp))) if cfg.tp > 1 else (0.0, 0.0)
    layer, kept, embed, head, head_kept, layer_bwd = _per_microbatch(spec, kind, cfg.microbatch, cfg.tp, cfg.sp,
                                                          cfg.recompute, links)
    per_pos = max(layer_counts(spec.layers, cfg.pp, cfg.vpp) or [math.ceil(spec.layers / cfg.pp)]) * cfg.vpp
    m = global_batch // (cfg.dp * cfg.microbatch)
    slowest = per_pos * layer + max(embed, head)
    bubble = (cfg.pp - 1) / cfg.vpp / (3.0 if cfg.schedule == "zb-h1" else 1.0)
    params = 2.0 * (per_pos * spec.layer_params() + max(spec.embedding_params(), spec.head_params()))
    ar = 0.0
    if cfg.dp > 1:  # rank 0 of each replica of the first position: the slowest link of their ring
        rail = cluster.group_min_bandwidth(range(0, cfg.dp * cfg.tp, cfg.tp))
        ar = 2.0 * (cfg.dp - 1) / cfg.dp * params / cfg.tp / (rail * float(cluster.meta.get("allreduce_efficiency", 1.0)))
    if cfg.overlap:  # all but what outlasts the last microbatch's backward on the first position
        ar = max(ar - per_pos * layer_bwd, 0.0)
    iteration = (m + bubble) * slowest + ar
    flight = min(cfg.pp, m) * (1.0 + (cfg.pp - 1) / (cfg.pp * cfg.vpp) if cfg.vpp > 1 else 1.0)
    state = state_bytes(params, optimizer, "bf16", cfg.dp if cfg.zero else 1) / cfg.tp
    memory = state + flight * per_pos * kept + (head_kept if cfg.pp == 1 else 0.0)
    return Estimate(iteration, memory, memory <= float(cluster.memory.min()))


# -- choosing -----------------------------------------------------------------------------------
def global_batch_of(graph: Graph, global_batch: int | None, microbatches: int) -> int:
    """Samples per iteration: ``--global-batch``, else the graph's microbatch x ``--microbatches``."""
    return int(global_batch) if global_batch else int(graph.meta.get("microbatch", 1)) * microbatches


def screened(spec: DecoderSpec, cluster: Cluster, cands: list[Config], global_batch: int,
             optimizer: str) -> list[tuple[Config, Estimate]]:
    """``cands`` with their estimates, those that fit first, each part fastest first."""
    rows = [(c, estimate(spec, cluster, c, global_batch, optimizer)) for c in cands]
    rows.sort(key=lambda r: (not r[1].fits, r[1].iteration_s if r[1].fits else r[1].memory_bytes))
    return rows


def rule_of_thumb(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins, optimizer: str) -> Config:
    """Megatron-LM's rules of thumb (Narayanan et al. 2021 §3.3, Korthikanti et al. 2022):
    TP = the GPUs of a server as far as the heads split, microbatch 1, sequence parallelism
    with TP, the distributed optimizer with DP, selective recomputation; the smallest PP whose
    estimate fits (full recomputation only where nothing fits without), interleaving where the
    estimate says it helps. Pinned dimensions are kept."""
    degrees = tp_degrees(spec, cluster)
    if not degrees:
        raise PipeplanError(f"{spec.name}: no tensor-parallel degree divides both a server's GPUs and the heads")
    base = replace(pins, tp=pins.tp or max(degrees), microbatch=pins.microbatch or 1)
    for rc in ([pins.recompute] if pins.recompute else ["selective", "full"]):
        cands = configs(spec, cluster, global_batch, replace(base, recompute=rc))
        cands = [c for c in cands if pins.zero is not None or c.zero == (1 if c.dp > 1 else 0)]
        for p in sorted({c.pp for c in cands}):
            mine = [c for c in cands if c.pp == p and (c.schedule != "zb-h1" or pins.schedule == "zb-h1")]
            rows = screened(spec, cluster, mine, global_batch, optimizer)
            if rows and rows[0][1].fits:
                return rows[0][0]
    cands = configs(spec, cluster, global_batch, base)
    if not cands:
        raise _none_agree(spec, cluster, global_batch, pins)
    return screened(spec, cluster, cands, global_batch, optimizer)[0][0]


def _none_agree(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins) -> PipeplanError:
    said = ", ".join(f"{k}={v}" for k, v in pins.__dict__.items() if v is not None) or "none"
    return PipeplanError(f"{spec.name} on {len(cluster)} GPUs, global batch {global_batch}: no configuration "
                         f"agrees with the pinned dimensions ({said}): TP must divide a server's "
                         f"{server_size(cluster)} GPUs and the heads, TP x PP the GPUs and PP be at most the "
                         "layers, DP the global batch")


def simulated(graph: Graph, cluster: Cluster, cfgs: list[Config], global_batch: int, optimizer: str,
              allow_over_memory: bool) -> tuple[Plan, list[dict]]:
    """Each configuration's plan simulated; the first by ``ranking.rank_key`` and a row per
    configuration (its settings, predicted seconds and whether it fits)."""
    from ..sim import simulate
    from .ranking import rank_key

    best, rows = None, []
    for i, cfg in enumerate(cfgs):
        plan = plan_of(graph, cluster, cfg, global_batch, optimizer)
        r = simulate(plan, timeline=False)
        rows.append({**cfg.as_dict(), "iteration_s": r.iteration_s, "fits": not r.over_memory})
        key = (rank_key(r, allow_over_memory), i)
        if best is None or key < best[0]:
            best = (key, plan)
    assert best is not None
    return best[1], rows


def search(graph: Graph, cluster: Cluster, global_batch: int, pins: Pins, optimizer: str, simulations: int,
           allow_over_memory: bool, also: tuple[Config, ...] = ()) -> Plan:
    """Every configuration agreeing with ``pins`` estimated in closed form, the ``simulations``
    best of them (and ``also``) simulated; the best simulated plan. ``extra["llm3d"]`` says how
    many were screened and simulated; ``complete`` only when all were simulated."""
    spec = spec_of(graph)
    cands = configs(spec, cluster, global_batch, pins)
    if not cands:
        raise _none_agree(spec, cluster, global_batch, pins)
    rows = screened(spec, cluster, cands, global_batch, optimizer)
    chosen = [c for c, _ in rows[:simulations]]
    chosen += [c for c in also if c not in chosen]
    plan, tried = simulated(graph, cluster, chosen, global_batch, optimizer, allow_over_memory)
    facts = {"configurations": len(cands), "simulated": tried, "complete": len(chosen) >= len(cands)}
    if not facts["complete"]:
        facts["incomplete"] = (f"simulated the {len(chosen)} best of {len(cands)} configurations by the "
                               "closed-form estimate")
    plan.extra["llm3d"] = facts
    return plan
