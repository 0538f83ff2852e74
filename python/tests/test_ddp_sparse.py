# SPDX-License-Identifier: Apache-2.0
"""DistributedDataParallel with sparse_grad=True heads (xsoftmax.ddp's recipe), two gloo ranks in
spawned processes: after backward() and all_reduce_sparse_gradients, every rank holds the gradients
of the mean of the ranks' losses (DDP's convention), dense and sparse, equal to one process's over
all the ranks' batches; and an optimiser step leaves the ranks' weights equal."""
import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this torch build")

N, D, F_IN, B, WORLD = 500, 12, 7, 16, 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from xsoftmax import FullSoftmaxLoss, HierarchicalSoftmaxLoss, Tree
        torch.manual_seed(3)
        self.proj = torch.nn.Linear(F_IN, D)
        self.hs = HierarchicalSoftmaxLoss(N, D, tree=Tree.uniform(N, 2, 23), bias=True, sparse_grad=True)
        self.full = FullSoftmaxLoss(N, D, sparse_grad=True)

    def forward(self, x, y):
        h = self.proj(x)
        return self.hs(h, y) + 0.5 * self.full(h, y)


def _batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(B, F_IN, generator=g), torch.randint(0, N, (B,), generator=g)


def _dense(g):
    return g.to_dense() if g.is_sparse else g


def _check(rank):
    from torch.nn.parallel import DistributedDataParallel

    from xsoftmax.ddp import all_reduce_sparse_gradients, ignore_sparse_heads

    model = Model()
    reference = Model()  # one process, every rank's batch: the mean of the ranks' losses
    ignored = ignore_sparse_heads(model)
    assert sorted(ignored) == ["full.weight", "hs.bias", "hs.weight"], ignored
    ddp = DistributedDataParallel(model)
    x, y = _batch(rank)
    ddp(x, y).backward()
    assert all_reduce_sparse_gradients(model) == 3
    (sum(reference(*_batch(r)) for r in range(WORLD)) / WORLD).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.grad.is_sparse == q.grad.is_sparse, name
        if not torch.allclose(_dense(p.grad), _dense(q.grad), rtol=1e-5, atol=1e-6):
            raise AssertionError(f"rank {rank}: {name}: max difference "
                                 f"{(_dense(p.grad) - _dense(q.grad)).abs().max().item():.3g}")
    # A step keeps the ranks' weights equal (what DDP promises for the dense ones).
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    for name, p in model.named_parameters():
        others = [torch.empty_like(p.detach()) for _ in range(WORLD)]
        dist.all_gather(others, p.detach())
        assert all(torch.equal(o, others[0]) for o in others), f"{name} differs between ranks after a step"
    dist.barrier()


def _worker(rank, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        # The model, its DDP wrapper and the collectives' tensors live in _check's frame and are gone
        # when it returns, so that destroy_process_group drops the last reference to the process
        # group and its destructor joins gloo's worker threads. Left alive (DDP holds the group),
        # a worker thread could release the last all_gather's tensors during the interpreter's
        # finalisation, needing the GIL there: torch's ProcessGroupGloo::runLoop then calls
        # std::terminate (SIGABRT, ~1 run in 30 here).
        _check(rank)
        gc.collect()  # and any reference cycle through them
    finally:
        dist.destroy_process_group()


def test_ddp_with_sparse_gradient_heads_two_gloo_ranks(tmp_path):
    init_file = os.path.join(str(tmp_path), "init")
    mp.spawn(_worker, args=(init_file,), nprocs=WORLD, join=True)
