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
from ..cluster.collectives import exchange_links, servers_of
from ..cluster.kinds import KINDS
from ..errors import PipeplanError
from ..graph import Graph
from ..graph.scale import with_microbatch
from ..llm.experts import DISPATCHERS, remote_share
from ..llm.layout import candidates, chunked, runs_of, stages, v_candidates
from ..llm.parallelism import GRAD_REDUCE, INTERLEAVED, PRECISIONS, V_SCHEDULES, Parallelism
from ..llm.rank_costs import CP_COMM, Cut, Links, fp8_weight_bytes, node_costs, node_parts, rank_params
from ..llm.spec import BF16, RECOMPUTE, DecoderSpec, decoder_of
from ..llm.step_costs import dp_collectives_s, dp_ring, pipeline_send_s, tied_reduction_s
from ..plan import Plan, Stage
from ..sim.durations import pair_s
from ..sim.formulas import state_bytes

#: Model chunks per GPU tried at most (interleaved 1F1B)
MAX_CHUNKS = 8
#: Samples per microbatch tried at most
MAX_MICROBATCH = 16
#: The fewest tokens of a sequence a context-parallel rank keeps in the search (``cp_degrees``)
MIN_CP_TOKENS = 4096


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
    cp: int | None = _pin("context-parallel degree (the sequence over CP ranks; a multiple of 2 x CP)", min=1)
    ep: int | None = _pin("expert-parallel degree (a mixture's routed experts over EP ranks)", min=1)
    etp: int | None = _pin("expert tensor-parallel degree (each routed expert over ETP ranks)", min=1)
    cp_comm: str | None = _pin("how CP ranks exchange keys and values: p2p (Megatron-core's ring) or "
                               "allgather (Llama 3's)", choices=CP_COMM)
    expert_skew: float | None = _pin("the busiest expert rank's routed tokens over the mean (1: balanced; a "
                                     "measured ratio)", min=1, max=64)
    precision: str | None = _pin("the layers' GEMMs: bf16 (the default) or fp8 (Transformer Engine, H100/H800)",
                                 choices=PRECISIONS)
    fp8_params: bool | None = _pin("FP8 weights (--fp8-param-gather: no 16-bit copy, ZeRO-1's all-gather in 8 bits; "
                                   "needs precision=fp8)")
    dispatcher: str | None = _pin("how a mixture's tokens reach their experts: alltoall (Megatron-core's, the "
                                  "default) or deepep (DeepEP: a token once to each server, forwarded inside)",
                                  choices=DISPATCHERS)


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
                "overlap_p2p": par.overlap_p2p, "cp": par.cp, "ep": par.ep, "etp": par.etp, "cp_comm": par.cp_comm,
                "expert_skew": par.expert_skew, "precision": par.precision, "fp8_params": par.fp8_params,
                "dispatcher": par.dispatcher}
        if any(getattr(o, k) is not None and getattr(o, k) != v for k, v in have.items()):
            return False
        stages = tuple(par.stage_layers())
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


def _layouts(spec: DecoderSpec, pp: int, vpp: int, stage_counts: tuple[int, ...] | None,
             v_shape: bool = False) -> list[tuple[int, ...]]:
    """The chunk layouts of PP x ``vpp``: the pinned stage counts' (none unless PP of them), else
    ``llm.layout.candidates`` (a V: ``llm.layout.v_candidates``, pinned counts refused)."""
    if v_shape:
        return v_candidates(spec.layers, pp) if stage_counts is None else []
    if stage_counts is None:
        return candidates(spec.layers, pp, vpp)
    lay = chunked(stage_counts, vpp) if len(stage_counts) == pp else None
    return [lay] if lay is not None else []


def _switches(t: int, p: int, d: int, v: int, pins: Pins, moe: bool = False) -> list[dict]:
    """The sp, zero, overlap, grad_reduce and overlap_p2p settings of a (TP, PP, DP x CP, chunks):
    the pinned ones, else sequence parallelism with TP, ZeRO-1 and the overlap with DP, fp32
    gradients, sends overlapped where Megatron overlaps them by default (interleaved) and
    blocking elsewhere (dominated settings dropped, docs/llm.md); none where a pin cannot hold
    (Megatron runs interleaving without overlapped sends only on PP > 2)."""
    o = pins.options
    sp = (t > 1) if o.sp is None else o.sp
    ov = (d > 1) if o.overlap is None else o.overlap
    p2p = (v > 1) if o.overlap_p2p is None else o.overlap_p2p
    if (sp and t == 1) or (ov and d == 1) or (p2p and v == 1) or (v > 1 and not p2p and p <= 2) or \
            (moe and t > 1 and not sp):
        return []
    return [{"sp": sp, "zero": (1 if d > 1 else 0) if o.zero is None else o.zero, "overlap_grad_reduce": ov,
             "grad_reduce": o.grad_reduce or "fp32", "overlap_p2p": p2p}]


def _pick(pinned, choices: list) -> list:
    return [pinned] if pinned is not None else choices


def cp_degrees(spec: DecoderSpec, rest: int) -> list[int]:
    """CP degrees the search considers on ``rest`` GPUs a TP group leaves: 1, and those that
    split the sequence into chunks of 2 x CP and leave each rank at least ``MIN_CP_TOKENS``
    (shorter shares are pinned, ``-O cp=``)."""
    return [c for c in _divisors(rest) if c == 1 or (spec.seq % (2 * c) == 0 and spec.seq // c >= MIN_CP_TOKENS)]


def expert_grids(spec: DecoderSpec, t: int, width: int, pins: Pins) -> list[tuple[int, int]]:
    """(EP, ETP) pairs of a position of ``width`` GPUs at TP ``t``: (1, 1) for a dense model;
    for a mixture EP dividing the experts and ETP 1 or TP dividing the experts' width, EP x
    ETP dividing ``width`` (Megatron-core's expert grid), the pinned ones only."""
    o = pins.options
    if not spec.moe:
        return [(e, f) for e, f in [(o.ep or 1, o.etp or 1)] if e == f == 1]
    etps = _pick(o.etp, sorted({1, t}))
    return [(e, f) for f in etps for e in _pick(o.ep, _divisors(spec.experts))
            if spec.experts % e == 0 and spec.expert_ffn % f == 0 and width % (e * f) == 0]


def configs(spec: DecoderSpec, cluster: Cluster, global_batch: int, pins: Pins = Pins()) -> list[Parallelism]:
    """Every realizable configuration that agrees with ``pins`` (module docstring)."""
    out, o = [], pins.options
    for t in _pick(o.tp, tp_degrees(spec, cluster)):
        for c in _pick(o.cp, cp_degrees(spec, len(cluster) // t)):
            if len(cluster) % (t * c):
                continue
            for p in _pick(o.pp, [p for p in _divisors(len(cluster) // (t * c)) if p <= spec.layers]):
                if len(cluster) % (t * c * p) == 0 and global_batch % (len(cluster) // (t * c * p)) == 0:
                    out += _configs_at(spec, t, c, p, len(cluster) // (t * c * p), global_batch, pins)
    return out


def _configs_at(spec: DecoderSpec, t: int, c: int, p: int, d: int, global_batch: int, pins: Pins) -> list[Parallelism]:
    """``configs`` at TP ``t``, CP ``c``, PP ``p``, DP ``d``."""
    out, o = [], pins.options
    counts = None if o.layout is None else parse_layout(o.layout, spec.layers)
    extra = {"cp_comm": o.cp_comm or "p2p", "expert_skew": float(o.expert_skew or 1.0),
             "precision": o.precision or "bf16", "fp8_params": bool(o.fp8_params),
             "dispatcher": o.dispatcher or "alltoall"}
    if (o.fp8_params and extra["precision"] != "fp8") or (o.dispatcher not in (None, "alltoall") and not spec.moe):
        return []
    for b in _pick(o.microbatch, [b for b in _divisors(global_batch // d) if b <= MAX_MICROBATCH]):
        if (global_batch // d) % b:
            continue
        m = global_batch // (d * b)
        for v, sched in _schedules(p, m, pins, spec.moe):
            for lay in _layouts(spec, p, v, counts, sched in V_SCHEDULES):
                for sw in _switches(t, p, d * c, v, pins, spec.moe):  # gradients reduced over DP x CP
                    for e, f in expert_grids(spec, t, t * c * d, pins):
                        out += [Parallelism(t, p, d, lay, v, cp=c, ep=e, etp=f, microbatch=b, recompute=rc,
                                            schedule=sched, **sw, **extra)
                                for rc in _pick(o.recompute, list(RECOMPUTE))]
    return out


def _schedules(pp: int, m: int, pins: Pins, moe: bool) -> list[tuple[int, str]]:
    """(chunks, schedule) pairs: 1F1B and zero-bubble H1 with one chunk, interleaved 1F1B with
    v >= 2 where the replica's microbatches are a multiple of PP, and with two chunks the V
    schedules (ZB-V, DualPipeV) where they are asked for (``--schedule``), DualPipeV for a
    mixture of experts unasked (built to hide its all-to-alls)."""
    out = []
    for v in ([pins.options.vpp] if pins.options.vpp is not None else range(1, MAX_CHUNKS + 1)):
        if v == 1:
            out += [(1, s) for s in ("1f1b", "zb-h1")
                    if pins.allows(s) and (pp > 1 or s == "1f1b" or pins.schedules == (s,))]
            continue
        if pp >= 2 and m % pp == 0 and pins.allows(INTERLEAVED):
            out.append((v, INTERLEAVED))
        if v == 2 and pp >= 2 and pins.schedules is not None:
            out += [(2, s) for s in V_SCHEDULES if s in pins.schedules]
        elif v == 2 and pp >= 2 and moe:
            out.append((2, "dualpipe-v"))
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


@dataclass(frozen=True)
class MicrobatchCosts:
    """One rank's costs of one microbatch: forward + backward seconds and bytes kept of a dense
    and of a mixture's layer, the embedding's and head's seconds, the head's bytes kept, each
    layer's backward, and a mixture layer's all-to-alls (forward and backward)."""

    dense: float
    dense_kept: float
    moe: float
    moe_kept: float
    embed: float
    head: float
    head_kept: float
    dense_bwd: float
    moe_bwd: float
    moe_comm: float = 0.0


@lru_cache(maxsize=4096)
def _per_microbatch(spec: DecoderSpec, kind_name: str, b: int, cut: Cut, rc: str, links: Links) -> MicrobatchCosts:
    kind = KINDS[kind_name]
    lf, lb, lkept = node_costs(spec, "layer", kind, b, cut, rc, links)
    mp = node_parts(spec, "layer", kind, b, cut, rc, links, True) if spec.moe else None
    mf, mb, mkept = (mp.fwd_s, mp.bwd_s, mp.kept) if mp else (lf, lb, lkept)
    ef, eb, _ = node_costs(spec, "embed", kind, b, cut, rc, links)
    hf, hb, hkept = node_costs(spec, "head", kind, b, cut, rc, links)
    return MicrobatchCosts(lf + lb, lkept, mf + mb, mkept, ef + eb, hf + hb, hkept, lb, mb,
                           mp.fwd_ep + mp.bwd_ep if mp else 0.0)


_LINKS: dict[tuple, tuple[Cluster, tuple[float, float]]] = {}


def _links_of(cluster: Cluster, start: int, stop: int, step: int, exchange: bool = False,
              share: float | None = None) -> tuple[float, float]:
    """``group_links`` (``exchange``: an all-to-all's, ``exchange_links``, ``share`` of its
    array off the server where a dispatcher sends less) of GPUs ``range(start, stop, step)``
    (the first position's groups: TP, CP, EP, data-parallel rings), computed once per cluster
    and group (a search screens thousands of configurations)."""
    if len(range(start, stop, step)) < 2:
        return (0.0, 0.0)
    key = (id(cluster), start, stop, step, exchange, share)
    hit = _LINKS.get(key)
    if hit is None or hit[0] is not cluster:
        if len(_LINKS) > 1024:
            _LINKS.clear()
        group = list(range(start, stop, step))
        hit = _LINKS[key] = (cluster, exchange_links(cluster, group, share) if exchange else dp_ring(cluster, group))
    return hit[1]


def _links(cluster: Cluster, par: Parallelism, spec: DecoderSpec) -> Links:
    """The first position's TP, CP, EP and ETP groups' links (Megatron's rank order)."""
    ep = range(0, par.ep * par.etp, par.etp)
    share = remote_share(spec, par.cut().experts, servers_of(cluster, ep)) if par.ep > 1 else None
    return Links(_links_of(cluster, 0, par.tp, 1), _links_of(cluster, 0, par.tp * par.cp, par.tp),
                 _links_of(cluster, 0, par.ep * par.etp, par.etp, exchange=True, share=share),
                 _links_of(cluster, 0, par.etp, 1))


@dataclass(frozen=True)
class Position:
    """A pipeline position: its dense and mixture layers, a rank's dense and routed-expert
    parameters (counts) and whether it holds the embedding (1), the head (2) or both (3)."""

    dense: int
    moe: int
    params: float
    expert: float
    ends: int
    extra_bytes: float = 0.0  # FP8 weight copies (``rank_costs.fp8_weight_bytes``)

    @property
    def layers(self) -> int:
        return self.dense + self.moe


def _positions(spec: DecoderSpec, par: Parallelism) -> list[Position]:
    """Each pipeline position (``Position``)."""
    cut, moe_of = par.cut(), [0] * par.pp
    first_moe = spec.dense_layers if spec.moe else spec.layers
    for j, run in enumerate(runs_of(par.layout)):
        moe_of[par.position(j)] += max(0, run.stop - max(run.start, first_moe))  # layers from first_moe on
    first, last = par.position(0), par.position(len(par.layout) - 1)  # the embedding's, the head's
    (d_dense, _), (m_dense, m_expert) = rank_params(spec, False, cut), rank_params(spec, True, cut)
    d_fp8, m_fp8 = fp8_weight_bytes(spec, False, cut), fp8_weight_bytes(spec, True, cut)
    out = []
    for s, n in enumerate(par.stage_layers()):
        ends = int(s == first) + 2 * int(s == last)
        params = (n - moe_of[s]) * d_dense + moe_of[s] * m_dense
        params += spec.embedding_params() / par.tp if s == first else 0
        params += (spec.head_params() + (spec.vocab * spec.hidden if spec.tied and first != last else 0)) / par.tp \
            if s == last else 0
        out.append(Position(n - moe_of[s], moe_of[s], float(params), moe_of[s] * m_expert, ends,
                            (n - moe_of[s]) * d_fp8 + moe_of[s] * m_fp8))
    return out


def _in_flight(par: Parallelism, s: int, m: int) -> float:
    """Microbatches whose activations position ``s`` holds at its fullest, in units of all its
    layers: 1F1B min(PP - s, m); interleaved, Megatron's warm-up of (PP - s - 1) x 2 + (v - 1) x PP
    chunks plus one, each 1 / v of the position's layers (Narayanan et al. 2021 §2.2); ZB-V 2 PP
    chunks and DualPipeV 2 PP + 1 (docs/schedules.md), each half the position's layers."""
    if par.v_shape:
        return min(2 * par.pp + (par.schedule == "dualpipe-v"), 2 * m) / 2
    if par.vpp == 1:
        return float(min(par.pp - s, m))
    return min((par.pp - s - 1) * 2 + (par.vpp - 1) * par.pp + 1, m * par.vpp) / par.vpp


def estimate(spec: DecoderSpec, cluster: Cluster, par: Parallelism, global_batch: int,
             optimizer: str = "adam") -> Estimate:
    """The screening estimate of ``par`` (module docstring)."""
    kind = cluster.devices[0].kind.lower()
    c = _per_microbatch(spec, kind, par.microbatch, par.cut(), par.recompute, _links(cluster, par, spec))
    pos = _positions(spec, par)
    times = [p.dense * c.dense + p.moe * c.moe + (c.embed if p.ends % 2 else 0.0) + (c.head if p.ends >= 2 else 0.0)
             for p in pos]
    if par.schedule == "dualpipe-v":  # a forward and a backward overlapped (``sim.durations.pair_s``)
        times = [float(pair_s(t - p.moe * c.moe_comm, p.moe * c.moe_comm)) for t, p in zip(times, pos)]
    m = global_batch // (par.dp * par.microbatch)
    bubble = (par.pp - 1) / par.vpp / (3.0 if par.schedule in ("zb-h1", *V_SCHEDULES) else 1.0)
    sends = 0.0 if par.overlap_p2p or par.pp == 1 else 2 * par.vpp * pipeline_send_s(spec, cluster, par)
    ar = max(_reduction_s(cluster, par, params, expert) for params, expert in {(p.params, p.expert) for p in pos})
    if par.overlap_grad_reduce:  # all but what outlasts the last microbatch's backward on a position
        ar = max(ar - min(p.dense * c.dense_bwd + p.moe * c.moe_bwd for p in pos) / par.vpp, 0.0)
    if spec.tied and par.pp > 1 and not par.v_shape:  # the embedding's gradient between first and last stage
        ar += tied_reduction_s(spec, cluster, par.tp, par.grad_reduce, 0, (par.pp - 1) * par.dp * par.tp * par.cp)
    iteration = (m + bubble) * max(times) + m * sends + ar
    zero = par.zero
    memory = max(state_bytes(BF16 * p.params, optimizer, "bf16", par.dp * par.cp if zero else 1)
                 + state_bytes(BF16 * p.expert, optimizer, "bf16", par.expert_dp if zero else 1) + p.extra_bytes
                 + _in_flight(par, s, m) * (p.dense * c.dense_kept + p.moe * c.moe_kept)
                 + (c.head_kept if p.ends >= 2 else 0.0) for s, p in enumerate(pos))
    return Estimate(iteration, memory, memory <= float(cluster.usable.min()))


def _reduction_s(cluster: Cluster, par: Parallelism, params: float, expert: float) -> float:
    """A position's data-parallel gradient reduction of a rank's ``params`` dense and
    ``expert`` routed-expert parameters: dense over DP x CP, experts over EDP."""
    width, weight = par.tp * par.cp * par.dp, 1.0 if par.fp8_params else BF16
    dense = dp_collectives_s(par.dp * par.cp, par.zero, par.grad_reduce, params, _links_of(cluster, 0, width, par.tp),
                             weight)
    if not expert:
        return dense
    return dense + dp_collectives_s(par.expert_dp, par.zero, par.grad_reduce, expert,
                                    _links_of(cluster, 0, width, par.ep * par.etp), weight)


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
            here = [c for c in mine if c.pp == p and (c.schedule not in ("zb-h1", *V_SCHEDULES)
                                                      or pins.schedules == (c.schedule,))]
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
    elif (o.ep or 1) * (o.etp or 1) > 1 and not spec.moe:
        why = f"ep={o.ep or 1}, etp={o.etp or 1}: {spec.name} has no experts (EP and ETP are 1 for a dense model)"
    elif o.dispatcher not in (None, "alltoall") and not spec.moe:
        why = f"dispatcher={o.dispatcher}: {spec.name} has no experts to dispatch tokens to"
    elif o.ep is not None and spec.moe and spec.experts % o.ep:
        why = f"ep={o.ep}: EP must divide the {spec.experts} experts"
    elif spec.moe and o.sp is False and (o.tp or 1) > 1:
        why = "sp=false: a mixture of experts under tensor parallelism needs sequence parallelism (Megatron-core's rule)"
    elif o.fp8_params and o.precision != "fp8":
        why = "fp8_params=true: FP8 weights need precision=fp8"
    elif o.cp is not None and (spec.seq % (2 * o.cp) or len(cluster) % o.cp):
        why = f"cp={o.cp}: the sequence {spec.seq} must be a multiple of 2 x CP and CP divide the {len(cluster)} GPUs"
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
