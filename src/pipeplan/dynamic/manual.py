"""The hand-made placements of DynPartition's §8.1.4 (Figs. 10-11), as the original program
makes them: the *left/right split* puts the root and the second half of its children's
subtrees on device ``b`` and the first half (the left subtree of a binary node) on ``a``; the
*state/output split* computes every node's state on ``a`` and every output on ``b``."""

from __future__ import annotations

from .trees import Tree


def left_right(tree: Tree, a: int, b: int) -> list[int]:
    """Node devices of the left/right split (Fig. 10)."""
    place = [b] * tree.n
    root_children = tree.children[-1]
    for c in root_children[:len(root_children) // 2]:
        for i in tree.subtree(c):
            place[i] = a
    return place


def state_output(tree: Tree, a: int, b: int) -> tuple[list[int], list[int]]:
    """(state devices, output devices) of the state/output split (Fig. 11)."""
    return [a] * tree.n, [b] * tree.n
