# SPDX-License-Identifier: Apache-2.0
"""The heads on CUDA tensors against the same heads on the CPU, and the CUDA operators as PyTorch
citizens: torch's streams (two models on two streams equal one after the other) and torch's caching
allocator (torch.cuda.max_memory_allocated sees the heads' working memory, torch.cuda.memory_allocated
their weight gradients). Skipped, and counted,
without a GPU (conftest.py)."""
import copy

import pytest
import torch
from conftest import requires_cuda

from xsoftmax import FullSoftmaxLoss, HierarchicalSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss, Tree

pytestmark = [requires_cuda, pytest.mark.cuda]

N, D, B = 3000, 48, 256


def make(kind, dtype=torch.float32, sparse_grad=False, bias=False):
    """A head on the CPU (its CUDA twin is a deep copy moved to the GPU)."""
    common = dict(bias=bias, dtype=dtype, sparse_grad=sparse_grad)
    if kind == "full":
        return FullSoftmaxLoss(N, D, **common)
    if kind == "hs":
        return HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 64), **common)
    if kind == "huffman_sigmoid":
        counts = torch.arange(1.0, N + 1).flip(0)
        return HierarchicalSoftmaxLoss(N, D, tree=Tree.huffman(counts), node="sigmoid", **common)
    if kind == "sampled":
        return SampledSoftmaxLoss(N, D, num_sampled=200, **common)
    if kind == "knn":
        return KNNSoftmaxLoss(N, D, k=20, **common)
    raise ValueError(kind)


def step(head, hidden, targets):
    """loss, d loss / d hidden, d loss / d weight (dense, fp32) of one training step."""
    h = hidden.clone().requires_grad_(True)
    head.zero_grad()
    loss = head(h, targets)
    loss.backward()
    g = head.weight.grad
    g = g.to_dense() if g.is_sparse else g
    return loss.detach().float().cpu(), h.grad.float().cpu(), g.float().cpu()


def relative_gap(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("kind", ["full", "hs", "huffman_sigmoid", "sampled", "knn"])
@pytest.mark.parametrize("sparse_grad", [False, True])
def test_cuda_step_equals_cpu_step_fp32(kind, sparse_grad):
    torch.manual_seed(5)
    cpu = make(kind, sparse_grad=sparse_grad, bias=kind != "huffman_sigmoid")
    gpu = copy.deepcopy(cpu).cuda()
    hidden = torch.randn(B, D)
    targets = torch.randint(0, N, (B,))
    targets[::17] = -100
    want = step(cpu, hidden, targets)
    got = step(gpu, hidden.cuda(), targets.cuda())
    assert gpu.weight.grad.device.type == "cuda"
    assert gpu.weight.grad.is_sparse == sparse_grad
    for name, a, b in zip(("loss", "grad_hidden", "grad_weight"), got, want):
        assert relative_gap(a, b) <= 1e-5, f"{kind} {name}: {relative_gap(a, b):.3g}"


@pytest.mark.parametrize("kind", ["full", "hs", "sampled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_step_equals_cpu_step_16_bit(kind, dtype):
    # The CUDA heads round the hidden rows to the weights' type for their tensor-core GEMMs; the CPU
    # heads score fp32 rows against rounded weights: agreement within the 16-bit rounding of the rows.
    torch.manual_seed(6)
    cpu = make(kind, dtype=dtype)
    gpu = copy.deepcopy(cpu).cuda()
    hidden = torch.randn(B, D)
    targets = torch.randint(0, N, (B,))
    want = step(cpu, hidden, targets)
    got = step(gpu, hidden.cuda(), targets.cuda())
    for name, a, b in zip(("loss", "grad_hidden", "grad_weight"), got, want):
        assert relative_gap(a, b) <= 2e-2, f"{kind} {dtype} {name}: {relative_gap(a, b):.3g}"


@pytest.mark.parametrize("kind", ["full", "hs", "huffman_sigmoid"])
def test_cuda_log_prob_and_predict_equal_cpu(kind):
    torch.manual_seed(7)
    cpu = make(kind)
    gpu = copy.deepcopy(cpu).cuda()
    hidden = torch.randn(64, D)
    targets = torch.randint(0, N, (64,))
    lp = gpu.log_prob(hidden.cuda(), targets.cuda())
    assert lp.device.type == "cuda"
    assert relative_gap(lp.cpu(), cpu.log_prob(hidden, targets)) <= 1e-5
    values, classes = gpu.predict(hidden.cuda(), k=5)
    want_values, want_classes = cpu.predict(hidden, k=5)
    assert relative_gap(values.cpu(), want_values) <= 1e-5
    assert (classes.cpu() == want_classes).float().mean() >= 0.99  # near-ties may order differently


def test_the_loss_stays_on_the_device():
    head = make("full").cuda()
    loss = head(torch.randn(8, D, device="cuda"), torch.randint(0, N, (8,), device="cuda"))
    assert loss.device.type == "cuda" and loss.dim() == 0


def test_two_models_on_two_streams_equal_one_after_the_other():
    torch.manual_seed(8)
    first, second = make("full", dtype=torch.bfloat16).cuda(), make("hs").cuda()
    inputs = [(torch.randn(512, D, device="cuda"), torch.randint(0, N, (512,), device="cuda")) for _ in range(2)]
    sequential = [first(*inputs[0]).item(), second(*inputs[1]).item()]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    results = []
    for _ in range(3):
        with torch.cuda.stream(s1):
            a = first(*inputs[0])
        with torch.cuda.stream(s2):
            b = second(*inputs[1])
        torch.cuda.synchronize()
        results.append((a.item(), b.item()))
    for a, b in results:
        assert a == pytest.approx(sequential[0], rel=1e-5)
        assert b == pytest.approx(sequential[1], rel=1e-5)


def test_max_memory_allocated_sees_the_heads_working_memory():
    # A forward of the full softmax over 64K classes scores the batch in chunks of classes (1024 x
    # 16384 fp32 = 64 MiB each): that memory comes from torch's caching allocator, so torch sees it.
    head = FullSoftmaxLoss(65536, 64).cuda()
    hidden = torch.randn(1024, 64, device="cuda")
    targets = torch.randint(0, 65536, (1024,), device="cuda")
    with torch.no_grad():
        head(hidden, targets)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        head(hidden, targets)
        torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before >= 4 << 20


def test_the_weight_gradient_is_counted_by_torchs_allocator():
    # The fused operator hands a sparse weight gradient (here every row: N x d fp32) to torch over
    # the library's own buffer; that buffer comes from torch's caching allocator
    # (torch_vector_memory), so torch counts it while the tensor lives and gets it back when the
    # tensor goes. (A dense one is a torch tensor from the start: the next test.)
    n, d = 65536, 64
    w = torch.randn(n, d, device="cuda")
    h = torch.randn(256, d, device="cuda")
    t = torch.randint(0, n, (256,), device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    outputs = torch.ops.xsoftmax.loss_fused(h, w, None, t, 1, -100, 0, None, True)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before >= n * d * 4
    del outputs
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < n * d * 4


def test_a_bf16_step_holds_no_fp32_weight_gradient():
    # The full softmax writes its dense weight gradient into a bf16 tensor (the library's
    # dense_gradient): a step's peak beyond the weights is that bf16 gradient plus the scores, below
    # what an fp32 N x d gradient alone would take (which the old path held, and then converted).
    n, d, b = 131072, 512, 64
    head = FullSoftmaxLoss(n, d, dtype=torch.bfloat16).cuda()
    hidden = torch.randn(b, d, device="cuda")
    targets = torch.randint(0, n, (b,), device="cuda")
    head(hidden, targets).backward()  # warm-up: workspace, cuBLAS
    head.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    head(hidden, targets).backward()
    torch.cuda.synchronize()
    assert head.weight.grad.dtype == torch.bfloat16
    peak = torch.cuda.max_memory_allocated() - before
    bf16_gradient, scores = n * d * 2, b * n * 4
    assert peak >= bf16_gradient
    assert peak < n * d * 4, f"peak {peak / 2**20:.0f} MiB: an fp32 weight gradient was held"
    assert peak <= bf16_gradient + 2 * scores + (64 << 20)


def test_sparse_gradients_are_cuda_sparse_tensors():
    head = make("hs", sparse_grad=True, bias=True).cuda()
    loss = head(torch.randn(32, D, device="cuda"), torch.randint(0, N, (32,), device="cuda"))
    loss.backward()
    for p in (head.weight, head.bias):
        assert p.grad.is_sparse and p.grad.device.type == "cuda"
