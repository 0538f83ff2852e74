# SPDX-License-Identifier: Apache-2.0
"""PyTorch modules over the xsoftmax heads.

Every module is a loss: ``module(hidden, targets)`` with ``hidden`` of shape (..., dim) and int64
``targets`` of shape (...), with the conventions of ``F.cross_entropy`` (``reduction`` 'mean' |
'sum' | 'none', ``ignore_index``). The class weights are ``module.weight`` (an ``nn.Parameter`` of
float32, bfloat16 or float16; the C++ head reads and writes it in place) and ``module.bias``.

* ``FullSoftmaxLoss``          exact softmax over all classes (never materialises the logits)
* ``HierarchicalSoftmaxLoss``  softmax (or sigmoid, word2vec) nodes along a tree (``Tree``)
* ``SampledSoftmaxLoss``       sampled softmax with log-Q correction (training); exact in eval
* ``KNNSoftmaxLoss``           softmax over the targets' nearest classes (training); exact in eval

Weight gradients are dense by default; ``sparse_grad=True`` gives sparse COO gradients of the rows
a step touched (for ``torch.optim.SparseAdam`` / ``SGD``; eager mode only).
"""
import functools
import math
import weakref

import torch
from torch import nn

from . import _C, _ops
from ._loss_terms import any_terms, check_class_weight, check_loss_terms
from .tree import Tree

__all__ = ["Tree", "FullSoftmaxLoss", "HierarchicalSoftmaxLoss", "SampledSoftmaxLoss", "KNNSoftmaxLoss"]


# --------------------------------------------------------------------------------------------------
# Handles of C++ head state (trees, samplers, KNN graphs)
# --------------------------------------------------------------------------------------------------

class _Handle:
    """Owns one C++ head state; released when garbage-collected. Copies (deepcopy, pickling) make
    a new state from the same recipe."""

    def __init__(self, factory):
        self._factory = factory
        self.value = int(factory())
        self._finalizer = weakref.finalize(self, _C.release, self.value)

    def __deepcopy__(self, memo):
        return _Handle(self._factory)

    def __reduce__(self):
        return (_Handle, (self._factory,))


def _make_full(score_cache_bytes, row_block):
    return _C.create_full(score_cache_bytes, row_block)


def _with_loss_terms(factory, terms):
    """A handle from ``factory`` with the module's loss terms set on it (a recipe, so that copies of
    the module get them too)."""
    handle = factory()
    _C.set_loss_terms(handle, *terms)
    return handle


def _recipe(factory, terms):
    """``factory``, or with the loss terms when they change the loss."""
    return functools.partial(_with_loss_terms, factory, terms) if any_terms(terms) else factory


def _make_tree(parent, leaf_class, num_classes, sigmoid):
    return _C.create_tree(parent, leaf_class, num_classes, sigmoid)


def _make_sampled(*args):
    return _C.create_sampled(*args)


def _make_knn(*args):
    return _C.create_knn(*args)


# --------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_reduction(reduction):
    if reduction not in _ops.REDUCTIONS:
        raise ValueError(f"reduction = {reduction!r} must be 'mean', 'sum' or 'none'")
    return reduction


def _check_device_supported(device):
    """CPU always; CUDA when this build has its CUDA operators (raises ValueError otherwise)."""
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise ValueError(f"device = {device}: the xsoftmax heads run on CPU and CUDA tensors")
    if not _ops.has_cuda():
        info = _ops.build_info()
        raise ValueError(f"device = {device}: this build of xsoftmax has no CUDA operators "
                         f"({info['why_no_cuda'] or 'not built'}); reinstall it with a CUDA build of torch and nvcc "
                         f"found (pip install --no-build-isolation ./python; XSOFTMAX_WITH_CUDA=1 makes a failed CUDA "
                         f"build an error)")


class _SoftmaxHead(nn.Module):
    """Shared parts: parameters, input checks, flattening of leading dimensions."""

    def __init__(self, num_classes, dim, weight_rows, bias, dtype, reduction, ignore_index, sparse_grad, device,
                 init_scale=None, class_weight=None):
        super().__init__()
        if int(num_classes) < 1:
            raise ValueError(f"num_classes = {num_classes} must be >= 1")
        if int(dim) < 1:
            raise ValueError(f"dim = {dim} must be >= 1")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype = {dtype} must be torch.float32, torch.bfloat16 or torch.float16")
        if device is not None:
            _check_device_supported(torch.device(device))
        self.num_classes = int(num_classes)
        self.dim = int(dim)
        self.reduction = reduction  # checked by the property's setter
        self.ignore_index = int(ignore_index)
        self.sparse_grad = bool(sparse_grad)
        self.weight = nn.Parameter(torch.empty(int(weight_rows), self.dim, dtype=dtype, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(int(weight_rows), dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self._init_scale = init_scale
        self.reset_parameters()
        # Per-class weights (F.cross_entropy's `weight`): a buffer, so that .to() / .cuda() and
        # state_dict carry it; None when not given.
        cw = check_class_weight(class_weight, self.num_classes)
        self.register_buffer("class_weight", None if cw is None else cw.to(self.weight.device))

    @property
    def reduction(self):
        """'mean', 'sum' or 'none'; checked when set (also after construction)."""
        return self._reduction

    @reduction.setter
    def reduction(self, value):
        self._reduction = _check_reduction(value)

    def reset_parameters(self):
        scale = self._init_scale if self._init_scale is not None else 1.0 / math.sqrt(self.dim)
        with torch.no_grad():
            self.weight.uniform_(-scale, scale)
            if self.bias is not None:
                self.bias.zero_()

    def _set_loss_terms(self, terms, margin):
        """Keeps the checked loss terms (see ``_loss_terms.check_loss_terms``) as attributes."""
        self.label_smoothing, self.z_loss, _, self.margin_scale, self.margin_m, self.softcap = terms[:6]
        self.gradient_filter = terms[6]
        self.margin = margin

    def extra_repr(self):
        text = (f"num_classes={self.num_classes}, dim={self.dim}, weight_rows={self.weight.shape[0]}, "
                f"bias={self.bias is not None}, dtype={self.weight.dtype}, reduction={self.reduction!r}, "
                f"ignore_index={self.ignore_index}, sparse_grad={self.sparse_grad}")
        if getattr(self, "label_smoothing", 0.0):
            text += f", label_smoothing={self.label_smoothing}"
        if getattr(self, "z_loss", 0.0):
            text += f", z_loss={self.z_loss}"
        if getattr(self, "margin", None) is not None:
            text += f", margin={self.margin!r}, margin_scale={self.margin_scale}, margin_m={self.margin_m}"
        if getattr(self, "softcap", 0.0):
            text += f", softcap={self.softcap}"
        if getattr(self, "gradient_filter", 0.0):
            text += f", gradient_filter={self.gradient_filter}"
        if self.class_weight is not None:
            text += ", class_weight=tensor"
        return text

    # -- helpers ----------------------------------------------------------------------------------

    def _hidden_2d(self, hidden):
        if not isinstance(hidden, torch.Tensor):
            raise TypeError(f"hidden must be a torch.Tensor, got {type(hidden).__name__}")
        self._check_device("hidden", hidden)
        if hidden.dim() < 1 or hidden.shape[-1] != self.dim:
            raise ValueError(f"hidden has shape {tuple(hidden.shape)}; its last dimension must be dim = {self.dim}")
        if not hidden.is_floating_point():
            raise ValueError(f"hidden.dtype = {hidden.dtype} must be a floating-point type")
        if hidden.dtype not in (torch.float32, self.weight.dtype):
            hidden = hidden.float()
        return hidden.reshape(-1, self.dim)

    def _check_device(self, name, tensor):
        """Every tensor of a call on the weight's device: a CPU head never reads a meta or CUDA
        tensor's memory (a meta target once gave an uninitialised loss)."""
        if tensor.device != self.weight.device:
            raise ValueError(f"{name} is on device {tensor.device} but the head's weight is on {self.weight.device}: "
                             f"move {name} to {self.weight.device} (or the module to {tensor.device}, where supported)")

    def _targets_1d(self, targets, hidden):
        if not isinstance(targets, torch.Tensor):
            raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
        self._check_device("targets", targets)
        if targets.dtype != torch.int64:
            raise ValueError(f"targets.dtype = {targets.dtype} must be torch.int64 (class indices)")
        if tuple(targets.shape) != tuple(hidden.shape[:-1]):
            raise ValueError(f"targets has shape {tuple(targets.shape)} but hidden has shape {tuple(hidden.shape)}; "
                             f"expected targets of shape {tuple(hidden.shape[:-1])}")
        return targets.reshape(-1)

    def _loss(self, hidden, targets, head, step, reduction=None, ignore_index=None, weight=None, bias=None,
              class_weight=None):
        reduction = self.reduction if reduction is None else _check_reduction(reduction)
        ignore_index = self.ignore_index if ignore_index is None else ignore_index
        weight = self.weight if weight is None else weight
        bias = self.bias if bias is None else bias
        h = self._hidden_2d(hidden)  # first: checks that hidden is a tensor
        lead = hidden.shape[:-1]
        t = self._targets_1d(targets, hidden)
        red = _ops.REDUCTIONS[reduction]
        if h.shape[0] == 0:  # empty batch: F.cross_entropy's values (nan mean, 0 sum, empty none)
            zero = h.sum() * 0.0 + weight.sum() * 0.0
            if red == 0:
                return hidden.new_zeros(lead, dtype=torch.float32)
            return zero / 0.0 if red == 1 else zero
        if class_weight is not None:
            self._check_device("class_weight", class_weight)
        out = _ops.loss(h, weight, bias, t, red, ignore_index, head, step, self.sparse_grad, class_weight)
        return out.reshape(lead) if red == 0 else out

    def _log_prob(self, hidden, targets, head):
        # No target is ignored here (ignore_index INT64_MIN): a bad target's message must not
        # mention an ignore_index the caller never gave.
        try:
            return -self._loss(hidden, targets, head, None, reduction="none", ignore_index=_ops.INT64_MIN)
        except IndexError as e:
            raise IndexError(str(e).replace(f" and is not ignore_index ({_ops.INT64_MIN})", "")) from None

    def _predict(self, hidden, k, head, beam_width=0, return_expansions=False):
        h = self._hidden_2d(hidden)
        lead = tuple(hidden.shape[:-1])
        if not 1 <= int(k) <= self.num_classes:
            raise ValueError(f"k = {k} must be in [1, num_classes = {self.num_classes}]")
        if h.shape[0] == 0:
            values = h.new_empty(lead + (k,), dtype=torch.float32)
            indices = h.new_empty(lead + (k,), dtype=torch.int64)
            expansions = h.new_empty(lead, dtype=torch.int64)
        else:
            with torch.no_grad():
                values, indices, expansions = _ops.topk(h, self.weight, self.bias, int(k), head, int(beam_width),
                                                        return_expansions=True)
            values, indices, expansions = (values.reshape(lead + (k,)), indices.reshape(lead + (k,)),
                                           expansions.reshape(lead))
        return (values, indices, expansions) if return_expansions else (values, indices)

    def _evaluate(self, hidden, targets, k, head):
        """(loss, log-probabilities, classes) of the full softmax handle `head` in one pass
        (``xsoftmax::loss_topk``), shaped as ``forward`` and ``predict`` shape them."""
        h = self._hidden_2d(hidden)
        lead = tuple(hidden.shape[:-1])
        t = self._targets_1d(targets, hidden)
        if not 1 <= int(k) <= self.num_classes:
            raise ValueError(f"k = {k} must be in [1, num_classes = {self.num_classes}]")
        k = int(k)
        with torch.no_grad():
            if h.shape[0] == 0:  # as forward and predict on an empty batch
                loss = self._loss(hidden, targets, head, None, class_weight=self.class_weight)
                return loss, h.new_empty(lead + (k,), dtype=torch.float32), h.new_empty(lead + (k,), dtype=torch.int64)
            if self.class_weight is not None:
                self._check_device("class_weight", self.class_weight)
            red = _ops.REDUCTIONS[self.reduction]
            loss, values, indices = _ops.loss_topk(h, self.weight, self.bias, t, red, self.ignore_index, k, head,
                                                   self.class_weight)
        return (loss.reshape(lead) if red == 0 else loss), values.reshape(lead + (k,)), indices.reshape(lead + (k,))


class FullSoftmaxLoss(_SoftmaxHead):
    """Exact softmax cross-entropy over ``num_classes`` classes:
    ``F.cross_entropy(F.linear(hidden, weight, bias), targets)`` without the logits matrix.

    Args:
        num_classes, dim: weight is (num_classes x dim).
        bias: learn a per-class bias.
        dtype: weight storage, torch.float32 / bfloat16 / float16 (arithmetic is float32).
        reduction, ignore_index: as in ``F.cross_entropy``.
        sparse_grad: sparse COO weight gradients (rows touched; for the full softmax, every row).
        score_cache_bytes: workspace (bytes) a training step may spend keeping the forward pass's
            scores for the backward pass instead of recomputing them: chunks of B x chunk float32
            scores are kept in class order while they fit, each saving one of the step's four
            B x chunk x dim GEMMs; B x num_classes x 4 bytes keeps all (a step then does three GEMMs,
            like ``F.cross_entropy(F.linear(...))``). Results are bitwise the same at every budget.
            None (and ``row_block`` None): the library chooses budget and blocks per step so that
            nothing is recomputed where that fits (on the CPU, blocks whose scores take at most the
            larger of 64 MiB and the num_classes x dim float32 weight gradient: 256 rows at
            d = 256; see ``full_softmax::training_plan``); None with ``row_block``,
            row_block x num_classes x 4 (every score of a block kept); 0: keep none, the least
            memory. A negative value raises ``ValueError``.
        row_block: solve a training step in blocks of this many rows (0: all at once), each
            a complete softmax over every class, their weight gradients added up. With a budget
            holding a block's every score (the default with ``row_block``), nothing is recomputed,
            at the memory of row_block rows' scores instead of B rows': one of the four GEMMs saved
            for one more pass over the weight gradient per extra block (worth it for blocks of more
            than a few tens of rows on a CPU). Results are within rounding of those without blocks.
            A negative value raises ``ValueError``.
        label_smoothing: epsilon in [0, 1], as ``F.cross_entropy(label_smoothing=...)``.
        z_loss: z >= 0 adds z * logsumexp(logits)^2 per sample (PaLM's z-loss).
        margin: None, 'arcface' (target logit s cos(theta + m)) or 'cosface' (s (cos theta - m)),
            on L2-normalised rows and weights (needs ``bias=False``); ``margin_scale`` is s (default
            64), ``margin_m`` is m (default 0.5 for ArcFace, 0.35 for CosFace).
        softcap: c > 0 caps the logits at c tanh(logits / c) (Gemma 2's soft-capping, Cut
            Cross-Entropy's and Liger's ``softcap``); 0: none. Not with a margin.
        gradient_filter: f in [0, 1): the backward drops every entry of dloss/dlogit below f times
            its row's upstream gradient (with the plain loss: classes j with |p_j - [j = t]| < f),
            Cut Cross-Entropy's ``filter_eps`` applied per entry (its bf16 default, "auto", is
            2**-12); the loss is unchanged. On CUDA with bf16/fp16 weights, the classes no row of a
            block keeps are left out of the gradient GEMMs, which then shrink. 0 (the default):
            the exact gradient.
        class_weight: per-class weights (num_classes values >= 0), ``F.cross_entropy``'s ``weight``:
            each sample's loss is multiplied by its class's weight, and 'mean' divides by the sum of
            the weights of the samples not ignored. With ``label_smoothing``, PyTorch's formula: each
            class of the smoothing term carries its own weight (``F.cross_entropy(weight=w,
            label_smoothing=eps)``'s loss). A buffer (``self.class_weight``).
            The loss terms (all but ``class_weight``) change the training loss only: ``log_prob``
            and ``predict`` are those of the plain softmax over ``hidden @ weight.T + bias``.
    """

    def __init__(self, num_classes, dim, bias=False, dtype=torch.float32, reduction="mean", ignore_index=-100,
                 sparse_grad=False, device=None, init_scale=None, score_cache_bytes=None, row_block=None,
                 label_smoothing=0.0, z_loss=0.0, margin=None, margin_scale=64.0, margin_m=None, softcap=0.0,
                 class_weight=None, gradient_filter=0.0):
        terms = check_loss_terms(label_smoothing, z_loss, margin, margin_scale, margin_m, bias, softcap,
                                 gradient_filter)
        super().__init__(num_classes, dim, num_classes, bias, dtype, reduction, ignore_index, sparse_grad, device,
                         init_scale, class_weight)
        self._set_loss_terms(terms, margin)
        self.score_cache_bytes = None if score_cache_bytes is None else int(score_cache_bytes)
        self.row_block = None if row_block is None else int(row_block)
        self._cache_handle = None
        if self.score_cache_bytes is not None or self.row_block is not None or any_terms(terms):
            budget, blocks = self.score_cache_bytes, self.row_block
            if budget is None and blocks is not None and blocks > 0:
                budget = blocks * num_classes * 4  # every score of a block kept
            self._cache_handle = _Handle(_recipe(functools.partial(_make_full, budget, blocks), terms))

    @property
    def _head(self):
        return 0 if self._cache_handle is None else self._cache_handle.value

    def extra_repr(self):
        return super().extra_repr() + f", score_cache_bytes={self.score_cache_bytes}, row_block={self.row_block}"

    def forward(self, hidden, targets):
        return self._loss(hidden, targets, self._head, None, class_weight=self.class_weight)

    def log_prob(self, hidden, targets):
        """log p(targets | hidden) of the plain softmax, shape of ``targets`` (differentiable)."""
        return self._log_prob(hidden, targets, 0)

    def predict(self, hidden, k=1):
        """(log-probabilities, classes) of the k most probable classes, shape (..., k), best first."""
        return self._predict(hidden, k, 0)

    def evaluate(self, hidden, targets, k=1):
        """(loss, log-probabilities, classes): ``forward``'s loss (this module's reduction, loss terms
        and class weights) and the k most probable classes of each row, shape (..., k), best first,
        from **one** pass over the scores -- a validation step's loss and accuracy@k for one score GEMM
        instead of two (``forward`` then ``predict``). Not differentiable (the loss comes back
        detached). The top-k is that of the distribution the loss is taken over: ``predict``'s,
        except with ``softcap``, where the log-probabilities are the capped logits' (the order is the
        same). Rows whose target is ``ignore_index`` get class -1 and log-probability -inf. Raises
        ``ValueError`` with a margin (its target logit is not a prediction: call ``forward`` and
        ``predict``) and unless 1 <= k <= num_classes."""
        return self._evaluate(hidden, targets, k, self._head)


class HierarchicalSoftmaxLoss(_SoftmaxHead):
    """Hierarchical softmax: p(class) = product of node probabilities along its path in ``tree``.

    Args:
        num_classes, dim: classes and hidden width.
        tree: a ``Tree`` (``Tree.uniform``, ``Tree.huffman``, ``Tree.from_parents``); default a
            two-level uniform tree with branching ceil(sqrt(num_classes)).
        node: 'softmax' (a softmax over each node's children, one weight row per child, any
            arity) or 'sigmoid' (word2vec: one row per internal node of a binary tree).
        bias, dtype, reduction, ignore_index, sparse_grad, class_weight: as ``FullSoftmaxLoss``
            (a class's weight multiplies its samples' loss, -log of the product along the path).

    ``weight`` has one row per tree edge (softmax nodes) or per internal node (sigmoid nodes), in
    the library's layout (see ``tree_arrays()``).
    """

    def __init__(self, num_classes, dim, tree=None, node="softmax", bias=False, dtype=torch.float32,
                 reduction="mean", ignore_index=-100, sparse_grad=False, device=None, init_scale=None,
                 class_weight=None):
        if tree is None:
            n = int(num_classes)
            branching = max(2, math.ceil(math.sqrt(n)))
            tree = Tree.uniform(n, 2 if n > branching else 1, branching)
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an xsoftmax.torch.Tree, got {type(tree).__name__}")
        if tree.num_classes != int(num_classes):
            raise ValueError(f"tree has {tree.num_classes} classes but num_classes = {num_classes}")
        if node not in ("softmax", "sigmoid"):
            raise ValueError(f"node = {node!r} must be 'softmax' or 'sigmoid'")
        handle = _Handle(functools.partial(_make_tree, tree.parent, tree.leaf_class, tree.num_classes,
                                           node == "sigmoid"))
        rows = _C.tree_arrays(handle.value)["weight_rows"]
        super().__init__(num_classes, dim, rows, bias, dtype, reduction, ignore_index, sparse_grad, device,
                         init_scale, class_weight)
        self.tree = tree
        self.node = node
        self._handle = handle

    def extra_repr(self):
        return f"tree={self.tree!r}, node={self.node!r}, " + super().extra_repr()

    def tree_arrays(self):
        """The tree's layout: path_offset, path_row, leaf_rank, row_parent, row_child, block_offset
        (int64 tensors) and its sizes; see include/xsoftmax/tree/runtime_tree.hpp."""
        return _C.tree_arrays(self._handle.value)

    def forward(self, hidden, targets):
        return self._loss(hidden, targets, self._handle.value, None, class_weight=self.class_weight)

    def log_prob(self, hidden, targets):
        """log p(targets | hidden), shape of ``targets`` (differentiable)."""
        return self._log_prob(hidden, targets, self._handle.value)

    def predict(self, hidden, k=1, beam_width=0, return_expansions=False):
        """(log-probabilities, classes) of the k most probable classes, best first: exact
        best-first tree search, or a beam search keeping ``beam_width`` open nodes when > 0. With
        ``return_expansions``, also each row's node expansions (int64, shape of ``hidden`` without
        its last dimension): the nodes whose children the search scored, its cost -- a forward
        scores one node per level of the target's path. On CPU tensors an exact search runs level
        by level, many rows a node at once, and may expand a few more nodes than a one-row
        best-first search (the same results)."""
        return self._predict(hidden, k, self._handle.value, beam_width, return_expansions)

    def evaluate(self, hidden, targets, k=1, beam_width=0):
        """(loss, log-probabilities, classes), as ``FullSoftmaxLoss.evaluate`` returns them:
        ``forward``'s loss and ``predict``'s top-k (exact, or a beam search with ``beam_width``),
        rows whose target is ``ignore_index`` with class -1 and log-probability -inf. Two passes here
        (the loss reads each row's path, the search its own nodes: nothing to share). Not
        differentiable."""
        with torch.no_grad():
            loss = self(hidden, targets)
            values, classes = self.predict(hidden, k, beam_width)
            ignored = targets == self.ignore_index
            values = values.masked_fill(ignored[..., None], float("-inf"))
            classes = classes.masked_fill(ignored[..., None], -1)
        return loss, values, classes

    @torch.no_grad()
    def init_weights_from_class_vectors(self, class_vectors, class_bias=None):
        """Sets the node weights from one vector per class (num_classes x dim: embeddings, mean
        features, or a trained softmax's weight rows), so that a head over a new tree -- say
        ``Tree.kmeans`` of the same vectors -- starts where the classes are: with softmax nodes
        each row is the mean of the vectors of the classes beneath its child (h . row is then the
        mean logit of those classes); with sigmoid nodes each internal node's row is the first
        child's mean minus the second's (sigmoid(h . row) is the softmax over the two means).
        ``class_bias`` (num_classes values) sets the bias the same way (without it a head's bias is
        set to zero; a head without a bias refuses it). Means are taken in float64 on the CPU and
        written into ``weight`` (and ``bias``) in place, in their dtype and device; on an error
        nothing is written. Returns self.
        """
        if not isinstance(class_vectors, torch.Tensor):
            raise TypeError("init_weights_from_class_vectors: class_vectors must be a torch.Tensor, got "
                            f"{type(class_vectors).__name__}")
        if class_vectors.dim() != 2 or class_vectors.shape != (self.num_classes, self.dim):
            raise ValueError(f"init_weights_from_class_vectors: class_vectors has shape {tuple(class_vectors.shape)}, "
                             f"expected (num_classes, dim) = ({self.num_classes}, {self.dim})")
        if class_bias is not None and self.bias is None:
            raise ValueError("init_weights_from_class_vectors: class_bias is given but the head has no bias "
                             "(construct it with bias=True)")
        rows = _C.tree_weights_from_class_vectors(self._handle.value, class_vectors)
        node_bias = None
        if class_bias is not None:
            class_bias = torch.as_tensor(class_bias)
            if class_bias.numel() != self.num_classes:
                raise ValueError(f"init_weights_from_class_vectors: class_bias has {class_bias.numel()} values, "
                                 f"expected num_classes = {self.num_classes}")
            node_bias = _C.tree_weights_from_class_vectors(self._handle.value, class_bias.reshape(-1, 1)).reshape(-1)
        self.weight.copy_(rows)  # nothing above wrote the parameters: an error leaves them as they were
        if self.bias is not None:
            if node_bias is not None:
                self.bias.copy_(node_bias)
            else:
                self.bias.zero_()
        return self

    @classmethod
    def from_class_vectors(cls, class_vectors, branching=None, depth=None, node="softmax", class_bias=None,
                           iterations=8, spherical=True, seed=0, **kwargs):
        """A head over ``Tree.kmeans(class_vectors, branching, depth, iterations, spherical, seed)``
        with its weights from ``init_weights_from_class_vectors`` -- e.g. to re-tree a model from
        its trained class weights, ``HierarchicalSoftmaxLoss.from_class_vectors(full.weight)``
        for a trained ``FullSoftmaxLoss`` ``full``. ``node='sigmoid'`` needs a binary tree
        (``branching=2``). The other keyword arguments go to the constructor (``bias``
        defaults to whether ``class_bias`` is given; ``dtype`` and ``device`` default to those of
        ``class_vectors``, float32 for a dtype the heads do not store)."""
        if not isinstance(class_vectors, torch.Tensor) or class_vectors.dim() != 2:
            raise TypeError("from_class_vectors: class_vectors must be a 2-D torch.Tensor (num_classes x dim)")
        tree = Tree.kmeans(class_vectors, branching, depth, iterations, spherical, seed)
        kwargs.setdefault("dtype", class_vectors.dtype if class_vectors.dtype in _DTYPES else torch.float32)
        kwargs.setdefault("device", class_vectors.device)
        kwargs.setdefault("bias", class_bias is not None)
        n, d = class_vectors.shape
        head = cls(n, d, tree=tree, node=node, **kwargs)
        return head.init_weights_from_class_vectors(class_vectors, class_bias)


class _SelectiveHead(_SoftmaxHead):
    """Heads whose training loss is a softmax over a per-step active set. Evaluation (``eval()``
    with ``exact_eval``), ``log_prob`` and ``predict`` use the exact full softmax."""

    def __init__(self, factory, num_classes, dim, bias, dtype, reduction, ignore_index, sparse_grad, device,
                 init_scale, exact_eval, terms, margin, class_weight):
        super().__init__(num_classes, dim, num_classes, bias, dtype, reduction, ignore_index, sparse_grad, device,
                         init_scale, class_weight)
        self._set_loss_terms(terms, margin)
        self._handle = _Handle(_recipe(factory, terms))
        # The exact evaluation loss keeps the loss terms: a full softmax handle that carries them.
        self._eval_handle = None
        if any_terms(terms):
            self._eval_handle = _Handle(_recipe(functools.partial(_make_full, None, None),
                                                terms))
        self.exact_eval = bool(exact_eval)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))

    def forward(self, hidden, targets):
        cw = self.class_weight
        if not self.training and self.exact_eval:
            return self._loss(hidden, targets, 0 if self._eval_handle is None else self._eval_handle.value, None,
                              class_weight=cw)
        loss = self._loss(hidden, targets, self._handle.value, self.step.clone(), class_weight=cw)
        with torch.no_grad():
            self.step.add_(1)
        return loss

    def log_prob(self, hidden, targets):
        """Exact log p(targets | hidden) under the full softmax, shape of ``targets``."""
        return self._log_prob(hidden, targets, 0)

    def predict(self, hidden, k=1):
        """(log-probabilities, classes) of the k most probable classes (exact), best first."""
        return self._predict(hidden, k, 0)

    def evaluate(self, hidden, targets, k=1):
        """(loss, log-probabilities, classes): the exact evaluation loss (``eval()``'s, with this
        module's reduction, loss terms and class weights, whatever ``training`` and ``exact_eval``
        say) and the k most probable classes of each row, from one pass over every class's scores
        (see ``FullSoftmaxLoss.evaluate``). Not differentiable; does not advance ``step``."""
        return self._evaluate(hidden, targets, k, 0 if self._eval_handle is None else self._eval_handle.value)


class SampledSoftmaxLoss(_SelectiveHead):
    """Sampled softmax (TensorFlow's ``sampled_softmax_loss``): each step draws ``num_sampled``
    shared negatives; logits are corrected by -log Q and accidental hits removed. The draw is a
    function of (seed, ``self.step``), which every training forward advances.

    Args:
        num_sampled: negatives per step.
        sampler: 'log_uniform' (Zipf, classes sorted by decreasing frequency), 'uniform', or
            'counts' (P(c) proportional to counts[c] ** power).
        unique: draw without replacement; subtract_log_q: the log-Q correction; seed.
        exact_eval: in eval mode, the loss is the exact full softmax.
        label_smoothing, z_loss, margin, margin_scale, margin_m, softcap, class_weight: as
            ``FullSoftmaxLoss``; label smoothing spreads over the step's active set (the target and the
            sampled negatives); the soft cap applies before the -log Q correction.
    """

    def __init__(self, num_classes, dim, num_sampled=64, sampler="log_uniform", counts=None, power=1.0, unique=True,
                 subtract_log_q=True, seed=0, bias=False, dtype=torch.float32, reduction="mean", ignore_index=-100,
                 sparse_grad=False, device=None, init_scale=None, exact_eval=True, label_smoothing=0.0, z_loss=0.0,
                 margin=None, margin_scale=64.0, margin_m=None, softcap=0.0, class_weight=None):
        terms = check_loss_terms(label_smoothing, z_loss, margin, margin_scale, margin_m, bias, softcap)
        if counts is not None:
            counts = torch.as_tensor(counts, dtype=torch.float64).reshape(-1).cpu()
        factory = functools.partial(_make_sampled, int(num_classes), str(sampler), counts, float(power),
                                    int(num_sampled), bool(unique), bool(subtract_log_q), int(seed))
        super().__init__(factory, num_classes, dim, bias, dtype, reduction, ignore_index, sparse_grad, device,
                         init_scale, exact_eval, terms, margin, class_weight)
        self.num_sampled = int(num_sampled)
        self.sampler = sampler


class KNNSoftmaxLoss(_SelectiveHead):
    """KNN softmax (Alibaba, 100M classes): the active set of a step is the union of its targets'
    ``k`` nearest classes in a graph over the class weights, updated every ``rebuild_every``
    training steps from the current weights (rebuilt, or refreshed from its last lists between
    rebuilds). With k = num_classes it is the full softmax.

    Args:
        k: graph neighbours per class; neighbors_used: how many of them a target brings (0: k).
        metric: 'cosine' or 'inner_product'; method: 'exact' (tiled brute force), 'ivf' (each
            k-means list's members search the ``nprobe`` lists nearest to its centroid;
            ``ivf_lists`` lists, 0: sqrt(N); ``nprobe``, 0: 8) or 'ivf_class_probes' (each class
            searches the ``nprobe`` lists nearest to itself; ``ivf_lists`` 0: 3 sqrt(N)): at
            N = 1e5 clustered classes, recall 0.99 at about a tenth of the exact build's time.
        rebuild_every: steps between graph updates (0: never; see ``rebuild_graph``).
        refreshes_between_rebuilds: updates that refresh the last graph between full builds (0:
            every update rebuilds): neighbours-of-neighbours passes from its lists
            (``refresh_passes`` of them), cheaper than a build; ``refresh_moved``: the fraction of
            classes, those whose weights turned most since the last update, a refresh searches
            exactly (0: none). ``refine_passes``: such passes after every IVF build too.
        exact_eval: in eval mode, the loss is the exact full softmax.
        label_smoothing, z_loss, margin, margin_scale, margin_m, softcap, class_weight: as
            ``FullSoftmaxLoss``; label smoothing spreads over the step's active set.
    """

    def __init__(self, num_classes, dim, k=50, metric="cosine", method="exact", neighbors_used=0, rebuild_every=100,
                 ivf_lists=0, nprobe=0, refreshes_between_rebuilds=0, refine_passes=0, refresh_passes=1,
                 refresh_moved=0.0, bias=False, dtype=torch.float32, reduction="mean", ignore_index=-100,
                 sparse_grad=False, device=None, init_scale=None, exact_eval=True, label_smoothing=0.0, z_loss=0.0,
                 margin=None, margin_scale=64.0, margin_m=None, softcap=0.0, class_weight=None):
        if not 1 <= int(k) <= int(num_classes):
            raise ValueError(f"k = {k} must be in [1, num_classes = {num_classes}]")
        terms = check_loss_terms(label_smoothing, z_loss, margin, margin_scale, margin_m, bias, softcap)
        factory = functools.partial(_make_knn, int(k), str(metric), str(method), int(neighbors_used),
                                    int(rebuild_every), int(ivf_lists), int(nprobe), int(refreshes_between_rebuilds),
                                    int(refine_passes), int(refresh_passes), float(refresh_moved))
        super().__init__(factory, num_classes, dim, bias, dtype, reduction, ignore_index, sparse_grad, device,
                         init_scale, exact_eval, terms, margin, class_weight)
        self.k = int(k)
        self.rebuild_every = int(rebuild_every)
        self.refreshes_between_rebuilds = int(refreshes_between_rebuilds)

    def rebuild_graph(self):
        """Rebuilds the KNN graph from the current weights now (it is built at the first training
        forward and then every ``rebuild_every`` steps)."""
        _C.knn_rebuild(self._handle.value)
