# SPDX-License-Identifier: Apache-2.0
"""Loss terms on the exact and selective modules: label smoothing (F.cross_entropy's), z-loss
(PaLM's z * lse^2) and the ArcFace / CosFace margins, against plain PyTorch formulas, with their
gradients; they change the training loss only (log_prob and predict stay the plain softmax's),
survive copies, and are checked at construction."""
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
    h = torch.randn(b, D, generator=g)
    t = torch.randint(0, N, (b,), generator=g)
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


def reference(h, w, b, t, reduction, label_smoothing=0.0, z_loss=0.0, margin=None, s=64.0, m=0.0):
    logits = margin_logits(h, w, t, margin, s, m) if margin else F.linear(h, w, b)
    loss = F.cross_entropy(logits, t, reduction="none", label_smoothing=label_smoothing)
    keep = t != -100
    loss = torch.where(keep, loss + z_loss * torch.logsumexp(logits, dim=1) ** 2, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    return loss.sum() / keep.sum() if reduction == "mean" else loss.sum()


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
