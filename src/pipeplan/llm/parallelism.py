"""One parallel configuration of a decoder LLM, validated once (docs/llm.md), as Megatron-core's
``TransformerConfig.__post_init__`` and torchtitan's ``ParallelDims`` check theirs.

The world is TP x CP x PP x DP GPUs, ranks in Megatron-core's default order ``tp-cp-ep-dp-pp``
(``RANK_ORDER``: tensor-parallel rank fastest, pipeline rank slowest; ``layout.stages`` lays
them out and the exporters read the same order). Checks, each one line naming what is wrong:
heads divisible by TP and key/value heads a divisor or a multiple of it (Megatron-core's
``num_attention_heads % tp`` and its ``num_query_groups`` rule, docs/megatron-rules.md), the layout's chunks PP x v and their layers
summing to the model's, interleaving (v > 1) only with a pipeline and its schedule, sequence
parallelism only with TP > 1, the data-parallel overlap only with DP > 1, the global batch
whole samples per replica (and, interleaved, a multiple of PP microbatches a replica).
Context parallelism: the sequence a multiple of 2 x CP (Megatron's load-balanced chunks).
Expert parallelism (a mixture's routed experts over EP x ETP ranks of a position's
TP x CP x DP, Megatron-core's expert grid ``etp-ep-dp-pp``; the rest, expert data
parallelism): EP x ETP divides TP x CP x DP, EP the experts, ETP the expert width; a dense
model takes EP = ETP = 1; a mixture under TP needs sequence parallelism (Megatron-core raises
otherwise).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import PipeplanError
from .experts import DISPATCHERS
from .rank_costs import CP_COMM, Cut, ExpertCut
from .spec import RECOMPUTE, DecoderSpec

#: Megatron-core's default rank order (``--order``/``parallel_state``): fastest first
RANK_ORDER = ("tp", "cp", "ep", "dp", "pp")
#: schedules of a decoder plan: one chunk a GPU, or interleaved chunks
SINGLE_SCHEDULES = ("1f1b", "zb-h1")
INTERLEAVED = "interleaved-1f1b"
#: schedules of two chunks a GPU in a V (Qi et al. ICLR'24 §6; DeepSeek-V3's DualPipeV): chunk j
#: on pipeline position j, then 2 PP - 1 - j (``Parallelism.position``), so that the first and
#: last chunk share position 0
V_SCHEDULES = ("zb-v", "dualpipe-v")
#: fields ``as_dict`` leaves out at their defaults (plans of dense models stay as they were)
QUIET_DEFAULTS = {"etp": 1, "cp_comm": "p2p", "expert_skew": 1.0, "precision": "bf16", "fp8_params": False,
                  "dispatcher": "alltoall"}
#: the layers' GEMM precision: bf16, or FP8 through Transformer Engine (``llm.costs.Rates``)
PRECISIONS = ("bf16", "fp8")
#: the busiest expert rank's routed tokens over the mean, at most
MAX_SKEW = 64.0
#: gradient (and ZeRO-1 reduce-scatter) dtype: Megatron reduces fp32 main gradients for bf16
#: (``accumulate_allreduce_grads_in_fp32``) unless told ``--grad-reduce-in-bf16``
GRAD_REDUCE = ("fp32", "bf16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class Parallelism:
    """TP x CP x PP x DP (EP x ETP inside TP x CP x DP) with v model chunks a GPU, the microbatch size, the
    layers of each of the PP x v chunks in chunk order (chunk j on pipeline position j mod PP),
    recomputation, sequence parallelism, ZeRO stage, the overlaps and the gradient-reduce
    dtype. ``overlap_p2p``: pipeline sends overlap compute (Megatron's default with interleaving,
    ``--no-overlap-p2p-communication`` turns it off; without interleaving Megatron's sends block),
    else they are on the critical path. ``cp_comm``: how CP ranks exchange keys and values
    (``llm.rank_costs``); ``expert_skew``: the busiest expert rank's tokens over the mean
    (``llm.experts``; 1: balanced routing); ``precision``: the layers' GEMMs in bf16 or FP8;
    ``fp8_params``: FP8 weights (the ZeRO-1 all-gather in 8 bits, no 16-bit copy);
    ``dispatcher``: how a mixture's tokens reach their experts (``llm.experts.DISPATCHERS``)."""

    tp: int
    pp: int
    dp: int
    layout: tuple[int, ...]
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    microbatch: int = 1
    recompute: str = "none"
    sp: bool = False
    zero: int = 0
    overlap_grad_reduce: bool = False
    grad_reduce: str = "fp32"
    overlap_p2p: bool | None = None  # None: Megatron's default, overlapped with interleaving only
    schedule: str = "1f1b"
    etp: int = 1
    cp_comm: str = "p2p"
    expert_skew: float = 1.0
    precision: str = "bf16"
    fp8_params: bool = False
    dispatcher: str = "alltoall"

    def __post_init__(self) -> None:
        if self.overlap_p2p is None:
            object.__setattr__(self, "overlap_p2p", self.vpp > 1)
        for key in ("tp", "pp", "dp", "vpp", "cp", "ep", "etp", "microbatch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PipeplanError(f"parallelism: {key} must be an integer >= 1, got {value!r}")
        if self.precision not in PRECISIONS:
            raise PipeplanError(f"parallelism: precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_params is not False and (self.fp8_params is not True or self.precision != "fp8"):
            raise PipeplanError(f"parallelism: fp8_params (FP8 weights, --fp8-param-gather) needs precision fp8, got "
                                f"{self.fp8_params!r} with {self.precision}")
        if self.dispatcher not in DISPATCHERS:
            raise PipeplanError(f"parallelism: dispatcher must be one of {', '.join(DISPATCHERS)}, got "
                                f"{self.dispatcher!r}")
        if self.cp_comm not in CP_COMM:
            raise PipeplanError(f"parallelism: cp_comm must be one of {', '.join(CP_COMM)}, got {self.cp_comm!r}")
        skew = self.expert_skew
        if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not 1.0 <= skew <= MAX_SKEW:
            raise PipeplanError(f"parallelism: expert_skew must be a number from 1 to {MAX_SKEW:g}, got {skew!r}")
        if (self.tp * self.cp * self.dp) % (self.ep * self.etp):
            raise PipeplanError(f"parallelism: EP {self.ep} x ETP {self.etp} must divide TP x CP x DP = "
                                f"{self.tp * self.cp * self.dp} (Megatron-core's expert grid)")
        if self.recompute not in RECOMPUTE:
            raise PipeplanError(f"parallelism: recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.zero not in (0, 1):
            raise PipeplanError(f"parallelism: zero must be 0 or 1, got {self.zero!r}")
        if self.grad_reduce not in GRAD_REDUCE:
            raise PipeplanError(f"parallelism: grad_reduce must be fp32 or bf16, got {self.grad_reduce!r}")
        self._check_shape()

    def _check_shape(self) -> None:
        lay = self.layout
        if (len(lay) != self.pp * self.vpp or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lay)
                or 0 in lay[1:-1] or (self.pp == 1 and 0 in lay) or min(self.stage_layers()) < 1):
            raise PipeplanError(f"parallelism: the layout must give {self.pp * self.vpp} chunks (PP {self.pp} x "
                                f"{self.vpp}) of at least one layer each (the first or last may hold the embedding "
                                f"or the head alone), got {list(lay)}")
        if self.schedule in V_SCHEDULES:
            if self.vpp != 2 or self.pp < 2:
                raise PipeplanError(f"parallelism: {self.schedule} runs two chunks a GPU in a V (vpp 2) on a pipeline "
                                    f"(PP >= 2), got vpp {self.vpp} and PP {self.pp}")
        elif self.vpp > 1 and (self.pp < 2 or self.schedule != INTERLEAVED):
            raise PipeplanError(f"parallelism: {self.vpp} model chunks a GPU need a pipeline (PP >= 2) and the "
                                f"{INTERLEAVED} schedule (or, two a GPU, {' or '.join(V_SCHEDULES)}), got PP "
                                f"{self.pp} and {self.schedule}")
        if self.vpp == 1 and self.schedule not in SINGLE_SCHEDULES:
            raise PipeplanError(f"parallelism: schedule {self.schedule} with one chunk a GPU (use "
                                f"{', '.join(SINGLE_SCHEDULES)}, or vpp > 1 for {INTERLEAVED})")
        if self.sp and self.tp == 1:
            raise PipeplanError("parallelism: sequence parallelism splits the tensor-parallel group's sequence; "
                                "it needs TP > 1")
        if self.overlap_grad_reduce and self.dp * self.cp == 1:
            raise PipeplanError("parallelism: overlapping the gradient all-reduce needs data (or context) "
                                "parallelism (DP x CP > 1)")
        if self.overlap_p2p and self.vpp == 1:
            raise PipeplanError("parallelism: Megatron overlaps pipeline sends only with interleaving (vpp > 1)")
        if self.vpp > 1 and not self.overlap_p2p and self.pp <= 2:
            raise PipeplanError("parallelism: Megatron runs interleaving without overlapped sends only on PP > 2")

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        """Expert data parallelism: the ranks holding the same experts, TP x CP x DP / (EP x ETP)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def cut(self) -> Cut:
        """How one GPU's share of a node is cut (``llm.rank_costs``)."""
        return Cut(self.tp, self.sp, self.cp, self.cp_comm, ExpertCut(self.ep, self.etp, float(self.expert_skew),
                                                                         self.dispatcher),
                   self.precision == "fp8", self.fp8_params)

    @property
    def v_shape(self) -> bool:
        """Two chunks a GPU in a V (``V_SCHEDULES``)."""
        return self.schedule in V_SCHEDULES

    def position(self, chunk: int) -> int:
        """The pipeline position of chunk ``chunk``: j mod PP (Megatron's loop), or in a V j then
        2 PP - 1 - j."""
        return min(chunk, 2 * self.pp - 1 - chunk) if self.v_shape else chunk % self.pp

    def stage_layers(self) -> list[int]:
        """Layers of each pipeline position (its v chunks together)."""
        if not self.v_shape:
            return [sum(self.layout[s::self.pp]) for s in range(self.pp)]
        return [self.layout[s] + self.layout[2 * self.pp - 1 - s] for s in range(self.pp)]

    def check_model(self, spec: DecoderSpec) -> None:
        """One line on what ``spec`` cannot run this way (module docstring)."""
        where = f"{spec.name} with TP {self.tp}"
        if spec.heads % self.tp:
            raise PipeplanError(f"{where}: {spec.heads} attention heads do not split over {self.tp} ranks")
        if spec.kv_heads % self.tp and self.tp % spec.kv_heads:
            raise PipeplanError(f"{where}: {spec.kv_heads} key/value heads neither split over nor replicate onto "
                                f"{self.tp} ranks (Megatron-core takes num_query_groups a divisor or a multiple of TP)")
        if sum(self.layout) != spec.layers:
            raise PipeplanError(f"{spec.name}: the layout {list(self.layout)} holds {sum(self.layout)} layers, "
                                f"the model {spec.layers}")
        if self.cp > 1 and spec.seq % (2 * self.cp):
            raise PipeplanError(f"{spec.name} with CP {self.cp}: the sequence {spec.seq} is not a multiple of 2 x CP "
                                "(Megatron's load-balanced chunks)")
        self._check_experts(spec)

    def _check_experts(self, spec: DecoderSpec) -> None:
        if not spec.moe:
            if self.ep != 1 or self.etp != 1 or self.dispatcher != "alltoall":
                raise PipeplanError(f"{spec.name} has no experts: EP and ETP must be 1 and the dispatcher the "
                                    f"default, got EP {self.ep}, ETP {self.etp}, dispatcher {self.dispatcher}")
            return
        where = f"{spec.name} with EP {self.ep}, ETP {self.etp}"
        if spec.experts % self.ep:
            raise PipeplanError(f"{where}: {spec.experts} experts do not split over {self.ep} ranks")
        if spec.expert_ffn % self.etp:
            raise PipeplanError(f"{where}: the experts' width {spec.expert_ffn} does not split over {self.etp} ranks")
        if self.tp > 1 and not self.sp:
            raise PipeplanError(f"{spec.name} with TP {self.tp}: a mixture of experts under tensor parallelism "
                                "needs sequence parallelism (Megatron-core raises otherwise)")

    def microbatches(self, global_batch: int) -> int:
        """Microbatches a replica runs for ``global_batch`` samples; one line unless whole."""
        per = self.dp * self.microbatch
        if global_batch % per:
            raise PipeplanError(f"global batch {global_batch} is not a whole number of microbatches of "
                                f"{self.microbatch} on each of {self.dp} data-parallel replicas")
        m = global_batch // per
        if self.vpp > 1 and not self.v_shape and m % self.pp:
            raise PipeplanError(f"interleaving runs a multiple of PP = {self.pp} microbatches a replica; "
                                f"global batch {global_batch} gives {m}")
        return m

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = list(self.layout)
        return {k: v for k, v in d.items() if k not in QUIET_DEFAULTS or v != QUIET_DEFAULTS[k]}


def parallelism_from_dict(d: object, where: str = "plan") -> Parallelism:
    """A plan file's ``parallelism`` object, or one line on what is wrong with it."""
    if not isinstance(d, dict):
        raise PipeplanError(f"{where}: 'parallelism' must be an object, got {d!r}")
    known = {f.name for f in fields(Parallelism)}
    unknown = sorted(set(d) - known - {"global_batch"})
    if unknown:
        raise PipeplanError(f"{where}: 'parallelism' has unknown key {unknown[0]!r}")
    for key in ("tp", "pp", "dp", "layout"):
        if key not in d:
            raise PipeplanError(f"{where}: 'parallelism' lacks {key!r}")
    if not isinstance(d["layout"], list):
        raise PipeplanError(f"{where}: 'parallelism' layout must be a list of layer counts, got {d['layout']!r}")
    for key, kind in (("sp", bool), ("overlap_grad_reduce", bool), ("overlap_p2p", bool), ("fp8_params", bool),
                      ("recompute", str), ("grad_reduce", str), ("schedule", str), ("cp_comm", str),
                      ("precision", str), ("dispatcher", str)):
        if key in d and not isinstance(d[key], kind):
            raise PipeplanError(f"{where}: 'parallelism' {key} must be {'true or false' if kind is bool else 'a string'}"
                                f", got {d[key]!r}")
    args = {k: v for k, v in d.items() if k in known}
    args["layout"] = tuple(args["layout"])
    return Parallelism(**args)
