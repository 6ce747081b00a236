"""Derivation rules: which placements of an op's tensors can run without moving data
(Auto-MAP §3.2.1 "derivation rules of each instruction", §4.2 propagation).

The devices form one line of N (Auto-MAP partitions a variable "across all devices"), so a
tensor's placement is one of: replicated (``R``), partitioned along one dimension
(``S(d)``), or a partial sum whose true value is the sum over the devices (``P``: the output
of a matmul whose contracted dimension is partitioned). A rule lists, for one op, every
tuple of placements (its tensor inputs, then its outputs) under which each device computes
its share locally. Beyond those tuples the only data movement allowed is an all-reduce of a
partial input that the op needs whole (``P`` read as ``R``): the Megatron pattern of a
row-parallel matmul followed by anything. A gather (``S`` read as ``R``) or an all-to-all is
a conflict, as is a placement no rule lists. docs/opp.md gives each rule and why.

Placement codes: ``R = 0``, ``P = 1``, ``S(d) = 2 + d``; ``ANY = -1`` in a tuple means the
op does not care (it reads only the tensor's shape). Reductions over a partitioned dimension
give ``P`` when they are sums (sum, mean: linear), and are conflicts otherwise (max, any),
except softmax / log-softmax along a partitioned dimension, which is allowed (its row
statistics are all-reduced: Megatron's vocabulary-parallel cross-entropy) and a gather along
a partitioned dimension with replicated indices, which gives ``P`` (each device contributes
the entries it holds, zeros elsewhere; likewise an embedding partitioned by rows).
"""

from __future__ import annotations

from typing import Callable, Sequence

from .program import OpInfo, TensorProgram

R, P, ANY = 0, 1, -1
Strategy = tuple[int, ...]


STRIDE = 16  # codes 2 + d + 16 k: dimension d (< 16) cut as component k of a merged dimension
COMPONENTS = 3


def S(d: int, k: int = 0) -> int:
    """The code of a cut of dimension d; k > 0: the dimension merges several and the cut is
    of its k-th component counted from the outermost (an interleaved, strided cut)."""
    return 2 + d + STRIDE * k


def dim_of(code: int) -> tuple[int, int]:
    """(d, k) of a cut's code."""
    return (code - 2) % STRIDE, (code - 2) // STRIDE


def name(code: int) -> str:
    if code in (R, P, ANY):
        return {R: "R", P: "P", ANY: "*"}[code]
    d, k = dim_of(code)
    return f"S({d})" if k == 0 else f"S({d}/{k})"


class Ctx:
    """What a rule sees of its op: shapes of inputs and outputs and the literal arguments."""

    def __init__(self, op: OpInfo, prog: TensorProgram, devices: int) -> None:
        self.op, self.devices = op, devices
        self.ins = [prog.tensors[t].shape for t in op.inputs]
        self.outs = [prog.tensors[t].shape for t in op.outputs]
        self.out_dtypes = [prog.tensors[t].dtype for t in op.outputs]

    def lit(self, i: int, default=None):
        """Positional argument ``i`` (torch.export passes these ops' dims and flags by position)."""
        return self.op.arg(i, default)

    def tensor_arg(self, i: int) -> int | None:
        """The input index of positional argument ``i`` when it is a tensor."""
        a = self.op.arg(i)
        return a[1] if isinstance(a, tuple) and len(a) == 2 and a[0] == "t" else None


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _all(ctx: Ctx, code: int) -> Strategy:
    return tuple([code] * (len(ctx.ins) + len(ctx.outs)))


# -- element-wise ------------------------------------------------------------------------------
LINEAR_ALL = {"add", "sub", "clone", "_to_copy", "alias", "detach", "lift_fresh_copy", "neg", "copy"}
LINEAR_ONE = {"mul", "div"}  # linear in one partial operand when the others are replicated


def _aligned(out: tuple[int, ...], shape: tuple[int, ...], d: int) -> int | None:
    """The dimension of ``shape`` (broadcast against ``out``) that follows output dimension d."""
    k = d - (len(out) - len(shape))
    return k if k >= 0 and shape[k] == out[d] else None


def elementwise(ctx: Ctx) -> list[Strategy]:
    out = ctx.outs[0]
    strategies = [_all(ctx, R)]
    for d in range(len(out)):
        if out[d] < 2:
            continue
        ins = [S(k) if (k := _aligned(out, s, d)) is not None else R for s in ctx.ins]
        strategies.append(tuple(ins + [S(d)] * len(ctx.outs)))
    name_ = ctx.op.target
    scalar_operand = any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in ctx.op.args[1:2])
    floating_out = all(d.startswith(("float", "bfloat")) for d in ctx.out_dtypes)
    if name_ in LINEAR_ALL and floating_out and not (name_ in ("add", "sub") and scalar_operand):
        strategies.append(_all(ctx, P))
    elif name_ in LINEAR_ONE:
        for i in range(len(ctx.ins) if name_ == "mul" else 1):
            strategies.append(tuple([P if j == i else R for j in range(len(ctx.ins))] + [P] * len(ctx.outs)))
    return strategies


# -- contractions ------------------------------------------------------------------------------
def mm(ctx: Ctx) -> list[Strategy]:
    """a[m, k] @ b[k, n]."""
    return [(R, R, R), (S(0), R, S(0)), (R, S(1), S(1)), (S(1), S(0), P), (P, R, P), (R, P, P)]


def addmm(ctx: Ctx) -> list[Strategy]:
    """bias + a[m, k] @ b[k, n]; a 1-D bias is broadcast over rows; with a partial product
    the bias is added once (replicated, kept on one device)."""
    rank = len(ctx.ins[0])
    bias_rows = rank == 2 and ctx.ins[0][0] > 1
    bias_cols = S(rank - 1) if rank and ctx.ins[0][-1] > 1 else R
    return [(R, R, R, R), (S(0) if bias_rows else R, S(0), R, S(0)), (bias_cols, R, S(1), S(1)), (R, S(1), S(0), P)]


def bmm(ctx: Ctx) -> list[Strategy]:
    """a[b, m, k] @ b[b, k, n]."""
    return [(R, R, R), (S(0), S(0), S(0)), (S(1), R, S(1)), (R, S(2), S(2)), (S(2), S(1), P),
            (P, R, P), (R, P, P)]


def convolution(ctx: Ctx) -> list[Strategy]:
    """convolution(x[n, c, ...], w[o, c, ...], bias[o] | None, ...), groups = 1: batch,
    output channels, or input channels (partial output, the bias added once)."""
    bias = ctx.tensor_arg(2) is not None
    b = lambda code: (code,) if bias else ()  # noqa: E731
    batch = [(R, R, *b(R), R), (S(0), R, *b(R), S(0))]
    if ctx.lit(8, 1) != 1 or ctx.lit(6, False):  # grouped or transposed: the batch only
        return batch
    return batch + [(R, S(0), *b(S(0)), S(1)), (S(1), S(1), *b(R), P)]


def embedding(ctx: Ctx) -> list[Strategy]:
    """embedding(weight[V, D], indices): rows of a partitioned table give partial sums."""
    idx_rank = len(ctx.ins[1])
    out = [(R, R, R), (S(1), R, S(idx_rank)), (S(0), R, P)]
    out += [(R, S(d), S(d)) for d in range(idx_rank)]
    return out


def gather(ctx: Ctx) -> list[Strategy]:
    """gather(x, dim, index): along other dimensions freely; along ``dim`` partial."""
    x, index = ctx.ins[0], ctx.ins[1]
    rank, dim = len(x), _dim(ctx.lit(1), len(x))
    out = [(R, R, R), (S(dim), R, P)]
    out += [(R, S(d), S(d)) for d in range(rank)]  # each device gathers its rows of the index
    out += [(S(d), S(d), S(d)) for d in range(rank) if d != dim and x[d] == index[d]]
    return out


# -- normalizations and reductions -------------------------------------------------------------
def softmax(ctx: Ctx) -> list[Strategy]:
    """Softmax, log-softmax and softmax's backward: every tensor alike, along any dimension."""
    return [_all(ctx, R)] + [_all(ctx, S(d)) for d in range(len(ctx.ins[0]))]


def layer_norm(ctx: Ctx) -> list[Strategy]:
    """native_layer_norm(x, normalized_shape, weight, bias, eps) -> (out, mean, rstd)."""
    rank, normed = len(ctx.ins[0]), len(ctx.lit(1))
    params = len(ctx.ins) - 1
    out = [_all(ctx, R)]
    out += [(S(d),) + (R,) * params + (S(d),) * len(ctx.outs) for d in range(rank - normed)]
    return out


def batch_norm(ctx: Ctx) -> list[Strategy]:
    """Batch norm in training: its statistics are over the batch, so only channels split."""
    x_rank = len(ctx.ins[0])
    per_channel = lambda shapes: tuple(S(1) if len(s) == x_rank else S(0) for s in shapes)  # noqa: E731
    return [_all(ctx, R), per_channel(ctx.ins) + per_channel(ctx.outs)]


def _reduced_dims(ctx: Ctx) -> tuple[set[int], bool]:
    rank = len(ctx.ins[0])
    target = ctx.op.target
    if target in ("mean", "sum") and len(ctx.op.args) < 2:
        return set(range(rank)), False
    dims = ctx.lit(1)
    dims = list(range(rank)) if dims in (None, [], ()) else ([dims] if isinstance(dims, int) else dims)
    keep = bool(ctx.op.arg(2, ctx.op.kwargs.get("keepdim", False)))
    return {_dim(d, rank) for d in dims}, keep


def reduction(ctx: Ctx) -> list[Strategy]:
    """sum / mean (linear: a partitioned reduced dimension gives a partial sum), max / any...
    (the reduced dimension must be whole)."""
    rank = len(ctx.ins[0])
    reduced, keep = _reduced_dims(ctx)
    linear = ctx.op.target in ("sum", "mean")
    out = [(R,) * (1 + len(ctx.outs))]
    for d in range(rank):
        if d in reduced:
            if linear:
                out.append((S(d),) + (P,) * len(ctx.outs))
            continue
        od = d if keep else d - sum(1 for r in reduced if r < d)
        out.append((S(d),) + (S(od),) * len(ctx.outs))
    if linear:
        out.append((P,) + (P,) * len(ctx.outs))
    return out


def pool(ctx: Ctx) -> list[Strategy]:
    """Pooling over spatial dimensions: batch or channels split (an unbatched input: channels)."""
    if len(ctx.ins[0]) == 3:
        return [_all(ctx, R), _all(ctx, S(0))]
    return [_all(ctx, R), _all(ctx, S(0)), _all(ctx, S(1))]


# -- views -------------------------------------------------------------------------------------
def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of dimensions of two shapes of equal size whose products match."""
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb and (i < len(a) or j < len(b)):
            if pa < pb and i < len(a):
                pa, i = pa * a[i], i + 1
                ga.append(i - 1)
            elif j < len(b):
                pb, j = pb * b[j], j + 1
                gb.append(j - 1)
            else:
                break
        groups.append((ga, gb))
    return groups


def view(ctx: Ctx) -> list[Strategy]:
    """view / reshape: dimensions map within runs of merged or split dimensions. Merging cut
    dimension d into one makes a cut of its component (outermost: a plain cut; inner: a
    strided one, T5 merging batch and heads for its attention products); splitting it
    again gives the cut back to the same component; runs that both merge and split keep only
    their outermost cut. Through a merge or split only even cuts pass (the component's size a
    multiple of the devices), so that each device's share is the same elements either side."""
    a, b = ctx.ins[0], ctx.outs[0]
    even = lambda size: size % ctx.devices == 0  # noqa: E731  (a device's share stays one block)
    out = [(R, R), (P, P)]
    for ga, gb in _groups(a, b):
        big_a, big_b = [d for d in ga if a[d] > 1], [d for d in gb if b[d] > 1]
        if not big_a or not big_b:
            continue
        if len(big_a) == 1 and len(big_b) == 1:
            out += [(S(big_a[0], k), S(big_b[0], k)) for k in range(COMPONENTS)]
        elif len(big_b) == 1:
            out += [(S(da), S(big_b[0], j)) for j, da in enumerate(big_a) if j < COMPONENTS and even(a[da])]
        elif len(big_a) == 1:
            out += [(S(big_a[0], j), S(db)) for j, db in enumerate(big_b) if j < COMPONENTS and even(b[db])]
        elif even(a[big_a[0]]) and even(b[big_b[0]]):
            out.append((S(big_a[0]), S(big_b[0])))
    return out


def _mapped(ctx: Ctx, to_out: Callable[[int], int | None]) -> list[Strategy]:
    """One input, outputs that rename its dimensions (``to_out(d)``: None = cannot split d)."""
    out = [(R,) * (1 + len(ctx.outs)), (P,) * (1 + len(ctx.outs))]
    for d in range(len(ctx.ins[0])):
        od = to_out(d)
        if od is not None:
            out.append((S(d),) + (S(od),) * len(ctx.outs))
    return out


def permute(ctx: Ctx) -> list[Strategy]:
    rank = len(ctx.ins[0])
    perm = [_dim(d, rank) for d in ctx.lit(1)]
    return _mapped(ctx, lambda d: perm.index(d))


def transpose(ctx: Ctx) -> list[Strategy]:
    rank = len(ctx.ins[0])
    a, b = (0, 1) if ctx.op.target in ("t", "numpy_T") else (_dim(ctx.lit(1), rank), _dim(ctx.lit(2), rank))
    return _mapped(ctx, lambda d: b if d == a else a if d == b else d)


def expand(ctx: Ctx) -> list[Strategy]:
    """Dimensions kept map one to one; a dimension made by broadcasting holds the same values
    all along, so a replicated input may be expanded straight into a cut of it (each device
    expands to its own share)."""
    a, b = ctx.ins[0], ctx.outs[0]
    off = len(b) - len(a)
    out = _mapped(ctx, lambda d: d + off if a[d] == b[d + off] else None)
    grown = [d for d in range(len(b)) if d < off or (a[d - off] == 1 and b[d] > 1)]
    return out + [(R, S(d)) for d in grown]


def unsqueeze(ctx: Ctx) -> list[Strategy]:
    at = _dim(ctx.lit(1), len(ctx.outs[0]))
    return _mapped(ctx, lambda d: d if d < at else d + 1)


def squeeze(ctx: Ctx) -> list[Strategy]:
    a = ctx.ins[0]
    dims = ctx.lit(1)
    dims = [d for d in range(len(a)) if a[d] == 1] if dims is None else ([dims] if isinstance(dims, int) else dims)
    gone = {_dim(d, len(a)) for d in dims if a[_dim(d, len(a))] == 1}
    return _mapped(ctx, lambda d: None if d in gone else d - sum(1 for g in gone if g < d))


def slice_(ctx: Ctx) -> list[Strategy]:
    a = ctx.ins[0]
    dim = _dim(ctx.lit(1, 0), len(a))
    whole = ctx.lit(2, 0) in (0, None) and (ctx.lit(3) is None or ctx.lit(3) >= a[dim]) and ctx.lit(4, 1) == 1
    return _mapped(ctx, lambda d: d if d != dim or whole else None)


def select(ctx: Ctx) -> list[Strategy]:
    dim = _dim(ctx.lit(1), len(ctx.ins[0]))
    return _mapped(ctx, lambda d: None if d == dim else (d if d < dim else d - 1))


def split(ctx: Ctx) -> list[Strategy]:
    """split / split_with_sizes: the split dimension must be whole, except that a strided cut
    of it (component 1: the dimension read as [pieces, size of a piece], each piece cut alike)
    splits into equal pieces each cut evenly: GPT-2's fused q | k | v cut by heads."""
    dim = _dim(ctx.lit(2, 0), len(ctx.ins[0]))
    out = _mapped(ctx, lambda d: None if d == dim else d)
    sizes = {shape[dim] for shape in ctx.outs}
    if len(ctx.outs) > 1 and len(sizes) == 1 and sizes.pop() % ctx.devices == 0:
        out.append((S(dim, 1),) + (S(dim),) * len(ctx.outs))
    return out


def unbind(ctx: Ctx) -> list[Strategy]:
    dim = _dim(ctx.lit(1, 0), len(ctx.ins[0]))
    return _mapped(ctx, lambda d: None if d == dim else (d if d < dim else d - 1))


def cat(ctx: Ctx) -> list[Strategy]:
    rank = len(ctx.outs[0])
    dim = _dim(ctx.lit(1, 0), rank)
    k = len(ctx.ins)
    out = [(R,) * (k + 1), (P,) * (k + 1)]
    out += [(S(d),) * (k + 1) for d in range(rank) if d != dim]
    return out


def creation(ctx: Ctx) -> list[Strategy]:
    """A tensor made from nothing, or from another's shape only: the same on every device,
    so free to be cut any way."""
    ins = (ANY,) * len(ctx.ins)
    return [ins + (R,) * len(ctx.outs)] + [ins + (S(d),) * len(ctx.outs) for d in range(len(ctx.outs[0]))]


def replicated_only(ctx: Ctx) -> list[Strategy]:
    """An op without a rule: it runs only on whole tensors."""
    return [_all(ctx, R)]


ELEMENTWISE = {"add", "sub", "mul", "div", "pow", "rsqrt", "sqrt", "relu", "gelu", "silu", "tanh", "sigmoid",
               "exp", "log", "neg", "abs", "clone", "_to_copy", "alias", "detach", "lift_fresh_copy", "where",
               "eq", "ne", "gt", "ge", "lt", "le", "logical_not", "logical_and", "logical_or", "minimum",
               "maximum", "clamp", "clamp_min", "clamp_max", "native_dropout", "masked_fill", "reciprocal",
               "erf", "copy", "bitwise_not", "sign", "log1p", "expm1", "tanh_backward", "hardtanh", "leaky_relu",
               "bernoulli", "fill", "floor", "ceil", "round", "remainder", "fmod", "rsub", "square"}
RULES: dict[str, Callable[[Ctx], list[Strategy]]] = {
    **{n: elementwise for n in ELEMENTWISE},
    "mm": mm, "addmm": addmm, "bmm": bmm, "convolution": convolution, "embedding": embedding,
    "gather": gather, "_softmax": softmax, "_log_softmax": softmax, "_softmax_backward_data": softmax,
    "native_layer_norm": layer_norm,
    "_native_batch_norm_legit_functional": batch_norm, "_native_batch_norm_legit": batch_norm,
    "_native_batch_norm_legit_no_training": batch_norm, "native_batch_norm": batch_norm,
    **{n: reduction for n in ("sum", "mean", "amax", "amin", "any", "all", "argmax", "argmin", "prod", "max", "min",
                              "var", "std")},
    "max_pool2d_with_indices": pool, "avg_pool2d": pool,
    "_adaptive_avg_pool2d": pool, "adaptive_avg_pool2d": pool,
    "view": view, "_unsafe_view": view, "reshape": view, "permute": permute, "transpose": transpose, "t": transpose,
    "expand": expand, "unsqueeze": unsqueeze, "squeeze": squeeze, "slice": slice_, "select": select,
    "split": split, "split_with_sizes": split, "unbind": unbind, "cat": cat,
    **{n: creation for n in ("arange", "full", "scalar_tensor", "zeros", "ones", "empty", "full_like", "zeros_like",
                             "ones_like", "empty_like", "rand_like", "randn_like", "empty_strided", "new_zeros",
                             "new_ones", "new_full", "new_empty", "randint_like", "rand", "randn")},
}


EXPLICIT_COMPONENTS = {"view", "_unsafe_view", "reshape"}


def _strided(strategies_: list[Strategy]) -> list[Strategy]:
    """Each tuple again with all its cuts strided alike (component k = 1, 2): an op that
    cuts aligned dimensions cuts them the same way whatever their layout."""
    out = list(strategies_)
    for k in range(1, COMPONENTS):
        for s in strategies_:
            shifted = tuple(c + STRIDE * k if c >= 2 else c for c in s)
            if any(c >= 2 for c in s) and max(shifted) < S(0, COMPONENTS):
                out.append(shifted)
    return out


def strategies(op: OpInfo, prog: TensorProgram, devices: int) -> tuple[list[Strategy], bool]:
    """The op's placement tuples (inputs, then outputs) on ``devices``, and whether a rule knew the op."""
    rule = RULES.get(op.target)
    ctx = Ctx(op, prog, devices)
    if rule is None:
        return replicated_only(ctx), False
    try:
        out = rule(ctx)
        if op.target not in EXPLICIT_COMPONENTS:
            out = _strided(out)
    except (TypeError, IndexError, ValueError):  # an overload with arguments the rule does not read
        return replicated_only(ctx), False
    width = len(op.inputs) + len(op.outputs)
    return [s for s in dict.fromkeys(out) if len(s) == width], True
