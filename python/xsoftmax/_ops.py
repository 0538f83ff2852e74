# SPDX-License-Identifier: Apache-2.0
"""The xsoftmax operators: loading the C++ extension, fake (meta) kernels for torch.compile, autograd.

Operators (schemas in csrc/ops.cpp), on CPU tensors and, when the extension was built with its CUDA
operators (``build_info()['cuda']``), on CUDA tensors: one body per operator for both devices
(csrc/op_bodies.hpp); every tensor of a call must be on the weight's device.

* ``xsoftmax::loss`` -- the loss only. Differentiable: its backward calls ``xsoftmax::backward``
  with the upstream gradient (a scalar for mean/sum, one value per sample for reduction none).
* ``xsoftmax::loss_fused`` -- loss and gradients in one pass (the library's ``forward_backward``,
  upstream gradient 1), for mean/sum. Differentiable: its backward scales the saved gradients by
  the (scalar) upstream gradient.
* ``xsoftmax::backward`` -- the gradients for a given upstream gradient.
* ``xsoftmax::topk`` -- the k most probable classes and their log-probabilities.
* ``xsoftmax::loss_topk`` -- the full softmax's loss and top-k from one pass over the scores (an
  evaluation step's loss and accuracy@k for one score GEMM). Not differentiable.
"""
import os

import torch


def _avx512_cpu():
    """Whether the CPU has the AVX-512 subsets OpenBLAS's SkylakeX kernels use (Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= flags
    except OSError:
        pass
    return False


# OpenBLAS (the dense scores' BLAS when the package links it) picks its kernels from a CPU table when
# it loads, and older releases (Debian 12's 0.3.21) give CPUs newer than the table the AVX2 Haswell
# or even SSE3 kernels: on an AMD EPYC of family 26 (Zen 5) that is half the sgemm speed of the
# AVX-512 SkylakeX kernels (bench/RESULTS.md). So, before the extension loads OpenBLAS, the SkylakeX
# kernels are asked for on an AVX-512 CPU, unless OPENBLAS_CORETYPE is set already (that wins;
# XSOFTMAX_OPENBLAS_CORETYPE=keep leaves OpenBLAS's own choice). No effect on an OpenBLAS that is
# already loaded, or without one.
if ("OPENBLAS_CORETYPE" not in os.environ and os.environ.get("XSOFTMAX_OPENBLAS_CORETYPE") != "keep"
        and _avx512_cpu()):
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"

from . import _C  # noqa: E402,F401  (registers the operators)

__all__ = ["REDUCTIONS", "loss", "topk", "loss_topk", "INT64_MIN", "build_info", "has_cuda"]

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
INT64_MIN = -(2 ** 63)

_ops = torch.ops.xsoftmax


def build_info():
    """What this installation was built with, as a dict: ``cpu`` (always True), ``cuda`` (whether the
    CUDA operators were built), ``cuda_archs`` (their GPU architectures, TORCH_CUDA_ARCH_LIST's form),
    ``cuda_ptx_only`` (whether they were built as PTX only, which the GPU JIT-compiles on load:
    XSOFTMAX_CUDA_PTX_ONLY=1), ``why_no_cuda`` (None, or why they were not built), ``blas`` (the CPU operators' dense GEMM),
    ``torch`` and ``torch_cuda`` (the torch it was built against and its CUDA version)."""
    info = dict(_C.build_info())
    try:
        from . import _build_config as config
    except ImportError:  # built by other means than setup.py
        config = None
    info["cuda_archs"] = config.CUDA_ARCHS if config is not None and info["cuda"] else ""
    info["cuda_ptx_only"] = bool(getattr(config, "CUDA_PTX_ONLY", False)) and info["cuda"]
    info["why_no_cuda"] = None if info["cuda"] else getattr(config, "WHY_NO_CUDA", None)
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    return info


def release_cached_gradients():
    """Frees the CPU weight-gradient buffers that xsoftmax keeps for reuse, returning how many bytes.

    A loss module's backward returns its weight gradient as a tensor over a buffer of the extension;
    on CPU tensors the extension keeps up to two such buffers once PyTorch has dropped every tensor
    over them (``optimizer.zero_grad()``), and the next backward fills one again instead of a fresh
    allocation (a fresh one cost 58-76 ms a step at 100,000 x 256: page faults, zeroing and the free).
    A kept buffer is as large as the largest gradient it held; buffers still in use (e.g. as a
    parameter's ``.grad``) are left alone. CUDA gradients come from PyTorch's caching allocator and
    are not kept here (``torch.cuda.empty_cache`` releases those)."""
    return int(_C.release_cached_gradients())


def has_cuda():
    """Whether this build has its CUDA operators."""
    return bool(_C.build_info()["cuda"])


# --------------------------------------------------------------------------------------------------
# Fake kernels: output shapes and dtypes without running anything (torch.compile, meta tensors)
# --------------------------------------------------------------------------------------------------

def _fake_gradients(hidden, weight, bias, sparse_grad):
    b, d = hidden.shape
    grad_hidden = hidden.new_empty((b, d), dtype=torch.float32)
    if sparse_grad:
        rows = torch.library.get_ctx().new_dynamic_size()
        grad_rows = hidden.new_empty((rows,), dtype=torch.int64)
        grad_values = hidden.new_empty((rows, d), dtype=torch.float32)
        grad_bias = hidden.new_empty((rows if bias is not None else 0,), dtype=torch.float32)
    else:
        n = weight.shape[0]
        grad_rows = hidden.new_empty((0,), dtype=torch.int64)
        grad_values = hidden.new_empty((n, d), dtype=weight.dtype)  # dense: the weight's dtype
        grad_bias = hidden.new_empty((n if bias is not None else 0,), dtype=torch.float32)
    return grad_hidden, grad_rows, grad_values, grad_bias


@torch.library.register_fake("xsoftmax::loss")
def _loss_fake(hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad, class_weight=None):
    if reduction == 0:
        return hidden.new_empty((hidden.shape[0],), dtype=torch.float32)
    return hidden.new_empty((), dtype=torch.float32)


@torch.library.register_fake("xsoftmax::loss_fused")
def _loss_fused_fake(hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad,
                     class_weight=None):
    loss = hidden.new_empty((), dtype=torch.float32)
    return (loss,) + _fake_gradients(hidden, weight, bias, sparse_grad)


@torch.library.register_fake("xsoftmax::backward")
def _backward_fake(hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad, grad_output,
                   class_weight=None):
    return _fake_gradients(hidden, weight, bias, sparse_grad)


@torch.library.register_fake("xsoftmax::topk")
def _topk_fake(hidden, weight, bias, k, head, beam_width):
    b = hidden.shape[0]
    return (hidden.new_empty((b, k), dtype=torch.float32), hidden.new_empty((b, k), dtype=torch.int64),
            hidden.new_empty((b,), dtype=torch.int64))


@torch.library.register_fake("xsoftmax::loss_topk")
def _loss_topk_fake(hidden, weight, bias, targets, reduction, ignore_index, head, k, class_weight=None):
    b = hidden.shape[0]
    loss = _loss_fake(hidden, weight, bias, targets, reduction, ignore_index, head, None, False)
    return loss, hidden.new_empty((b, k), dtype=torch.float32), hidden.new_empty((b, k), dtype=torch.int64)


# --------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------

def _is_one(scale):
    """Whether the upstream scale is exactly 1 (then the operator's gradients are returned as they are:
    no copy of the num_classes x dim weight gradient, which autograd can then take over as .grad).
    A tensor is read only when it is a plain one outside any tracing (torch.compile, fake or
    functional tensors, a dispatch mode): traced, the multiply stays."""
    if isinstance(scale, torch.Tensor):
        if (type(scale) is not torch.Tensor or scale.numel() != 1 or torch.compiler.is_compiling()
                or _dispatch_mode() is not None):
            return False
        return bool(scale == 1)
    return scale == 1


def _dispatch_mode():
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:  # an older or newer torch without it: assume tracing, keep the multiply
        return True
    return _get_current_dispatch_mode()


def _scaled(values, scale):
    """values * scale; scale None means exactly 1 (decided once per backward by _is_one: reading a
    CUDA tensor's value synchronises, so it is read once, not once per gradient)."""
    return values if scale is None else values * scale


def _weight_gradients(grad_rows, grad_values, grad_bias, scale, weight_shape, weight_dtype, has_bias, sparse_grad,
                      need_weight, need_bias):
    """The weight and bias gradients from the operator's (rows, values, bias) and the upstream scale
    (None: exactly 1, nothing to multiply)."""
    grad_weight = grad_b = None
    if need_weight:
        values = _scaled(grad_values, scale)
        if sparse_grad:
            grad_weight = torch.sparse_coo_tensor(grad_rows.unsqueeze(0), values.to(weight_dtype), weight_shape,
                                                  check_invariants=False)
        else:
            grad_weight = values.to(weight_dtype)
    if need_bias and has_bias:
        values = _scaled(grad_bias, scale)
        if sparse_grad:
            grad_b = torch.sparse_coo_tensor(grad_rows.unsqueeze(0), values.to(weight_dtype), weight_shape[:1],
                                             check_invariants=False)
        else:
            grad_b = values.to(weight_dtype)
    return grad_weight, grad_b


def _refuse_double_backward():
    """The operators' gradients are not themselves differentiable: with create_graph=True (grad
    mode on inside backward, outside any tracing) say so instead of returning gradients that
    silently lack their second-order terms."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling() and _dispatch_mode() is None:
        raise RuntimeError("xsoftmax: double backward (torch.autograd.grad(..., create_graph=True), "
                           "backward(create_graph=True), or a torch.func transform such as grad or jacrev, which "
                           "differentiates with create_graph=True) is not supported: the heads' gradients come from "
                           "fused kernels that are not themselves differentiable")


def _fused_setup_context(ctx, inputs, output):
    hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad = inputs[:9]
    _, grad_hidden, grad_rows, grad_values, grad_bias = output
    ctx.save_for_backward(grad_hidden, grad_rows, grad_values, grad_bias)
    ctx.info = (hidden.dtype, weight.shape, weight.dtype, bias is not None, sparse_grad)
    ctx.mark_non_differentiable(grad_hidden, grad_rows, grad_values, grad_bias)
    # No zero tensors for the gradient outputs' (never used) upstream gradients: one of them would be
    # num_classes x dim, as large as the weight gradient itself.
    ctx.set_materialize_grads(False)


def _fused_backward(ctx, grad_loss, *unused):
    if grad_loss is None:  # not materialised: the loss does not reach what is differentiated
        return (None,) * 10
    _refuse_double_backward()
    grad_hidden, grad_rows, grad_values, grad_bias = ctx.saved_tensors
    hidden_dtype, weight_shape, weight_dtype, has_bias, sparse_grad = ctx.info
    need = ctx.needs_input_grad
    scale = None if _is_one(grad_loss) else grad_loss
    gh = _scaled(grad_hidden, scale).to(hidden_dtype) if need[0] else None
    gw, gb = _weight_gradients(grad_rows, grad_values, grad_bias, scale, weight_shape, weight_dtype, has_bias,
                               sparse_grad, need[1], need[2])
    return gh, gw, gb, None, None, None, None, None, None, None


def _loss_setup_context(ctx, inputs, output):
    hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad = inputs[:9]
    class_weight = inputs[9] if len(inputs) > 9 else None
    ctx.save_for_backward(hidden, weight, bias, targets, step, class_weight)
    ctx.args = (reduction, ignore_index, head, sparse_grad)
    ctx.info = (hidden.dtype, weight.shape, weight.dtype, bias is not None)


def _loss_backward(ctx, grad_loss):
    _refuse_double_backward()
    hidden, weight, bias, targets, step, class_weight = ctx.saved_tensors
    reduction, ignore_index, head, sparse_grad = ctx.args
    hidden_dtype, weight_shape, weight_dtype, has_bias = ctx.info
    need = ctx.needs_input_grad
    grad_hidden, grad_rows, grad_values, grad_bias = _ops.backward(
        hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad, grad_loss, class_weight)
    gh = grad_hidden.to(hidden_dtype) if need[0] else None
    gw, gb = _weight_gradients(grad_rows, grad_values, grad_bias, None, weight_shape, weight_dtype, has_bias,
                               sparse_grad, need[1], need[2])
    return gh, gw, gb, None, None, None, None, None, None, None


torch.library.register_autograd("xsoftmax::loss_fused", _fused_backward, setup_context=_fused_setup_context)
torch.library.register_autograd("xsoftmax::loss", _loss_backward, setup_context=_loss_setup_context)


# --------------------------------------------------------------------------------------------------
# Entry points used by the modules
# --------------------------------------------------------------------------------------------------

def _refuse_functorch():
    """torch.func transforms (grad, vmap, jacrev, ...) would need the operators' autograd to be
    functorch-aware and differentiable twice: say so plainly instead of torch's message about
    setup_context."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    if active is not None and active():
        raise RuntimeError("xsoftmax: torch.func transforms (grad, vmap, jacrev, jvp, ...) are not supported by the "
                           "xsoftmax heads; use torch.autograd (loss.backward() or torch.autograd.grad)")


def loss(hidden, weight, bias, targets, reduction, ignore_index, head=0, step=None, sparse_grad=False,
         class_weight=None):
    """The loss of a (B x d) batch; fused forward+backward when a gradient will be needed.

    ``reduction`` is an int (see ``REDUCTIONS``); ``class_weight`` None or one float per class.
    Returns a scalar, or B values for reduction 0. Raises RuntimeError inside a torch.func transform.
    """
    _refuse_functorch()
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad and reduction != 0:
        return _ops.loss_fused(hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad,
                               class_weight)[0]
    return _ops.loss(hidden, weight, bias, targets, reduction, ignore_index, head, step, sparse_grad, class_weight)


def topk(hidden, weight, bias, k, head=0, beam_width=0, return_expansions=False):
    """(log-probabilities, classes) of the k most probable classes of each row, best first; with
    ``return_expansions``, also each row's node expansions (int64: the nodes whose children a tree
    search scored; -1 for heads without a tree search)."""
    _refuse_functorch()
    values, classes, expansions = _ops.topk(hidden, weight, bias, k, head, beam_width)
    return (values, classes, expansions) if return_expansions else (values, classes)


def loss_topk(hidden, weight, bias, targets, reduction, ignore_index, k, head=0, class_weight=None):
    """(loss, log-probabilities, classes) of a full softmax head from one pass over the scores: the
    loss as ``loss`` gives it (``reduction`` an int, see ``REDUCTIONS``) and the k most probable
    classes of each row, best first, as ``topk`` (-1 and -inf for rows whose target is ignored).
    Not differentiable: evaluation only (run it under ``torch.no_grad()``)."""
    _refuse_functorch()
    return _ops.loss_topk(hidden, weight, bias, targets, reduction, ignore_index, head, k, class_weight)
