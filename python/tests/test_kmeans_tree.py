# SPDX-License-Identifier: Apache-2.0
"""Tree.kmeans and HierarchicalSoftmaxLoss.init_weights_from_class_vectors / from_class_vectors:
the label tree of class vectors and the node weights from them.

Checked: well-separated clusters of classes are recovered (each cluster's classes share one
internal node; a tree over the same classes in shuffled id order does not), the depth and
branching options shape the tree, the same seed gives the same tree; the node weights equal a
float64 reference computed from the tree's layout arrays (softmax nodes: each row the mean of the
class vectors beneath its child; sigmoid nodes: first child's mean minus the second's), biases
likewise, in the head's dtype and device; a head built from trained class vectors starts with a
much lower loss than a randomly initialised one on the same tree; bad arguments raise errors
naming them.
"""
import pytest
import torch

from xsoftmax import HierarchicalSoftmaxLoss, Tree

pytestmark = pytest.mark.usefixtures("device")


def clustered(clusters=6, per=10, dim=12, spread=0.05, seed=0):
    """(vectors, cluster of each class): classes in shuffled order around well-separated centres."""
    g = torch.Generator().manual_seed(seed)
    cpu = dict(generator=g, device="cpu")
    centres = torch.randn(clusters, dim, dtype=torch.float64, **cpu)
    labels = torch.arange(clusters, device="cpu").repeat_interleave(per)
    labels = labels[torch.randperm(labels.numel(), **cpu)]
    vectors = centres[labels] + spread * torch.randn(labels.numel(), dim, dtype=torch.float64, **cpu)
    return vectors.float().to(torch.get_default_device()), labels


def internal_parent_of_classes(tree):
    """The internal node each class hangs from (parent array, leaf_class given)."""
    parent = tree.parent.tolist()
    out = [None] * tree.num_classes
    for node, c in enumerate(tree.leaf_class.tolist()):
        if c >= 0:
            out[c] = parent[node]
    return out


def subtree_classes(arrays):
    """For each weight row: the classes whose path goes through it."""
    offsets, rows = arrays["path_offset"].tolist(), arrays["path_row"].tolist()
    under = [[] for _ in range(arrays["num_rows"])]
    for c in range(arrays["num_classes"]):
        for r in rows[offsets[c]:offsets[c + 1]]:
            under[r].append(c)
    return under


def test_clusters_share_a_node():
    vectors, labels = clustered()
    tree = Tree.kmeans(vectors, branching=6, depth=2)
    parents = internal_parent_of_classes(tree)
    for k in range(6):
        members = {parents[c] for c in range(labels.numel()) if labels[c] == k}
        assert len(members) == 1, f"cluster {k} split over nodes {members}"
    assert len(set(parents)) == 6
    # the uniform tree over the same (shuffled) ids mixes the clusters
    uniform = Tree.uniform(labels.numel(), 2, 10)
    up = uniform.parent[:labels.numel()].tolist()
    mixed = sum(len({up[c] for c in range(labels.numel()) if labels[c] == k}) for k in range(6))
    assert mixed > 12


def test_options_shape_the_tree():
    vectors, _ = clustered(clusters=4, per=25)
    head = HierarchicalSoftmaxLoss(100, 12, tree=Tree.kmeans(vectors, branching=3))  # no depth limit
    assert head.tree_arrays()["height"] == 5  # ceil(log_3 100)
    assert HierarchicalSoftmaxLoss(100, 12, tree=Tree.kmeans(vectors)).tree_arrays()["height"] == 2  # sqrt tree
    assert HierarchicalSoftmaxLoss(100, 12, tree=Tree.kmeans(vectors, branching=2, depth=3)).tree_arrays()[
        "height"] == 3
    a, b = Tree.kmeans(vectors, branching=3, seed=5), Tree.kmeans(vectors, branching=3, seed=5)
    assert torch.equal(a.parent, b.parent) and torch.equal(a.leaf_class, b.leaf_class)
    assert "kmeans(branching=3" in repr(a)


@pytest.mark.parametrize("node,branching", [("softmax", 4), ("softmax", 2), ("sigmoid", 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_equal_the_float64_reference(node, branching, dtype):
    vectors, _ = clustered(clusters=3, per=7, dim=5)
    class_bias = torch.linspace(-1, 1, vectors.shape[0])
    head = HierarchicalSoftmaxLoss(21, 5, tree=Tree.kmeans(vectors, branching=branching, depth=0), node=node,
                                   bias=True, dtype=dtype)
    assert head.init_weights_from_class_vectors(vectors, class_bias) is head
    arrays = head.tree_arrays()
    under = subtree_classes(arrays)
    v64, b64 = vectors.double(), class_bias.double()
    if node == "softmax":
        want = torch.stack([v64[u].mean(0) for u in under])
        want_bias = torch.stack([b64[u].mean() for u in under])
    else:  # row k: internal node k, whose block is rows 2k (first child) and 2k + 1
        k = arrays["num_internal_nodes"]
        want = torch.stack([v64[under[2 * i]].mean(0) - v64[under[2 * i + 1]].mean(0) for i in range(k)])
        want_bias = torch.stack([b64[under[2 * i]].mean() - b64[under[2 * i + 1]].mean() for i in range(k)])
    assert head.weight.dtype == dtype
    tol = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(head.weight.double().cpu(), want, **tol)
    torch.testing.assert_close(head.bias.double().cpu(), want_bias, **tol)


def test_from_class_vectors_starts_where_the_classes_are():
    vectors, labels = clustered(clusters=8, per=16, dim=16, spread=0.3)
    vectors = 5 * torch.nn.functional.normalize(vectors, dim=1)  # a trained classifier's rows, say
    n = labels.numel()
    targets = torch.arange(n).repeat(4)
    hidden = vectors[targets] + 0.05 * torch.randn(targets.numel(), 16)  # features near their class
    warm = HierarchicalSoftmaxLoss.from_class_vectors(vectors, branching=8, depth=2)
    cold = HierarchicalSoftmaxLoss(n, 16, tree=warm.tree)
    # the same initialisation over a tree that ignores the vectors (ids in order, clusters mixed)
    uniform = HierarchicalSoftmaxLoss(n, 16, tree=Tree.uniform(n, 2, 12)).init_weights_from_class_vectors(vectors)
    with torch.no_grad():  # measured: 1.24 against 5.35 (cold) and 4.26 (uniform tree)
        assert warm(hidden, targets) < 0.5 * cold(hidden, targets)
        assert warm(hidden, targets) < 0.5 * uniform(hidden, targets)
    assert warm.weight.device == hidden.device
    sig = HierarchicalSoftmaxLoss.from_class_vectors(vectors.double(), branching=2, node="sigmoid")
    assert sig.weight.dtype == torch.float32 and sig.tree_arrays()["is_binary"]
    loss = sig(hidden, targets)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(sig.weight.grad).all()


def test_bad_arguments_name_what_is_wrong():
    vectors, _ = clustered()
    with pytest.raises(ValueError, match="2-D"):
        Tree.kmeans(vectors[0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        Tree.kmeans(vectors.tolist())
    with pytest.raises(ValueError, match="branching"):
        Tree.kmeans(vectors, branching=1)
    with pytest.raises(ValueError, match="depth"):
        Tree.kmeans(vectors, branching=3, depth=-1)
    bad = vectors.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match="nan|NaN"):
        Tree.kmeans(bad)
    head = HierarchicalSoftmaxLoss(60, 12, tree=Tree.kmeans(vectors))
    with pytest.raises(ValueError, match=r"expected \(num_classes, dim\) = \(60, 12\)"):
        head.init_weights_from_class_vectors(vectors[:, :5])
    with pytest.raises(ValueError, match="class_bias is given but the head has no bias"):
        head.init_weights_from_class_vectors(vectors, torch.zeros(60))
    biased = HierarchicalSoftmaxLoss(60, 12, tree=head.tree, bias=True)
    with torch.no_grad():
        biased.bias.fill_(3.0)
    biased.init_weights_from_class_vectors(vectors)  # no class_bias: the node biases are zeroed
    assert torch.count_nonzero(biased.bias) == 0
    with pytest.raises(ValueError, match="class_bias has 59 values"):
        biased.init_weights_from_class_vectors(vectors, torch.zeros(59))
    with pytest.raises(ValueError, match="binary"):
        HierarchicalSoftmaxLoss.from_class_vectors(vectors, branching=3, node="sigmoid")
    before = head.weight.detach().clone()
    with pytest.raises(ValueError):
        head.init_weights_from_class_vectors(bad)
    assert torch.equal(head.weight.detach(), before)  # nothing written on an error
