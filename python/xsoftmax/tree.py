# SPDX-License-Identifier: Apache-2.0
"""``Tree``: the class trees of ``HierarchicalSoftmaxLoss`` (parent arrays; uniform, Huffman and
k-means label-tree constructions, the last two by the C++ library)."""
import math

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

    @classmethod
    def kmeans(cls, class_vectors, branching=None, depth=None, iterations=8, spherical=True, seed=0):
        """A label tree by balanced hierarchical k-means over one vector per class, so that similar
        classes share nodes (the way Parabel, Bonsai and napkinXC build extreme-classification
        trees): each node's classes are split into ``branching`` clusters of equal size (+-1),
        recursively. ``class_vectors``: num_classes x dim, e.g. class embeddings, the mean
        training feature of each class, or the weight rows of a trained ``FullSoftmaxLoss``
        (any device and float dtype; the tree is built on the CPU, in float32, with the library's
        OpenMP threads: about 1-3 s at 1e5 classes and d = 64, 12-35 s at 1e6).

        Args:
            branching: children per internal node (>= 2); default ceil(sqrt(num_classes)).
            depth: most internal nodes on a class's path; 0 for no limit (nodes are split until
                they hold at most ``branching`` classes). Default 2 when ``branching`` is not
                given (the default tree's two-level shape), else 0.
            iterations: balanced k-means rounds per node.
            spherical: cluster by cosine (vectors and centroids at unit length; the usual choice
                for embeddings and softmax weights, whose norms mostly carry class frequency), or
                by Euclidean distance.
            seed: seeds each node's initial centroids; the same seed gives the same tree.

        Pair it with ``HierarchicalSoftmaxLoss.init_weights_from_class_vectors`` (or build both at
        once with ``HierarchicalSoftmaxLoss.from_class_vectors``) so that the new head starts
        where the classes are. Raises ``ValueError`` naming the argument for bad arguments and
        for NaN or infinite vectors.
        """
        if not isinstance(class_vectors, torch.Tensor):
            raise TypeError(f"Tree.kmeans: class_vectors must be a torch.Tensor, got {type(class_vectors).__name__}")
        if class_vectors.dim() != 2:
            raise ValueError(f"Tree.kmeans: class_vectors must be 2-D (num_classes x dim), got shape "
                             f"{tuple(class_vectors.shape)}")
        n = class_vectors.shape[0]
        if depth is None:
            depth = 2 if branching is None else 0
        if branching is None:
            branching = max(2, math.ceil(math.sqrt(n)))
        branching, depth, iterations, seed = int(branching), int(depth), int(iterations), int(seed)
        parent, leaf_class = _C.kmeans_tree_parents(class_vectors, branching, depth, iterations, bool(spherical), seed)
        return cls(parent, n, leaf_class,
                   kind=f"kmeans(branching={branching}, depth={depth or 'any'}, spherical={bool(spherical)})")

    def __repr__(self):
        return f"Tree({self.kind}, num_classes={self.num_classes}, nodes={self.parent.numel()})"
