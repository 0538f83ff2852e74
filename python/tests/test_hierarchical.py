# SPDX-License-Identifier: Apache-2.0
"""HierarchicalSoftmaxLoss against a plain-PyTorch implementation of the same tree.

The reference derives the weight layout from the parent array alone, as the library documents it
(include/xsoftmax/tree/runtime_tree.hpp): one row per non-root node; the children of an internal
node are one contiguous block in child (node index) order; blocks are stacked in breadth-first
order of their internal nodes, the root's block first. Sigmoid (word2vec) nodes: one row per
internal node in that breadth-first order; p(first child) = sigmoid(h.v + b), p(second) =
sigmoid(-(h.v + b)).
"""
from collections import deque

import pytest
import torch
import torch.nn.functional as F

from xsoftmax import HierarchicalSoftmaxLoss, Tree

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

D = 10


class ReferenceTree:
    """Paths of every class as lists of (block_begin, block_size, child, internal_bfs_index)."""

    def __init__(self, tree):
        parent = tree.parent.tolist()
        m = len(parent)
        leaf_class = list(range(tree.num_classes)) + [-1] * (m - tree.num_classes) if tree.leaf_class is None \
            else tree.leaf_class.tolist()
        children = [[] for _ in range(m)]
        root = None
        for i, p in enumerate(parent):
            if p < 0:
                root = i
            else:
                children[p].append(i)  # in node index order
        block_of, bfs_index, rows = {}, {}, 0
        queue = deque([root])
        while queue:
            v = queue.popleft()
            block_of[v] = (rows, len(children[v]))
            bfs_index[v] = len(bfs_index)
            rows += len(children[v])
            queue.extend(c for c in children[v] if children[c])
        self.num_rows = rows
        self.num_internal = len(bfs_index)
        self.paths = [None] * tree.num_classes
        for node, c in enumerate(leaf_class):
            if c < 0:
                continue
            path, v = [], node
            while parent[v] >= 0:
                p = parent[v]
                begin, size = block_of[p]
                path.append((begin, size, children[p].index(v), bfs_index[p]))
                v = p
            self.paths[c] = path[::-1]

    def log_prob(self, hidden, targets, weight, bias, sigmoid):
        """log p(targets[i] | hidden[i]) in float64, differentiable in hidden, weight and bias."""
        out = []
        for i in range(hidden.shape[0]):
            lp = hidden.new_zeros(())
            for begin, size, child, node in self.paths[int(targets[i])]:
                if sigmoid:
                    s = weight[node] @ hidden[i] + (bias[node] if bias is not None else 0)
                    lp = lp + F.logsigmoid(s if child == 0 else -s)
                else:
                    s = weight[begin:begin + size] @ hidden[i]
                    if bias is not None:
                        s = s + bias[begin:begin + size]
                    lp = lp + F.log_softmax(s, 0)[child]
            out.append(lp)
        return torch.stack(out)

    def loss(self, hidden, targets, weight, bias, sigmoid, reduction, ignore_index):
        keep = targets != ignore_index
        safe = torch.where(keep, targets, torch.zeros_like(targets))
        per = torch.where(keep, -self.log_prob(hidden, safe, weight, bias, sigmoid), hidden.new_zeros(()))
        if reduction == "none":
            return per
        return per.sum() / keep.sum() if reduction == "mean" else per.sum()


def trees():
    counts = torch.tensor([50, 1, 7, 30, 2, 2, 9, 13, 1, 4, 20, 6, 3], dtype=torch.float64)
    # a hand-made tree: classes 0..6 are nodes 0..6; internal nodes 7 (root), 8, 9, 10
    parent = [8, 9, 8, 10, 9, 7, 10, 7 - 8, 7, 7, 9]  # node 7: root (-1)
    return {
        "uniform_2x6": (Tree.uniform(31, 2, 6), False),
        "uniform_3x3_partial": (Tree.uniform(20, 3, 3), False),
        "flat": (Tree.uniform(9, 1, 9), False),
        "huffman2": (Tree.huffman(counts, 2), False),
        "huffman3": (Tree.huffman(counts, 3), False),
        "huffman2_sigmoid": (Tree.huffman(counts, 2), True),
        "parents": (Tree.from_parents(parent, 7), False),
        "parents_leaf_class": (Tree.from_parents([-1, 0, 0, 1, 1, 1, 2, 2], leaf_class=[-1, -1, -1, 2, 0, 4, 1, 3]),
                               False),
    }


TREES = trees()


@pytest.mark.parametrize("name", sorted(TREES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_reference(name, reduction):
    tree, sigmoid = TREES[name]
    head = HierarchicalSoftmaxLoss(tree.num_classes, D, tree=tree, node="sigmoid" if sigmoid else "softmax",
                                   bias=True, reduction=reduction, init_scale=0.5)
    ref = ReferenceTree(tree)
    assert head.weight.shape[0] == (ref.num_internal if sigmoid else ref.num_rows)
    with torch.no_grad():
        head.bias.normal_()
    hidden = torch.randn(2, 7, D)
    targets = torch.randint(0, tree.num_classes, (2, 7))
    targets[0, 3] = -100
    upstream = torch.linspace(0.5, 1.5, 14).reshape(2, 7) if reduction == "none" else torch.tensor(0.7)

    h = hidden.clone().requires_grad_()
    loss = head(h, targets)
    (loss * upstream).sum().backward()

    h64 = hidden.double().reshape(-1, D).requires_grad_()
    w64 = head.weight.detach().double().requires_grad_()
    b64 = head.bias.detach().double().requires_grad_()
    ref_loss = ref.loss(h64, targets.reshape(-1), w64, b64, sigmoid, reduction, -100)
    if reduction == "none":
        ref_loss = ref_loss.reshape(2, 7)
    (ref_loss * upstream.double()).sum().backward()

    torch.testing.assert_close(loss.double(), ref_loss.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad.double(), h64.grad.reshape(2, 7, D), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(head.weight.grad.double(), w64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(head.bias.grad.double(), b64.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(TREES))
def test_layout_matches_documentation(name):
    tree, sigmoid = TREES[name]
    head = HierarchicalSoftmaxLoss(tree.num_classes, D, tree=tree, node="sigmoid" if sigmoid else "softmax")
    arrays = head.tree_arrays()
    ref = ReferenceTree(tree)
    assert arrays["num_rows"] == ref.num_rows
    offsets, rows = arrays["path_offset"].tolist(), arrays["path_row"].tolist()
    for c in range(tree.num_classes):
        expected = [begin + child for begin, _, child, _ in ref.paths[c]]
        assert rows[offsets[c]:offsets[c + 1]] == expected, f"class {c}"


@pytest.mark.parametrize("name", sorted(TREES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_distribution_sums_to_one_and_predict(name, dtype):
    tree, sigmoid = TREES[name]
    n = tree.num_classes
    head = HierarchicalSoftmaxLoss(n, D, tree=tree, node="sigmoid" if sigmoid else "softmax", bias=True,
                                   dtype=dtype, init_scale=0.8)
    with torch.no_grad():
        head.bias.normal_()
    hidden = torch.randn(5, D)
    all_lp = head.log_prob(hidden[:, None, :].expand(5, n, D), torch.arange(n).expand(5, n)).detach()
    torch.testing.assert_close(all_lp.exp().sum(1), torch.ones(5), rtol=1e-5, atol=1e-5)
    k = min(4, n)
    values, classes = head.predict(hidden, k=k)
    ref_v, _ = all_lp.topk(k, dim=1)
    torch.testing.assert_close(values, ref_v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(all_lp.gather(1, classes), values, rtol=1e-5, atol=1e-5)
    beam_v, _ = head.predict(hidden, k=k, beam_width=n)  # a beam as wide as the tree is exact
    torch.testing.assert_close(beam_v, values, rtol=1e-5, atol=1e-5)


def test_predict_returns_expansions():
    tree = Tree.uniform(50, 2, 8)  # the root's block: 7 internal nodes of up to 8 classes each
    head = HierarchicalSoftmaxLoss(50, D, tree=tree, bias=True, init_scale=0.8)
    hidden = torch.randn(6, D)
    values, classes, expansions = head.predict(hidden, k=1, beam_width=1, return_expansions=True)
    assert expansions.dtype == torch.int64 and expansions.shape == (6,)
    assert expansions.device == hidden.device
    assert expansions.tolist() == [2] * 6  # greedy descent: the root, then one node
    _, _, every = head.predict(hidden, k=50, return_expansions=True)
    assert every.tolist() == [1 + 7] * 6  # every class: each internal node once
    v2, c2 = head.predict(hidden, k=1, beam_width=1)  # without the flag: the 2-tuple, same values
    torch.testing.assert_close(v2, values)
    assert torch.equal(c2, classes)
    _, _, lead = head.predict(hidden.reshape(2, 3, D), k=2, return_expansions=True)
    assert lead.shape == (2, 3)
    _, _, none = head.predict(hidden[:0], k=2, return_expansions=True)
    assert none.shape == (0,)


def test_sparse_grad_equals_dense():
    tree = Tree.uniform(50, 2, 8)
    dense = HierarchicalSoftmaxLoss(50, D, tree=tree, bias=True)
    sparse = HierarchicalSoftmaxLoss(50, D, tree=tree, bias=True, sparse_grad=True)
    sparse.load_state_dict(dense.state_dict())
    hidden = torch.randn(6, D)
    targets = torch.tensor([0, 1, 2, 3, 40, 41])
    for reduction in ["mean", "none"]:
        dense.reduction = sparse.reduction = reduction
        dense.zero_grad()
        sparse.zero_grad()
        dense(hidden, targets).sum().backward()
        sparse(hidden, targets).sum().backward()
        g = sparse.weight.grad.coalesce()
        # only the rows on the batch's paths: the root block (7 rows) and the blocks of nodes 0 and 5
        assert g.indices().numel() == 7 + 8 + 8
        torch.testing.assert_close(g.to_dense(), dense.weight.grad)
        torch.testing.assert_close(sparse.bias.grad.to_dense(), dense.bias.grad)


def test_default_tree_and_huffman_depths():
    head = HierarchicalSoftmaxLoss(1000, 4)
    assert head.tree_arrays()["height"] == 2
    counts = torch.tensor([1000.0] + [1.0] * 63)
    arrays = HierarchicalSoftmaxLoss(64, 4, tree=Tree.huffman(counts)).tree_arrays()
    depth = arrays["path_offset"].diff()
    assert depth[0] == 1 and depth[1:].min() >= depth[0]  # the frequent class gets the short path


def test_uniform_tree_large_is_fast():
    tree = Tree.uniform(1_000_000, 2, 1000)
    head = HierarchicalSoftmaxLoss(1_000_000, 4, tree=tree)
    assert head.weight.shape == (1_001_000, 4)


@pytest.mark.parametrize("beam_width", [0, 4])
def test_evaluate_is_forward_and_predict(beam_width):
    head = HierarchicalSoftmaxLoss(40, 8, tree=Tree.uniform(40, 2, 7))
    hidden = torch.randn(6, 8)
    targets = torch.randint(0, 40, (6,))
    targets[4] = -100
    loss, values, classes = head.evaluate(hidden, targets, k=3, beam_width=beam_width)
    with torch.no_grad():
        assert torch.equal(loss, head(hidden, targets))
    ref_values, ref_classes = head.predict(hidden, 3, beam_width=beam_width)
    kept = targets != -100
    assert torch.equal(classes[kept], ref_classes[kept]) and (classes[4] == -1).all()
    assert torch.equal(values[kept], ref_values[kept]) and torch.isneginf(values[4]).all()

