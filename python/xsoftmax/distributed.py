# SPDX-License-Identifier: Apache-2.0
"""The exact softmax with its classes split across the ranks of a ``torch.distributed`` group
(vocabulary-parallel, as Megatron's cross-entropy and InsightFace's Partial FC).

Each rank holds the weight rows of a contiguous block of classes
(``class_range(num_classes, world_size, rank)``). A step needs one max and one sum all-reduce of
per-row statistics, an all-gather of the hidden rows (``layout='data_parallel'``: each rank passes
its own batch) and the return of each row's hidden gradient to its owner; the weight gradients
never leave their rank. The collectives run on the group given, through the C++ library's
``class_sharding`` over a communicator that wraps the group: CPU tensors over gloo or MPI; CUDA
tensors (a build with the CUDA operators) over the group's NCCL backend, on torch's current
stream, or through host copies over a group without NCCL (gloo: slower, for tests and several
ranks sharing one GPU, which NCCL refuses).

Example (every rank)::

    import torch.distributed as dist
    from xsoftmax.distributed import ShardedFullSoftmaxLoss

    dist.init_process_group("gloo")     # "nccl" with device="cuda" (one GPU per rank)
    head = ShardedFullSoftmaxLoss(num_classes=1_000_000, dim=256)   # this rank's rows only
    loss = head(hidden, targets)        # hidden, targets: this rank's batch
    loss.backward()                     # head.weight.grad: this rank's rows; hidden.grad: its rows
"""
import math

import torch
import torch.distributed as dist
from torch import nn

from . import _C, _ops
from ._loss_terms import check_loss_terms

__all__ = ["class_range", "ShardedFullSoftmaxLoss"]

_LAYOUTS = {"data_parallel": 0, "replicated": 1}


def class_range(num_classes, world_size, rank):
    """The classes ``[begin, end)`` rank ``rank`` of ``world_size`` holds: the library's split, where
    the first ``num_classes % world_size`` ranks hold one class more than the others."""
    n, s, r = int(num_classes), int(world_size), int(rank)
    if s < 1 or not 0 <= r < s:
        raise ValueError(f"class_range: rank = {r} must be in [0, world_size = {s})")
    if n < s:
        raise ValueError(f"class_range: num_classes = {n} is less than world_size = {s}: a rank would hold no class")
    base, extra = divmod(n, s)
    begin = r * base + min(r, extra)
    return begin, begin + base + (1 if r < extra else 0)


class _ShardedLoss(torch.autograd.Function):
    """Loss of this rank's rows; gradients for hidden (this rank's rows), weight and bias (this
    rank's classes, from every rank's rows)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, module, reduction):
        ctx.module, ctx.reduction = module, reduction
        fused = any(ctx.needs_input_grad[:3]) and reduction != 0  # mean / sum: the gradients now, for an upstream gradient of 1
        loss, gh, gw, gb = module._run(hidden, weight, bias, targets, reduction, None, fused)
        ctx.fused = fused
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), targets, gh, gw, gb)
        ctx.has_bias = bias is not None
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, bias, targets, gh, gw, gb = ctx.saved_tensors
        m = ctx.module
        bias = bias if ctx.has_bias else None
        g = grad_loss.float()
        if ctx.fused:
            # The saved weight gradient sums every rank's rows at upstream gradient 1: scaling it
            # is right only if every rank's upstream gradient is the same. One all-reduce tells.
            both = torch.stack([g.reshape(()), -g.reshape(())])
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=m.group)
            if float(both[0]) == -float(both[1]):
                gh, gw, gb = gh * g, gw * g, gb * g
            else:
                _, gh, gw, gb = m._run(hidden, weight, bias, targets, ctx.reduction, g.reshape(1), True)
        else:
            _, gh, gw, gb = m._run(hidden, weight, bias, targets, ctx.reduction, g.reshape(-1).contiguous(), True)
        grad_hidden = gh.to(hidden.dtype).reshape(hidden.shape) if ctx.needs_input_grad[0] else None
        grad_weight = gw.to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = gb.to(bias.dtype) if (bias is not None and ctx.needs_input_grad[2]) else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


class ShardedFullSoftmaxLoss(nn.Module):
    """Exact softmax cross-entropy over ``num_classes`` classes split across the ranks of
    ``group``; ``weight`` holds this rank's ``class_end - class_begin`` rows.

    Args:
        num_classes, dim: the whole layer is (num_classes x dim).
        group: a ``torch.distributed`` process group (default: the default group, which must be
            initialised). Every rank of it must build this module with the same arguments and call
            its methods in the same order (they are collectives).
        layout: 'data_parallel' (each rank passes its own batch, of any size; it gets the loss and
            the hidden gradients of its rows) or 'replicated' (every rank passes the same batch).
        bias: learn a per-class bias (this rank's classes).
        dtype: weight storage, torch.float32 / bfloat16 / float16 (arithmetic is float32).
        reduction, ignore_index: as in ``F.cross_entropy``, over this rank's rows.
        label_smoothing, z_loss: the library's loss terms (exact under sharding).
        gradient_filter: f in [0, 1), as ``FullSoftmaxLoss``'s (Cut Cross-Entropy's ``filter_eps``,
            per entry): the backward drops every entry of dloss/dlogit below f times its row's
            upstream gradient; 0 (the default): the exact gradient.
        margin: None, 'arcface' (target logit s cos(theta + m), InsightFace's form) or 'cosface'
            (s (cos theta - m)); every other logit is s cos theta, features and class weights
            L2-normalised (needs ``bias=False``). ``margin_scale`` is s (default 64, the papers'
            value for millions of identities; 16-32 suit fewer classes), ``margin_m`` is m
            (default 0.5 rad for ArcFace, 0.35 for CosFace). ``log_prob`` and ``predict`` stay
            margin-free (plain logits), as in the C++ library.
        init_scale: weights uniform in +-init_scale (default 1 / sqrt(dim)), drawn from ``seed``
            with the rank mixed in, so ranks differ.
        device: where the parameters live (default the CPU; ``.to()`` / ``.cuda()`` move them
            later). Every tensor of a call must be on the weight's device.

    Targets are global class ids. ``loss.backward()`` gives ``weight.grad`` for this rank's classes
    from every rank's rows; the upstream gradient of the loss may differ between ranks (then the
    backward pass recomputes), but every rank must call backward.
    """

    def __init__(self, num_classes, dim, group=None, layout="data_parallel", bias=False, dtype=torch.float32,
                 reduction="mean", ignore_index=-100, label_smoothing=0.0, z_loss=0.0, margin=None,
                 margin_scale=64.0, margin_m=None, init_scale=None, seed=0, device=None, gradient_filter=0.0):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ShardedFullSoftmaxLoss: torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first)")
        if layout not in _LAYOUTS:
            raise ValueError(f"layout = {layout!r} must be 'data_parallel' or 'replicated'")
        if reduction not in _ops.REDUCTIONS:
            raise ValueError(f"reduction = {reduction!r} must be 'mean', 'sum' or 'none'")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype = {dtype} must be torch.float32, torch.bfloat16 or torch.float16")
        if int(dim) < 1:
            raise ValueError(f"dim = {dim} must be >= 1")
        terms = check_loss_terms(label_smoothing, z_loss, margin, margin_scale, margin_m, bias,
                                 gradient_filter=gradient_filter)
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.num_classes, self.dim = int(num_classes), int(dim)
        self.class_begin, self.class_end = class_range(self.num_classes, self.world_size, self.rank)
        self.layout, self.reduction, self.ignore_index = layout, reduction, int(ignore_index)
        self.label_smoothing, self.z_loss, self._margin_code, self.margin_scale, self.margin_m = terms[:5]
        self.gradient_filter = terms[6]
        self.margin = margin
        rows = self.class_end - self.class_begin
        scale = init_scale if init_scale is not None else 1.0 / math.sqrt(self.dim)
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + self.rank)
        w = (torch.rand(rows, self.dim, generator=gen) * 2 - 1) * scale
        self.weight = nn.Parameter(w.to(device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(rows, dtype=dtype, device=device)) if bias else None

    def extra_repr(self):
        return (f"num_classes={self.num_classes}, dim={self.dim}, rank={self.rank}/{self.world_size}, "
                f"classes=[{self.class_begin}, {self.class_end}), layout={self.layout!r}, "
                f"bias={self.bias is not None}, dtype={self.weight.dtype}, reduction={self.reduction!r}")

    def shard_of(self, full):
        """This rank's rows of a (num_classes x ...) tensor (e.g. to load a whole layer's weights)."""
        if full.shape[0] != self.num_classes:
            raise ValueError(f"shard_of: {tuple(full.shape)} has {full.shape[0]} rows, expected num_classes = "
                             f"{self.num_classes}")
        return full[self.class_begin:self.class_end]

    def _rows(self, hidden, targets=None):
        if hidden.dim() < 1 or hidden.shape[-1] != self.dim:
            raise ValueError(f"hidden has shape {tuple(hidden.shape)}; its last dimension must be dim = {self.dim}")
        if targets is not None:
            if targets.dtype != torch.int64:
                raise ValueError(f"targets.dtype = {targets.dtype} must be torch.int64 (class indices)")
            if tuple(targets.shape) != tuple(hidden.shape[:-1]):
                raise ValueError(f"targets has shape {tuple(targets.shape)} but hidden has shape "
                                 f"{tuple(hidden.shape)}; expected {tuple(hidden.shape[:-1])}")
            targets = targets.reshape(-1)
        return hidden.reshape(-1, self.dim), targets

    def _run(self, hidden, weight, bias, targets, reduction, grad_output, want_gradients):
        return _C.sharded_full_run(self.group, hidden, weight.detach(), None if bias is None else bias.detach(),
                                   targets, self.num_classes, _LAYOUTS[self.layout], reduction, self.ignore_index,
                                   self.label_smoothing, self.z_loss, self._margin_code, self.margin_scale,
                                   self.margin_m, self.gradient_filter, grad_output, want_gradients)

    def forward(self, hidden, targets):
        """The loss of this rank's rows (per ``reduction``)."""
        lead = hidden.shape[:-1]
        h, t = self._rows(hidden, targets)
        red = _ops.REDUCTIONS[self.reduction]
        out = _ShardedLoss.apply(h, self.weight, self.bias, t, self, red)
        return out.reshape(lead) if red == 0 else out

    def log_prob(self, hidden, targets):
        """log p(targets | hidden) of this rank's rows (not differentiable)."""
        lead = hidden.shape[:-1]
        h, t = self._rows(hidden, targets)
        with torch.no_grad():
            nll = _C.sharded_full_run(self.group, h, self.weight, self.bias, t, self.num_classes,
                                      _LAYOUTS[self.layout], 0, _ops.INT64_MIN, 0.0, 0.0, 0, 1.0, 0.0, 0.0, None,
                                      False)[0]
        return (-nll).reshape(lead)

    def predict(self, hidden, k=1):
        """(log-probabilities, classes) of the k most probable classes of this rank's rows, best first."""
        if not 1 <= int(k) <= self.num_classes:
            raise ValueError(f"k = {k} must be in [1, num_classes = {self.num_classes}]")
        lead = hidden.shape[:-1]
        h, _ = self._rows(hidden)
        with torch.no_grad():
            values, classes = _C.sharded_full_topk(self.group, h, self.weight, self.bias, self.num_classes,
                                                   _LAYOUTS[self.layout], int(k))
        return values.reshape(tuple(lead) + (k,)), classes.reshape(tuple(lead) + (k,))

    def evaluate(self, hidden, targets, k=1):
        """(loss, log-probabilities, classes) of this rank's rows: ``forward``'s loss (this module's
        reduction and loss terms) and ``predict``'s top-k from one pass over each rank's scores, a
        validation step's loss and accuracy@k for one score GEMM a rank instead of two. Collective,
        like ``forward``. Not differentiable. Rows whose target is ``ignore_index`` get class -1 and
        log-probability -inf. Raises ``ValueError`` with a margin (its target logit is not a
        prediction: call ``forward`` and ``predict``) and unless 1 <= k <= num_classes."""
        if not 1 <= int(k) <= self.num_classes:
            raise ValueError(f"k = {k} must be in [1, num_classes = {self.num_classes}]")
        if self._margin_code:
            raise ValueError(f"evaluate: margin = {self.margin!r}: an angular margin changes the target's logit in "
                             f"the loss, so its scores are not the model's prediction; call forward and predict")
        k = int(k)
        lead = tuple(hidden.shape[:-1])
        h, t = self._rows(hidden, targets)
        with torch.no_grad():
            loss, values, classes = _C.sharded_full_evaluate(
                self.group, h, self.weight, self.bias, t, self.num_classes, _LAYOUTS[self.layout],
                _ops.REDUCTIONS[self.reduction], self.ignore_index, self.label_smoothing, self.z_loss, k)
        red = _ops.REDUCTIONS[self.reduction]
        return (loss.reshape(lead) if red == 0 else loss), values.reshape(lead + (k,)), classes.reshape(lead + (k,))
