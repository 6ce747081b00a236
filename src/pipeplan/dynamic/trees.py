"""Input trees of DynPartition's dynamic networks (dynpartition.txt §5.1, §5.3) and their
generators: binary parse trees whose sentence lengths follow the Stanford Sentiment
Treebank's (SST, Socher et al. 2013), and random MathFunc expressions of 8-10 functions.

A ``Tree`` is numbered in post-order: every child has a smaller index than its parent and
the root is the last node, so index order is a topological order of the computation.
No dataset is downloaded: the SST figures used are in ``SST_*`` below (docs/dynpartition.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import PipeplanError

#: SST sentences: mean length 18 words (Kim 2014, Table 1, SST-1: 11,855 sentences) and a
#: standard deviation of 9 words (assumed: the treebank's lengths are right-skewed, 2 to ~56);
#: lengths are drawn from a gamma distribution with that mean and deviation, clipped
SST_MEAN_WORDS = 18.0
SST_SD_WORDS = 9.0
SST_MIN_WORDS, SST_MAX_WORDS = 2, 56
#: SST's vocabulary (Kim 2014, Table 1: |V| = 17,836 for SST-1)
SST_VOCAB = 17836

#: MathFunc's functions (§5.3: "addition, subtraction, sine, cosine, and others"): name -> arity
FUNCTIONS: dict[str, int] = {"add": 2, "sub": 2, "mul": 2, "sin": 1, "cos": 1, "exp": 1, "tanh": 1, "neg": 1}
FUNCTION_NAMES = tuple(FUNCTIONS)
#: a MathFunc leaf reads input ``label`` of this many inputs
MATH_INPUTS = 4


@dataclass(frozen=True)
class Tree:
    """A rooted tree in post-order. ``children[i]`` are node i's children (left to right);
    ``labels[i]`` is a leaf's word id (TreeLSTM) or input index (MathFunc), an inner node's
    function index into ``FUNCTION_NAMES`` (MathFunc) or -1 (TreeLSTM)."""

    children: tuple[tuple[int, ...], ...]
    labels: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.children)
        if n == 0 or len(self.labels) != n:
            raise PipeplanError(f"tree: {n} nodes and {len(self.labels)} labels")
        seen = [0] * n
        for i, ch in enumerate(self.children):
            for c in ch:
                if not 0 <= c < i:
                    raise PipeplanError(f"tree: node {i}'s child {c} is not an earlier node (post-order)")
                seen[c] += 1
        if any(s != 1 for s in seen[:-1]) or seen[-1]:
            raise PipeplanError("tree: every node but the last (the root) must have exactly one parent")

    @property
    def n(self) -> int:
        return len(self.children)

    @cached_property
    def parent(self) -> np.ndarray:
        """Each node's parent (-1 for the root)."""
        out = np.full(self.n, -1, dtype=np.int64)
        for i, ch in enumerate(self.children):
            out[list(ch)] = i
        return out

    @cached_property
    def depth(self) -> np.ndarray:
        """Each node's distance from the root."""
        out = np.zeros(self.n, dtype=np.int64)
        for i in range(self.n - 2, -1, -1):  # parents come after their children
            out[i] = out[self.parent[i]] + 1
        return out

    @cached_property
    def inorder(self) -> tuple[int, ...]:
        """In-order traversal (§4.1): first child's subtree, the node, the other children's."""
        out: list[int] = []
        stack: list[tuple[int, bool]] = [(self.n - 1, False)]
        while stack:
            i, expanded = stack.pop()
            ch = self.children[i]
            if expanded or not ch:
                out.append(i)
                continue
            for c in reversed(ch[1:]):
                stack.append((c, False))
            stack.append((i, True))
            stack.append((ch[0], False))
        return tuple(out)

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i, ch in enumerate(self.children) if not ch)

    def subtree(self, i: int) -> list[int]:
        """Node i and its descendants, in post-order."""
        out, stack = [], [i]
        while stack:
            j = stack.pop()
            out.append(j)
            stack.extend(self.children[j])
        return sorted(out)


def _from_nested(nested) -> Tree:
    """A Tree from nested tuples ``(label, child, child...)`` or a leaf label (an int)."""
    children: list[tuple[int, ...]] = []
    labels: list[int] = []

    def visit(x) -> int:
        if isinstance(x, tuple):
            ids = tuple(visit(c) for c in x[1:])
            children.append(ids)
            labels.append(x[0])
        else:
            children.append(())
            labels.append(int(x))
        return len(children) - 1

    visit(nested)
    return Tree(tuple(children), tuple(labels))


def sst_length(rng: np.random.Generator) -> int:
    """A sentence length (words) drawn to SST's mean and deviation (``SST_*``)."""
    shape = (SST_MEAN_WORDS / SST_SD_WORDS) ** 2
    x = rng.gamma(shape, SST_MEAN_WORDS / shape)
    return int(np.clip(round(x), SST_MIN_WORDS, SST_MAX_WORDS))


def binary_parse_tree(words: int, rng: np.random.Generator, vocab: int = SST_VOCAB) -> Tree:
    """A random binary parse tree over ``words`` leaves (2 x words - 1 nodes): each span is
    split at a uniformly drawn point; leaves get uniform word ids."""
    if words < 1:
        raise PipeplanError(f"a parse tree needs at least one word, got {words}")

    def span(k: int):
        if k == 1:
            return int(rng.integers(vocab))
        cut = int(rng.integers(1, k))
        return (-1, span(cut), span(k - cut))

    return _from_nested(span(words))


def sst_tree(rng: np.random.Generator, vocab: int = SST_VOCAB) -> Tree:
    """A binary parse tree of an SST-like sentence."""
    return binary_parse_tree(sst_length(rng), rng, vocab)


def math_expression(rng: np.random.Generator, functions: tuple[int, int] = (8, 10)) -> Tree:
    """A random MathFunc expression (§5.3: "on-the-fly combination of 8-10 simple mathematical
    functions"): starting from one input, a uniformly drawn leaf is replaced by a uniformly
    drawn function over new inputs until the expression has that many functions."""
    lo, hi = functions
    if not 1 <= lo <= hi:
        raise PipeplanError(f"math_expression: bad function count range {functions}")
    count = int(rng.integers(lo, hi + 1))
    root: list = [int(rng.integers(MATH_INPUTS))]  # a mutable cell holding the expression

    def leaves(cell: list, node, path: tuple) -> list[tuple]:
        if isinstance(node, list):
            return [p for i, c in enumerate(node[1:], 1) for p in leaves(cell, c, path + (i,))]
        return [path]

    for _ in range(count):
        paths = leaves(root, root[0], ())
        path = paths[int(rng.integers(len(paths)))]
        f = int(rng.integers(len(FUNCTION_NAMES)))
        new = [f] + [int(rng.integers(MATH_INPUTS)) for _ in range(FUNCTIONS[FUNCTION_NAMES[f]])]
        if not path:
            root[0] = new
        else:
            holder = root[0]
            for step in path[:-1]:
                holder = holder[step]
            holder[path[-1]] = new

    def freeze(x):
        return tuple([x[0]] + [freeze(c) for c in x[1:]]) if isinstance(x, list) else x

    return _from_nested(freeze(root[0]))


def sample_trees(net: str, count: int, seed: int, max_nodes: int = 128) -> list[Tree]:
    """``count`` input trees for ``net`` (treelstm: SST-like parse trees; mathfunc: random
    expressions), those above ``max_nodes`` nodes dropped and redrawn (§6.1)."""
    rng = np.random.default_rng(seed)
    draw = {"treelstm": sst_tree, "mathfunc": math_expression}.get(net)
    if draw is None:
        raise PipeplanError(f"unknown dynamic network {net!r} (known: treelstm, mathfunc)")
    out: list[Tree] = []
    while len(out) < count:
        t = draw(rng)
        if t.n <= max_nodes:
            out.append(t)
    return out
