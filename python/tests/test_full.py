# SPDX-License-Identifier: Apache-2.0
"""FullSoftmaxLoss against F.cross_entropy(F.linear(h, W, b), t)."""
import pytest
import torch
import torch.nn.functional as F

from xsoftmax import _ops
from xsoftmax import FullSoftmaxLoss

# Every test runs on the CPU and on CUDA (conftest.py: skipped, and counted, without a GPU).
pytestmark = pytest.mark.usefixtures("device")

N, D = 37, 12


def reference(hidden, targets, weight, bias, reduction, ignore_index):
    """Loss and gradients (hidden, weight, bias) of the plain PyTorch computation, in fp32."""
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().float().clone().requires_grad_()
    b = None if bias is None else bias.detach().float().clone().requires_grad_()
    logits = F.linear(h, w, b)
    loss = F.cross_entropy(logits.reshape(-1, w.shape[0]), targets.reshape(-1), reduction=reduction,
                           ignore_index=ignore_index)
    if reduction == "none":
        loss = loss.reshape(targets.shape)
    upstream = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape) if reduction == "none" else 1.3
    (loss * upstream).sum().backward()
    return loss.detach(), h.grad, w.grad, None if b is None else b.grad, upstream


def run(head, hidden, targets, upstream):
    h = hidden.detach().clone().requires_grad_()
    head.zero_grad(set_to_none=True)
    loss = head(h, targets)
    (loss * upstream).sum().backward()
    gb = None if head.bias is None else head.bias.grad
    return loss.detach(), h.grad, head.weight.grad, gb


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(9,), (3, 5)])
def test_matches_cross_entropy(reduction, bias, shape):
    head = FullSoftmaxLoss(N, D, bias=bias, reduction=reduction, ignore_index=-100)
    if bias:
        with torch.no_grad():
            head.bias.normal_()
    hidden = torch.randn(*shape, D)
    targets = torch.randint(0, N, shape)
    targets.view(-1)[1] = -100  # ignored
    ref_loss, ref_gh, ref_gw, ref_gb, upstream = reference(hidden, targets, head.weight, head.bias, reduction, -100)
    loss, gh, gw, gb = run(head, hidden, targets, upstream)
    assert loss.shape == ref_loss.shape
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-5, atol=1e-6)
    if bias:
        torch.testing.assert_close(gb, ref_gb, rtol=1e-5, atol=1e-6)
    if reduction == "none":
        assert loss.view(-1)[1] == 0


def test_custom_ignore_index_and_no_grad_path():
    head = FullSoftmaxLoss(N, D, ignore_index=3)
    hidden = torch.randn(8, D)
    targets = torch.randint(0, N, (8,))
    targets[0] = 3
    targets[5] = 3
    with torch.no_grad():
        loss = head(hidden, targets)
    ref = F.cross_entropy(F.linear(hidden, head.weight), targets, ignore_index=3)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights(dtype):
    head = FullSoftmaxLoss(N, D, bias=True, dtype=dtype)
    with torch.no_grad():
        head.bias.normal_()
    hidden = torch.randn(10, D)
    targets = torch.randint(0, N, (10,))
    ref_loss, ref_gh, ref_gw, ref_gb, _ = reference(hidden, targets, head.weight, head.bias, "mean", -100)
    loss, gh, gw, gb = run(head, hidden, targets, 1.3)
    assert gw.dtype == dtype and gb.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-4, atol=1e-5)
    # fp32 gradients rounded to the storage type
    torch.testing.assert_close(gw.float(), ref_gw, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(gb.float(), ref_gb, rtol=1e-2, atol=1e-3)
    # hidden in the storage type is accepted too
    loss16 = head(hidden.to(dtype), targets)
    torch.testing.assert_close(loss16.float(), F.cross_entropy(F.linear(hidden.to(dtype).float(), head.weight.float(),
                                                                         head.bias.float()), targets).detach(),
                               rtol=1e-4, atol=1e-4)


def test_sparse_grad_equals_dense():
    dense = FullSoftmaxLoss(N, D, bias=True)
    sparse = FullSoftmaxLoss(N, D, bias=True, sparse_grad=True)
    sparse.load_state_dict(dense.state_dict())
    hidden = torch.randn(6, D)
    targets = torch.randint(0, N, (6,))
    dense(hidden, targets).backward()
    sparse(hidden, targets).backward()
    assert sparse.weight.grad.layout == torch.sparse_coo
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad)
    torch.testing.assert_close(sparse.bias.grad.to_dense(), dense.bias.grad)
    torch.optim.SparseAdam(list(sparse.parameters()), lr=0.01).step()  # accepted by the sparse optimiser


def test_log_prob_and_predict():
    head = FullSoftmaxLoss(N, D, bias=True)
    with torch.no_grad():
        head.bias.normal_()
    hidden = torch.randn(2, 4, D)
    logp = F.log_softmax(F.linear(hidden, head.weight, head.bias), -1).detach()
    targets = torch.randint(0, N, (2, 4))
    torch.testing.assert_close(head.log_prob(hidden, targets), logp.gather(-1, targets[..., None])[..., 0],
                               rtol=1e-5, atol=1e-5)
    values, indices = head.predict(hidden, k=5)
    ref_v, ref_i = logp.topk(5, dim=-1)
    assert values.shape == (2, 4, 5) and indices.shape == (2, 4, 5)
    torch.testing.assert_close(values, ref_v, rtol=1e-5, atol=1e-5)
    assert torch.equal(indices, ref_i)
    # The functional top-k says "no tree search" in its expansions for this head.
    _, _, expansions = _ops.topk(hidden[0], head.weight, head.bias, 5, return_expansions=True)
    assert expansions.tolist() == [-1] * 4


def test_weight_is_used_in_place():
    head = FullSoftmaxLoss(N, D)
    hidden = torch.randn(4, D)
    targets = torch.randint(0, N, (4,))
    before = head(hidden, targets).item()
    with torch.no_grad():
        head.weight.mul_(0)  # the operator reads the parameter's memory: uniform distribution now
    assert head(hidden, targets).item() == pytest.approx(torch.log(torch.tensor(float(N))).item(), rel=1e-6)
    assert before != pytest.approx(head(hidden, targets).item())


def test_empty_batch():
    head = FullSoftmaxLoss(N, D)
    h = torch.randn(0, D, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    assert torch.isnan(head(h, t))
    head.reduction = "sum"
    assert head(h, t).item() == 0
    head.reduction = "none"
    assert head(h, t).shape == (0,)


def test_sgd_training_lowers_loss():
    head = FullSoftmaxLoss(N, D, bias=True)
    hidden = torch.randn(64, D)
    targets = torch.randint(0, N, (64,))
    opt = torch.optim.SGD(head.parameters(), lr=1.0)
    first = None
    for _ in range(30):
        opt.zero_grad()
        loss = head(hidden, targets)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert head(hidden, targets).item() < 0.5 * first


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_every_sample_ignored(reduction):
    head = FullSoftmaxLoss(N, D, reduction=reduction)
    hidden = torch.randn(3, D, requires_grad=True)
    targets = torch.full((3,), -100)
    ref_h = hidden.detach().clone().requires_grad_()
    ref = F.cross_entropy(F.linear(ref_h, head.weight), targets, reduction=reduction)
    loss = head(hidden, targets)
    torch.testing.assert_close(loss, ref.detach(), equal_nan=True)  # mean: nan, as F.cross_entropy
    loss.sum().backward()
    assert hidden.grad.abs().sum() == 0 and head.weight.grad.abs().sum() == 0


def sine_head(n, d, **options):
    """A FullSoftmaxLoss with bias and fixed, smooth weights (the same at every call)."""
    head = FullSoftmaxLoss(n, d, bias=True, **options)
    with torch.no_grad():
        head.weight.copy_(torch.linspace(-1, 1, n * d).reshape(n, d).sin())
        head.bias.copy_(torch.linspace(-1, 1, n))
    return head


def test_score_cache_bytes_gives_bitwise_the_same_step():
    # B = 4096 rows: the library's chunks are 2048 classes (32 MiB of scores), so N = 5000 is three
    # chunks; the budgets keep none, one, two (64 MiB) and all of them. The automatic layout (None)
    # solves the batch in blocks of 3328 rows (their scores fit 64 MiB), each keeping every score:
    # within rounding of the others, not bitwise.
    n, d, b = 5000, 8, 4096
    torch.manual_seed(3)
    hidden, targets = torch.randn(b, d), torch.randint(0, n, (b,))
    targets[::7] = -100
    chunk_bytes = b * 2048 * 4
    results = []
    for budget in (0, chunk_bytes + 1, 64 << 20, b * n * 4):
        head = sine_head(n, d, score_cache_bytes=budget)
        results.append(run(head, hidden, targets, 1.0))
        assert f"score_cache_bytes={budget}" in repr(head)
    for other in results[1:]:
        for a, e in zip(other, results[0]):
            assert torch.equal(a, e)
    automatic = run(sine_head(n, d), hidden, targets, 1.0)
    for a, e in zip(automatic, results[0]):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    ref = reference(hidden, targets, head.weight, head.bias, "mean", -100)
    torch.testing.assert_close(results[-1][0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[-1][2] * ref[4], ref[2], rtol=1e-4, atol=1e-6)


def test_score_cache_bytes_rejects_negative_and_survives_copies():
    with pytest.raises(ValueError, match="bytes = -1"):
        FullSoftmaxLoss(N, D, score_cache_bytes=-1)
    import copy
    import pickle
    head = FullSoftmaxLoss(N, D, score_cache_bytes=1 << 20)
    h, t = torch.randn(5, D), torch.randint(0, N, (5,))
    for clone in (copy.deepcopy(head), pickle.loads(pickle.dumps(head))):
        assert clone.score_cache_bytes == 1 << 20
        torch.testing.assert_close(clone(h, t), head(h, t))
        assert torch.equal(clone.predict(h, 3)[1], head.predict(h, 3)[1])


def test_row_block_gives_the_same_step_within_rounding():
    # B = 1000 rows in blocks of 300 (the last of 100), each keeping every score (the default
    # budget with row_block: 300 x N x 4 bytes) or none (score_cache_bytes=0).
    n, d, b = 700, 8, 1000
    torch.manual_seed(4)
    hidden, targets = torch.randn(b, d), torch.randint(0, n, (b,))
    targets[::9] = -100
    results = []
    for row_block, budget in ((None, None), (300, None), (300, 0)):
        head = sine_head(n, d, score_cache_bytes=budget, row_block=row_block)
        results.append(run(head, hidden, targets, 1.0))
        assert f"row_block={row_block}" in repr(head)
    for other in results[1:]:
        for a, e in zip(other, results[0]):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    ref = reference(hidden, targets, head.weight, head.bias, "mean", -100)
    torch.testing.assert_close(results[1][0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1][2] * ref[4], ref[2], rtol=1e-4, atol=1e-6)


def test_row_block_rejects_negative_and_survives_copies():
    with pytest.raises(ValueError, match="rows = -2"):
        FullSoftmaxLoss(N, D, row_block=-2)
    import copy
    head = FullSoftmaxLoss(N, D, row_block=2)
    h, t = torch.randn(5, D), torch.randint(0, N, (5,))
    clone = copy.deepcopy(head)
    assert clone.row_block == 2
    torch.testing.assert_close(clone(h, t), head(h, t))


def test_upstream_scale_is_applied_to_the_weight_gradient():
    # loss.backward() takes the operator's gradient as it is (no num_classes x dim copy);
    # (loss * 2.5).backward(): scaled, and equal to 2.5 x the first.
    head = FullSoftmaxLoss(N, D)
    h, t = torch.randn(6, D), torch.randint(0, N, (6,))
    head(h, t).backward()
    g1 = head.weight.grad.clone()
    head.weight.grad = None
    (head(h, t) * 2.5).backward()
    torch.testing.assert_close(head.weight.grad, 2.5 * g1)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_evaluate_is_forward_and_predict_in_one_pass(reduction, softcap):
    head = FullSoftmaxLoss(N, D, bias=True, reduction=reduction, softcap=softcap, label_smoothing=0.1)
    with torch.no_grad():
        head.bias.normal_()
    hidden = torch.randn(3, 4, D)
    targets = torch.randint(0, N, (3, 4))
    targets[1, 2] = -100  # ignored: class -1, log-probability -inf
    loss, values, indices = head.evaluate(hidden, targets, k=5)
    with torch.no_grad():
        alone = head(hidden, targets)
    assert not loss.requires_grad
    assert torch.equal(loss, alone)  # the same pass as forward: bitwise
    logits = F.linear(hidden, head.weight, head.bias).detach()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    ref_v, ref_i = F.log_softmax(logits, -1).topk(5, dim=-1)
    assert values.shape == (3, 4, 5) and indices.shape == (3, 4, 5)
    kept = targets != -100
    torch.testing.assert_close(values[kept], ref_v[kept], rtol=1e-5, atol=1e-5)
    assert torch.equal(indices[kept], ref_i[kept])
    assert indices[1, 2].tolist() == [-1] * 5
    assert torch.isneginf(values[1, 2]).all()
    if not softcap:  # predict's top-k
        pv, pi = head.predict(hidden, k=5)
        assert torch.equal(indices[kept], pi[kept])
        torch.testing.assert_close(values[kept], pv[kept], rtol=1e-6, atol=1e-6)


def test_evaluate_refuses_what_it_cannot_answer():
    head = FullSoftmaxLoss(N, D)
    hidden, targets = torch.randn(4, D), torch.randint(0, N, (4,))
    with pytest.raises(ValueError, match=r"k = 0 must be in \[1, num_classes = 37\]"):
        head.evaluate(hidden, targets, k=0)
    with pytest.raises(ValueError, match="targets has shape"):
        head.evaluate(hidden, targets[:3], k=2)
    margin = FullSoftmaxLoss(N, D, margin="cosface")
    with pytest.raises(ValueError, match="angular margin"):
        margin.evaluate(hidden, targets, k=2)
    # Empty batch: forward's value (nan for the mean) and empty top-k outputs.
    loss, values, indices = head.evaluate(hidden[:0], targets[:0], k=3)
    assert torch.isnan(loss) and values.shape == (0, 3) and indices.shape == (0, 3)
    # Every row ignored: the mean is nan (as F.cross_entropy), every class -1.
    loss, _, indices = head.evaluate(hidden, torch.full((4,), -100), k=2)
    assert torch.isnan(loss) and (indices == -1).all()
