"""Decoder-only transformer LLMs (GPT-3-style, Llama 2/3, Mistral, Qwen): dimensions ->
parameters, FLOPs and activation bytes per layer, in closed form (docs/llm.md); the published
presets.

- Parameters: attention (queries h x h, keys and values h x kv each with grouped-query
  attention, output h x h), MLP (2 matrices h x ffn, or 3 with a gated SwiGLU MLP), two norms
  per layer (LayerNorm: weight + bias; RMSNorm: weight), biases where the model has them, the
  token embedding (+ learned positions), a final norm and the LM head (none when tied).
  With GPT-3's layout this is Narayanan et al. 2021's Eq. 2, 12lh^2(1 + 13/12h + (V+s)/12lh).
- FLOPs of one microbatch's forward (a multiply-add is 2): the four projections, the
  attention scores QK^T and their product with V (2 x 2bs^2h, the causal mask not exploited,
  as Megatron counts) and the MLP; the LM head 2bshV. Backward is 2 x forward; full
  recomputation adds a layer's forward, selective recomputation (Korthikanti et al. 2022 §5)
  the attention core's. With GPT-3's layout a layer's forward is 24bsh^2 + 4bs^2h
  (Narayanan et al. 2021, Appendix).
- Activation bytes one layer keeps for its backward (16-bit tensors, 1-byte dropout masks):
  Korthikanti et al. 2022 §4, generalized to grouped-query attention, gated MLPs, models
  without dropout and fused (flash) attention, which keeps no s x s matrix. With GPT-3's
  layout it is their Eq. 1, sbh(34 + 5as/h); tensor parallelism t divides all but the
  norms, the dropout masks after attention and MLP and the inputs of the QKV and first MLP
  matrices (Eq. 2, 10sbh replicated); sequence parallelism divides those too (Eq. 4);
  selective recomputation drops the attention core; full recomputation keeps the layer's
  input, 2sbh.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..errors import PipeplanError
from ..limits import check_decoder

BF16 = 2  # bytes of a 16-bit activation, weight or gradient
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class DecoderSpec:
    """A decoder-only transformer's dimensions. ``ffn``: the MLP's intermediate size;
    ``kv_heads``: key/value heads (grouped-query attention; = ``heads`` without it);
    ``gated``: a SwiGLU MLP (3 matrices); ``tied``: the LM head shares the embedding table;
    ``norm``: ``layernorm`` or ``rmsnorm``; ``positions``: ``learned`` (a seq x hidden table)
    or ``rope``; ``dropout``: the layer keeps dropout masks; ``flash``: fused attention;
    ``qkv_bias``: without ``bias``, biases on the query, key and value projections alone;
    ``rope_base``, ``norm_eps``: what an engine needs to build the same model (no cost)."""

    name: str
    hidden: int
    layers: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    kv_heads: int
    gated: bool = False
    tied: bool = False
    norm: str = "layernorm"
    bias: bool = True
    positions: str = "learned"
    dropout: bool = True
    flash: bool = False
    qkv_bias: bool = False  # biases on the query, key and value projections only (Qwen2)
    rope_base: float = 10000.0  # rotary positions' base (theta); Llama 3: 500,000 (costs nothing, engines need it)
    norm_eps: float = 1e-5  # the norms' epsilon (as rope_base: for the engines)
    head_size: int = 0  # a head's width where it is not hidden / heads (Qwen3: 128 for hidden 2,048 and 32 heads)
    qk_norm: bool = False  # an RMSNorm over each head's queries and keys (Qwen3)
    # mixture of experts (``experts`` 0: a dense MLP in every layer): routed experts of width
    # ``expert_ffn``, ``top_k`` of them a token, shared experts of width ``shared_ffn`` in all,
    # a router (hidden x experts); the first ``dense_layers`` keep a dense MLP of ``ffn``
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    # group-limited routing (DeepSeek-V2/V3; ``route_groups`` 0: none): the experts in
    # ``route_groups`` equal groups, a token's ``top_k`` chosen among the ``route_group_topk``
    # groups its scores rank first (Megatron-core's ``moe_router_num_groups``/``group_topk``)
    route_groups: int = 0
    route_group_topk: int = 0
    # Multi-head Latent Attention (DeepSeek-V2/V3; ``kv_lora`` 0: none): queries through a
    # rank-``q_lora`` bottleneck, keys and values through a rank-``kv_lora`` latent, each
    # query/key head ``head_size`` wide plus ``rope_dim`` of decoupled rotary part, each value
    # head ``v_head`` wide
    q_lora: int = 0
    kv_lora: int = 0
    rope_dim: int = 0
    v_head: int = 0

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for key in ("hidden", "layers", "heads", "seq", "vocab", "ffn", "kv_heads"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PipeplanError(f"{where}: {key} must be a positive integer, got {value!r}")
            check_decoder(key, value, where)
        for key in ("head_size", "experts", "top_k", "expert_ffn", "shared_ffn", "dense_layers", "route_groups",
                    "route_group_topk", "q_lora", "kv_lora", "rope_dim", "v_head"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PipeplanError(f"{where}: {key} must be an integer >= 0, got {value!r}")
            check_decoder(key, value, where)
        if self.experts and not (0 < self.top_k <= self.experts and self.expert_ffn > 0):
            raise PipeplanError(f"{where}: {self.experts} experts need top_k from 1 to {self.experts} and an "
                                f"expert_ffn, got top_k {self.top_k}, expert_ffn {self.expert_ffn}")
        self._check_route_groups(where)
        if self.dense_layers > self.layers:
            raise PipeplanError(f"{where}: dense_layers {self.dense_layers} is above layers {self.layers}")
        if self.kv_lora and not (self.head_size and self.v_head):
            raise PipeplanError(f"{where}: latent attention (kv_lora) needs head_size and v_head")
        if not self.head_size and self.hidden % self.heads:
            raise PipeplanError(f"{where}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise PipeplanError(f"{where}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        for key in ("rope_base", "norm_eps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e12:
                raise PipeplanError(f"{where}: {key} must be a number > 0, got {value!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise PipeplanError(f"{where}: norm must be layernorm or rmsnorm, got {self.norm!r}")
        if self.positions not in ("learned", "rope"):
            raise PipeplanError(f"{where}: positions must be learned or rope, got {self.positions!r}")

    def _check_route_groups(self, where: str) -> None:
        """Megatron-core's rules for group-limited routing (``TransformerConfig.__post_init__``)."""
        g, m = self.route_groups, self.route_group_topk
        if not (g or m):
            return
        if not (self.experts and g and m):
            raise PipeplanError(f"{where}: group-limited routing needs experts, route_groups and route_group_topk, "
                                f"got experts {self.experts}, route_groups {g}, route_group_topk {m}")
        if self.experts % g or m > g or self.top_k % m:
            raise PipeplanError(f"{where}: route_groups {g} must divide experts {self.experts}, route_group_topk {m} "
                                f"be at most route_groups and divide top_k {self.top_k}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def moe(self) -> bool:
        """A mixture of experts (``experts`` > 0)."""
        return self.experts > 0

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def kv_rank(self, tp: int) -> int:
        """Width of the keys (and of the values) one of ``tp`` tensor-parallel ranks holds: its
        1 / tp of the key/value heads, or with more ranks than key/value heads one head,
        replicated tp / kv_heads times (Megatron-core takes num_query_groups a divisor or a
        multiple of TP, docs/megatron-rules.md)."""
        if self.kv_heads % tp == 0:
            return self.kv_dim // tp
        if tp % self.kv_heads == 0:
            return self.head_dim
        raise PipeplanError(f"model {self.name!r}: {self.kv_heads} key/value heads neither split over nor replicate "
                            f"onto {tp} tensor-parallel ranks")

    def kv_replicated_params(self, tp: int) -> int:
        """Parameters a layer's ``tp`` ranks hold beyond its own (key/value heads replicated)."""
        return 2 * self.hidden * (tp * self.kv_rank(tp) - self.kv_dim)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    # -- parameters (counts) ------------------------------------------------------------------
    def _norm_params(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def layer_params(self) -> int:
        """A dense layer's: attention, MLP, two norms (a mixture's: ``moe_layer_params``)."""
        return self.attention_params() + self.mlp_params(False) + 2 * self._norm_params()

    def moe_layer_params(self) -> int:
        """A mixture's layer: attention, router, shared and routed experts, two norms."""
        return self.attention_params() + self.mlp_params(True) + 2 * self._norm_params()

    def embedding_params(self) -> int:
        """Token table (+ learned positions)."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.positions == "learned" else 0)

    def head_params(self) -> int:
        """The final norm and, unless tied to the embedding, the LM head."""
        return self._norm_params() + (0 if self.tied else self.vocab * self.hidden)

    def total_params(self) -> int:
        return self._layer_params_sum(active=False) + self.embedding_params() + self.head_params()

    # -- mixtures of experts, latent attention, other head sizes (counts) -----------------------
    def attention_params(self) -> int:
        """A layer's attention: the projections (with MLA its low-rank factors and their norms),
        the biases of the query, key and value projections where the model has them, the
        per-head query and key norms (``qk_norm``)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_dim
        if self.kv_lora:  # DeepSeek-V3's MLA (its modeling code's projections)
            qk = self.heads * (self.head_dim + self.rope_dim)
            queries = h * self.q_lora + self.q_lora + self.q_lora * qk if self.q_lora else h * qk
            latent = h * (self.kv_lora + self.rope_dim) + self.kv_lora
            return queries + latent + self.kv_lora * self.heads * (self.head_dim + self.v_head) + \
                self.heads * self.v_head * h
        biases = (q + 2 * kv) * (self.bias or self.qkv_bias) + (h if self.bias else 0)
        return h * (q + 2 * kv) + q * h + biases + (2 * self.head_dim if self.qk_norm else 0)

    def mlp_params(self, moe: bool, active: bool = False) -> int:
        """A layer's MLP: dense (``ffn``), or with ``moe`` its router, shared experts and routed
        experts (all of them, or with ``active`` the ``top_k`` a token goes through)."""
        m, h = self.mlp_matrices, self.hidden
        if not moe:
            return m * h * self.ffn + ((m - 1) * self.ffn + h if self.bias else 0)
        routed = (self.top_k if active else self.experts) * m * h * self.expert_ffn
        return routed + m * h * self.shared_ffn + h * self.experts

    def _layer_params_sum(self, active: bool) -> int:
        """Every layer's parameters (``active``: those a token goes through)."""
        dense = self.layer_params()
        sparse = dense - self.mlp_params(False) + self.mlp_params(True, active) if self.moe else dense
        n_dense = self.dense_layers if self.moe else self.layers
        return n_dense * dense + (self.layers - n_dense) * sparse

    def active_params(self, embedding: bool = True) -> int:
        """The parameters one token goes through (a dense model's all); ``embedding``: with the
        token table (a lookup, no multiply)."""
        return self._layer_params_sum(active=True) + (self.embedding_params() if embedding else 0) + \
            self.head_params()

    def flops_per_token(self) -> float:
        """Forward + backward FLOPs of one token's matrix multiplies through the active weights
        (2 a multiply-add, backward 2 x forward: 6 x the active parameters but the token table),
        plus the attention scores and their product with the values over the sequence
        (causal mask not exploited, as Megatron counts)."""
        qk = self.head_dim + (self.rope_dim if self.kv_lora else 0)
        v = self.v_head if self.kv_lora else self.head_dim
        attention = 2.0 * self.seq * self.heads * (qk + v) * self.layers
        weights = self._layer_params_sum(active=True) + self.vocab * self.hidden  # the LM head's (tied or not)
        return 3.0 * (2.0 * weights + attention)

    # -- FLOPs of one microbatch of ``samples`` sequences ---------------------------------------
    def attention_core_flops(self, samples: int, keys: int = 0) -> float:
        """QK^T and the product with V, forward: 2 x 2bs^2h, each of the s queries over ``keys``
        positions (default s; a context-parallel rank's s / cp queries see all s); with other
        head widths (``head_size``, latent attention) 2bs x keys x heads x (qk + v)."""
        keys = keys or self.seq
        if self.standard_heads:
            return 4.0 * samples * self.seq * keys * self.hidden
        qk, v = self.head_widths
        return 2.0 * samples * self.seq * keys * self.heads * (qk + v)

    @property
    def standard_heads(self) -> bool:
        """Heads of hidden / heads wide, keys and values as wide (no latent attention)."""
        return not self.kv_lora and (not self.head_size or self.head_size * self.heads == self.hidden)

    @property
    def head_widths(self) -> tuple[int, int]:
        """(query/key, value) width of a head: latent attention's queries and keys carry the
        decoupled rotary part, its values ``v_head``."""
        if self.kv_lora:
            return self.head_dim + self.rope_dim, self.v_head
        return self.head_dim, self.head_dim

    def attention_weights(self) -> tuple[int, int]:
        """(input projections, output projection) weights of a layer's attention, biases and
        norms apart: Q, K, V (with latent attention its down and up projections), and O."""
        if self.standard_heads:
            return self.hidden * (self.hidden + 2 * self.kv_dim), self.hidden * self.hidden
        qk, v = self.head_widths
        out = self.heads * v * self.hidden
        if not self.kv_lora:
            q = self.heads * self.head_dim
            return self.hidden * (q + 2 * self.kv_dim), out
        queries = self.hidden * self.q_lora + self.q_lora * self.heads * qk if self.q_lora else \
            self.hidden * self.heads * qk
        latent = self.hidden * (self.kv_lora + self.rope_dim) + self.kv_lora * self.heads * (self.head_dim + v)
        return queries + latent, out

    def mlp_weights(self, moe: bool) -> int:
        """Weights a token goes through in a layer's MLP: the dense one's, or a mixture's router,
        shared experts and its ``top_k`` routed experts."""
        m, h = self.mlp_matrices, self.hidden
        if not moe:
            return m * h * self.ffn
        return h * self.experts + m * h * (self.shared_ffn + self.top_k * self.expert_ffn)

    def is_moe_layer(self, i: int) -> bool:
        """Layer ``i`` routes to experts (a mixture's layers after its ``dense_layers``)."""
        return self.moe and i >= self.dense_layers

    def layer_flops(self, samples: int, moe: bool = False, keys: int = 0) -> float:
        """One layer's forward (``moe``: a mixture's layer, through the active experts)."""
        tokens = samples * self.seq
        if self.standard_heads and not moe:
            h, kv = self.hidden, self.kv_dim
            proj = 2.0 * tokens * h * (h + 2 * kv) + 2.0 * tokens * h * h
            mlp = 2.0 * tokens * h * self.ffn * self.mlp_matrices
            return proj + mlp + self.attention_core_flops(samples, keys)
        return 2.0 * tokens * (sum(self.attention_weights()) + self.mlp_weights(moe)) + \
            self.attention_core_flops(samples, keys)

    def head_flops(self, samples: int) -> float:
        """The LM head's forward: 2bshV."""
        return 2.0 * samples * self.seq * self.hidden * self.vocab

    def layer_training_flops(self, samples: int, recompute: str = "none", moe: bool = False) -> float:
        """Forward + backward (2 x forward) + what ``recompute`` runs again."""
        again = {"none": 0.0, "selective": self.attention_core_flops(samples),
                 "full": self.layer_flops(samples, moe)}[_recompute(recompute)]
        return 3.0 * self.layer_flops(samples, moe) + again

    def model_flops_per_sample(self) -> float:
        """Forward + backward of one sample, no recomputation: the FLOPs MFU counts (a
        mixture's: through the active experts)."""
        sparse = self.layers - self.dense_layers if self.moe else 0
        layers = (self.layers - sparse) * self.layer_flops(1) + (sparse * self.layer_flops(1, True) if sparse else 0.0)
        return 3.0 * (layers + self.head_flops(1))

    # -- activation memory (bytes one layer keeps for its backward) ----------------------------
    def layer_activation_bytes(self, samples: int, tp: int = 1, sp: bool = False,
                               recompute: str = "none", moe: bool = False, keys: int = 0, fp8: bool = False) -> float:
        """Korthikanti et al. 2022 §4 for this layer's layout (module docstring); ``keys`` as in
        ``attention_core_flops``. A mixture's layer (``moe``) counts its shared experts' MLP
        here, its routed experts apart (``llm.experts``). ``fp8``: each linear keeps its input
        as its FP8 copy, one byte an element (Transformer Engine's ``_Linear.forward`` saves
        the quantized input, its column-wise data, for the weight gradient)."""
        rc = _recompute(recompute)
        s, b, h = self.seq, samples, self.hidden
        f = (self.shared_ffn if moe else self.ffn)
        sbh = s * b * h
        if rc == "full":
            return BF16 * sbh / (tp if sp else 1)
        mask = 1 if self.dropout else 0
        linear_in = 1 if fp8 else BF16  # a linear's input, kept for its weight gradient
        # kept whole on every rank of a tensor-parallel group unless sequence-parallel:
        # the two norms' inputs, the QKV and first MLP matrices' inputs, the two dropout masks
        replicated = 2 * BF16 * sbh + 2 * linear_in * sbh + 2 * mask * sbh
        # divided over the group: Q and K for the scores, V, the output projection's input,
        # the MLP's intermediate tensors (the last one the second matrix's input), the attention core
        qk, v = self.head_widths
        split = BF16 * sbh + linear_in * sbh if self.standard_heads else \
            BF16 * s * b * self.heads * qk + linear_in * s * b * self.heads * v
        split += ((2 if self.gated else 1) * BF16 + linear_in) * s * b * f
        if rc == "none":
            split += self.attention_core_bytes(samples, keys)
        if self.standard_heads:
            keys_values = 2 * BF16 * s * b * self.kv_rank(tp)  # K and V: a rank's share, or a replicated head
        else:
            keys_values = BF16 * s * b * self.heads * (qk + v) / tp
        return replicated / (tp if sp else 1) + split / tp + keys_values

    def attention_core_bytes(self, samples: int, keys: int = 0) -> float:
        """What the attention core keeps besides Q, K, V and its output: the softmax output
        (and its dropout mask and dropped-out copy) per head, s x ``keys`` each; a fused
        (flash) kernel keeps each row's log-sum-exp (fp32) instead."""
        s, b, a = self.seq, samples, self.heads
        if self.flash:
            return 4 * b * a * s
        return (BF16 + (1 + BF16 if self.dropout else 0)) * a * s * (keys or s) * b

    def attention_core_traffic(self, samples: int, backward: bool = False, keys: int = 0) -> float:
        """Bytes an unfused attention core moves through memory, per s x s score of each head.
        Forward: the scores written (2), a fused scale-mask-softmax reading and writing them
        (4), with dropout its read, write and mask (5), and the product with V reading the
        probabilities (2). Backward: the probabilities read for dV (2), dP written (2), with
        dropout its backward reading dP and the mask and writing (5), the softmax backward
        reading P and dP and writing dS (6), dS read by the dQ and dK products (4). A fused
        (flash) kernel keeps them on chip (0)."""
        if self.flash:
            return 0.0
        drop = 5 if self.dropout else 0
        per_score = (2 + 2 + drop + 6 + 4) if backward else (2 + 4 + drop + 2)
        return float(per_score * samples * self.heads * self.seq * (keys or self.seq))

    def as_dict(self) -> dict:
        return asdict(self)


def decoder_of(meta: dict, where: str = "model") -> DecoderSpec:
    """The ``DecoderSpec`` a graph's ``meta["decoder"]`` records, or one line on what is wrong."""
    d = meta.get("decoder")
    if not isinstance(d, dict):
        raise PipeplanError(f"{where}: meta 'decoder' must be an object of a decoder's dimensions, got {d!r}")
    known = {f.name: f.type for f in fields(DecoderSpec)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise PipeplanError(f"{where}: meta 'decoder' has unknown key {unknown[0]!r}")
    missing = [k for k in ("name", "hidden", "layers", "heads", "seq", "vocab", "ffn", "kv_heads") if k not in d]
    if missing:
        raise PipeplanError(f"{where}: meta 'decoder' lacks {missing[0]!r}")
    for key, kind in known.items():
        want = {"bool": bool, "str": str}.get(str(kind))
        if key in d and want is not None and not isinstance(d[key], want):
            raise PipeplanError(f"{where}: meta 'decoder' {key!r} must be {'true or false' if want is bool else 'a string'}"
                                f", got {d[key]!r}")
    return DecoderSpec(**d)


def _recompute(value: str) -> str:
    if value not in RECOMPUTE:
        raise PipeplanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {value!r}")
    return value


def gpt(name: str, hidden: int, layers: int, heads: int, seq: int = 2048, vocab: int = 51200,
        ffn: int | None = None, kv_heads: int | None = None) -> DecoderSpec:
    """A GPT-3-style decoder (Brown et al. 2020; Megatron-LM's GPT): LayerNorm, biases,
    learned positions, GELU MLP of 4 x hidden, dropout, tied embedding and LM head."""
    return DecoderSpec(name, hidden, layers, heads, seq, vocab, ffn or 4 * hidden, kv_heads or heads,
                       tied=True)


def llama(name: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int = 128256,
          seq: int = 8192, rope_base: float = 500000.0, norm_eps: float = 1e-5) -> DecoderSpec:
    """A Llama-style decoder (Touvron et al. 2023; Llama 3, Dubey et al. 2024): RMSNorm, no
    biases, rotary positions, SwiGLU MLP, grouped-query attention, no dropout, fused attention,
    an LM head of its own; rotary base 500,000 (Llama 3) unless given."""
    return DecoderSpec(name, hidden, layers, heads, seq, vocab, ffn, kv_heads, gated=True, tied=False,
                       norm="rmsnorm", bias=False, positions="rope", dropout=False, flash=True, rope_base=rope_base,
                       norm_eps=norm_eps)


def mixture(name: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, experts: int,
        top_k: int, expert_ffn: int, rope_base: float, norm_eps: float, seq: int = 4096, **layout) -> DecoderSpec:
    """A Llama-style mixture of experts (Mixtral, Qwen3-MoE, DeepSeek-V3): routed experts in
    place of the dense MLP, ``layout`` the rest (shared experts, dense first layers, head
    size, latent attention)."""
    return replace(llama(name, hidden, layers, heads, kv_heads, ffn, vocab, seq, rope_base, norm_eps),
                   experts=experts, top_k=top_k, expert_ffn=expert_ffn, **layout)


#: Published dimensions. GPT-3 175B: Brown et al. 2020, Table 2.1 (Narayanan et al. 2021 use
#: vocab 51,200); Llama 3: Dubey et al. 2024, Table 3, vocabulary 128,256 as released.
#: Mixtures of experts, as their released configs give them (config.json on the Hugging Face
#: hub): Mixtral 8x7B and 8x22B (Jiang et al. 2024), Qwen3-30B-A3B and 235B-A22B (Qwen3
#: technical report, 2025), DeepSeek-V3 (DeepSeek-AI 2024, §2 and its config), with a
#: training sequence of 4,096 tokens (the configs give the longest context).
PRESETS: dict[str, DecoderSpec] = {s.name: s for s in (
    gpt("gpt3-175b", 12288, 96, 96),
    llama("llama3-8b", 4096, 32, 32, 8, 14336),
    llama("llama3-70b", 8192, 80, 64, 8, 28672),
    llama("llama3-405b", 16384, 126, 128, 8, 53248),
    mixture("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 8, 2, 14336, 1e6, 1e-5),
    mixture("mixtral-8x22b", 6144, 56, 48, 8, 16384, 32768, 8, 2, 16384, 1e6, 1e-5),
    mixture("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, 128, 8, 768, 1e6, 1e-6, head_size=128, qk_norm=True),
    mixture("qwen3-235b-a22b", 4096, 94, 64, 4, 12288, 151936, 128, 8, 1536, 1e6, 1e-6, head_size=128, qk_norm=True),
    mixture("deepseek-v3", 7168, 61, 128, 128, 18432, 129280, 256, 8, 2048, 1e4, 1e-6, shared_ffn=2048,
        dense_layers=3, route_groups=8, route_group_topk=4, head_size=128, q_lora=1536, kv_lora=512, rope_dim=64, v_head=128),
)}
