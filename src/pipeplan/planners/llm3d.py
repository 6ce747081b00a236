"""3D parallelism for decoder LLMs (docs/llm.md): tensor x pipeline x data parallelism with the
microbatch size, schedule, layer layout, recomputation, ZeRO-1, the overlaps and the gradient
dtype as Megatron-LM runs them (Narayanan et al. 2021 §2-3; Korthikanti et al. 2022), the
configurations a user may run (``llm.parallelism.Parallelism``, validated there), a
closed-form estimate to screen them, and the plan of one.

- Realizable only: TP divides the GPUs of a server, the heads and the key/value heads
  (Megatron's rule); PP divides the rest, the layers split over it as ``llm.layout.candidates``
  gives them (equal chunks, or the first and last stage apart); interleaving (v model chunks)
  needs at least v layers a position and the microbatches of a replica a multiple of PP; every
  replica gets whole samples (the global batch = microbatch x microbatches x DP).
- Pins (``LLMOptions``, ``-O``) are honored or refused: a configuration that disagrees with a
  pin is never returned, and when none agrees the refusal names the pin and why.
- The estimate (screening only; ``simulate`` decides): per replica, (m + (PP - 1) / v) x the
  slowest position's forward + backward per microbatch (zero-bubble H1: a third of the
  bubble) plus, without overlapped sends, each microbatch's blocking pipeline sends, plus the
  stage's data-parallel collectives (``sim.tensor_groups.dp_collectives_s``) less the last
  backward where overlapped, and a tied embedding's reduction between first and last stage;
  per GPU memory: the state (18 bytes a parameter, 6 + 12 / DP with
  ZeRO-1) / TP plus the activations of the microbatches in flight on the first position (PP of
  them; interleaved, PP (1 + (PP - 1) / (PP v)), §2.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

from ..cluster import Cluster
from ..cluster.collectives import group_links
from ..cluster.kinds import KINDS
from ..errors import PipeplanError
from ..graph import Graph
from ..graph.scale import with_microbatch
from ..llm.costs import node_costs
from ..llm.layout import candidates, chunked, stages
from ..llm.parallelism import GRAD_REDUCE, INTERLEAVED, Parallelism
from ..llm.spec import BF16, RECOMPUTE, DecoderSpec, decoder_of
from ..llm.step_costs import dp_collectives_s, dp_ring, pipeline_send_s, tied_reduction_s
from ..plan import Plan, Stage
from ..sim.formulas import state_bytes

#: Model chunks per GPU tried at most (interleaved 1F1B)
MAX_CHUNKS = 8
#: Samples per microbatch tried at most
MAX_MICROBATCH = 16


def _pin(help_text: str, **meta):
    return field(default=None, metadata={"help": help_text + " (decoder LLMs)", **meta})


@dataclass(frozen=True)
class LLMOptions:
    """Pinned dimensions of a decoder LLM's configuration (None: chosen by the planner). Every
    pin is in the plan returned, or the planner refuses in one line (``configs``)."""

    tp: int | None = _pin("tensor-parallel degree", min=1)
    pp: int | None = _pin("pipeline-parallel degree", min=1)
    vpp: int | None = _pin("model chunks per GPU, interleaved 1F1B when > 1", min=1)
    microbatch: int | None = _pin("samples per microbatch", min=1)
    recompute: str | None = _pin("activation recomputation: none, selective (the attention core) or full",
                                 choices=RECOMPUTE)
    zero: int | None = _pin("1: distributed optimizer (ZeRO-1) over the data-parallel replicas", min=0, max=1)
    sp: bool | None = _pin("sequence parallelism (needs TP > 1)")
    overlap: bool | None = _pin("overlap each stage's gradient reduction with its last backward, "
                                      "--overlap-grad-reduce (needs DP > 1)")
    grad_reduce: str | None = _pin("dtype of the gradient reduction: fp32 (Megatron's default for bf16) or "
                                        "bf16 (--grad-reduce-in-bf16)", choices=GRAD_REDUCE)
    overlap_p2p: bool | None = _pin("overlap pipeline sends with compute (interleaved only, Megatron's "
                                          "default there; false: --no-overlap-p2p-communication, needs PP > 2; "
                                          "without interleaving sends are on the critical path)")
    layout: str | None = _pin("layers of each pipeline stage, comma-separated, N*K for K stages of N: "
                                   "7,8*14,7 (each stage's layers split over its chunks evenly)")


@dataclass(frozen=True)
class Pins:
    """The pins of a search: the options' values and the schedule (``--schedule``)."""

    options: LLMOptions = LLMOptions()
    schedules: tuple[str, ...] | None = None  # the schedules allowed (None: any)

    def allows(self, schedule: str) -> bool:
        return self.schedules is None or schedule in self.schedules

    def holds(self, par: Parallelism) -> bool:
        """Whether configuration ``par`` (another planner's, say) agrees with every pin."""
        o, layers = self.options, sum(par.layout)
        have = {"tp": par.tp, "pp": par.pp, "vpp": par.vpp, "microbatch": par.microbatch, "recompute": par.recompute,
                "zero": par.zero, "sp": par.sp, "overlap": par.overlap_grad_reduce, "grad_reduce": par.grad_reduce,
                "overlap_p2p": par.overlap_p2p}
        if any(getattr(o, k) is not None and getattr(o, k) != v for k, v in have.items()):
            return False
        stages = tuple(sum(par.layout[j::par.pp]) for j in range(par.pp))
        return self.allows(par.schedule) and (o.layout is None or parse_layout(o.layout, layers) == stages)

    def said(self) -> str:
        items = [(f.name, getattr(self.options, f.name)) for f in fields(LLMOptions)]
        items.append(("schedule", ",".join(self.schedules) if self.schedules else None))
        return ", ".join(f"{k}={v}" for k, v in items if v is not None) or "none"


def pins_of(options: LLMOptions, schedule: str | None) -> Pins:
    """The pins of planner options ``options`` (a subclass of ``LLMOptions``) and ``--schedule``."""
    own = LLMOptions(**{f.name: getattr(options, f.name) for f in fields(LLMOptions)})
    return Pins(own, None if schedule is None else (schedule,))


def parse_layout(text: str, layers: int) -> tuple[int, ...]:
    """``7,8*14,7`` as per-stage layer counts; one line unless positive counts summing to ``layers``."""
    counts: list[int] = []
    try:
        for part in text.split(","):
            n, _, k = part.strip().partition("*")
            counts += [int(n)] * (int(k) if k else 1)
    except ValueError:
        raise PipeplanError(f"option layout={text!r}: expected layer counts like 7,8*14,7") from None
    if sum(counts) != layers or min(counts) < 1 or len(counts) > layers:
        raise PipeplanError(f"option layout={text!r}: gives {len(counts)} stages of {sum(counts)} layers; the model has "
                            f"{layers} layers (each stage at least one)")
    return tuple(counts)


def spec_of(graph: Graph) -> DecoderSpec:
    return decoder_of(graph.meta, f"model {graph.name!r}")


def server_size(cluster: Cluster) -> int:
    return min(len(s) for s in cluster.servers())


def tp_degrees(spec: DecoderSpec, cluster: Cluster) -> list[int]:
    """TP degrees that divide a server's GPUs and the heads, and divide or are a multiple of the
    key/value heads (replicated then, and priced so: ``DecoderSpec.kv_rank``)."""
    per = server_size(cluster)
    return [t for t in range(1, per + 1) if per % t == 0 and len(cluster) % t == 0 and spec.heads % t == 0
            and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _layouts(spec: DecoderSpec, pp: int, vpp: int, stage_counts: tuple[int, ...] | None) -> list[tuple[int, ...]]:
    """The chunk layouts of PP x ``vpp``: the pinned stage counts' (none unless PP of them), else
    ``llm.layout.candidates``."""
    if stage_counts is None:
        return candidates(spec.layers, pp, vpp)
    lay = chunked(stage_counts, vpp) if len(stage_counts) == pp else None
    return [lay] if lay is not None else []


def _switches(t: int, p: int, d: int, v: int, pins: Pins) -> list[dict]:
    """The sp, zero, overlap, grad_reduce and overlap_p2p settings of a (TP, PP, DP, chunks):
    the pinned ones, else sequence parallelism with TP, ZeRO-1 and the overlap with DP, fp32
    gradients, sends overlapped where Megatron overlaps them by default (interleaved) and
    blocking elsewhere (dominated settings dropped, docs/llm.md); none where a pin cannot hold
    (Megatron runs interleaving without overlapped sends only on PP > 2)."""
    o = pins.options
    sp = (t > 1) if o.sp is None else o.sp
    ov = (d > 1) if o.overlap is None else o.overlap
    p2p = (v > 1) if o.overlap_p2p is None else o.overlap_p2p
    if (sp and t == 1) or (ov and d == 1) or (p2p and v == 1) or (v > 1 and not p2p and p <= 2):
        return []
    return [{"sp": sp, "zero": (1 if d > 1 else 0) if o.zero is None else o.zero, "overlap_grad_reduce": ov,
             "grad_reduce": o.grad_reduce or "fp32", "overlap_p2p": p2p}]


def configs(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins = Pins()) -> list[Parallelism]:
    """Every realizable configuration that agrees with ``pins`` (module docstring)."""
    out, o = [], pins.options
    pick = lambda pinned, choices: [pinned] if pinned is not None else choices  # noqa: E731
    counts = None if o.layout is None else parse_layout(o.layout, spec.layers)
    for t in pick(o.tp, tp_degrees(spec, cluster)):
        for p in pick(o.pp, [p for p in _divisors(len(cluster) // t) if p <= spec.layers]):
            if len(cluster) % (t * p):
                continue
            d = len(cluster) // (t * p)
            if global_batch % d:
                continue
            for b in pick(o.microbatch, [b for b in _divisors(global_batch // d) if b <= MAX_MICROBATCH]):
                if (global_batch // d) % b:
                    continue
                m = global_batch // (d * b)
                for v, sched in _schedules(p, m, pins):
                    for lay in _layouts(spec, p, v, counts):
                        for sw in _switches(t, p, d, v, pins):
                            out += [Parallelism(t, p, d, lay, v, microbatch=b, recompute=rc, schedule=sched, **sw)
                                    for rc in pick(o.recompute, list(RECOMPUTE))]
    return out


def _schedules(pp: int, m: int, pins: Pins) -> list[tuple[int, str]]:
    """(chunks, schedule) pairs: 1F1B and zero-bubble H1 with one chunk, interleaved 1F1B with
    v >= 2 where the replica's microbatches are a multiple of PP."""
    out = []
    for v in ([pins.options.vpp] if pins.options.vpp is not None else range(1, MAX_CHUNKS + 1)):
        if v == 1:
            out += [(1, s) for s in ("1f1b", "zb-h1")
                    if pins.allows(s) and (pp > 1 or s == "1f1b" or pins.schedules == (s,))]
        elif pp >= 2 and m % pp == 0 and pins.allows(INTERLEAVED):
            out.append((v, INTERLEAVED))
    return out


# -- the plan of a configuration ----------------------------------------------------------------
def plan_of(graph: Graph, cluster: Cluster, par: Parallelism, global_batch: int, optimizer: str = "adam") -> Plan:
    """The plan Megatron-LM runs for ``par`` (``llm.layout.stages``), its graph at
    ``par.microbatch``, carrying ``par``."""
    st = [Stage(*chunk) for chunk in stages(cluster.names, par)]
    return Plan(with_microbatch(graph, par.microbatch), cluster, st, global_batch // par.microbatch,
                schedule=par.schedule, optimizer=optimizer, replicas="round-robin",
                recompute=[par.recompute == "full"] * len(st), selective=par.recompute == "selective",
                sequence_parallel=par.sp, zero=par.zero, overlap_grad_reduce=par.overlap_grad_reduce,
                parallelism=par)


# -- the closed-form estimate -------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    iteration_s: float
    memory_bytes: float  # per GPU, the fullest pipeline position
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


_RINGS: dict[tuple[int, int, int], tuple[Cluster, tuple[float, float]]] = {}


def _dp_links(cluster: Cluster, dp: int, tp: int) -> tuple[float, float]:
    """The data-parallel ring of the first position's rank 0s (``tensor_groups.dp_ring``),
    computed once per cluster and shape (a search screens thousands of configurations)."""
    key = (id(cluster), dp, tp)
    hit = _RINGS.get(key)
    if hit is None or hit[0] is not cluster:
        if len(_RINGS) > 256:
            _RINGS.clear()
        hit = _RINGS[key] = (cluster, dp_ring(cluster, list(range(0, dp * tp, tp))))
    return hit[1]


def _positions(spec: DecoderSpec, par: Parallelism) -> list[tuple[int, float, float]]:
    """Per pipeline position: (layers, parameters as a count, whether it holds embed/head)."""
    out = []
    for s, n in enumerate(par.stage_layers()):
        params = n * (spec.layer_params() + spec.kv_replicated_params(par.tp)) + (spec.embedding_params() if s == 0 else 0)
        params += spec.head_params() + (spec.vocab * spec.hidden if spec.tied and par.pp > 1 else 0) \
            if s == par.pp - 1 else 0
        out.append((n, float(params), float(s == 0) + 2.0 * float(s == par.pp - 1)))
    return out


def _in_flight(par: Parallelism, s: int, m: int) -> float:
    """Microbatches whose activations position ``s`` holds at its fullest, in units of all its
    layers: 1F1B min(PP - s, m); interleaved, Megatron's warm-up of (PP - s - 1) x 2 + (v - 1) x PP
    chunks plus one, each 1 / v of the position's layers (Narayanan et al. 2021 §2.2)."""
    if par.vpp == 1:
        return float(min(par.pp - s, m))
    return min((par.pp - s - 1) * 2 + (par.vpp - 1) * par.pp + 1, m * par.vpp) / par.vpp


def estimate(spec: DecoderSpec, cluster: Cluster, par: Parallelism, global_batch: int,
             optimizer: str = "adam") -> Estimate:
    """The screening estimate of ``par`` (module docstring)."""
    kind = cluster.devices[0].kind.lower()
    links = group_links(cluster, list(range(par.tp))) if par.tp > 1 else (0.0, 0.0)
    layer, kept, embed, head, head_kept, layer_bwd = _per_microbatch(spec, kind, par.microbatch, par.tp, par.sp,
                                                                     par.recompute, links)
    pos = _positions(spec, par)
    times = [n * layer + (embed if ends % 2 else 0.0) + (head if ends >= 2 else 0.0) for n, _, ends in pos]
    m = global_batch // (par.dp * par.microbatch)
    slowest = max(times)
    bubble = (par.pp - 1) / par.vpp / (3.0 if par.schedule == "zb-h1" else 1.0)
    sends = 0.0 if par.overlap_p2p or par.pp == 1 else 2 * par.vpp * pipeline_send_s(spec, cluster, par)
    ring = _dp_links(cluster, par.dp, par.tp) if par.dp > 1 else (0.0, 0.0)
    ar = max(dp_collectives_s(par.dp, par.zero, par.grad_reduce, params / par.tp, ring) for _, params, _ in pos)
    if par.overlap_grad_reduce:  # all but what outlasts the last microbatch's backward on a position
        ar = max(ar - min(n for n, _, _ in pos) * layer_bwd / par.vpp, 0.0)
    if spec.tied and par.pp > 1:  # the embedding's gradient between first and last stage, before the step
        ar += tied_reduction_s(spec, cluster, par.tp, par.grad_reduce, 0, (par.pp - 1) * par.dp * par.tp)
    iteration = (m + bubble) * slowest + m * sends + ar
    memory = max(state_bytes(BF16 * params, optimizer, "bf16", par.dp if par.zero else 1) / par.tp
                 + _in_flight(par, s, m) * n * kept + (head_kept if ends >= 2 else 0.0)
                 for s, (n, params, ends) in enumerate(pos))
    return Estimate(iteration, memory, memory <= float(cluster.usable.min()))


# -- choosing -----------------------------------------------------------------------------------
def global_batch_of(graph: Graph, global_batch: int | None, microbatches: int) -> int:
    """Samples per iteration: ``--global-batch``, else the graph's microbatch x ``--microbatches``."""
    return int(global_batch) if global_batch else int(graph.meta.get("microbatch", 1)) * microbatches


def screened(spec: DecoderSpec, cluster: Cluster, cands: list[Parallelism], global_batch: int,
             optimizer: str) -> list[tuple[Parallelism, Estimate]]:
    """``cands`` with their estimates, those that fit first, each part fastest first."""
    rows = [(c, estimate(spec, cluster, c, global_batch, optimizer)) for c in cands]
    rows.sort(key=lambda r: (not r[1].fits, r[1].iteration_s if r[1].fits else r[1].memory_bytes))
    return rows


def rule_of_thumb(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins, optimizer: str) -> Parallelism:
    """Megatron-LM's rules of thumb (Narayanan et al. 2021 §3.3, Korthikanti et al. 2022):
    TP = the GPUs of a server as far as the heads split, microbatch 1, sequence parallelism
    with TP, the distributed optimizer with DP, selective recomputation; the smallest PP whose
    estimate fits (full recomputation only where nothing fits without), interleaving where the
    estimate says it helps, equal layers where they divide. Pinned dimensions are kept."""
    degrees = tp_degrees(spec, cluster)
    if not degrees and pins.options.tp is None:
        raise PipeplanError(f"{spec.name}: no tensor-parallel degree divides a server's GPUs, the heads and the "
                            "key/value heads")
    o = pins.options
    for t in ([o.tp] if o.tp is not None else sorted(degrees, reverse=True)):
        base = replace(o, tp=t, microbatch=o.microbatch or 1)
        cands = configs(spec, cluster, global_batch, Pins(base, pins.schedules))
        if cands:  # the largest TP the other pins allow
            return _thumb_choice(spec, cluster, global_batch, Pins(base, pins.schedules), cands, optimizer)
    raise refusal(spec, cluster, global_batch, pins)


def _thumb_choice(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins, cands: list[Parallelism],
                  optimizer: str) -> Parallelism:
    """``rule_of_thumb`` at its TP: selective then full recomputation (unless pinned), the
    smallest PP whose best estimate fits; else the best of ``cands``."""
    o = pins.options
    if o.layout is None:  # practitioners split the layers as evenly as Megatron's defaults do
        cands = [c for c in cands if c.layout == candidates(spec.layers, c.pp, c.vpp)[0]]
    for rc in ([o.recompute] if o.recompute else ["selective", "full"]):
        mine = [c for c in cands if c.recompute == rc]
        for p in sorted({c.pp for c in mine}):
            here = [c for c in mine if c.pp == p and (c.schedule != "zb-h1" or pins.schedules == ("zb-h1",))]
            rows = screened(spec, cluster, here, global_batch, optimizer)
            if rows and rows[0][1].fits:
                return rows[0][0]
    return screened(spec, cluster, cands, global_batch, optimizer)[0][0]


def refusal(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins) -> PipeplanError:
    """One line naming the first pin no configuration can meet, and why (else all of them)."""
    o, why = pins.options, None
    if o.tp is not None and o.tp not in tp_degrees(spec, cluster):
        why = (f"tp={o.tp}: TP must divide a server's {server_size(cluster)} GPUs and the {spec.heads} heads, and "
               f"divide or be a multiple of the {spec.kv_heads} key/value heads (Megatron-core's rule)")
    elif o.sp and o.tp == 1:
        why = "sp=true: sequence parallelism needs TP > 1"
    elif o.overlap_p2p and o.vpp == 1:
        why = "overlap_p2p=true: Megatron overlaps pipeline sends only with interleaving (vpp > 1)"
    elif o.overlap_p2p is False and (o.vpp or 1) > 1 and o.pp is not None and o.pp <= 2:
        why = "overlap_p2p=false: Megatron runs interleaving without overlapped sends only on PP > 2"
    elif o.pp is not None and (o.pp > spec.layers or len(cluster) % o.pp):
        why = f"pp={o.pp}: PP must divide the {len(cluster)} GPUs and be at most the {spec.layers} layers"
    elif o.layout is not None and (len(cluster) % len(parse_layout(o.layout, spec.layers))
                                   or (o.pp is not None and o.pp != len(parse_layout(o.layout, spec.layers)))):
        why = (f"layout={o.layout}: its {len(parse_layout(o.layout, spec.layers))} stages must be the pipeline's "
               f"(pp={o.pp}) and divide the {len(cluster)} GPUs")
    text = why or (f"no configuration agrees with the pins ({pins.said()}): TP must divide a server's "
                   f"{server_size(cluster)} GPUs and the heads, TP x PP the GPUs and PP be at most the layers, DP the "
                   "global batch, interleaving a multiple of PP microbatches a replica, overlap DP > 1")
    return PipeplanError(f"{spec.name} on {len(cluster)} GPUs, global batch {global_batch}: {text}")


def simulated(graph: Graph, cluster: Cluster, cfgs: list[Parallelism], global_batch: int, optimizer: str,
              allow_over_memory: bool, deadline: float | None = None) -> tuple[Plan, list[dict]]:
    """Each configuration's plan simulated (until ``deadline``, a ``time.monotonic`` time, after
    the first); the first by ``ranking.rank_key`` and a row per configuration simulated (its
    settings, predicted seconds and whether it fits)."""
    import time

    from ..sim import simulate
    from .ranking import rank_key

    best, rows = None, []
    for i, cfg in enumerate(cfgs):
        if rows and deadline is not None and time.monotonic() > deadline:
            break
        plan = plan_of(graph, cluster, cfg, global_batch, optimizer)
        r = simulate(plan, timeline=False)
        rows.append({**cfg.as_dict(), "iteration_s": r.iteration_s, "fits": not r.over_memory})
        key = (rank_key(r, allow_over_memory), i)
        if best is None or key < best[0]:
            best = (key, plan)
    assert best is not None
    return best[1], rows


def search(graph: Graph, cluster: Cluster, global_batch: int, pins: Pins, optimizer: str, simulations: int,
           allow_over_memory: bool, also: tuple[Parallelism, ...] = (), deadline: float | None = None) -> Plan:
    """Every configuration agreeing with ``pins`` estimated in closed form, the ``simulations``
    best of them (and ``also``) simulated, until ``deadline``; the best simulated plan.
    ``extra["llm3d"]`` says how many were screened and simulated; ``complete`` only when every
    configuration was simulated."""
    spec = spec_of(graph)
    cands = configs(spec, cluster, global_batch, pins)
    if not cands:
        raise refusal(spec, cluster, global_batch, pins)
    rows = screened(spec, cluster, cands, global_batch, optimizer)
    chosen = [c for c, _ in rows[:simulations]]
    chosen += [c for c in also if c not in chosen]
    plan, tried = simulated(graph, cluster, chosen, global_batch, optimizer, allow_over_memory, deadline)
    done = {Parallelism(**{**row, "layout": tuple(row["layout"])}) for row in
            ({k: v for k, v in r.items() if k not in ("iteration_s", "fits")} for r in tried)}
    facts = {"configurations": len(cands), "simulated": tried, "complete": set(cands) <= done}
    if not facts["complete"]:
        facts["incomplete"] = (f"simulated {len(tried)} of {len(cands)} configurations, the best by the closed-form "
                               "estimate first" + (" until its wall-clock budget ran out" if len(tried) < len(chosen)
                                                   else ""))
    plan.extra["llm3d"] = facts
    return plan
