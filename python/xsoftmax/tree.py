# SPDX-License-Identifier: Apache-2.0
"""``Tree``: the class trees of ``HierarchicalSoftmaxLoss`` (parent arrays; uniform and Huffman
constructions, the latter by the C++ library)."""
import torch

from . import _C

__all__ = ["Tree"]


class Tree:
    """A class tree for ``HierarchicalSoftmaxLoss``, as a parent array.

    Nodes 0..M-1; ``parent[i]`` is node i's parent (-1 for the root); ``leaf_class[i]`` the class
    of leaf i (-1 for internal nodes). Children are ordered by node index. When ``leaf_class`` is
    None, nodes 0..num_classes-1 are the classes. Validated by the C++ library when a head is
    built (cycles, orphans, missing or duplicate classes raise ``ValueError`` naming the node).
    """

    def __init__(self, parent, num_classes, leaf_class=None, kind="parents"):
        self.parent = torch.as_tensor(parent, dtype=torch.int64).reshape(-1).cpu()
        self.leaf_class = None if leaf_class is None else torch.as_tensor(leaf_class, dtype=torch.int64).reshape(-1).cpu()
        self.num_classes = int(num_classes)
        self.kind = kind

    @classmethod
    def from_parents(cls, parent, num_classes=None, leaf_class=None):
        """A user tree. Without ``leaf_class``, nodes 0..num_classes-1 are the classes (then
        ``num_classes`` is required); with it, ``num_classes`` defaults to max(leaf_class) + 1."""
        if num_classes is None:
            if leaf_class is None:
                raise ValueError("Tree.from_parents: num_classes is required when leaf_class is not given")
            num_classes = int(torch.as_tensor(leaf_class).max().item()) + 1
        return cls(parent, num_classes, leaf_class)

    @classmethod
    def uniform(cls, num_classes, depth, branching):
        """Every internal node has ``branching`` children and every class sits at ``depth``; the
        last nodes of a level are partial when num_classes < branching ** depth. Classes are
        leaves in class order (the layout of the C++ ``uniform_tree<depth, branching>``)."""
        n, depth, branching = int(num_classes), int(depth), int(branching)
        if n < 1:
            raise ValueError(f"Tree.uniform: num_classes = {n} must be >= 1")
        if depth < 1:
            raise ValueError(f"Tree.uniform: depth = {depth} must be >= 1")
        if branching < 2:
            raise ValueError(f"Tree.uniform: branching = {branching} must be >= 2")
        if n > branching ** depth:
            raise ValueError(f"Tree.uniform: num_classes = {n} exceeds branching ** depth = {branching ** depth}")
        # Internal nodes of level l (root: l = 0): ceil(n / branching ** (depth - l)).
        sizes = [-(-n // branching ** (depth - level)) for level in range(depth)]
        base, offset = [], n
        for s in sizes:
            base.append(offset)
            offset += s
        parent = torch.empty(offset, dtype=torch.int64)
        parent[base[0]] = -1
        for level in range(1, depth):
            idx = torch.arange(sizes[level], dtype=torch.int64)
            parent[base[level]:base[level] + sizes[level]] = base[level - 1] + idx // branching
        parent[:n] = base[depth - 1] + torch.arange(n, dtype=torch.int64) // branching
        return cls(parent, n, kind=f"uniform(depth={depth}, branching={branching})")

    @classmethod
    def huffman(cls, counts, arity=2):
        """The Huffman tree of the class counts (any arity >= 2; binary = word2vec / fastText):
        frequent classes get short paths."""
        counts = torch.as_tensor(counts).reshape(-1)
        parent = _C.huffman_parents(counts, int(arity))
        return cls(parent, counts.numel(), kind=f"huffman(arity={arity})")

    def __repr__(self):
        return f"Tree({self.kind}, num_classes={self.num_classes}, nodes={self.parent.numel()})"
