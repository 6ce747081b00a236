"""The analytic model zoo: ``zoo:NAME?key=value`` -> a :class:`Graph` built from hyper-parameters.

Every node (a layer or a block) gets, for ONE microbatch:

* ``flops``  forward FLOPs of its matmuls / convolutions / recurrences (a multiply-add is 2 FLOPs;
  element-wise ops are priced by the bytes they move, not counted as FLOPs, the usual convention);
* ``fwd``    seconds on the reference device: compute FLOPs / (15.7 TFLOP/s x an efficiency per
  kind of op) + bytes of memory-bound ops / (900 GB/s x an efficiency);
* ``bwd``    2 x forward (input gradient + weight gradient), except where known better: the
  first convolution / linear of a model and embedding lookups compute no input gradient
  (1 x, resp. a scatter-add of the output gradient into a dense table gradient);
* the backward's split (zero-bubble schedules run it as I then W): a weight matmul's input
  gradient and weight gradient cost the same FLOPs (1 x each); a matmul of two activations
  (attention scores, P.V) has two input gradients and no weight gradient; memory-bound ops
  (norms, softmax, residual adds) are input gradient; an embedding's table gradient is weight
  gradient. ``meta["backward_input_fraction"]`` = input-gradient time / backward time of
  the whole model (the simulator's I share; docs/zoo.md);
* ``params`` parameter count x 4 bytes (fp32); weights tied between nodes are counted once, on
  their first user (``meta["shared_weights"]`` lists the other users);
* ``act``    bytes of what the node hands to the next node (its output, fp32). Graphs are chains
  of blocks; where a later node also needs an earlier output (the encoder memory of an
  encoder-decoder, BERT's sequence output past the pooler) it travels along with the output
  and is counted in ``act``, as it must cross a stage boundary;
* ``inplace`` / ``saved`` (docs/memory.md): the defaults. Nodes are whole blocks whose in-place
  ReLUs and residual adds lie inside them, so none is in-place; ``saved`` = ``act``, a lower
  bound of what a block keeps for backward (its internal tensors are not modelled).

``granularity=op`` (BERT, Transformer, T5; zoo_ops.py): one node per operation the layer's
builder prices instead (``layer14/attn.q``, ``dec5/cross.k``, ``lm_head/proj``, ...), with the
same formulas: a layer's ops sum to its node's fwd, bwd, flops and params; an op's ``act`` is
its output tensor; edges are the data dependencies, so cut bytes come from the DAG. Every
graph's ``meta["granularity"]`` says which (``"layer"`` or ``"op"``).

Architectures: BERT (Devlin et al. 2019), XLNet (Yang et al. 2019), Transformer (Vaswani et al.
2017), T5 (Raffel et al. 2020), GNMT (Wu et al. 2016, MLPerf/PipeDream variant), VGG (Simonyan &
Zisserman 2015), AlexNet (Krizhevsky et al. 2012, torchvision one-tower variant), GoogLeNet
(Szegedy et al. 2015), ResNet (He et al. 2016, torchvision v1.5), Inception-v3 (Szegedy et al.
2016, torchvision). See docs/zoo.md for the formulas, defaults and parameter counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from ..errors import PipeplanError
from ..limits import MAX_LAYERS, check_layers
from .model import Graph, NodeSpec
from .zoo_ops import GRANULARITIES, Op, assemble

# -- reference device ------------------------------------------------------------------------
REFERENCE_DEVICE = "V100"
REFERENCE_TFLOPS = 15.7            # fp32 peak of an NVIDIA V100 (SXM2), TFLOP/s
REFERENCE_MEM_GBPS = 900.0         # HBM2 peak, GB/s
EFFICIENCY = {"matmul": 0.70, "rnn": 0.60, "conv": 0.60, "conv_winograd": 1.10, "memory": 0.40}
BYTES = 4                          # fp32

_PEAK = REFERENCE_TFLOPS * 1e12
_MEM_BW = REFERENCE_MEM_GBPS * 1e9 * EFFICIENCY["memory"]
#: Key of a builder's ``hyper`` holding meta entries that replace others at granularity=op.
_OP_META = "_op_meta"


class _Node:
    """One node under construction: ops add their FLOPs, times and parameters to it and, if
    it ``record``s its ops (granularity=op), to the op opened by :meth:`op` (zoo_ops.py)."""

    def __init__(self, nid: str, desc: str, record: bool = False) -> None:
        self.id, self.desc, self.record = nid, desc, record
        self.flops = self.fwd = self.bwd = self.params = self.act = 0.0
        self.bwd_w = 0.0  # the weight-gradient part of ``bwd``
        self.ops: list[Op] = []
        self._open: Op | None = None

    def ref(self, name: str) -> str:
        """The op-level id of this node's op ``name``."""
        return f"{self.id}/{name}"

    def op(self, name: str, out: float, inputs: tuple[str | None, ...], what: str,
           shapes: tuple[tuple[float, ...], ...], sep: str = "x", note: str = "") -> "_Node":
        """Record op ``name`` (``out`` output elements, reading the op ids ``inputs``; for
        its description ``what``, tensor ``shapes`` joined by ``sep``, ``note``); the costs
        charged inside ``with n.op(...):`` are its own. A node that does not record keeps
        its totals only."""
        if self.record:
            self._open = Op(name, out, inputs, what, shapes, sep, note)
            self.ops.append(self._open)
        return self

    def __enter__(self) -> Op | None:
        return self._open

    def __exit__(self, *exc: object) -> None:
        self._open = None

    def _charge(self, flops: float, fwd: float, bwd: float, bwd_w: float = 0.0) -> None:
        self.flops += flops
        self.fwd += fwd
        self.bwd += bwd
        self.bwd_w += bwd_w
        if self._open is not None:
            self._open.flops += flops
            self._open.fwd += fwd
            self._open.bwd += bwd

    def compute(self, flops: float, kind: str = "matmul", input_grad: bool = True, weights: bool = True) -> None:
        """Dense FLOPs; backward = weight gradient (1x) + input gradient (1x, if needed); a
        product of two activations (``weights=False``) has two input gradients instead."""
        t = flops / (_PEAK * EFFICIENCY[kind])
        if weights:
            self._charge(flops, t, (2.0 if input_grad else 1.0) * t, t)
        else:
            self._charge(flops, t, 2.0 * t)

    def memory(self, nbytes: float, bwd_bytes: float | None = None, weight_grad: bool = False) -> None:
        """A memory-bound op moving ``nbytes`` forward (backward: as many unless given; an
        input gradient unless ``weight_grad``, a table's gradient)."""
        bwd = (nbytes if bwd_bytes is None else bwd_bytes) / _MEM_BW
        self._charge(0.0, nbytes / _MEM_BW, bwd, bwd if weight_grad else 0.0)

    def add_params(self, count: float) -> None:
        """Parameters (a count) of the node and of its open op."""
        self.params += count
        if self._open is not None:
            self._open.params += count

    def spec(self) -> NodeSpec:
        return NodeSpec(id=self.id, fwd=self.fwd, bwd=self.bwd, params=self.params * BYTES,
                        act=self.act * BYTES, desc=self.desc, flops=self.flops)


# -- building blocks shared by the NLP models (rows = tokens in the microbatch) --------------
# Each records the op(s) it prices; ``name`` / ``x`` (the op id it reads) wire the op graph.
def _eltwise(n: _Node, elems: float, passes: float = 2, *, name: str = "eltwise",
             what: str = "elementwise", shape: tuple[float, ...] | None = None,
             inputs: tuple[str | None, ...] = ()) -> str:
    """An element-wise op reading/writing ``passes`` tensors of ``elems`` fp32 elements
    (its output: ``elems`` elements)."""
    with n.op(name, elems, inputs, what, (shape or (elems,),)):
        n.memory(passes * elems * BYTES)
    return n.ref(name)


def _linear(n: _Node, rows: float, din: int, dout: int, bias: bool = True,
            kind: str = "matmul", input_grad: bool = True, *, name: str = "linear",
            x: str | None = None) -> str:
    with n.op(name, rows * dout, (x,), "matmul", ((rows, din), (din, dout)),
              note=" + bias" if bias else ""):
        n.compute(2.0 * rows * din * dout, kind, input_grad)
        n.add_params(din * dout + (dout if bias else 0))
    return n.ref(name)


def _norm(n: _Node, rows: float, d: int, shift: bool = True, *, name: str = "norm",
          x: str | None = None) -> str:
    """LayerNorm (scale + shift) or T5's RMS norm (scale only)."""
    with n.op(name, rows * d, (x,), "layernorm" if shift else "rmsnorm", ((rows, d),)):
        n.add_params(d * (2 if shift else 1))
        n.memory(2 * (rows * d) * BYTES)                  # = _eltwise(n, rows * d)
    return n.ref(name)


def _embedding(n: _Node, rows: float, vocab: int, d: int, owner: bool = True, *,
               name: str = "lookup") -> str:
    """Table lookup: no FLOPs, no input gradient; backward scatter-adds the output gradient
    into a dense (vocab x d) table gradient, which is written in full."""
    with n.op(name, rows * d, (), "embedding lookup", ((vocab, d), (rows, d)), " -> ",
              "" if owner else " [tied]"):
        if owner:
            n.add_params(vocab * d)
        out = rows * d * BYTES
        n.memory(2 * out, bwd_bytes=2 * out + vocab * d * BYTES, weight_grad=True)
    return n.ref(name)


def _attention(n: _Node, B: int, sq: int, sk: int, d: int, heads: int, dkv: int,
               bias: bool = True, *, x: str | None = None, kv: str | None = None,
               res: str | None = None, pre: str = "attn", scored: str | None = None) -> str:
    """Multi-head attention, queries over ``sq`` positions, keys/values over ``sk``: ops
    ``{pre}.q/k/v/scores/softmax/context/out/residual``. Q reads ``x``, K and V read ``kv``,
    the residual add ``res``; the softmax reads ``scored`` (T5: the position-biased scores)."""
    inner, bh, p = heads * dkv, B * heads, f"{pre}."
    q = _linear(n, B * sq, d, inner, bias, name=p + "q", x=x)
    k = _linear(n, B * sk, d, inner, bias, name=p + "k", x=kv)
    v = _linear(n, B * sk, d, inner, bias, name=p + "v", x=kv)
    with n.op(p + "scores", bh * sq * sk, (q, k), "bmm Q.K^T", ((bh, sq, dkv), (bh, dkv, sk))):
        n.compute(2.0 * B * heads * sq * sk * dkv, weights=False)
    s = _eltwise(n, B * heads * sq * sk, 2, name=p + "softmax", what="scale+mask+softmax",
                 shape=(bh, sq, sk), inputs=(scored or n.ref(p + "scores"),))
    with n.op(p + "context", B * sq * inner, (s, v), "bmm P.V", ((bh, sq, sk), (bh, sk, dkv))):
        n.compute(2.0 * B * heads * sq * sk * dkv, weights=False)
    o = _linear(n, B * sq, inner, d, bias, name=p + "out", x=n.ref(p + "context"))
    return _eltwise(n, B * sq * d, 3, name=p + "residual", what="residual add",
                    shape=(B * sq, d), inputs=(o, res))


def _ffn(n: _Node, rows: float, d: int, ffn: int, bias: bool = True, *, act: str = "gelu",
         x: str | None = None, res: str | None = None) -> str:
    """Feed-forward: ops ``ffn.fc1``, ``ffn.act`` (``act``), ``ffn.fc2``, ``ffn.residual``."""
    h = _linear(n, rows, d, ffn, bias, name="ffn.fc1", x=x)
    h = _eltwise(n, rows * ffn, name="ffn.act", what=act, shape=(rows, ffn), inputs=(h,))
    h = _linear(n, rows, ffn, d, bias, name="ffn.fc2", x=h)
    return _eltwise(n, rows * d, 3, name="ffn.residual", what="residual add", shape=(rows, d),
                    inputs=(h, res))


def _lm_head(n: _Node, rows: float, d: int, vocab: int, owner: bool, bias: bool, *,
             x: str | None = None) -> str:
    """Projection to the vocabulary (weights tied to the embedding unless ``owner``) + softmax:
    ops ``proj`` and ``softmax``."""
    note = ("" if owner else " [tied]") + (" + bias" if bias else "")
    with n.op("proj", rows * vocab, (x,), "matmul", ((rows, d), (d, vocab)), note=note):
        n.compute(2.0 * rows * d * vocab)
        n.add_params((d * vocab if owner else 0) + (vocab if bias else 0))
    return _eltwise(n, rows * vocab, 2, name="softmax", what="softmax", shape=(rows, vocab),
                    inputs=(n.ref("proj"),))


# -- NLP models -------------------------------------------------------------------------------
def _bert(o: dict, *, d: int = 1024, heads: int = 16, ffn: int = 4096,
          vocab: int = 30522, max_pos: int = 512) -> tuple:
    """BERT (Devlin et al. 2019): embeddings, ``layers`` post-LN transformer layers, pooler,
    SQuAD span head (27 nodes for BERT-large, as in SPP's simulation)."""
    B, S, L = o["microbatch"], o["seq"], o["layers"]
    T = B * S
    node = partial(_Node, record=o["granularity"] == "op")
    emb = node("embed", f"BertEmbeddings(vocab={vocab}, d={d})")
    parts = (_embedding(emb, T, vocab, d, name="word"),
             _embedding(emb, T, max_pos, d, name="position"),
             _embedding(emb, T, 2, d, name="token_type"))
    x = _eltwise(emb, T * d, 4, name="sum", what="sum of the 3 embeddings", shape=(T, d),
                 inputs=parts)
    x = _norm(emb, T, d, name="norm", x=x)
    emb.act = T * d
    nodes = [emb]
    for i in range(1, L + 1):
        n = node(f"layer{i}", f"TransformerLayer(d={d}, h={heads}, ffn={ffn})")
        h = _attention(n, B, S, S, d, heads, d // heads, x=x, kv=x, res=x)
        h = _norm(n, T, d, name="norm1", x=h)
        h = _ffn(n, T, d, ffn, act="gelu", x=h, res=h)
        x = _norm(n, T, d, name="norm2", x=h)
        n.act = T * d
        nodes.append(n)
    pool = node("pooler", f"BertPooler(d={d})")
    h = _linear(pool, B, d, d, name="dense", x=x)          # reads the first token of each sample
    _eltwise(pool, B * d, name="tanh", what="tanh", shape=(B, d), inputs=(h,))
    pool.act = T * d + B * d                              # the head reads the sequence output
    head = node("head", f"SQuADSpanHead(d={d})")
    h = _linear(head, T, d, 2, name="span", x=x)
    _eltwise(head, T * 2, name="logits", what="split start/end logits", shape=(T, 2),
             inputs=(h,))
    head.act = T * 2
    hyper = {"layers": L, "d_model": d, "heads": heads, "ffn": ffn, "vocab": vocab}
    return nodes + [pool, head], None, hyper


def _xlnet(o: dict[str, int], *, d: int = 1024, heads: int = 16, ffn: int = 4096,
           vocab: int = 32000) -> tuple:
    """XLNet (Yang et al. 2019): Transformer-XL layers with relative positional attention over
    2S relative positions and segment terms; ``streams=2`` adds the query stream of two-stream
    attention (over all positions, an upper bound), ``streams=1`` is fine-tuning's content
    stream alone. SQuAD head (start, end, answerability) as in XLNet's run_squad."""
    B, S, L, streams = o["microbatch"], o["seq"], o["layers"], o["streams"]
    T, dh = B * S, d // heads
    emb = _Node("embed", f"WordEmbedding(vocab={vocab}, d={d}) + mask_emb")
    _embedding(emb, T, vocab, d)
    emb.params += d                                       # mask_emb (query stream init)
    if streams == 2:
        _eltwise(emb, T * d, 1)
    emb.act = streams * T * d
    nodes = [emb]
    for i in range(1, L + 1):
        n = _Node(f"layer{i}", f"XLNetLayer(d={d}, h={heads}, ffn={ffn}, streams={streams})")
        _linear(n, T, d, d, bias=False)                   # K (shared by both streams)
        _linear(n, T, d, d, bias=False)                   # V
        _linear(n, B * 2 * S, d, d, bias=False)           # R: relative position projection
        n.params += 3 * heads * dh + 2 * heads * dh       # r_w/r_r/r_s biases, seg_embed
        n.params += d * d                                 # Q weights (computed per stream below)
        for s in range(streams):
            n.compute(2.0 * T * d * d)                    # Q (weights shared by the streams)
            n.compute(2.0 * B * heads * S * S * dh, weights=False)      # AC: content term
            n.compute(2.0 * B * heads * S * 2 * S * dh, weights=False)  # BD: position term (2S positions)
            n.compute(2.0 * B * heads * S * 2 * dh, weights=False)      # EF: segment term
            _eltwise(n, B * heads * S * S, 6)             # rel-shift, sum of terms, softmax
            n.compute(2.0 * B * heads * S * S * dh, weights=False)      # P V
            n.compute(2.0 * T * d * d)                    # output projection (shared weights)
            _eltwise(n, T * d, 3)
            _eltwise(n, T * d)                            # LayerNorm (shared weights)
            n.compute(4.0 * T * d * ffn)                  # FFN (shared weights)
            _eltwise(n, T * ffn)
            _eltwise(n, T * d, 5)                         # residual + LayerNorm
        n.params += d * d + 2 * d + (d * ffn + ffn + ffn * d + d) + 2 * d  # O, LN, FFN, LN
        n.act = streams * T * d
        nodes.append(n)
    head = _Node("head", f"XLNetSQuADHead(d={d})")
    _linear(head, T, d, 1)                                # start logits
    _linear(head, T, 2 * d, d)                            # end logits | start state
    _eltwise(head, T * d)
    _norm(head, T, d)
    _linear(head, T, d, 1)
    _linear(head, B, 2 * d, d)                            # answerability
    _eltwise(head, B * d)
    _linear(head, B, d, 1, bias=False)
    head.act = 2 * T + B
    hyper = {"layers": L, "d_model": d, "heads": heads, "ffn": ffn, "vocab": vocab,
             "streams": streams}
    return nodes + [head], None, hyper


def _position_bias(n: _Node, B: int, heads: int, sq: int, first: bool) -> None:
    """T5: add the relative position bias to the self-attention scores (op ``attn.bias``;
    the bucket table belongs to the first layer of the stack)."""
    elems = B * heads * sq * sq
    with n.op("attn.bias", elems, (n.ref("attn.scores"),), "add position bias",
              ((B * heads, sq, sq),)):
        if first:
            n.add_params(32 * heads)                      # relative attention bias buckets
        n.memory(3 * elems * BYTES)                       # = _eltwise(n, elems, 3)


def _stack_layer(n: _Node, x: str, *, B: int, sq: int, d: int, heads: int, dkv: int,
                 ffn: int, t5: bool, first: bool, last: bool, memory: str | None = None,
                 sk: int = 0) -> str:
    """One encoder layer, or a decoder layer (cross-attention over ``memory``, ``sk``
    positions), reading the residual stream ``x``; returns its output op. Post-LN
    (Vaswani) or pre-RMS-norm (T5); norms are named norm1, norm2, ... in sublayer order."""
    rows, bias = B * sq, not t5

    def sublayer(s: str, norm: str, body: Callable[[str, str], str]) -> str:
        y = body(n.ref(norm) if t5 else s, s)             # T5 reads the normed stream
        z = _norm(n, rows, d, shift=not t5, name=norm, x=s if t5 else y)
        return y if t5 else z

    if t5:
        _position_bias(n, B, heads, sq, first)
    scored = n.ref("attn.bias") if t5 else None
    x = sublayer(x, "norm1", lambda a, r: _attention(n, B, sq, sq, d, heads, dkv, bias, x=a,
                                                     kv=a, res=r, scored=scored))
    if memory is not None:
        x = sublayer(x, "norm2", lambda a, r: _attention(n, B, sq, sk, d, heads, dkv, bias,
                                                         x=a, kv=memory, res=r, pre="cross"))
    x = sublayer(x, "norm3" if memory else "norm2",
                 lambda a, r: _ffn(n, rows, d, ffn, bias, act="relu", x=a, res=r))
    if t5 and last:
        x = _norm(n, rows, d, shift=False, name="final_norm", x=x)
    return x


def _token_embedding(node: Callable[..., _Node], nid: str, rows: int, vocab: int, d: int,
                     t5: bool) -> tuple[_Node, str]:
    """The shared table's lookup (+ sinusoidal positions unless T5); owned by ``embed``."""
    owner = nid == "embed"
    n = node(nid, f"Embedding(vocab={vocab}, d={d}) "
              + ("[shared]" if owner else "[tied to embed]"))
    x = _embedding(n, rows, vocab, d, owner=owner, name="word")
    if not t5:
        x = _eltwise(n, rows * d, 3, name="position", what="add sinusoidal positions",
                     shape=(rows, d), inputs=(x,))
    return n, x


def _enc_dec(o: dict, *, d: int, heads: int, dkv: int, ffn: int, vocab: int,
             t5: bool) -> tuple:
    """Encoder-decoder transformer. ``t5=False``: Vaswani et al. (post-LN, biases, one table
    shared by source, target and pre-softmax). ``t5=True``: Raffel et al. (pre-RMS-norm, no
    biases, relative position buckets in the first layer of each stack, tied LM head)."""
    B, S, Tg, L = o["microbatch"], o["seq"], o["tgt_seq"], o["layers"]
    src, tgt = B * S, B * Tg
    node = partial(_Node, record=o["granularity"] == "op")
    arch = {"B": B, "d": d, "heads": heads, "dkv": dkv, "ffn": ffn, "t5": t5}
    emb, x = _token_embedding(node, "embed", src, vocab, d, t5)
    emb.act = src * d
    nodes = [emb]
    kind = "T5" if t5 else "Transformer"
    for i in range(1, L + 1):
        n = node(f"enc{i}", f"{kind}EncoderLayer(d={d}, h={heads}, ffn={ffn})")
        x = _stack_layer(n, x, sq=S, first=i == 1, last=i == L, **arch)
        n.act = src * d
        nodes.append(n)
    memory = x
    demb, y = _token_embedding(node, "dec_embed", tgt, vocab, d, t5)
    demb.act = tgt * d + src * d                          # + encoder memory
    nodes.append(demb)
    for i in range(1, L + 1):
        n = node(f"dec{i}", f"{kind}DecoderLayer(d={d}, h={heads}, ffn={ffn})")
        y = _stack_layer(n, y, sq=Tg, first=i == 1, last=i == L, memory=memory, sk=S, **arch)
        n.act = tgt * d + (src * d if i < L else 0)
        nodes.append(n)
    head = node("lm_head", f"LMHead(d={d}, vocab={vocab}) [tied to embed]")
    _lm_head(head, tgt, d, vocab, owner=False, bias=False, x=y)
    head.act = tgt * vocab
    nodes.append(head)
    shared = {"owner": "embed", "users": ["dec_embed", "lm_head"], "bytes": vocab * d * BYTES}
    hyper = {"layers": L, "d_model": d, "heads": heads, "d_kv": dkv, "ffn": ffn, "vocab": vocab,
             "shared_weights": [shared],
             _OP_META: {"shared_weights": [{**shared, "owner": "embed/word",
                                            "users": ["dec_embed/word", "lm_head/proj"]}]}}
    return nodes, None, hyper


def _gnmt(o: dict[str, int], *, h: int = 1024, vocab: int = 32320) -> tuple:
    """GNMT (Wu et al. 2016) as in MLPerf / PipeDream: encoder = embedding, a bidirectional
    LSTM, an LSTM(2h->h), then residual LSTMs; decoder = embedding, an LSTM with Bahdanau
    attention, then LSTMs fed [output, context] (residual from the third); a classifier.
    ``layers`` counts LSTM layers per side (GNMT-4: 4 + 4). Embeddings are not shared."""
    B, S, Tg, L = o["microbatch"], o["seq"], o["tgt_seq"], o["layers"]
    src, tgt = B * S, B * Tg

    def lstm(n: _Node, rows: float, din: int, bidir: bool = False) -> None:
        dirs = 2 if bidir else 1
        n.compute(dirs * 2.0 * rows * 4 * h * (din + h), "rnn")
        n.params += dirs * (4 * h * (din + h) + 8 * h)   # W_ih, W_hh, b_ih, b_hh
        _eltwise(n, dirs * rows * 4 * h, 3)               # gates and cell update

    emb = _Node("enc_embed", f"Embedding({vocab}, {h})")
    _embedding(emb, src, vocab, h)
    emb.act = src * h
    nodes = [emb]
    for i in range(1, L + 1):
        din = h if i != 2 else 2 * h
        n = _Node(f"enc{i}", f"{'Bidir' if i == 1 else ''}LSTM({din}, {h})"
                  + (" + residual" if i > 2 else ""))
        lstm(n, src, din, bidir=i == 1)
        if i > 2:
            _eltwise(n, src * h, 3)
        n.act = src * h * (2 if i == 1 else 1)
        nodes.append(n)
    demb = _Node("dec_embed", f"Embedding({vocab}, {h})")
    _embedding(demb, tgt, vocab, h)
    demb.act = tgt * h + src * h                          # + encoder memory
    att = _Node("dec1", f"RecurrentAttention(LSTM({h}, {h}), Bahdanau)")
    lstm(att, tgt, h)
    att.params += 2 * h * h + 2 * h + 1                   # W_q, W_k, v, normalize bias/scale
    att.compute(2.0 * tgt * h * h + 2.0 * src * h * h)    # project queries and keys
    _eltwise(att, tgt * S * h, 3)                         # tanh(q + k) over all pairs
    att.compute(2.0 * tgt * S * h)                        # scores = v . tanh(...)
    _eltwise(att, tgt * S, 2)                             # softmax
    att.compute(2.0 * tgt * S * h, weights=False)         # context = P . memory
    att.act = 2 * tgt * h                                 # output + context
    nodes += [demb, att]
    for i in range(2, L + 1):
        n = _Node(f"dec{i}", f"LSTM({2 * h}, {h})" + (" + residual" if i > 2 else ""))
        _eltwise(n, tgt * 2 * h, 2)                       # concat [x, context]
        lstm(n, tgt, 2 * h)
        if i > 2:
            _eltwise(n, tgt * h, 3)
        n.act = tgt * h * (2 if i < L else 1)             # context travels on
        nodes.append(n)
    cls = _Node("classifier", f"Linear({h}, {vocab})")
    _lm_head(cls, tgt, h, vocab, owner=True, bias=True)
    cls.act = tgt * vocab
    nodes.append(cls)
    hyper = {"layers": L, "hidden": h, "vocab": vocab}
    return nodes, None, hyper


# -- image models -----------------------------------------------------------------------------
_Shape = tuple[int, int, int]  # (channels, height, width) of one sample


class _CNN:
    """Convolutional building blocks for a microbatch of ``B`` images."""

    def __init__(self, B: int) -> None:
        self.B = B

    def finish(self, n: _Node, x: _Shape) -> _Shape:
        n.act = self.B * x[0] * x[1] * x[2]
        return x

    def conv(self, n: _Node, x: _Shape, c: int, k: int | tuple[int, int], s: int = 1,
             p: int | tuple[int, int] = 0, *, bias: bool = False, bn: bool = True,
             relu: bool = True, first: bool = False) -> _Shape:
        """Conv2d (+ BatchNorm) (+ ReLU). ``first``: the input needs no gradient."""
        (kh, kw), (ph, pw) = _pair(k), _pair(p)
        cin, hh, ww = x
        y = (c, (hh + 2 * ph - kh) // s + 1, (ww + 2 * pw - kw) // s + 1)
        out = self.B * y[0] * y[1] * y[2]
        kind = "conv_winograd" if kh == kw >= 3 and s == 1 else "conv"
        n.compute(2.0 * out * cin * kh * kw, kind, input_grad=not first)
        n.params += c * cin * kh * kw + (c if bias else 0) + (2 * c if bn else 0)
        _eltwise(n, out, (3 if bn else 0) + (2 if relu else 0))  # BN: stats + normalize
        return y

    def pool(self, n: _Node, x: _Shape, k: int, s: int, p: int = 0, ceil: bool = False) -> _Shape:
        """Max or average pooling (memory-bound)."""
        def size(v: int) -> int:
            span = v + 2 * p - k
            return (-(-span // s) if ceil else span // s) + 1

        c, hh, ww = x
        y = (c, size(hh), size(ww))
        _eltwise(n, self.B * (c * hh * ww + c * y[1] * y[2]), 1)
        return y

    def gpool(self, n: _Node, x: _Shape) -> _Shape:
        """Global average pooling."""
        _eltwise(n, self.B * x[0] * x[1] * x[2], 1)
        return (x[0], 1, 1)

    def fc(self, n: _Node, din: int, dout: int, relu: bool = True) -> _Shape:
        _linear(n, self.B, din, dout)
        _eltwise(n, self.B * dout, 2 if relu else 0)
        return (dout, 1, 1)

    def concat(self, n: _Node, parts: list[_Shape]) -> _Shape:
        y = (sum(p[0] for p in parts), parts[0][1], parts[0][2])
        _eltwise(n, self.B * y[0] * y[1] * y[2], 2)
        return y

    def add(self, n: _Node, x: _Shape, relu: bool = True) -> None:
        _eltwise(n, self.B * x[0] * x[1] * x[2], 3 + (2 if relu else 0))


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return v if isinstance(v, tuple) else (v, v)


def _classifier(net: _CNN, x: _Shape, classes: int = 1000) -> _Node:
    head = _Node("head", f"GlobalAvgPool + Linear({x[0]}, {classes})")
    x = net.gpool(head, x)
    net.finish(head, net.fc(head, x[0], classes, relu=False))
    return head


def _fc_stack(net: _CNN, x: _Shape) -> list[_Node]:
    """fc6, fc7 (Linear + ReLU + Dropout) and fc8 of VGG and AlexNet."""
    nodes, din = [], x[0] * x[1] * x[2]
    for i, dout in zip((6, 7, 8), (4096, 4096, 1000)):
        n = _Node(f"fc{i}", f"Linear({din}, {dout})" + (" + ReLU + Dropout" if i < 8 else ""))
        net.finish(n, net.fc(n, din, dout, relu=i < 8))
        nodes.append(n)
        din = dout
    return nodes


_VGG = {16: [2, 2, 3, 3, 3], 19: [2, 2, 4, 4, 4]}


def _vgg(o: dict[str, int], *, depth: int) -> tuple:
    """VGG-16/19 (Simonyan & Zisserman 2015, configurations D/E): one node per conv layer
    (with its ReLU and any following max-pool), then fc6, fc7, fc8."""
    net, x, nodes = _CNN(o["microbatch"]), (3, 224, 224), []
    for stage, (reps, c) in enumerate(zip(_VGG[depth], (64, 128, 256, 512, 512)), start=1):
        for r in range(1, reps + 1):
            n = _Node(f"conv{stage}_{r}", f"Conv2d({x[0]}->{c}, 3x3) + ReLU"
                      + (" + MaxPool" if r == reps else ""))
            x = net.conv(n, x, c, 3, 1, 1, bias=True, bn=False, first=not nodes)
            if r == reps:
                x = net.pool(n, x, 2, 2)
            nodes.append(n)
            net.finish(n, x)
    nodes += _fc_stack(net, x)
    return nodes, None, {"depth": depth, "image": 224}


def _alexnet(o: dict[str, int]) -> tuple:
    """AlexNet (Krizhevsky et al. 2012), the one-tower torchvision variant PipeDream profiled."""
    net, x, nodes = _CNN(o["microbatch"]), (3, 224, 224), []
    for i, (c, k, s, p, pool) in enumerate([(64, 11, 4, 2, True), (192, 5, 1, 2, True),
                                            (384, 3, 1, 1, False), (256, 3, 1, 1, False),
                                            (256, 3, 1, 1, True)], start=1):
        n = _Node(f"conv{i}", f"Conv2d({x[0]}->{c}, {k}x{k}/{s}) + ReLU"
                  + (" + MaxPool" if pool else ""))
        x = net.conv(n, x, c, k, s, p, bias=True, bn=False, first=i == 1)
        if pool:
            x = net.pool(n, x, 3, 2)
        nodes.append(n)
        net.finish(n, x)
    nodes += _fc_stack(net, x)
    return nodes, None, {"image": 224}


def _resnet(o: dict[str, int], *, blocks: tuple[int, ...]) -> tuple:
    """ResNet (He et al. 2016) with bottleneck blocks, torchvision v1.5 (stride in the 3x3).
    One node per block: the shortcut lies inside the block, so the chain is exact."""
    net = _CNN(o["microbatch"])
    stem = _Node("stem", "Conv2d(3->64, 7x7/2) + BN + ReLU + MaxPool")
    x = net.conv(stem, (3, 224, 224), 64, 7, 2, 3, first=True)
    x = net.finish(stem, net.pool(stem, x, 3, 2, 1))
    nodes = [stem]
    for stage, (reps, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), start=2):
        for r in range(1, reps + 1):
            s = 2 if (r == 1 and stage > 2) else 1
            n = _Node(f"conv{stage}_{r}", f"Bottleneck({x[0]}->{4 * planes}, stride {s})")
            y = net.conv(n, x, planes, 1)
            y = net.conv(n, y, planes, 3, s, 1)
            y = net.conv(n, y, 4 * planes, 1, relu=False)
            if r == 1:
                net.conv(n, x, 4 * planes, 1, s, relu=False)   # projection shortcut
            net.add(n, y)
            x = net.finish(n, y)
            nodes.append(n)
    nodes.append(_classifier(net, x))
    return nodes, None, {"depth": 2 + 3 * sum(blocks), "blocks": list(blocks), "image": 224}


# name, #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj (Szegedy et al. 2015, Table 1)
_GOOGLENET = [
    ("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64),
    ("4a", 192, 96, 208, 16, 48, 64), ("4b", 160, 112, 224, 24, 64, 64),
    ("4c", 128, 128, 256, 24, 64, 64), ("4d", 112, 144, 288, 32, 64, 64),
    ("4e", 256, 160, 320, 32, 128, 128), ("5a", 256, 160, 320, 32, 128, 128),
    ("5b", 384, 192, 384, 48, 128, 128)]


def _googlenet(o: dict[str, int]) -> tuple:
    """GoogLeNet / Inception v1 (Szegedy et al. 2015) as published: conv biases, LRN, 5x5
    branches, no BatchNorm. One node per inception module; ``aux=1`` adds the two auxiliary
    classifiers as side branches (a DAG)."""
    net = _CNN(o["microbatch"])
    conv = partial(net.conv, bias=True, bn=False)
    n1 = _Node("conv1", "Conv2d(3->64, 7x7/2) + ReLU + MaxPool + LRN")
    x = net.pool(n1, conv(n1, (3, 224, 224), 64, 7, 2, 3, first=True), 3, 2, ceil=True)
    _eltwise(n1, net.B * x[0] * x[1] * x[2], 3)           # LRN
    n2 = _Node("conv2", "Conv2d(64->64, 1x1) + Conv2d(64->192, 3x3) + LRN + MaxPool")
    x = conv(n2, conv(n2, net.finish(n1, x), 64, 1), 192, 3, 1, 1)
    _eltwise(n2, net.B * x[0] * x[1] * x[2], 3)
    x = net.finish(n2, net.pool(n2, x, 3, 2, ceil=True))
    nodes, aux, edges = [n1, n2], [], []
    for name, c1, r3, c3, r5, c5, pp in _GOOGLENET:
        pool = name in ("3b", "4e")
        n = _Node(f"inception{name}", f"Inception({x[0]}->{c1 + c3 + c5 + pp})"
                  + (" + MaxPool" if pool else ""))
        parts = [conv(n, x, c1, 1), conv(n, conv(n, x, r3, 1), c3, 3, 1, 1),
                 conv(n, conv(n, x, r5, 1), c5, 5, 1, 2), conv(n, net.pool(n, x, 3, 1, 1), pp, 1)]
        x = net.concat(n, parts)
        if pool:
            x = net.pool(n, x, 3, 2, ceil=True)
        net.finish(n, x)
        nodes.append(n)
        if o["aux"] and name in ("4a", "4d"):
            a = _Node(f"aux{len(aux) + 1}", f"AuxClassifier({x[0]})")
            y = conv(a, net.pool(a, x, 5, 3), 128, 1)
            y = net.fc(a, y[0] * y[1] * y[2], 1024)
            net.finish(a, net.fc(a, 1024, 1000, relu=False))
            aux.append(a)
            edges.append((n.id, a.id))
    nodes.append(_classifier(net, x))
    if not aux:
        return nodes, None, {"image": 224, "aux": 0}
    edges += [(a.id, b.id) for a, b in zip(nodes, nodes[1:])]
    return nodes + aux, edges, {"image": 224, "aux": 1}


def _inception_v3(o: dict[str, int]) -> tuple:
    """Inception-v3 (Szegedy et al. 2016), torchvision layout: conv + BN (no bias) + ReLU,
    one node per stem conv and per Mixed module; ``aux=1`` adds the auxiliary classifier
    after Mixed_6e as a side branch (a DAG)."""
    net = _CNN(o["microbatch"])
    conv = net.conv
    x: _Shape = (3, 299, 299)
    nodes: list[_Node] = []
    for name, c, k, s, p, pool in [("conv1a", 32, 3, 2, 0, False), ("conv2a", 32, 3, 1, 0, False),
                                   ("conv2b", 64, 3, 1, 1, True), ("conv3b", 80, 1, 1, 0, False),
                                   ("conv4a", 192, 3, 1, 0, True)]:
        n = _Node(name, f"Conv2d({x[0]}->{c}, {k}x{k}/{s}) + BN + ReLU"
                  + (" + MaxPool" if pool else ""))
        x = conv(n, x, c, k, s, p, first=not nodes)
        if pool:
            x = net.pool(n, x, 3, 2)
        nodes.append(n)
        net.finish(n, x)

    def mixed_a(n: _Node, x: _Shape, pf: int) -> _Shape:
        return net.concat(n, [conv(n, x, 64, 1), conv(n, conv(n, x, 48, 1), 64, 5, 1, 2),
                              conv(n, conv(n, conv(n, x, 64, 1), 96, 3, 1, 1), 96, 3, 1, 1),
                              conv(n, net.pool(n, x, 3, 1, 1), pf, 1)])

    def mixed_b(n: _Node, x: _Shape) -> _Shape:
        return net.concat(n, [conv(n, x, 384, 3, 2),
                              conv(n, conv(n, conv(n, x, 64, 1), 96, 3, 1, 1), 96, 3, 2),
                              net.pool(n, x, 3, 2)])

    def mixed_c(n: _Node, x: _Shape, c7: int) -> _Shape:
        b7 = conv(n, conv(n, conv(n, x, c7, 1), c7, (1, 7), 1, (0, 3)), 192, (7, 1), 1, (3, 0))
        d = conv(n, x, c7, 1)
        for cout, k, p in [(c7, (7, 1), (3, 0)), (c7, (1, 7), (0, 3)), (c7, (7, 1), (3, 0)),
                           (192, (1, 7), (0, 3))]:
            d = conv(n, d, cout, k, 1, p)
        return net.concat(n, [conv(n, x, 192, 1), b7, d, conv(n, net.pool(n, x, 3, 1, 1), 192, 1)])

    def mixed_d(n: _Node, x: _Shape) -> _Shape:
        b7 = conv(n, conv(n, conv(n, x, 192, 1), 192, (1, 7), 1, (0, 3)), 192, (7, 1), 1, (3, 0))
        return net.concat(n, [conv(n, conv(n, x, 192, 1), 320, 3, 2), conv(n, b7, 192, 3, 2),
                              net.pool(n, x, 3, 2)])

    def mixed_e(n: _Node, x: _Shape) -> _Shape:
        b3 = conv(n, x, 384, 1)
        d = conv(n, conv(n, x, 448, 1), 384, 3, 1, 1)
        split = [conv(n, y, 384, k, 1, p) for y in (b3, d)
                 for k, p in (((1, 3), (0, 1)), ((3, 1), (1, 0)))]
        return net.concat(n, [conv(n, x, 320, 1), *split,
                              conv(n, net.pool(n, x, 3, 1, 1), 192, 1)])

    modules: list[tuple[str, str, Callable[..., _Shape], tuple]] = [
        ("mixed5b", "InceptionA", mixed_a, (32,)), ("mixed5c", "InceptionA", mixed_a, (64,)),
        ("mixed5d", "InceptionA", mixed_a, (64,)), ("mixed6a", "InceptionB", mixed_b, ()),
        ("mixed6b", "InceptionC", mixed_c, (128,)), ("mixed6c", "InceptionC", mixed_c, (160,)),
        ("mixed6d", "InceptionC", mixed_c, (160,)), ("mixed6e", "InceptionC", mixed_c, (192,)),
        ("mixed7a", "InceptionD", mixed_d, ()), ("mixed7b", "InceptionE", mixed_e, ()),
        ("mixed7c", "InceptionE", mixed_e, ())]
    aux = None
    for name, kind, fn, args in modules:
        n = _Node(name, kind)
        y = fn(n, x, *args)
        n.desc = f"{kind}({x[0]}->{y[0]})"
        x = net.finish(n, y)
        nodes.append(n)
        if name == "mixed6e" and o["aux"]:
            aux = _Node("aux", f"AuxClassifier({x[0]})")
            y = conv(aux, conv(aux, net.pool(aux, x, 5, 3), 128, 1), 768, 5)
            net.finish(aux, net.fc(aux, y[0] * y[1] * y[2], 1000, relu=False))
    nodes.append(_classifier(net, x))
    if aux is None:
        return nodes, None, {"image": 299, "aux": 0}
    edges = [(a.id, b.id) for a, b in zip(nodes, nodes[1:])] + [("mixed6e", "aux")]
    return nodes + [aux], edges, {"image": 299, "aux": 1}


# -- registry ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Model:
    name: str
    description: str
    build: Callable[[dict], tuple]
    defaults: dict[str, int]
    published_params: float
    limits: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    ops: bool = False              # offers granularity=op (zoo_ops.py)


_t5 = partial(_enc_dec, vocab=32128, t5=True)
_NLP = {"microbatch": 4, "seq": 384}
_SEQ2SEQ = {"microbatch": 32, "seq": 128, "tgt_seq": 128, "layers": 6}
_T5 = {"microbatch": 16, "seq": 512, "tgt_seq": 128}
_IMG = {"microbatch": 32}
_AUX = {"aux": (0, 1)}

_MODELS = {m.name: m for m in [
    _Model("bert-large", "BERT-large (Devlin et al. 2019): embeddings + 24 transformer layers "
           "(d=1024, 16 heads) + pooler + SQuAD head", _bert, {**_NLP, "layers": 24}, 340e6,
           ops=True),
    _Model("bert-48", "BERT-large width with 48 transformer layers (SPP Table II)", _bert,
           {**_NLP, "layers": 48}, 640e6, ops=True),
    _Model("xlnet-large", "XLNet-large (Yang et al. 2019): 24 relative-attention layers, "
           "d=1024, two-stream attention, SQuAD head", _xlnet,
           {"microbatch": 4, "seq": 512, "layers": 24, "streams": 2}, 340e6,
           {"streams": (1, 2)}),
    _Model("transformer", "Transformer base (Vaswani et al. 2017): 6+6 layers, d=512, 8 heads, "
           "shared 37000-token vocabulary",
           partial(_enc_dec, d=512, heads=8, dkv=64, ffn=2048, vocab=37000, t5=False),
           _SEQ2SEQ, 65e6, ops=True),
    _Model("t5-base", "T5-base (Raffel et al. 2020): 12+12 layers, d=768, 12 heads, ffn 3072",
           partial(_t5, d=768, heads=12, dkv=64, ffn=3072), {**_T5, "layers": 12}, 220e6,
           ops=True),
    _Model("t5-3b", "T5-3B (Raffel et al. 2020): 24+24 layers, d=1024, 32 heads of 128, "
           "ffn 16384", partial(_t5, d=1024, heads=32, dkv=128, ffn=16384),
           {**_T5, "layers": 24}, 2.85e9, ops=True),
    _Model("t5-11b", "T5-11B (Raffel et al. 2020): 24+24 layers, d=1024, 128 heads of 128, "
           "ffn 65536", partial(_t5, d=1024, heads=128, dkv=128, ffn=65536),
           {**_T5, "layers": 24}, 11.3e9, ops=True),
    _Model("gnmt-4", "GNMT (Wu et al. 2016) with 4+4 LSTM layers of 1024, attention, vocab "
           "32320 (PipeDream / MLPerf)", _gnmt,
           {"microbatch": 64, "seq": 50, "tgt_seq": 50, "layers": 4}, 193.8e6,
           {"layers": (2, None)}),
    _Model("vgg16", "VGG-16 (Simonyan & Zisserman 2015), 224x224", partial(_vgg, depth=16),
           _IMG, 138.4e6),
    _Model("vgg19", "VGG-19 (Simonyan & Zisserman 2015), 224x224", partial(_vgg, depth=19),
           _IMG, 143.7e6),
    _Model("alexnet", "AlexNet (Krizhevsky et al. 2012), torchvision variant, 224x224",
           _alexnet, _IMG, 61.1e6),
    _Model("googlenet", "GoogLeNet / Inception v1 (Szegedy et al. 2015), 224x224, one node "
           "per inception module", _googlenet, {**_IMG, "aux": 0}, 6.8e6, _AUX),
    _Model("resnet50", "ResNet-50 (He et al. 2016), 224x224, one node per bottleneck block",
           partial(_resnet, blocks=(3, 4, 6, 3)), _IMG, 25.6e6),
    _Model("resnet152", "ResNet-152 (He et al. 2016), 224x224, one node per bottleneck block",
           partial(_resnet, blocks=(3, 8, 36, 3)), {"microbatch": 4}, 60.2e6),
    _Model("inception-v3", "Inception-v3 (Szegedy et al. 2016), 299x299, one node per "
           "Mixed module", _inception_v3, {**_IMG, "aux": 0}, 23.8e6, _AUX),
]}


def names() -> list[str]:
    """The zoo's model names, in the order of ``describe()``."""
    return list(_MODELS)


def describe() -> list[dict]:
    """One entry per model: name, description, default options (for ``pipeplan models``;
    ``granularity`` appears there, as a string, for the models that offer ``op``), the
    granularities it offers and its published parameter count."""
    return [{"name": m.name, "description": m.description,
             "defaults": {**m.defaults, **({"granularity": "layer"} if m.ops else {})},
             "granularities": list(_granularities(m)),
             "published_params": m.published_params} for m in _MODELS.values()]


def _model(name: str) -> _Model:
    model = _MODELS.get(name)
    if model is None:
        raise PipeplanError(f"unknown zoo model {name!r} (known: {', '.join(_MODELS)})")
    return model


def _granularities(model: _Model) -> tuple[str, ...]:
    return GRANULARITIES if model.ops else GRANULARITIES[:1]


def _granularity(model: _Model, raw: object) -> str:
    """The ``granularity`` option: ``layer`` for every model, ``op`` where the model offers it."""
    value = str(raw).strip().lower()
    allowed = _granularities(model)
    if isinstance(raw, str) and value in allowed:
        return value
    offer = "" if model.ops else \
        f" (granularity=op is offered by {', '.join(m.name for m in _MODELS.values() if m.ops)})"
    raise PipeplanError(f"zoo model {model.name!r}: option 'granularity' must be one of "
                        f"{', '.join(allowed)}, got {raw!r}{offer}")


def _options(model: _Model, options: dict) -> dict[str, int | str]:
    """Defaults overridden by ``options``: positive integers (within the model's limits),
    and the string option ``granularity``."""
    values: dict[str, int | str] = {**model.defaults, "granularity": GRANULARITIES[0]}
    for key, raw in (options or {}).items():
        if key not in values:
            raise PipeplanError(f"zoo model {model.name!r}: unknown option {key!r} "
                                f"(known: {', '.join(sorted(values))})")
        if key == "granularity":
            values[key] = _granularity(model, raw)
            continue
        lo, hi = model.limits.get(key, (1, None))
        rng = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        try:
            value = int(str(raw).strip())
        except ValueError:
            value = None
        if value is None or isinstance(raw, bool) or value < lo or (hi is not None and value > hi):
            raise PipeplanError(f"zoo model {model.name!r}: option {key!r} must be {rng}, "
                                f"got {raw!r}")
        if key == "layers":
            check_layers(value, f"zoo model {model.name!r}")
        values[key] = value
    return values


def build(name: str, options: dict[str, str] | None = None) -> Graph:
    """Build zoo model ``name`` with ``options`` (strings, from ``zoo:NAME?key=value&...``):
    one node per layer / block, or per operation with ``granularity=op`` (zoo_ops.py)."""
    model = _model(name)
    opts = _options(model, options or {})
    nodes, edges, hyper = model.build(opts)
    op_meta = hyper.pop(_OP_META, {})
    meta = {"source": "zoo", **opts, **hyper, "reference_device": REFERENCE_DEVICE,
            "reference_tflops": REFERENCE_TFLOPS, "reference_mem_gbps": REFERENCE_MEM_GBPS,
            "efficiency": dict(EFFICIENCY), "published_params": model.published_params,
            "backward_input_fraction": input_fraction(nodes)}
    if opts["granularity"] == "op":
        count = sum(len(n.ops) for n in nodes)
        if count > MAX_LAYERS:
            raise PipeplanError(f"zoo model {name!r}: granularity=op gives {count:,} nodes; "
                                f"pipeplan plans for at most {MAX_LAYERS:,} (use fewer layers "
                                "or granularity=layer)")
        specs, op_edges = assemble(nodes, BYTES)
        return Graph.from_nodes(name, specs, op_edges, {**meta, **op_meta})
    if edges is None:
        edges = [(a.id, b.id) for a, b in zip(nodes, nodes[1:])]
    return Graph.from_nodes(name, [n.spec() for n in nodes], edges, meta)


def input_fraction(nodes: list[_Node]) -> float:
    """Input-gradient share of the model's backward time (the rest: weight gradients)."""
    bwd = sum(n.bwd for n in nodes)
    return (bwd - sum(n.bwd_w for n in nodes)) / bwd if bwd > 0 else 0.5
