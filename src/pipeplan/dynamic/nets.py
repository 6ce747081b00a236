"""DynPartition's dynamic tree networks (dynpartition.txt §5): a binary TreeLSTM with word
embeddings and a sentiment classifier at every node, and MathFunc, a tree of simple
functions. Both compute one tree node at a time, so an executor can place every node on
its own device (§8.1.2).

Every node's computation has two parts (the split of Fig. 11): the *state* (TreeLSTM: the
LSTM cell; MathFunc: the function) and the *output* (TreeLSTM: the classifier's
log-probabilities over 5 sentiment classes; MathFunc: none). A node's state is one tensor,
the one sent to its parent. ``width`` scales each node's work: the TreeLSTM's hidden and
embedding size (Tai et al. 2015 use 150), the length of MathFunc's vectors.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PipeplanError
from .trees import FUNCTION_NAMES, MATH_INPUTS, Tree

#: SST's five sentiment classes
CLASSES = 5
#: the widest TreeLSTM built (its 15 x width^2 weights: 1 GiB at 4096)
MAX_TREELSTM_WIDTH = 4096
#: the longest MathFunc vectors (its 4 inputs: 160 MB at 10 million)
MAX_MATHFUNC_WIDTH = 10_000_000


def _check_width(net: str, width: int, most: int) -> None:
    """One line for a width outside 1..``most``, before any tensor is allocated."""
    if not 1 <= width <= most:
        raise PipeplanError(f"{net}: width {width:,} is out of range 1..{most:,}")


class TreeLSTM(nn.Module):
    """Binary N-ary TreeLSTM (Tai et al. 2015 §3.2; the constituency model DynPartition runs,
    §5.2). A leaf reads its word's embedding; an inner node reads its two children's (h, c):

        i, f_l, f_r, o, u = W [h_l; h_r] + b      (a leaf: W' x + b')
        c = sigmoid(i) * tanh(u) + sigmoid(f_l) * c_l + sigmoid(f_r) * c_r
        h = sigmoid(o) * tanh(c)

    A node's state is ``[h; c]`` (1 x 2·width); its output ``log_softmax(V h)``."""

    kind = "treelstm"
    has_output = True

    def __init__(self, width: int = 150, vocab: int = 2048, classes: int = CLASSES) -> None:
        super().__init__()
        _check_width("treelstm", width, MAX_TREELSTM_WIDTH)
        if vocab < 1:
            raise PipeplanError(f"treelstm: vocab must be >= 1, got {vocab}")
        self.width, self.vocab = width, vocab
        self.embedding = nn.Embedding(vocab, width)
        self.leaf = nn.Linear(width, 5 * width)
        self.inner = nn.Linear(2 * width, 5 * width)
        self.classifier = nn.Linear(width, classes)

    def state(self, tree: Tree, i: int, children: list[torch.Tensor]) -> torch.Tensor:
        """Node i's ``[h; c]`` from its children's states (on this module's device)."""
        w = self.width
        if not children:
            word = torch.tensor([tree.labels[i] % self.vocab], device=self.leaf.weight.device)
            gates = self.leaf(self.embedding(word))
            cells = [torch.zeros(1, w, device=gates.device)] * 2
        else:
            left, right = children
            gates = self.inner(torch.cat([left[:, :w], right[:, :w]], dim=1))
            cells = [left[:, w:], right[:, w:]]
        i_g, f_l, f_r, o_g, u = gates.chunk(5, dim=1)
        c = torch.sigmoid(i_g) * torch.tanh(u) + torch.sigmoid(f_l) * cells[0] + torch.sigmoid(f_r) * cells[1]
        h = torch.sigmoid(o_g) * torch.tanh(c)
        return torch.cat([h, c], dim=1)

    def output(self, state: torch.Tensor) -> torch.Tensor:
        """The node's sentiment log-probabilities (1 x classes)."""
        return torch.log_softmax(self.classifier(state[:, :self.width]), dim=1)

    def state_bytes(self) -> int:
        """Bytes of a node's state (sent to its parent)."""
        return 2 * self.width * 4

    def output_bytes(self) -> int:
        """Bytes the output part reads of its node's state (h)."""
        return self.width * 4


class MathFunc(nn.Module):
    """MathFunc (§5.1): the root computes the expression; a leaf reads one of the
    ``MATH_INPUTS`` input vectors (length ``width``, drawn from ``seed``), an inner node applies
    its function (add, sub, mul, sin, cos, exp, tanh, neg) to its children's values. ``exp``
    and ``mul`` are computed on clamped values so that no expression overflows."""

    kind = "mathfunc"
    has_output = False

    def __init__(self, width: int = 1, seed: int = 0) -> None:
        super().__init__()
        _check_width("mathfunc", width, MAX_MATHFUNC_WIDTH)
        self.width = width
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("inputs", torch.rand(MATH_INPUTS, width, generator=g) * 2 - 1)

    def state(self, tree: Tree, i: int, children: list[torch.Tensor]) -> torch.Tensor:
        if not children:
            return self.inputs[tree.labels[i]]
        name = FUNCTION_NAMES[tree.labels[i]]
        a = children[0]
        if name == "add":
            return a + children[1]
        if name == "sub":
            return a - children[1]
        if name == "mul":
            return a.clamp(-4, 4) * children[1].clamp(-4, 4)
        if name == "exp":
            return torch.exp(a.clamp(max=4))
        return {"sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "neg": torch.neg}[name](a)

    def output(self, state: torch.Tensor) -> torch.Tensor | None:
        return None

    def state_bytes(self) -> int:
        return self.width * 4

    def output_bytes(self) -> int:
        return 0


def build_net(net: str, width: int | None = None, seed: int = 0) -> TreeLSTM | MathFunc:
    """A dynamic network with seeded random weights (``width`` None: the paper's size:
    TreeLSTM 150, MathFunc scalars)."""
    torch.manual_seed(seed)
    if net == "treelstm":
        return TreeLSTM(width or 150).eval()
    if net == "mathfunc":
        return MathFunc(width or 1, seed).eval()
    raise PipeplanError(f"unknown dynamic network {net!r} (known: treelstm, mathfunc)")


@torch.no_grad()
def reference(net: TreeLSTM | MathFunc, tree: Tree) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Single-device execution in post-order: (root state, every node's output)."""
    states: list[torch.Tensor] = []
    outputs: list[torch.Tensor | None] = []
    for i in range(tree.n):
        s = net.state(tree, i, [states[c] for c in tree.children[i]])
        states.append(s)
        outputs.append(net.output(s))
    return states[-1], outputs
