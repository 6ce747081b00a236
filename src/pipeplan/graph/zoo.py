"""The analytic model zoo: ``zoo:NAME?key=value`` -> a :class:`Graph` built from hyper-parameters.

Every node (a layer or a block) gets, for ONE microbatch:

* ``flops``  forward FLOPs of its matmuls / convolutions / recurrences (a multiply-add is 2 FLOPs;
  element-wise ops are priced by the bytes they move, not counted as FLOPs, the usual convention);
* ``fwd``    seconds on the reference device: compute FLOPs / (15.7 TFLOP/s x an efficiency per
  kind of op) + bytes of memory-bound ops / (900 GB/s x an efficiency);
* ``bwd``    2 x forward (input gradient + weight gradient), except where known better: the
  first convolution / linear of a model and embedding lookups compute no input gradient
  (1 x, resp. a scatter-add of the output gradient into a dense table gradient);
* ``params`` parameter count x 4 bytes (fp32); weights tied between nodes are counted once, on
  their first user (``meta["shared_weights"]`` lists the other users);
* ``act``    bytes of what the node hands to the next node (its output, fp32). Graphs are chains
  of blocks; where a later node also needs an earlier output (the encoder memory of an
  encoder-decoder, BERT's sequence output past the pooler) it travels along with the output
  and is counted in ``act``, as it must cross a stage boundary;
* ``inplace`` / ``saved`` (docs/memory.md): the defaults. Nodes are whole blocks whose in-place
  ReLUs and residual adds lie inside them, so none is in-place; ``saved`` = ``act``, a lower
  bound of what a block keeps for backward (its internal tensors are not modelled).

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
from ..limits import check_layers
from .model import Graph, NodeSpec

# -- reference device ------------------------------------------------------------------------
REFERENCE_DEVICE = "V100"
REFERENCE_TFLOPS = 15.7            # fp32 peak of an NVIDIA V100 (SXM2), TFLOP/s
REFERENCE_MEM_GBPS = 900.0         # HBM2 peak, GB/s
EFFICIENCY = {"matmul": 0.70, "rnn": 0.60, "conv": 0.60, "conv_winograd": 1.10, "memory": 0.40}
BYTES = 4                          # fp32

_PEAK = REFERENCE_TFLOPS * 1e12
_MEM_BW = REFERENCE_MEM_GBPS * 1e9 * EFFICIENCY["memory"]


class _Node:
    """One node under construction: ops add their FLOPs, times and parameters to it."""

    def __init__(self, nid: str, desc: str) -> None:
        self.id, self.desc = nid, desc
        self.flops = self.fwd = self.bwd = self.params = self.act = 0.0

    def compute(self, flops: float, kind: str = "matmul", input_grad: bool = True) -> None:
        """Dense FLOPs; backward = weight gradient (1x) + input gradient (1x, if needed)."""
        t = flops / (_PEAK * EFFICIENCY[kind])
        self.flops += flops
        self.fwd += t
        self.bwd += (2.0 if input_grad else 1.0) * t

    def memory(self, nbytes: float, bwd_bytes: float | None = None) -> None:
        """A memory-bound op moving ``nbytes`` forward (backward: as many unless given)."""
        self.fwd += nbytes / _MEM_BW
        self.bwd += (nbytes if bwd_bytes is None else bwd_bytes) / _MEM_BW

    def spec(self) -> NodeSpec:
        return NodeSpec(id=self.id, fwd=self.fwd, bwd=self.bwd, params=self.params * BYTES,
                        act=self.act * BYTES, desc=self.desc, flops=self.flops)


# -- building blocks shared by the NLP models (rows = tokens in the microbatch) --------------
def _eltwise(n: _Node, elems: float, passes: float = 2) -> None:
    """An element-wise op reading/writing ``passes`` tensors of ``elems`` fp32 elements."""
    n.memory(passes * elems * BYTES)


def _linear(n: _Node, rows: float, din: int, dout: int, bias: bool = True,
            kind: str = "matmul", input_grad: bool = True) -> None:
    n.compute(2.0 * rows * din * dout, kind, input_grad)
    n.params += din * dout + (dout if bias else 0)


def _norm(n: _Node, rows: float, d: int, shift: bool = True) -> None:
    """LayerNorm (scale + shift) or T5's RMS norm (scale only)."""
    n.params += d * (2 if shift else 1)
    _eltwise(n, rows * d)


def _embedding(n: _Node, rows: float, vocab: int, d: int, owner: bool = True) -> None:
    """Table lookup: no FLOPs, no input gradient; backward scatter-adds the output gradient
    into a dense (vocab x d) table gradient, which is written in full."""
    if owner:
        n.params += vocab * d
    out = rows * d * BYTES
    n.memory(2 * out, bwd_bytes=2 * out + vocab * d * BYTES)


def _attention(n: _Node, B: int, sq: int, sk: int, d: int, heads: int, dkv: int,
               bias: bool = True) -> None:
    """Multi-head attention, queries over ``sq`` positions, keys/values over ``sk``."""
    inner = heads * dkv
    _linear(n, B * sq, d, inner, bias)                    # Q
    _linear(n, B * sk, d, inner, bias)                    # K
    _linear(n, B * sk, d, inner, bias)                    # V
    n.compute(2.0 * B * heads * sq * sk * dkv)            # Q K^T
    _eltwise(n, B * heads * sq * sk, 2)                   # scale + mask + softmax (fused)
    n.compute(2.0 * B * heads * sq * sk * dkv)            # P V
    _linear(n, B * sq, inner, d, bias)                    # output projection
    _eltwise(n, B * sq * d, 3)                            # residual add


def _ffn(n: _Node, rows: float, d: int, ffn: int, bias: bool = True) -> None:
    _linear(n, rows, d, ffn, bias)
    _eltwise(n, rows * ffn)                               # GELU / ReLU
    _linear(n, rows, ffn, d, bias)
    _eltwise(n, rows * d, 3)                              # residual add


def _lm_head(n: _Node, rows: float, d: int, vocab: int, owner: bool, bias: bool) -> None:
    """Projection to the vocabulary (weights tied to the embedding unless ``owner``) + softmax."""
    n.compute(2.0 * rows * d * vocab)
    n.params += (d * vocab if owner else 0) + (vocab if bias else 0)
    _eltwise(n, rows * vocab, 2)


# -- NLP models -------------------------------------------------------------------------------
def _bert(o: dict[str, int], *, d: int = 1024, heads: int = 16, ffn: int = 4096,
          vocab: int = 30522, max_pos: int = 512) -> tuple:
    """BERT (Devlin et al. 2019): embeddings, ``layers`` post-LN transformer layers, pooler,
    SQuAD span head (27 nodes for BERT-large, as in SPP's simulation)."""
    B, S, L = o["microbatch"], o["seq"], o["layers"]
    T = B * S
    emb = _Node("embed", f"BertEmbeddings(vocab={vocab}, d={d})")
    _embedding(emb, T, vocab, d)
    _embedding(emb, T, max_pos, d)
    _embedding(emb, T, 2, d)
    _eltwise(emb, T * d, 4)                               # sum of the three lookups
    _norm(emb, T, d)
    emb.act = T * d
    nodes = [emb]
    for i in range(1, L + 1):
        n = _Node(f"layer{i}", f"TransformerLayer(d={d}, h={heads}, ffn={ffn})")
        _attention(n, B, S, S, d, heads, d // heads)
        _norm(n, T, d)
        _ffn(n, T, d, ffn)
        _norm(n, T, d)
        n.act = T * d
        nodes.append(n)
    pool = _Node("pooler", f"BertPooler(d={d})")
    _linear(pool, B, d, d)
    _eltwise(pool, B * d)                                 # tanh
    pool.act = T * d + B * d                              # the head reads the sequence output
    head = _Node("head", f"SQuADSpanHead(d={d})")
    _linear(head, T, d, 2)
    _eltwise(head, T * 2)
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
            n.compute(2.0 * B * heads * S * S * dh)       # AC: content term
            n.compute(2.0 * B * heads * S * 2 * S * dh)   # BD: position term (2S positions)
            n.compute(2.0 * B * heads * S * 2 * dh)       # EF: segment term
            _eltwise(n, B * heads * S * S, 6)             # rel-shift, sum of terms, softmax
            n.compute(2.0 * B * heads * S * S * dh)       # P V
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


def _enc_dec(o: dict[str, int], *, d: int, heads: int, dkv: int, ffn: int, vocab: int,
             t5: bool) -> tuple:
    """Encoder-decoder transformer. ``t5=False``: Vaswani et al. (post-LN, biases, one table
    shared by source, target and pre-softmax). ``t5=True``: Raffel et al. (pre-RMS-norm, no
    biases, relative position buckets in the first layer of each stack, tied LM head)."""
    B, S, Tg, L = o["microbatch"], o["seq"], o["tgt_seq"], o["layers"]
    src, tgt = B * S, B * Tg
    emb = _Node("embed", f"Embedding(vocab={vocab}, d={d}) [shared]")
    _embedding(emb, src, vocab, d)
    if not t5:
        _eltwise(emb, src * d, 3)                         # + sinusoidal positions
    emb.act = src * d
    nodes = [emb]
    kind = "T5" if t5 else "Transformer"
    for i in range(1, L + 1):
        n = _Node(f"enc{i}", f"{kind}EncoderLayer(d={d}, h={heads}, ffn={ffn})")
        if t5 and i == 1:
            n.params += 32 * heads                        # relative attention bias buckets
        if t5:
            _eltwise(n, B * heads * S * S, 3)             # add position bias to the scores
        _attention(n, B, S, S, d, heads, dkv, bias=not t5)
        _norm(n, src, d, shift=not t5)
        _ffn(n, src, d, ffn, bias=not t5)
        _norm(n, src, d, shift=not t5)
        if t5 and i == L:
            _norm(n, src, d, shift=False)                 # final encoder norm
        n.act = src * d
        nodes.append(n)
    demb = _Node("dec_embed", f"Embedding(vocab={vocab}, d={d}) [tied to embed]")
    _embedding(demb, tgt, vocab, d, owner=False)
    if not t5:
        _eltwise(demb, tgt * d, 3)
    demb.act = tgt * d + src * d                          # + encoder memory
    nodes.append(demb)
    for i in range(1, L + 1):
        n = _Node(f"dec{i}", f"{kind}DecoderLayer(d={d}, h={heads}, ffn={ffn})")
        if t5 and i == 1:
            n.params += 32 * heads
        if t5:
            _eltwise(n, B * heads * Tg * Tg, 3)
        _attention(n, B, Tg, Tg, d, heads, dkv, bias=not t5)   # causal self-attention
        _norm(n, tgt, d, shift=not t5)
        _attention(n, B, Tg, S, d, heads, dkv, bias=not t5)    # cross-attention
        _norm(n, tgt, d, shift=not t5)
        _ffn(n, tgt, d, ffn, bias=not t5)
        _norm(n, tgt, d, shift=not t5)
        if t5 and i == L:
            _norm(n, tgt, d, shift=False)
        n.act = tgt * d + (src * d if i < L else 0)
        nodes.append(n)
    head = _Node("lm_head", f"LMHead(d={d}, vocab={vocab}) [tied to embed]")
    _lm_head(head, tgt, d, vocab, owner=False, bias=False)
    head.act = tgt * vocab
    nodes.append(head)
    hyper = {"layers": L, "d_model": d, "heads": heads, "d_kv": dkv, "ffn": ffn, "vocab": vocab,
             "shared_weights": [{"owner": "embed", "users": ["dec_embed", "lm_head"],
                                 "bytes": vocab * d * BYTES}]}
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
    att.compute(2.0 * tgt * S * h)                        # context = P . memory
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
    build: Callable[[dict[str, int]], tuple]
    defaults: dict[str, int]
    published_params: float
    limits: dict[str, tuple[int, int | None]] = field(default_factory=dict)


_t5 = partial(_enc_dec, vocab=32128, t5=True)
_NLP = {"microbatch": 4, "seq": 384}
_SEQ2SEQ = {"microbatch": 32, "seq": 128, "tgt_seq": 128, "layers": 6}
_T5 = {"microbatch": 16, "seq": 512, "tgt_seq": 128}
_IMG = {"microbatch": 32}
_AUX = {"aux": (0, 1)}

_MODELS = {m.name: m for m in [
    _Model("bert-large", "BERT-large (Devlin et al. 2019): embeddings + 24 transformer layers "
           "(d=1024, 16 heads) + pooler + SQuAD head", _bert, {**_NLP, "layers": 24}, 340e6),
    _Model("bert-48", "BERT-large width with 48 transformer layers (SPP Table II)", _bert,
           {**_NLP, "layers": 48}, 640e6),
    _Model("xlnet-large", "XLNet-large (Yang et al. 2019): 24 relative-attention layers, "
           "d=1024, two-stream attention, SQuAD head", _xlnet,
           {"microbatch": 4, "seq": 512, "layers": 24, "streams": 2}, 340e6,
           {"streams": (1, 2)}),
    _Model("transformer", "Transformer base (Vaswani et al. 2017): 6+6 layers, d=512, 8 heads, "
           "shared 37000-token vocabulary",
           partial(_enc_dec, d=512, heads=8, dkv=64, ffn=2048, vocab=37000, t5=False),
           _SEQ2SEQ, 65e6),
    _Model("t5-base", "T5-base (Raffel et al. 2020): 12+12 layers, d=768, 12 heads, ffn 3072",
           partial(_t5, d=768, heads=12, dkv=64, ffn=3072), {**_T5, "layers": 12}, 220e6),
    _Model("t5-3b", "T5-3B (Raffel et al. 2020): 24+24 layers, d=1024, 32 heads of 128, "
           "ffn 16384", partial(_t5, d=1024, heads=32, dkv=128, ffn=16384),
           {**_T5, "layers": 24}, 2.85e9),
    _Model("t5-11b", "T5-11B (Raffel et al. 2020): 24+24 layers, d=1024, 128 heads of 128, "
           "ffn 65536", partial(_t5, d=1024, heads=128, dkv=128, ffn=65536),
           {**_T5, "layers": 24}, 11.3e9),
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
    """One entry per model: name, description, default options (for ``pipeplan models``)."""
    return [{"name": m.name, "description": m.description, "defaults": dict(m.defaults),
             "published_params": m.published_params} for m in _MODELS.values()]


def _model(name: str) -> _Model:
    model = _MODELS.get(name)
    if model is None:
        raise PipeplanError(f"unknown zoo model {name!r} (known: {', '.join(_MODELS)})")
    return model


def _options(model: _Model, options: dict) -> dict[str, int]:
    values = dict(model.defaults)
    for key, raw in (options or {}).items():
        if key not in values:
            raise PipeplanError(f"zoo model {model.name!r}: unknown option {key!r} "
                                f"(known: {', '.join(sorted(values))})")
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
    """Build zoo model ``name`` with ``options`` (strings, from ``zoo:NAME?key=value&...``)."""
    model = _model(name)
    opts = _options(model, options or {})
    nodes, edges, hyper = model.build(opts)
    meta = {"source": "zoo", **opts, **hyper, "reference_device": REFERENCE_DEVICE,
            "reference_tflops": REFERENCE_TFLOPS, "reference_mem_gbps": REFERENCE_MEM_GBPS,
            "efficiency": dict(EFFICIENCY), "published_params": model.published_params}
    if edges is None:
        edges = [(a.id, b.id) for a, b in zip(nodes, nodes[1:])]
    return Graph.from_nodes(name, [n.spec() for n in nodes], edges, meta)
