# SPDX-License-Identifier: Apache-2.0
"""SampledSoftmaxLoss and KNNSoftmaxLoss: with every class active they equal the full softmax;
otherwise their gradients match finite differences of their own loss (the draw fixed)."""
import pytest
import torch
import torch.nn.functional as F

from xsoftmax import FullSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss, _ops

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

N, D = 23, 6


def grads(head, hidden, targets, upstream):
    h = hidden.clone().requires_grad_()
    head.zero_grad(set_to_none=True)
    loss = head(h, targets)
    (loss * upstream).sum().backward()
    return [loss.detach(), h.grad] + [p.grad for p in head.parameters()]


def copy_params(dst, src):
    with torch.no_grad():
        for a, b in zip(dst.parameters(), src.parameters()):
            a.copy_(b)


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform", "counts"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_sampled_with_every_class_equals_full(sampler, reduction):
    counts = torch.randint(1, 100, (N,)) if sampler == "counts" else None
    head = SampledSoftmaxLoss(N, D, num_sampled=N, sampler=sampler, counts=counts, power=0.75, unique=True,
                              bias=True, reduction=reduction)
    full = FullSoftmaxLoss(N, D, bias=True, reduction=reduction)
    with torch.no_grad():
        head.bias.normal_()
    copy_params(full, head)
    hidden = torch.randn(3, 4, D)
    targets = torch.randint(0, N, (3, 4))
    targets[1, 1] = -100
    upstream = torch.rand(3, 4) if reduction == "none" else torch.tensor(1.7)
    for _ in range(2):  # two steps (two draws)
        for a, b in zip(grads(head, hidden, targets, upstream), grads(full, hidden, targets, upstream)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert head.step.item() == 2


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_knn_with_k_equal_n_equals_full(reduction):
    head = KNNSoftmaxLoss(N, D, k=N, bias=True, reduction=reduction, rebuild_every=1)
    full = FullSoftmaxLoss(N, D, bias=True, reduction=reduction)
    with torch.no_grad():
        head.bias.normal_()
    copy_params(full, head)
    hidden = torch.randn(10, D)
    targets = torch.randint(0, N, (10,))
    upstream = torch.rand(10) if reduction == "none" else torch.tensor(0.3)
    for _ in range(3):
        for a, b in zip(grads(head, hidden, targets, upstream), grads(full, hidden, targets, upstream)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_eval_mode_is_exact_and_log_prob_predict_are_full():
    head = SampledSoftmaxLoss(N, D, num_sampled=4)
    full = FullSoftmaxLoss(N, D)
    copy_params(full, head)
    hidden = torch.randn(7, D)
    targets = torch.randint(0, N, (7,))
    head.eval()
    torch.testing.assert_close(head(hidden, targets), full(hidden, targets))
    assert head.step.item() == 0
    torch.testing.assert_close(head.log_prob(hidden, targets), full.log_prob(hidden, targets))
    assert torch.equal(head.predict(hidden, 3)[1], full.predict(hidden, 3)[1])
    head.train()
    sampled = head(hidden, targets)
    assert head.step.item() == 1
    assert sampled.item() != pytest.approx(full(hidden, targets).item())


@pytest.mark.parametrize("cls", [SampledSoftmaxLoss, KNNSoftmaxLoss])
def test_evaluate_is_the_exact_eval_loss_and_predict(cls):
    options = {"num_sampled": 4} if cls is SampledSoftmaxLoss else {"k": 5}
    head = cls(N, D, label_smoothing=0.1, **options)
    hidden = torch.randn(7, D)
    targets = torch.randint(0, N, (7,))
    targets[3] = -100
    loss, values, classes = head.evaluate(hidden, targets, k=3)  # in training mode too: exact
    assert head.step.item() == 0
    head.eval()
    with torch.no_grad():
        assert torch.equal(loss, head(hidden, targets))
    ref_values, ref_classes = head.predict(hidden, 3)
    kept = targets != -100
    assert torch.equal(classes[kept], ref_classes[kept]) and (classes[3] == -1).all()
    torch.testing.assert_close(values[kept], ref_values[kept], rtol=1e-6, atol=1e-6)


def finite_difference_check(head_handle, weight, bias, hidden, targets, reduction, step):
    """Analytic gradients of the selective loss (fixed draw) against central differences in fp32."""
    red = _ops.REDUCTIONS[reduction]
    w = weight.detach().clone().requires_grad_()
    h = hidden.detach().clone().requires_grad_()
    loss = _ops.loss(h, w, bias, targets, red, -100, head_handle, step, False)
    loss.sum().backward()

    def f(hh, ww):
        with torch.no_grad():
            return _ops.loss(hh, ww, bias, targets, red, -100, head_handle, step, False).double().sum().item()

    # Perturbations are made in place: a KNN head is cached per weight tensor (a new tensor would
    # get a new graph, built from the perturbed weights, and another active set).
    eps = 1e-2
    for tensor, grad, name in ((h, h.grad, "hidden"), (w, w.grad, "weight")):
        gen = torch.Generator().manual_seed(5)
        for idx in torch.randperm(tensor.numel(), generator=gen, device="cpu")[:12].tolist():
            with torch.no_grad():
                x = tensor.view(-1)
                saved = x[idx].item()
                x[idx] = saved + eps
                up = f(h.detach(), w.detach())
                x[idx] = saved - eps
                down = f(h.detach(), w.detach())
                x[idx] = saved
            num = (up - down) / (2 * eps)
            assert grad.view(-1)[idx].item() == pytest.approx(num, rel=2e-2, abs=2e-3), f"{name}[{idx}]"


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("unique", [True, False])
def test_sampled_gradients_match_finite_differences(reduction, unique):
    head = SampledSoftmaxLoss(N, D, num_sampled=5, unique=unique, init_scale=0.5)
    hidden = torch.randn(6, D)
    targets = torch.randint(0, N, (6,))
    finite_difference_check(head._handle.value, head.weight, None, hidden, targets, reduction,
                            torch.tensor(3, dtype=torch.int64))


@pytest.mark.parametrize("metric", ["cosine", "inner_product"])
def test_knn_gradients_match_finite_differences(metric):
    head = KNNSoftmaxLoss(N, D, k=4, metric=metric, rebuild_every=0, init_scale=0.5)
    hidden = torch.randn(6, D)
    targets = torch.randint(0, N, (6,))
    # the graph is built from the weights at the first use; perturbing the weights does not rebuild
    # it (rebuild_every=0), so every evaluation sees the same active set
    finite_difference_check(head._handle.value, head.weight, None, hidden, targets, "mean",
                            torch.tensor(0, dtype=torch.int64))


def test_sampled_draw_changes_with_step_and_is_reproducible():
    head = SampledSoftmaxLoss(200, D, num_sampled=8, seed=3)
    hidden = torch.randn(4, D)
    targets = torch.randint(0, 200, (4,))
    red = _ops.REDUCTIONS["mean"]
    at = lambda s: _ops.loss(hidden, head.weight.detach(), None, targets, red, -100, head._handle.value,  # noqa: E731
                             torch.tensor(s), False).item()
    assert at(0) == at(0)
    assert at(0) != at(1)


def test_knn_training_runs_and_lowers_loss():
    n = 300
    head = KNNSoftmaxLoss(n, 16, k=10, rebuild_every=5, bias=True, sparse_grad=True)
    hidden = torch.randn(128, 16)
    targets = torch.randint(0, n, (128,))
    opt = torch.optim.SGD(head.parameters(), lr=2.0)
    full_before = F.cross_entropy(F.linear(hidden, head.weight, head.bias), targets).item()
    for _ in range(40):
        opt.zero_grad()
        head(hidden, targets).backward()
        opt.step()
    assert head.step.item() == 40
    head.rebuild_graph()
    full_after = F.cross_entropy(F.linear(hidden, head.weight, head.bias), targets).item()
    assert full_after < 0.7 * full_before


# Refreshed: updates at steps 3, 6, ... refresh, refresh, rebuild, ...; with refresh_moved, a refresh
# also searches the 10 % of classes that turned most.
_REFRESHED = dict(refreshes_between_rebuilds=2, refine_passes=1, refresh_passes=2)


@pytest.mark.parametrize("method,refresh", [("ivf", {}), ("ivf_class_probes", {}), ("ivf_class_probes", _REFRESHED),
                                            ("ivf", dict(_REFRESHED, refresh_moved=0.1))])
def test_knn_ivf_graph_trains(method, refresh):
    n = 400
    head = KNNSoftmaxLoss(n, 8, k=10, method=method, ivf_lists=10, nprobe=3, rebuild_every=3, **refresh)
    hidden = torch.randn(32, 8)
    targets = torch.randint(0, n, (32,))
    opt = torch.optim.SGD(head.parameters(), lr=1.0)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = head(hidden, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    touched = int(head.weight.grad.abs().sum(1).gt(0).sum())
    assert 32 <= touched < n  # the active set: targets and some of their neighbours, not every class
    assert losses[-1] < losses[0]


def test_knn_refresh_options_are_checked():
    with pytest.raises(ValueError, match="refine.moved = 1.5"):
        KNNSoftmaxLoss(50, 4, k=5, refresh_moved=1.5)
    with pytest.raises(ValueError, match="refreshes_between_rebuilds = -1"):
        KNNSoftmaxLoss(50, 4, k=5, refreshes_between_rebuilds=-1)
    with pytest.raises(ValueError, match="refine.refresh_passes = -2"):
        KNNSoftmaxLoss(50, 4, k=5, refresh_passes=-2)
