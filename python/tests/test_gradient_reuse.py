# SPDX-License-Identifier: Apache-2.0
"""The CPU weight-gradient buffers the extension reuses between calls (csrc/gradient_pool.hpp):
reused once PyTorch has dropped them, never while a tensor still uses them, refilled exactly as a
fresh buffer (also by heads whose gradients are sparse and change size), and freed by
``xsoftmax.release_cached_gradients``. CPU only: CUDA gradients are not pooled."""
import gc

import torch

import xsoftmax
from xsoftmax import FullSoftmaxLoss, HierarchicalSoftmaxLoss, Tree

N, D = 300, 16


def fresh_pool():
    """Drops this process's idle pooled gradients, so that the next call allocates."""
    gc.collect()
    xsoftmax.release_cached_gradients()


def step(head, hidden, targets):
    head.zero_grad(set_to_none=True)
    head(hidden, targets).backward()
    return head.weight.grad


def test_full_softmax_reuses_the_buffer_after_zero_grad():
    fresh_pool()
    head = FullSoftmaxLoss(N, D)
    hidden, targets = torch.randn(40, D), torch.randint(0, N, (40,))
    first = step(head, hidden, targets)
    first_ptr, first_values = first.data_ptr(), first.clone()
    del first
    again = step(head, hidden, targets)  # zero_grad dropped the first gradient: its buffer again
    assert again.data_ptr() == first_ptr
    assert torch.equal(again, first_values)


def test_a_held_gradient_is_not_reused_and_accumulation_is_right():
    fresh_pool()
    head = FullSoftmaxLoss(N, D)
    hidden, targets = torch.randn(40, D), torch.randint(0, N, (40,))
    one = step(head, hidden, targets).clone()
    head.zero_grad(set_to_none=True)
    head(hidden, targets).backward()
    held_ptr = head.weight.grad.data_ptr()
    head(hidden, targets).backward()  # accumulates into .grad, which still uses its buffer
    assert head.weight.grad.data_ptr() == held_ptr
    torch.testing.assert_close(head.weight.grad, 2 * one, rtol=1e-6, atol=1e-7)
    # More gradients held at once than the pool keeps (two): each call still gets a buffer of its
    # own and the right values.
    heads = [FullSoftmaxLoss(N, D) for _ in range(3)]
    for h in heads:
        h.load_state_dict(head.state_dict())
    kept = [step(h, hidden, targets) for h in heads]
    assert len({g.data_ptr() for g in kept} | {held_ptr}) == 4
    for g in kept:
        assert torch.equal(g, one)


def test_a_reused_buffer_is_refilled_exactly_for_sparse_and_hierarchical_gradients():
    tree = Tree.uniform(N, 2, 18)
    for sparse in (False, True):
        head = HierarchicalSoftmaxLoss(N, D, tree=tree, bias=True, sparse_grad=sparse)
        wide, wide_t = torch.randn(64, D), torch.randint(0, N, (64,))
        narrow, narrow_t = torch.randn(5, D), torch.randint(0, N, (5,))
        fresh_pool()
        want = step(head, narrow, narrow_t).clone()  # a fresh buffer
        want_bias = head.bias.grad.clone()
        step(head, wide, wide_t)  # the pool's buffer now holds a larger, different gradient
        got = step(head, narrow, narrow_t)  # ... and is emptied and refilled for the narrow batch
        assert torch.equal(got.to_dense() if sparse else got, want.to_dense() if sparse else want)
        assert torch.equal(head.bias.grad.to_dense() if sparse else head.bias.grad,
                           want_bias.to_dense() if sparse else want_bias)


def test_release_frees_idle_buffers_only():
    fresh_pool()
    assert xsoftmax.release_cached_gradients() == 0
    head = FullSoftmaxLoss(N, D)
    hidden, targets = torch.randn(8, D), torch.randint(0, N, (8,))
    grad = step(head, hidden, targets)
    values = grad.clone()
    assert xsoftmax.release_cached_gradients() == 0  # in use as .grad: kept
    assert torch.equal(head.weight.grad, values)
    del grad
    head.zero_grad(set_to_none=True)
    assert xsoftmax.release_cached_gradients() >= N * D * 4
    assert xsoftmax.release_cached_gradients() == 0
