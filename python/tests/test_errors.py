# SPDX-License-Identifier: Apache-2.0
"""Bad input raises a Python exception naming the argument (never a crash)."""
import copy
import pickle

import pytest
import torch
from conftest import requires_cuda

from xsoftmax import FullSoftmaxLoss, HierarchicalSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss, Tree, _ops

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

N, D = 12, 5
ERRORS = (RuntimeError, ValueError, IndexError)


def heads():
    return {
        "full": FullSoftmaxLoss(N, D),
        "hs": HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 4)),
        "sampled": SampledSoftmaxLoss(N, D, num_sampled=3),
        "knn": KNNSoftmaxLoss(N, D, k=3),
    }


@pytest.mark.parametrize("name", ["full", "hs", "sampled", "knn"])
@pytest.mark.parametrize("grad", [True, False])
def test_bad_inputs(name, grad):
    head = heads()[name]
    h = torch.randn(4, D)
    t = torch.tensor([0, 1, 2, 3])
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        # target out of range: the library's message names the argument, index and value
        with pytest.raises(ERRORS, match=r"targets\[2\] = 12 is out of range \[0, 12\)"):
            head(h, torch.tensor([0, 1, 12, 3]))
        with pytest.raises(ERRORS, match=r"targets\[0\] = -5 is out of range"):
            head(h, torch.tensor([-5, 1, 2, 3]))
        # NaN / inf hidden
        bad = h.clone()
        bad[1, 3] = float("nan")
        with pytest.raises(ValueError, match=r"hidden\[1\]\[3\] = -?nan is not finite"):
            head(bad, t)
        bad[1, 3] = float("inf")
        with pytest.raises(ValueError, match=r"hidden\[1\]\[3\] = inf is not finite"):
            head(bad, t)
        # shapes and dtypes
        with pytest.raises(ValueError, match="hidden has shape .*dim = 5"):
            head(torch.randn(4, D + 1), t)
        with pytest.raises(ValueError, match="targets has shape"):
            head(h, t[:3])
        with pytest.raises(ValueError, match="targets.dtype"):
            head(h, t.int())
        with pytest.raises(ValueError, match="targets.dtype"):
            head(h, t.float())


def test_nothing_changes_after_an_error():
    head = FullSoftmaxLoss(N, D, bias=True)
    before = [p.detach().clone() for p in head.parameters()]
    with pytest.raises(IndexError):
        head(torch.randn(3, D, requires_grad=True), torch.tensor([0, 99, 1]))
    assert head.weight.grad is None
    for a, b in zip(before, head.parameters()):
        assert torch.equal(a, b)
    assert torch.isfinite(head(torch.randn(3, D), torch.tensor([0, 1, 2])))


def test_operator_level_checks():
    w = torch.randn(N, D)
    h = torch.randn(3, D)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"weight.dtype = Double"):
        _ops.loss(h, w.double(), None, t, 1, -100)
    with pytest.raises(ValueError, match=r"weight must have unit column stride"):
        _ops.loss(h, torch.randn(D, N).t(), None, t, 1, -100)
    with pytest.raises(ValueError, match=r"bias has shape"):
        _ops.loss(h, w, torch.zeros(N + 1), t, 1, -100)
    with pytest.raises(ValueError, match=r"reduction = 7"):
        _ops.loss(h, w, None, t, 7, -100)
    with pytest.raises(ValueError, match=r"head = 987654 is not a live"):
        _ops.loss(h, w, None, t, 1, -100, head=987654)
    with pytest.raises(ValueError, match=r"k = 13 must be in \[1, num_classes = 12\]"):
        _ops.topk(h, w, None, 13)
    with pytest.raises(ValueError, match=r"hidden has 4 columns but the head's dim is 5"):
        _ops.loss(torch.randn(3, D - 1), w, None, t, 1, -100)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="reduction"):
        FullSoftmaxLoss(N, D, reduction="avg")
    with pytest.raises(ValueError, match="dtype"):
        FullSoftmaxLoss(N, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="num_classes = 0"):
        FullSoftmaxLoss(0, D)
    with pytest.raises(ValueError, match="num_sampled = 13"):
        SampledSoftmaxLoss(N, D, num_sampled=13)
    with pytest.raises(ValueError, match="sampler = 'zipf'"):
        SampledSoftmaxLoss(N, D, sampler="zipf")
    with pytest.raises(ValueError, match=r"counts\[1\] = -1"):
        SampledSoftmaxLoss(3, D, num_sampled=1, sampler="counts", counts=[1.0, -1.0, 2.0])
    with pytest.raises(ValueError, match="k = 13"):
        KNNSoftmaxLoss(N, D, k=13)
    with pytest.raises(ValueError, match="metric"):
        KNNSoftmaxLoss(N, D, k=3, metric="l2")
    with pytest.raises(ValueError, match="num_classes = 20 exceeds branching"):
        Tree.uniform(20, 2, 4)
    with pytest.raises(ValueError, match="arity"):
        Tree.huffman([1.0, 2.0], arity=1)
    with pytest.raises(ValueError, match=r"counts\[1\]"):
        Tree.huffman([1.0, float("nan")])
    with pytest.raises(ValueError, match="sigmoid"):
        HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 4), node="sigmoid")
    with pytest.raises(ValueError, match="tree has 12 classes"):
        HierarchicalSoftmaxLoss(13, D, tree=Tree.uniform(N, 2, 4))


@pytest.mark.parametrize("parent, n, what", [
    ([3, 3, 4, 4, 3], 3, "root"),            # no root
    ([2, 2, -1, -1], 2, "root"),              # two roots
    ([4, 2, 3, 2, -1], 2, "cycle|orphan|reach"),  # 2 -> 3 -> 2
    ([2, 7, -1], 2, "parent"),                # parent out of range
    ([2, 1, -1], 2, "."),                     # class 1 is its own parent
])
def test_malformed_trees(parent, n, what):
    with pytest.raises(ValueError, match=what):
        HierarchicalSoftmaxLoss(n, D, tree=Tree.from_parents(parent, n))


def test_tensors_on_another_device_are_rejected(device):
    # A meta tensor beside the weights once gave uninitialised memory.
    head = FullSoftmaxLoss(1000, 16, reduction="none")
    with pytest.raises(ValueError, match=f"targets is on device meta but the head's weight is on {device.type}"):
        head(torch.randn(64, 16), torch.randint(0, 1000, (64,), device="meta"))
    with pytest.raises(ValueError, match="hidden is on device meta"):
        head(torch.randn(64, 16, device="meta"), torch.randint(0, 1000, (64,)))
    with pytest.raises(ValueError, match="hidden is on device meta"):
        head.predict(torch.randn(4, 16, device="meta"), k=2)


@requires_cuda
def test_cpu_tensors_beside_cuda_weights_are_rejected():
    head = FullSoftmaxLoss(1000, 16, device="cuda")
    with pytest.raises(ValueError, match="targets is on device cpu but the head's weight is on cuda"):
        head(torch.randn(64, 16, device="cuda"), torch.randint(0, 1000, (64,)))
    with pytest.raises(ValueError, match="hidden is on device cpu"):
        head(torch.randn(64, 16), torch.randint(0, 1000, (64,), device="cuda"))
    # The operator itself checks too (a caller of torch.ops.xsoftmax, or a CPU bias beside CUDA weights).
    with pytest.raises(ValueError, match="targets is on cpu but weight is on cuda"):
        torch.ops.xsoftmax.loss(torch.randn(4, 16, device="cuda"), head.weight, None, torch.zeros(4, dtype=torch.long),
                                1, -100, 0, None, False)
    with pytest.raises(ValueError, match="bias is on cpu but weight is on cuda"):
        torch.ops.xsoftmax.loss(torch.randn(4, 16, device="cuda"), head.weight, torch.zeros(1000),
                                torch.zeros(4, dtype=torch.long, device="cuda"), 1, -100, 0, None, False)


def test_cuda_without_cuda_operators_is_a_clear_error():
    if _ops.has_cuda():
        pytest.skip("this build has its CUDA operators")
    with pytest.raises(ValueError, match="has no CUDA operators"):
        FullSoftmaxLoss(10, 4, device="cuda")


def test_non_tensor_inputs_and_late_reduction():
    head = FullSoftmaxLoss(N, D)
    with pytest.raises(TypeError, match="hidden must be a torch.Tensor, got list"):
        head([[0.0] * D], torch.tensor([0]))
    with pytest.raises(TypeError, match="targets must be a torch.Tensor, got list"):
        head(torch.randn(1, D), [0])
    with pytest.raises(ValueError, match="reduction = 'avg'"):
        head.reduction = "avg"
    assert head.reduction == "mean"  # unchanged by the refused assignment
    h = torch.randn(3, D)
    t = torch.tensor([0, 1, 2])
    head.reduction = "none"
    per_sample = head(h, t)
    head.reduction = "sum"
    assert torch.allclose(head(h, t), per_sample.sum())


@pytest.mark.parametrize("name", ["full", "hs", "sampled", "knn"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_double_backward_is_refused(name, reduction):
    # The fused operator (mean) and the loss operator's backward (none) both refuse create_graph.
    head = heads()[name]
    head.reduction = reduction
    h = torch.randn(4, D, requires_grad=True)
    t = torch.tensor([0, 1, 2, 3])
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(head(h, t).sum(), h, create_graph=True)
    (g,) = torch.autograd.grad(head(h, t).sum(), h)  # without create_graph the same call works
    assert g.shape == h.shape and not g.requires_grad


@pytest.mark.parametrize("name", ["full", "hs", "sampled", "knn"])
def test_log_prob_of_a_bad_target_names_no_ignore_index(name):
    head = heads()[name]
    with pytest.raises(IndexError, match=r"targets\[0\] = -5 is out of range \[0, 12\)") as info:
        head.log_prob(torch.randn(2, D), torch.tensor([-5, 1]))
    assert "ignore_index" not in str(info.value)


@pytest.mark.parametrize("transform", ["grad", "vmap", "jacrev"])
def test_torch_func_transforms_are_refused_clearly(transform):
    head = FullSoftmaxLoss(N, D, reduction="none")
    h = torch.randn(3, D)
    t = torch.tensor([0, 1, 2])
    fn = {"grad": lambda: torch.func.grad(lambda x: head(x, t).sum())(h),
          "vmap": lambda: torch.func.vmap(lambda x: head(x[None], t[:1]))(h),
          "jacrev": lambda: torch.func.jacrev(lambda x: head(x, t))(h)}[transform]
    with pytest.raises(RuntimeError, match="torch.func transforms .* are not supported"):
        fn()


def test_non_cpu_device_is_rejected():
    with pytest.raises(ValueError, match="CPU"):
        FullSoftmaxLoss(N, D, device="meta")


def test_copies_and_pickling_keep_working():
    for head in heads().values():
        clone = copy.deepcopy(head)
        restored = pickle.loads(pickle.dumps(head))
        h = torch.randn(3, D)
        t = torch.tensor([0, 5, 11])
        head.eval(), clone.eval(), restored.eval()
        torch.testing.assert_close(clone(h, t), head(h, t))
        torch.testing.assert_close(restored(h, t), head(h, t))
        assert clone._handle.value != head._handle.value if hasattr(head, "_handle") else True
        del head


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_nan_weight_gives_a_nan_loss_as_cross_entropy_does(reduction):
    # F.cross_entropy's loss is NaN on every row once a weight is NaN (each row scores the NaN
    # class); the host exponential once turned NaN into +inf, and the loss into inf.
    head = FullSoftmaxLoss(N, D, reduction=reduction)
    with torch.no_grad():
        head.weight[5, 3] = float("nan")
    h = torch.randn(4, D)
    t = torch.tensor([0, 5, 7, 9])
    ours = head(h, t)
    reference = torch.nn.functional.cross_entropy(h @ head.weight.t(), t, reduction=reduction)
    assert torch.isnan(reference).all()
    assert torch.isnan(ours).all()
