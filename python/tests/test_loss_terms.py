# SPDX-License-Identifier: Apache-2.0
"""Loss terms on the exact and selective modules: label smoothing (F.cross_entropy's), z-loss
(PaLM's z * lse^2), the ArcFace / CosFace margins, logit soft-capping (Gemma 2's c tanh(z / c)) and
per-class weights (F.cross_entropy's weight, also on the hierarchical softmax), against plain
PyTorch formulas, with their gradients; they change the training loss only (log_prob and predict
stay the plain softmax's), survive copies, and are checked at construction."""
import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

from xsoftmax import FullSoftmaxLoss, HierarchicalSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

N, D = 23, 8


def batch(seed=3, b=11):
    g = torch.Generator().manual_seed(seed)
    # Drawn on the CPU (a CPU generator), then on the test's device.
    h = torch.randn(b, D, generator=g, device="cpu").to(torch.get_default_device())
    t = torch.randint(0, N, (b,), generator=g, device="cpu").to(torch.get_default_device())
    t[4] = -100  # an ignored row
    return h, t


def margin_logits(h, w, t, margin, s, m):
    """s cos(theta_j) for every class, with the margin on the target's (rows with an ignored target:
    no margin)."""
    cos = F.normalize(h, dim=1) @ F.normalize(w, dim=1).T
    keep = t >= 0
    tc = cos[keep].gather(1, t[keep][:, None])[:, 0]
    target = torch.cos(torch.acos(tc.clamp(-1, 1)) + m) if margin == "arcface" else tc - m
    out = cos.clone()
    out[keep] = cos[keep].scatter(1, t[keep][:, None], target[:, None])
    return s * out


def reference(h, w, b, t, reduction, label_smoothing=0.0, z_loss=0.0, margin=None, s=64.0, m=0.0, softcap=0.0,
              class_weight=None):
    logits = margin_logits(h, w, t, margin, s, m) if margin else F.linear(h, w, b)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    # reduction none with `weight`: class_weight[t] * nll per sample (0 for an ignored one).
    loss = F.cross_entropy(logits, t, reduction="none", label_smoothing=label_smoothing, weight=class_weight)
    keep = t != -100
    sample_weight = keep.float() if class_weight is None else torch.where(keep, class_weight[t.clamp(min=0)], 0.0)
    loss = torch.where(keep, loss + sample_weight * z_loss * torch.logsumexp(logits, dim=1) ** 2, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    return loss.sum() / sample_weight.sum() if reduction == "mean" else loss.sum()


def check_against_reference(head, reduction, **terms):
    h, t = batch()
    hx = h.clone().requires_grad_()
    loss = head(hx, t)
    upstream = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape)
    (loss * upstream).sum().backward()
    hr = h.clone().requires_grad_()
    wr = head.weight.detach().clone().requires_grad_()
    br = None if head.bias is None else head.bias.detach().clone().requires_grad_()
    ref = reference(hr, wr, br, t, reduction, **terms)
    (ref * upstream).sum().backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(hx.grad, hr.grad, rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(head.weight.grad, wr.grad, rtol=2e-4, atol=2e-5)
    if br is not None:
        torch.testing.assert_close(head.bias.grad, br.grad, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True])
def test_full_label_smoothing_and_z_loss_match_pytorch(reduction, bias):
    head = FullSoftmaxLoss(N, D, bias=bias, reduction=reduction, label_smoothing=0.1)
    check_against_reference(head, reduction, label_smoothing=0.1)
    head = FullSoftmaxLoss(N, D, bias=bias, reduction=reduction, z_loss=1e-2)
    check_against_reference(head, reduction, z_loss=1e-2)
    head = FullSoftmaxLoss(N, D, bias=bias, reduction=reduction, label_smoothing=0.2, z_loss=1e-3, row_block=4)
    check_against_reference(head, reduction, label_smoothing=0.2, z_loss=1e-3)


@pytest.mark.parametrize("margin, m", [("arcface", 0.3), ("cosface", 0.25)])
def test_full_margins_match_their_formulas(margin, m):
    head = FullSoftmaxLoss(N, D, margin=margin, margin_scale=8.0, margin_m=m)
    check_against_reference(head, "mean", margin=margin, s=8.0, m=m)


def class_weights():
    g = torch.Generator().manual_seed(17)
    w = torch.rand(N, generator=g, device="cpu") * 2
    w[3] = 0.0
    return w.to(torch.get_default_device())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_full_softcap_and_class_weight_match_pytorch(reduction):
    # |logits| reach about 2 here: a cap of 0.8 bends most of them.
    head = FullSoftmaxLoss(N, D, bias=True, reduction=reduction, softcap=0.8)
    check_against_reference(head, reduction, softcap=0.8)
    head = FullSoftmaxLoss(N, D, bias=True, reduction=reduction, softcap=0.8, label_smoothing=0.1, z_loss=1e-2,
                           row_block=4)
    check_against_reference(head, reduction, softcap=0.8, label_smoothing=0.1, z_loss=1e-2)
    cw = class_weights()
    head = FullSoftmaxLoss(N, D, bias=True, reduction=reduction, class_weight=cw, z_loss=1e-2)
    check_against_reference(head, reduction, class_weight=cw, z_loss=1e-2)
    head = FullSoftmaxLoss(N, D, reduction=reduction, class_weight=cw, softcap=1.5, margin=None)
    check_against_reference(head, reduction, class_weight=cw, softcap=1.5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_weight_with_label_smoothing_is_pytorchs_formula(reduction):
    # F.cross_entropy(weight=w, label_smoothing=eps): each class of the smoothing term carries its own
    # weight; the mean divides by the total weight of the targets. With z-loss, soft-capping, row blocks.
    cw = class_weights()
    head = FullSoftmaxLoss(N, D, bias=True, reduction=reduction, class_weight=cw, label_smoothing=0.2)
    check_against_reference(head, reduction, class_weight=cw, label_smoothing=0.2)
    head = FullSoftmaxLoss(N, D, reduction=reduction, class_weight=cw, label_smoothing=0.1, z_loss=1e-2, softcap=1.5,
                           row_block=4)
    check_against_reference(head, reduction, class_weight=cw, label_smoothing=0.1, z_loss=1e-2, softcap=1.5)
    # PyTorch's own reduction, not only our reference's.
    h, t = batch(7)
    with torch.no_grad():
        head = FullSoftmaxLoss(N, D, reduction=reduction, class_weight=cw, label_smoothing=0.3)
        want = F.cross_entropy(F.linear(h, head.weight), t, weight=cw, label_smoothing=0.3, reduction=reduction)
        torch.testing.assert_close(head(h, t), want, rtol=2e-5, atol=2e-5)
    # The selective heads: every class active (KNN, k = N) is the full softmax; the sampled head's
    # exact evaluation loss.
    check_against_reference(KNNSoftmaxLoss(N, D, k=N, class_weight=cw, label_smoothing=0.2, reduction=reduction),
                            reduction, class_weight=cw, label_smoothing=0.2)
    sampled = SampledSoftmaxLoss(N, D, num_sampled=5, class_weight=cw, label_smoothing=0.2,
                                 reduction=reduction).eval()
    with torch.no_grad():
        torch.testing.assert_close(sampled(h, t), F.cross_entropy(F.linear(h, sampled.weight), t, weight=cw,
                                                                  label_smoothing=0.2, reduction=reduction),
                                   rtol=2e-5, atol=2e-5)


def test_selective_heads_take_softcap_and_class_weight():
    cw = class_weights()
    # k = N: the active set is every class, the full softmax's loss.
    check_against_reference(KNNSoftmaxLoss(N, D, k=N, softcap=0.8), "mean", softcap=0.8)
    check_against_reference(KNNSoftmaxLoss(N, D, k=N, class_weight=cw, reduction="sum"), "sum", class_weight=cw)
    # The exact evaluation loss of the sampled head keeps both.
    head = SampledSoftmaxLoss(N, D, num_sampled=5, softcap=0.8, class_weight=cw).eval()
    h, t = batch(5)
    with torch.no_grad():
        torch.testing.assert_close(head(h, t), reference(h, head.weight, None, t, "mean", softcap=0.8, class_weight=cw),
                                   rtol=2e-5, atol=2e-5)
    head.train()
    loss = head(h, t)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_hierarchical_class_weight_scales_each_sample(reduction):
    cw = class_weights()
    plain = HierarchicalSoftmaxLoss(N, D, bias=True, reduction="none")
    weighted = HierarchicalSoftmaxLoss(N, D, bias=True, reduction=reduction, class_weight=cw)
    weighted.load_state_dict(dict(plain.state_dict(), class_weight=cw))
    h, t = batch()
    keep = t != -100
    sample_weight = torch.where(keep, cw[t.clamp(min=0)], 0.0)
    ha, hb = h.clone().requires_grad_(), h.clone().requires_grad_()
    got = weighted(ha, t)
    per = plain(hb, t)
    want = (sample_weight * per).sum() / (sample_weight.sum() if reduction == "mean" else 1.0)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    got.backward()
    want.backward()
    torch.testing.assert_close(ha.grad, hb.grad, rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(weighted.weight.grad, plain.weight.grad, rtol=2e-4, atol=2e-6)


def test_class_weights_of_zero_give_the_mean_nan_as_pytorch():
    h, t = batch()
    cw = torch.zeros(N)
    head = FullSoftmaxLoss(N, D, class_weight=cw)
    got = head(h, t)
    want = F.cross_entropy(F.linear(h, head.weight.detach()), t, weight=cw)
    assert torch.isnan(got) and torch.isnan(want)


def test_softcap_and_class_weight_are_checked():
    with pytest.raises(ValueError, match="softcap = -1"):
        FullSoftmaxLoss(N, D, softcap=-1)
    with pytest.raises(ValueError, match="softcap = 2.0 with margin"):
        FullSoftmaxLoss(N, D, softcap=2.0, margin="arcface")
    with pytest.raises(ValueError, match=r"class_weight has shape \(5,\); expected \(23,\)"):
        FullSoftmaxLoss(N, D, class_weight=torch.ones(5))
    with pytest.raises(ValueError, match="class_weight must be finite and >= 0"):
        KNNSoftmaxLoss(N, D, k=3, class_weight=-torch.ones(N))
    head = FullSoftmaxLoss(N, D, softcap=2.0, class_weight=torch.ones(N))
    assert "softcap=2.0" in repr(head) and "class_weight" in repr(head)
    assert "class_weight" in head.state_dict()


def test_knn_with_every_class_is_the_full_softmax_with_its_terms():
    # k = N: the active set is every class, so the KNN loss is the full softmax's, terms included.
    head = KNNSoftmaxLoss(N, D, k=N, label_smoothing=0.1, z_loss=1e-2)
    check_against_reference(head, "mean", label_smoothing=0.1, z_loss=1e-2)
    # The exact evaluation loss keeps the terms too.
    head.eval()
    h, t = batch(5)
    with torch.no_grad():
        torch.testing.assert_close(head(h, t), reference(h, head.weight, None, t, "mean", 0.1, 1e-2),
                                   rtol=2e-5, atol=2e-5)


def test_terms_change_the_training_loss_only():
    h, t = batch(7)
    t = t.clamp(min=0)
    plain = FullSoftmaxLoss(N, D)
    smooth = FullSoftmaxLoss(N, D, label_smoothing=0.3, z_loss=0.1)
    smooth.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert not torch.allclose(smooth(h, t), plain(h, t))
        torch.testing.assert_close(smooth.log_prob(h, t), plain.log_prob(h, t))
        for a, b in zip(smooth.predict(h, k=3), plain.predict(h, k=3)):
            torch.testing.assert_close(a, b)
    sampled = SampledSoftmaxLoss(N, D, num_sampled=5, label_smoothing=0.3)
    sampled.load_state_dict({"weight": plain.weight.detach(), "step": torch.zeros((), dtype=torch.int64)})
    with torch.no_grad():
        torch.testing.assert_close(sampled.log_prob(h, t), plain.log_prob(h, t))


def loss_at_step_zero(head, h, t):
    """The training loss with the step counter (the sampled negatives' seed) at 0."""
    if hasattr(head, "step"):
        head.step.zero_()
    with torch.no_grad():
        return head(h, t)


def test_terms_survive_copies():
    h, t = batch(9)
    for head in (FullSoftmaxLoss(N, D, label_smoothing=0.1, margin="cosface", margin_scale=4.0),
                 KNNSoftmaxLoss(N, D, k=5, z_loss=0.05), SampledSoftmaxLoss(N, D, num_sampled=4, label_smoothing=0.2)):
        for clone in (copy.deepcopy(head), pickle.loads(pickle.dumps(head))):
            torch.testing.assert_close(loss_at_step_zero(clone, h, t), loss_at_step_zero(head, h, t))
            assert "label_smoothing" in repr(clone) or "z_loss" in repr(clone)


def test_bad_terms_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"label_smoothing = 1.5 must be in \[0, 1\]"):
        FullSoftmaxLoss(N, D, label_smoothing=1.5)
    with pytest.raises(ValueError, match="z_loss = -1"):
        KNNSoftmaxLoss(N, D, k=3, z_loss=-1)
    with pytest.raises(ValueError, match="z_loss = nan"):
        FullSoftmaxLoss(N, D, z_loss=math.nan)
    with pytest.raises(ValueError, match="margin = 'sphereface'"):
        SampledSoftmaxLoss(N, D, num_sampled=3, margin="sphereface")
    with pytest.raises(ValueError, match="needs bias=False"):
        FullSoftmaxLoss(N, D, bias=True, margin="arcface")
    with pytest.raises(ValueError, match="margin_m = 2"):
        FullSoftmaxLoss(N, D, margin="arcface", margin_m=2.0)
    with pytest.raises(ValueError, match="margin_scale = 0"):
        FullSoftmaxLoss(N, D, margin="cosface", margin_scale=0.0)
    with pytest.raises(TypeError):  # not defined for the hierarchical softmax: no such argument
        HierarchicalSoftmaxLoss(N, D, label_smoothing=0.1)


def cut_in_widest_gap(values, lo, hi):
    """A cut in the widest relative gap between consecutive values inside [lo, hi] (the gap's
    geometric middle) and the gap's ratio: no value lies near the cut."""
    v = sorted(x for x in values if lo <= x <= hi)
    best, cut = 1.0, 0.0
    for a, b in zip(v, v[1:]):
        if a > 0 and b / a > best:
            best, cut = b / a, math.sqrt(a * b)
    return cut, best


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradient_filter_drops_every_entry_below_the_cut(dtype, reduction):
    # Cut Cross-Entropy's filter_eps, per entry: the gradients of the softmax with every entry of
    # p - onehot below the cut taken as 0 (float64 from the head's own weights); the loss unchanged.
    # Peaked logits (weights x 3) so that most entries are far below; the cut sits in the widest gap
    # between the entries' magnitudes, so none is near it. bf16 on CUDA: the tuned path, whose GEMMs
    # run over the kept classes only (chunks of 16 of 48 classes).
    n, b = 48, 24
    head = FullSoftmaxLoss(n, D, dtype=dtype, reduction=reduction)
    with torch.no_grad():
        head.weight.mul_(3.0)
    g = torch.Generator().manual_seed(31)
    h = torch.randn(b, D, generator=g, device="cpu").to(torch.get_default_device()).to(dtype)
    t = torch.randint(0, n, (b,), generator=g, device="cpu").to(torch.get_default_device())
    t[5] = -100
    w64, h64, keep = head.weight.detach().double(), h.double(), t != -100
    p = torch.softmax(h64 @ w64.T, dim=1)
    onehot = torch.zeros_like(p)
    onehot[keep] = onehot[keep].scatter(1, t[keep][:, None], 1.0)
    diff = (p - onehot)[keep]
    f, gap = cut_in_widest_gap(diff.abs().flatten().tolist(), 0.1, 0.9)
    assert gap > 1.001
    upstream = torch.linspace(0.5, 1.5, b, dtype=torch.float64, device=p.device)
    u = (torch.where(keep, 1.0 / keep.sum(), 0.0) if reduction == "mean" else upstream * keep).double()
    gd = torch.where((p - onehot).abs() < f, 0.0, p - onehot) * u[:, None]
    exact = (p - onehot) * u[:, None]
    assert (gd - exact).abs().max() > 0.05 * exact.abs().max()  # the filter matters here

    filtered = FullSoftmaxLoss(n, D, dtype=dtype, reduction=reduction, gradient_filter=f)
    filtered.load_state_dict(head.state_dict())
    hx = h.clone().requires_grad_()
    loss = filtered(hx, t)
    (loss * upstream.to(loss.dtype)).sum().backward() if reduction == "none" else loss.backward()
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2 * exact.abs().max().item())
    torch.testing.assert_close(filtered.weight.grad.double(), gd.T @ h64, **tol)
    torch.testing.assert_close(hx.grad.double(), gd @ w64, **tol)
    torch.testing.assert_close(loss.detach(), head(h, t).detach(), rtol=0, atol=0)
    assert f"gradient_filter={f}" in repr(filtered)


def test_gradient_filter_is_checked():
    for bad in (-0.1, 1.0, math.nan):
        with pytest.raises(ValueError, match="gradient_filter = "):
            FullSoftmaxLoss(N, D, gradient_filter=bad)
    with pytest.raises(TypeError):  # the full softmax only: no such argument elsewhere
        SampledSoftmaxLoss(N, D, num_sampled=3, gradient_filter=0.1)
