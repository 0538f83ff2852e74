# SPDX-License-Identifier: Apache-2.0
"""ShardedFullSoftmaxLoss over a gloo process group (2 and 3 ranks, spawned processes) against
F.cross_entropy over the whole layer in float64: losses, hidden gradients of each rank's rows,
and each rank's weight and bias gradient rows, for uneven class and batch splits, every reduction,
label smoothing, ignored targets, upstream gradients that differ between ranks, the replicated
layout, gradient filtering, log_prob and predict. The same on CUDA tensors (where a GPU and the CUDA operators are
there): 2 gloo ranks sharing one GPU (the device buffers staged through the host) and one NCCL rank."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import requires_cuda

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this torch build")

N, D = 1003, 16       # 1003 classes: no world size here divides it
BATCHES = [5, 3, 4]   # rows per rank (data-parallel), uneven on purpose


def _layer(seed=7):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, D, generator=g, dtype=torch.float64) * 0.3
    b = torch.randn(N, generator=g, dtype=torch.float64) * 0.1
    return w, b


def _batch(world, seed=11):
    g = torch.Generator().manual_seed(seed)
    sizes = BATCHES[:world]
    h = torch.randn(sum(sizes), D, generator=g, dtype=torch.float64)
    t = torch.randint(0, N, (sum(sizes),), generator=g)
    t[1] = -100                      # an ignored row (rank 0's)
    t[min(sizes[0], len(t) - 1)] = N - 1   # the last class, on the last rank's shard
    return h, t, sizes


def _close(a, b, what, rtol=2e-5, atol=2e-6):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: max abs difference {(a - b).abs().max().item():.3g}")


def _reference(w, b, h, t, sizes, reduction, smoothing, upstream):
    """d(sum_q upstream_q . loss_q)/d(w, b, h) in float64, loss_q = cross-entropy of rank q's rows."""
    w, b, h = (x.clone().requires_grad_() for x in (w, b, h))
    losses, total, start = [], 0.0, 0
    for q, n in enumerate(sizes):
        rows = slice(start, start + n)
        lq = F.cross_entropy(h[rows] @ w.T + b, t[rows], reduction=reduction, label_smoothing=smoothing)
        losses.append(lq.detach())
        total = total + (lq * upstream[q]).sum()
        start += n
    total.backward()
    return losses, w.grad, b.grad, h.grad


def _check_step(head, w, b, h, t, sizes, rank, reduction, smoothing, upstream, device):
    start = sum(sizes[:rank])
    rows = slice(start, start + sizes[rank])
    with torch.no_grad():
        head.weight.copy_(head.shard_of(w).float())
        head.bias.copy_(head.shard_of(b).float())
    head.weight.grad = head.bias.grad = None
    head.reduction = reduction
    head.label_smoothing = smoothing
    mine = h[rows].float().to(device).requires_grad_()
    loss = head(mine, t[rows].to(device))
    (loss * upstream[rank].float().to(device)).sum().backward()
    losses, gw, gb, gh = _reference(w, b, h, t, sizes, reduction, smoothing, upstream)
    what = f"rank {rank}, reduction {reduction}, smoothing {smoothing}"
    _close(loss, losses[rank], f"{what}: loss")
    _close(mine.grad, gh[rows], f"{what}: grad_hidden")
    _close(head.weight.grad, head.shard_of(gw), f"{what}: weight grad")
    _close(head.bias.grad, head.shard_of(gb), f"{what}: bias grad")


def _worker(rank, world, init_file, device="cpu", backend="gloo"):
    from xsoftmax.distributed import ShardedFullSoftmaxLoss, class_range
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        w, b = _layer()
        h, t, sizes = _batch(world)
        head = ShardedFullSoftmaxLoss(N, D, bias=True, device=device)
        assert head.weight.device.type == device
        assert (head.class_begin, head.class_end) == class_range(N, world, rank)
        assert head.weight.shape == (head.class_end - head.class_begin, D)
        same = [torch.tensor(1.0, dtype=torch.float64)] * world
        twice = [torch.tensor(2.0, dtype=torch.float64)] * world
        differ = [torch.tensor(0.5 + q, dtype=torch.float64) for q in range(world)]
        _check_step(head, w, b, h, t, sizes, rank, "mean", 0.0, same, device)
        _check_step(head, w, b, h, t, sizes, rank, "sum", 0.1, same, device)
        _check_step(head, w, b, h, t, sizes, rank, "mean", 0.0, twice, device)    # the saved gradients, scaled
        _check_step(head, w, b, h, t, sizes, rank, "mean", 0.0, differ, device)   # the recomputing backward
        g = torch.Generator().manual_seed(5)
        per_row = [torch.randn(n, generator=g, dtype=torch.float64) for n in sizes]
        _check_step(head, w, b, h, t, sizes, rank, "none", 0.0, per_row, device)

        # log_prob and predict of this rank's rows against the whole layer's log-softmax.
        start = sum(sizes[:rank])
        rows = slice(start, start + sizes[rank])
        logp = torch.log_softmax(h[rows] @ w.T + b, dim=1)
        safe = t[rows].clamp(min=0)
        _close(head.log_prob(h[rows].float().to(device), safe.to(device)), logp.gather(1, safe[:, None])[:, 0],
               "log_prob")
        values, classes = head.predict(h[rows].float().to(device), k=3)
        assert values.device.type == device and classes.device.type == device
        ref_values, ref_classes = logp.topk(3, dim=1)
        classes = classes.cpu()
        assert torch.equal(classes, ref_classes), f"rank {rank}: predict classes {classes} != {ref_classes}"
        _close(values, ref_values, "predict log-probabilities")

        # evaluate: forward's loss and predict's top-k from one pass (ignored rows: -1 / -inf).
        loss, values, classes = head.evaluate(h[rows].float().to(device), t[rows].to(device), k=3)
        with torch.no_grad():
            _close(loss, head(h[rows].float().to(device), t[rows].to(device)), "evaluate loss")
        classes = classes.cpu()
        kept = t[rows] != -100
        assert torch.equal(classes[kept], ref_classes[kept]), f"rank {rank}: evaluate classes {classes}"
        assert (classes[~kept] == -1).all()
        _close(values[kept.to(values.device)], ref_values[kept], "evaluate log-probabilities")

        # Replicated rows: every rank passes the whole batch and gets the whole loss and gradient.
        rep = ShardedFullSoftmaxLoss(N, D, bias=True, layout="replicated", device=device)
        with torch.no_grad():
            rep.weight.copy_(rep.shard_of(w).float())
            rep.bias.copy_(rep.shard_of(b).float())
        all_rows = h.float().to(device).requires_grad_()
        rep(all_rows, t.to(device)).backward()
        losses, gw, _, gh = _reference(w, b, h, t, [h.shape[0]], "mean", 0.0, [torch.tensor(1.0)])
        _close(all_rows.grad, gh, "replicated grad_hidden")
        _close(rep.weight.grad, rep.shard_of(gw), "replicated weight grad")

        # Gradient filtering under sharding (replicated rows): every entry of p - onehot below the cut
        # dropped (float64 reference over the whole layer); the cut in the widest gap between the
        # magnitudes in [0.005, 0.5], so none is near it.
        p = torch.softmax(h @ w.T + b, dim=1)
        keep = t != -100
        onehot = torch.zeros_like(p)
        onehot[keep] = onehot[keep].scatter(1, t[keep][:, None], 1.0)
        mags = sorted(x for x in (p - onehot)[keep].abs().flatten().tolist() if 0.005 <= x <= 0.5)
        ratio, cut = max((hi / lo, (lo * hi) ** 0.5) for lo, hi in zip(mags, mags[1:]))
        assert ratio > 1.001
        gd = torch.where((p - onehot).abs() < cut, 0.0, p - onehot) * (keep.double() / keep.sum())[:, None]
        filt = ShardedFullSoftmaxLoss(N, D, bias=True, layout="replicated", device=device, gradient_filter=cut)
        with torch.no_grad():
            filt.weight.copy_(filt.shard_of(w).float())
            filt.bias.copy_(filt.shard_of(b).float())
        all_rows = h.float().to(device).requires_grad_()
        filt(all_rows, t.to(device)).backward()
        _close(all_rows.grad, gd @ w, "filtered grad_hidden")
        _close(filt.weight.grad, filt.shard_of(gd.T @ h), "filtered weight grad")
        _close(filt.bias.grad, filt.shard_of(gd.sum(0)), "filtered bias grad")
        assert (gd != 0).sum() < 0.5 * keep.sum() * N  # the filter dropped most entries

        # ArcFace under sharding (no bias): normalised rows and weights, s cos(theta_t + m) on the target.
        arc = ShardedFullSoftmaxLoss(N, D, margin="arcface", margin_scale=16.0, margin_m=0.3, device=device)
        with torch.no_grad():
            arc.weight.copy_(arc.shard_of(w).float())
        mine = h[rows].float().to(device).requires_grad_()
        arc(mine, t[rows].to(device)).backward()
        wr, hr = w.clone().requires_grad_(), h[rows].clone().requires_grad_()
        cos = F.normalize(hr, dim=1) @ F.normalize(wr, dim=1).T
        keep = t[rows] != -100
        tc = cos[keep].gather(1, t[rows][keep][:, None])[:, 0]
        theta = torch.acos(tc.clamp(-1, 1))
        logits = 16.0 * cos[keep].scatter(1, t[rows][keep][:, None], torch.cos(theta + 0.3)[:, None])
        ref = F.cross_entropy(logits, t[rows][keep])
        # The weight gradient sums every rank's loss: rank q's rows against the same weights.
        total = 0.0
        start_q = 0
        for q, n in enumerate(sizes):
            rq = slice(start_q, start_q + n)
            hq = hr if q == rank else h[rq]
            cq = F.normalize(hq, dim=1) @ F.normalize(wr, dim=1).T
            kq = t[rq] != -100
            tq = cq[kq].gather(1, t[rq][kq][:, None])[:, 0]
            lq = 16.0 * cq[kq].scatter(1, t[rq][kq][:, None], torch.cos(torch.acos(tq.clamp(-1, 1)) + 0.3)[:, None])
            total = total + F.cross_entropy(lq, t[rq][kq])
            start_q += n
        total.backward()
        _close(arc(h[rows].float().to(device), t[rows].to(device)), ref, "arcface loss")
        _close(mine.grad, hr.grad, "arcface grad_hidden")
        _close(arc.weight.grad, arc.shard_of(wr.grad), "arcface weight grad")
        with pytest.raises(ValueError, match="bias=False"):
            ShardedFullSoftmaxLoss(N, D, margin="cosface", bias=True)
        with pytest.raises(ValueError, match="angular margin"):  # refused before any collective
            arc.evaluate(h[rows].float().to(device), t[rows].to(device), k=2)

        # The communicator's all_to_all (the sharded hierarchical softmax's routing): rank p sends
        # q + 1 copies of 100 p + q to rank q.
        from xsoftmax import _C
        send = torch.cat([torch.full((q + 1,), 100 * rank + q, dtype=torch.int64) for q in range(world)])
        got = _C.communicator_all_to_all(dist.group.WORLD, send.to(device), [q + 1 for q in range(world)])
        assert got.device.type == device
        got = got.cpu()
        want = torch.cat([torch.full((rank + 1,), 100 * p + rank, dtype=torch.int64) for p in range(world)])
        assert torch.equal(got, want), f"rank {rank}: all_to_all gave {got.tolist()}, expected {want.tolist()}"

        # Bad input names the argument; a bad layout is refused before any collective.
        with pytest.raises(ValueError, match="layout"):
            ShardedFullSoftmaxLoss(N, D, layout="columns")
        with pytest.raises(ValueError, match="world_size"):
            class_range(world - 1, world, 0)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_full_softmax_equals_whole_layer(world, tmp_path):
    mp.spawn(_worker, args=(world, str(tmp_path / "init")), nprocs=world, join=True)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("world, backend", [(2, "gloo"), (1, "nccl")])
def test_sharded_full_softmax_on_cuda_equals_whole_layer(world, backend, tmp_path):
    # gloo: two ranks on the one GPU, device buffers through host copies (NCCL refuses two ranks on
    # one device); NCCL: one rank, device buffers as they are.
    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL in this build")
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), "cuda", backend), nprocs=world, join=True)


def test_class_range_split():
    from xsoftmax.distributed import class_range
    ranges = [class_range(10, 4, r) for r in range(4)]
    assert ranges == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_needs_an_initialised_group():
    from xsoftmax.distributed import ShardedFullSoftmaxLoss
    if dist.is_initialized():
        pytest.skip("a default group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        ShardedFullSoftmaxLoss(10, 4)
