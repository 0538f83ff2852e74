# SPDX-License-Identifier: Apache-2.0
"""torch.library.opcheck of the operators: schema (no hidden mutation or aliasing), autograd
registration, fake kernels against the real ones, AOT dispatch with dynamic shapes."""
import functools

import pytest
import torch

from xsoftmax import HierarchicalSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss, Tree

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

N, D, B = 20, 6, 5
ops = torch.ops.xsoftmax


HEAD_NAMES = ("full", "hs", "hs_sigmoid", "sampled", "knn")
CASE_IDS = [f"{name}-r{reduction}-{'sparse' if sparse else 'dense'}"
            for name in HEAD_NAMES for reduction in (0, 1, 2) for sparse in (False, True)]


@functools.lru_cache(maxsize=None)
def cases(device):
    """The operators' arguments for every head, reduction and gradient form, on `device` (made once
    per device; the modules own the handles and are kept alive with them)."""
    torch.manual_seed(0)
    w = torch.randn(N, D, requires_grad=True)
    b = torch.randn(N, requires_grad=True)
    h = torch.randn(B, D, requires_grad=True)
    t = torch.randint(0, N, (B,))
    t[2] = -100
    hs = HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 5), bias=True)
    sig = HierarchicalSoftmaxLoss(N, D, tree=Tree.huffman(torch.arange(1.0, N + 1)), node="sigmoid")
    sampled = SampledSoftmaxLoss(N, D, num_sampled=5)
    knn = KNNSoftmaxLoss(N, D, k=4)
    step = torch.tensor(3)
    heads = {
        "full": (w, b, 0, None),
        "hs": (hs.weight, hs.bias, hs._handle.value, None),
        "hs_sigmoid": (sig.weight, None, sig._handle.value, None),
        "sampled": (sampled.weight, None, sampled._handle.value, step),
        "knn": (knn.weight, None, knn._handle.value, step),
    }
    out = []
    for name, (weight, bias, head, st) in heads.items():
        for reduction in (0, 1, 2):
            for sparse in (False, True):
                out.append((f"{name}-r{reduction}-{'sparse' if sparse else 'dense'}",
                            (h, weight, bias, t, reduction, -100, head, st, sparse), (name, head, weight, bias)))
    return dict((c[0], c) for c in out), heads, [hs, sig, sampled, knn]


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_loss_ops(case_id, device):
    _, args, _ = cases(str(device))[0][case_id]
    torch.library.opcheck(ops.loss, args)
    if args[4] != 0:
        torch.library.opcheck(ops.loss_fused, args)
    grad_output = torch.rand(B) if args[4] == 0 else torch.tensor(0.7)
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(ops.backward, detached + (grad_output,))


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", ["full", "hs"])
def test_loss_ops_with_bf16_weights(name, sparse, device):
    # A dense weight gradient comes back in the weight's dtype (the full softmax writes it there
    # directly), a sparse one in float32: the fake kernels must say the same.
    torch.manual_seed(1)
    rows, head = N, 0
    if name == "hs":
        hs = HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 5), bias=True)
        rows, head = hs.weight.shape[0], hs._handle.value  # (the tree's node rows)
    w = torch.randn(rows, D, dtype=torch.bfloat16, device=device)
    b = torch.randn(rows, dtype=torch.bfloat16, device=device)
    h = torch.randn(B, D, device=device)
    t = torch.randint(0, N, (B,), device=device)
    t[1] = -100
    args = (h, w, b, t, 1, -100, head, None, sparse)
    torch.library.opcheck(ops.loss_fused, args)
    torch.library.opcheck(ops.backward, args + (torch.tensor(0.7, device=device),))
    _, _, rows, values, bias_grad = ops.loss_fused(*args)
    assert values.dtype == (torch.float32 if sparse else torch.bfloat16)
    assert bias_grad.dtype == torch.float32


@pytest.mark.parametrize("name", ["full", "hs", "hs_sigmoid"])
def test_topk_op(name, device):
    weight, bias, head, _ = cases(str(device))[1][name]
    h = torch.randn(B, D)
    torch.library.opcheck(ops.topk, (h, weight.detach(), None if bias is None else bias.detach(), 3, head, 0))


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("class_weight", [False, True])
def test_loss_topk_op(reduction, class_weight, device):
    by_id, heads, _ = cases(str(device))
    h, _, _, t = by_id["full-r1-dense"][1][:4]
    weight, bias, _, _ = heads["full"]
    cw = torch.rand(N) + 0.1 if class_weight else None
    torch.library.opcheck(ops.loss_topk, (h.detach(), weight.detach(), bias.detach(), t, reduction, -100, 0, 3, cw))
    # A hierarchical head has no one-pass loss and top-k: a clear error, not a wrong answer.
    hs_weight, hs_bias, hs_head, _ = heads["hs"]
    with pytest.raises(ValueError, match="is a hierarchical head"):
        ops.loss_topk(h.detach(), hs_weight.detach(), hs_bias.detach(), t, reduction, -100, hs_head, 3)


@pytest.mark.parametrize("name", ["full", "hs", "sampled"])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_loss_ops_with_class_weight(name, reduction, device):
    by_id, heads, _ = cases(str(device))
    h, _, _, t = by_id["full-r1-dense"][1][:4]
    weight, bias, head, st = heads[name]
    cw = torch.rand(N) + 0.1
    cw[1] = 0.0
    args = (h, weight, bias, t, reduction, -100, head, st, False, cw)
    torch.library.opcheck(ops.loss, args)
    if reduction != 0:
        torch.library.opcheck(ops.loss_fused, args)
    grad_output = torch.rand(B) if reduction == 0 else torch.tensor(0.7)
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args[:9])
    torch.library.opcheck(ops.backward, detached + (grad_output, cw))
