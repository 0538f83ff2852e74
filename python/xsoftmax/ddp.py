# SPDX-License-Identifier: Apache-2.0
"""Data-parallel training (DistributedDataParallel) of a model whose xsoftmax heads have
``sparse_grad=True``.

DDP reduces dense gradients in buckets and expects a sparse gradient only from ``nn.Embedding`` /
``nn.EmbeddingBag`` modules with ``sparse=True`` (it decides by the module's type); any other
parameter with a sparse gradient makes its reducer fail ("Cannot access storage of
SparseTensorImpl"). The recipe: DDP reduces every other parameter, the heads' sparse gradients are
reduced by :func:`all_reduce_sparse_gradients`, between ``backward()`` and the optimiser step::

    from xsoftmax.ddp import all_reduce_sparse_gradients, ignore_sparse_heads

    ignore_sparse_heads(model)                  # before wrapping: DDP leaves those parameters alone
    ddp = DistributedDataParallel(model)
    loss = ddp(x, y)
    loss.backward()                             # DDP all-reduces the dense gradients (averaged)
    all_reduce_sparse_gradients(model)          # the heads' sparse gradients, averaged the same way
    optimizer.step()                            # e.g. torch.optim.SparseAdam for the head

Only the rows some rank touched travel: each rank's coalesced rows and values are all-gathered
(any backend with ``all_gather``: gloo, NCCL, MPI) and summed, so every rank ends with the same
sparse gradient, the mean over ranks as DDP's.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .torch import _SoftmaxHead

__all__ = ["sparse_head_parameters", "ignore_sparse_heads", "all_reduce_sparse_gradients"]


def sparse_head_parameters(model):
    """(name, parameter) of every parameter of an xsoftmax head with ``sparse_grad=True`` in ``model``."""
    out = []
    for prefix, module in model.named_modules():
        if isinstance(module, _SoftmaxHead) and module.sparse_grad:
            for name, p in module.named_parameters(recurse=False):
                out.append((f"{prefix}.{name}" if prefix else name, p))
    return out


def ignore_sparse_heads(model):
    """Makes a later ``DistributedDataParallel(model)`` leave the parameters of the sparse-gradient
    heads alone (they are reduced by :func:`all_reduce_sparse_gradients`). Call before wrapping.
    Returns their names."""
    names = [name for name, _ in sparse_head_parameters(model)]
    if names:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    return names


def _all_gather_rows(rows, values, group):
    """Every rank's (rows, values), concatenated: sizes first, then padded to the largest."""
    world = dist.get_world_size(group)
    count = torch.tensor([rows.numel()], dtype=torch.int64, device=rows.device)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    counts = [int(c.item()) for c in counts]
    most = max(counts)
    padded_rows = rows.new_zeros(most)
    padded_rows[:rows.numel()] = rows
    padded_values = values.new_zeros((most,) + tuple(values.shape[1:]))
    padded_values[:rows.numel()] = values
    all_rows = [torch.empty_like(padded_rows) for _ in range(world)]
    all_values = [torch.empty_like(padded_values) for _ in range(world)]
    dist.all_gather(all_rows, padded_rows, group=group)
    dist.all_gather(all_values, padded_values, group=group)
    return (torch.cat([r[:c] for r, c in zip(all_rows, counts)]),
            torch.cat([v[:c] for v, c in zip(all_values, counts)]))


@torch.no_grad()
def all_reduce_sparse_gradients(model, group=None, average=True):
    """Sums (``average``: and divides by the world size, as DDP does) the sparse gradients of the
    heads with ``sparse_grad=True`` over the ranks of ``group`` (default: the world), in place of
    each ``.grad``. A head that got no gradient on a rank (``grad`` None) counts as zero there; every
    rank must call this, with the same model. Returns the number of parameters reduced."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("xsoftmax.ddp.all_reduce_sparse_gradients: torch.distributed is not initialised "
                           "(dist.init_process_group first)")
    world = dist.get_world_size(group)
    params = sparse_head_parameters(model)
    for name, p in params:
        g = p.grad
        if g is None:
            g = torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.int64, device=p.device),
                                        torch.empty((0,) + tuple(p.shape[1:]), dtype=p.dtype, device=p.device),
                                        p.shape)
        if not g.is_sparse:
            raise ValueError(f"xsoftmax.ddp.all_reduce_sparse_gradients: {name}.grad is dense; this reduces the "
                             f"sparse gradients of heads with sparse_grad=True (let DDP reduce dense ones)")
        g = g.coalesce()
        rows, values = _all_gather_rows(g.indices()[0], g.values(), group)
        if average:
            values = values / world
        p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, p.shape).coalesce()
    return len(params)
