# SPDX-License-Identifier: Apache-2.0
"""torch.compile(fullgraph=True) of a model using each head: no graph break, same values as eager."""
import copy

import pytest
import torch

from xsoftmax import FullSoftmaxLoss, HierarchicalSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss, Tree

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

N, D = 40, 8


class Model(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.encoder = torch.nn.Linear(D, D)
        self.head = head

    def forward(self, x, targets):
        return self.head(torch.tanh(self.encoder(x)), targets)


HEADS = {
    "full": lambda **kw: FullSoftmaxLoss(N, D, bias=True, **kw),
    "full_bf16": lambda **kw: FullSoftmaxLoss(N, D, dtype=torch.bfloat16, **kw),
    "hs_uniform": lambda **kw: HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 7), bias=True, **kw),
    "hs_sigmoid": lambda **kw: HierarchicalSoftmaxLoss(N, D, tree=Tree.huffman(torch.arange(1.0, N + 1)),
                                                       node="sigmoid", **kw),
    "sampled": lambda **kw: SampledSoftmaxLoss(N, D, num_sampled=10, **kw),
    "knn": lambda **kw: KNNSoftmaxLoss(N, D, k=6, rebuild_every=2, **kw),
}


def step(model, x, t):
    model.zero_grad(set_to_none=True)
    loss = model(x, t)
    loss.sum().backward()
    return loss.detach(), [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_matches_eager(name, reduction):
    torch._dynamo.reset()
    eager = Model(HEADS[name](reduction=reduction))
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, dynamic=False)
    x = torch.randn(3, 5, D)
    t = torch.randint(0, N, (3, 5))
    t[0, 0] = -100
    for _ in range(3):  # the sampled / KNN heads advance their step buffer each call
        loss_e, grads_e = step(eager, x, t)
        loss_c, grads_c = step(compiled, x, t)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads_c, grads_e):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if hasattr(eager.head, "step"):
        assert compiled_model.head.step.item() == eager.head.step.item() == 3


def test_compiled_inference_and_predict():
    torch._dynamo.reset()
    head = HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 7))

    def infer(h, t):
        return head.log_prob(h, t), head.predict(h, k=3)

    compiled = torch.compile(infer, fullgraph=True)
    h = torch.randn(4, D)
    t = torch.randint(0, N, (4,))
    with torch.no_grad():
        (lp_e, (v_e, i_e)), (lp_c, (v_c, i_c)) = infer(h, t), compiled(h, t)
    torch.testing.assert_close(lp_c, lp_e)
    torch.testing.assert_close(v_c, v_e)
    assert torch.equal(i_c, i_e)


@pytest.mark.parametrize("cls", [FullSoftmaxLoss, SampledSoftmaxLoss])
def test_compiled_evaluate(cls):
    torch._dynamo.reset()
    head = cls(N, D) if cls is FullSoftmaxLoss else cls(N, D, num_sampled=5)
    compiled = torch.compile(lambda h, t: head.evaluate(h, t, k=3), fullgraph=True)
    h = torch.randn(6, D)
    t = torch.randint(0, N, (6,))
    t[2] = -100  # an ignored row: -1 / -inf
    (loss_e, v_e, i_e), (loss_c, v_c, i_c) = head.evaluate(h, t, k=3), compiled(h, t)
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(v_c, v_e)
    assert torch.equal(i_c, i_e) and (i_c[2] == -1).all()


def test_compiled_sparse_grad():
    torch._dynamo.reset()
    eager = HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 7), sparse_grad=True)
    compiled_head = copy.deepcopy(eager)
    compiled = torch.compile(compiled_head, fullgraph=True)
    x = torch.randn(6, D)
    t = torch.randint(0, N, (6,))
    eager(x, t).backward()
    compiled(x, t).backward()
    assert compiled_head.weight.grad.is_sparse
    torch.testing.assert_close(compiled_head.weight.grad.to_dense(), eager.weight.grad.to_dense())
