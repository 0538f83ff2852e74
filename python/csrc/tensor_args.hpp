// SPDX-License-Identifier: Apache-2.0
//
// What every operator of the PyTorch bindings does with its tensor arguments: checks what a tensor
// must be before a view of it can be made (device, rank, dtype, strides), makes the library's views,
// maps the library's exceptions to the Python exceptions torch raises, dispatches on the weight
// dtype, and turns a sparse weight gradient into tensors. Device-neutral: the views hold the
// tensors' pointers, host or device; every tensor of a call must be on the weight's device. Shared
// by op_bodies.hpp (the heads, on CPU and CUDA) and sharded_ops.cpp (the class-sharded full softmax
// over a torch.distributed process group, CPU).

#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <limits>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <type_traits>

namespace xsoftmax_torch {

namespace xs = xsoftmax;
using xs::index_t;

// torch's 16-bit floats and CUDA's are the same 2-byte raw bit patterns; a weight tensor's data
// pointer is reinterpreted, never converted.
static_assert(sizeof(at::BFloat16) == sizeof(__nv_bfloat16) && alignof(at::BFloat16) == alignof(__nv_bfloat16),
              "at::BFloat16 and __nv_bfloat16 must be layout-compatible");
static_assert(sizeof(at::Half) == sizeof(__half) && alignof(at::Half) == alignof(__half),
              "at::Half and __half must be layout-compatible");
static_assert(std::is_same_v<index_t, int64_t>, "xsoftmax::index_t must be int64");

/// The backend of the operators on CPU tensors: OpenMP threads.
using host_backend = xs::omp;

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

/// Rethrows the exception being handled as the c10 error Python maps to the matching exception.
[[noreturn]] inline void rethrow_as_torch_error() {
  try {
    throw;
  } catch (const c10::Error&) {
    throw;
  } catch (const std::out_of_range& e) {
    C10_THROW_ERROR(IndexError, e.what());
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, e.what());
  } catch (const std::bad_alloc&) {
    C10_THROW_ERROR(Error, "xsoftmax: out of host memory");
  } catch (const std::exception& e) {
    C10_THROW_ERROR(Error, e.what());
  }
}

template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    rethrow_as_torch_error();
  }
}

// ------------------------------------------------------------------------------------------------
// Argument checks (the library checks values and shapes of what it is given; these check what a
// tensor must be before a view of it can be made)
// ------------------------------------------------------------------------------------------------

/// Operators that run on CPU tensors only (the class-sharded ones).
inline void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), "xsoftmax::", op, ": ", name, " is on ", t.device(),
                    "; this operator runs on CPU tensors only");
}

/// Every tensor of a call lives on the weight's device: a head never reads another device's memory
/// (a meta target once gave an uninitialised loss; a CPU target with CUDA hidden rows would fault).
inline void check_same_device(const at::Tensor& t, const at::Tensor& weight, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device() == weight.device(), "xsoftmax::", op, ": ", name, " is on ", t.device(),
                    " but weight is on ", weight.device(), "; move ", name, " to ", weight.device());
}

/// hidden: a (B x dim) float32 matrix on the weight's device with unit column stride (copied to such
/// if not).
inline at::Tensor prepare_hidden(const at::Tensor& hidden, const at::Tensor& weight, const char* op) {
  check_same_device(hidden, weight, op, "hidden");
  TORCH_CHECK_VALUE(hidden.dim() == 2, "xsoftmax::", op, ": hidden must be 2-D (B x dim), got shape ",
                    hidden.sizes());
  at::Tensor h = hidden.scalar_type() == at::kFloat ? hidden : hidden.to(at::kFloat);
  if (h.size(0) > 0 && h.size(1) > 0 && (h.stride(1) != 1 || h.stride(0) < h.size(1))) h = h.contiguous();
  return h;
}

inline at::Tensor prepare_targets(const at::Tensor& targets, const at::Tensor& hidden, const at::Tensor& weight,
                                  const char* op) {
  check_same_device(targets, weight, op, "targets");
  TORCH_CHECK_VALUE(targets.scalar_type() == at::kLong, "xsoftmax::", op, ": targets.dtype = ",
                    targets.scalar_type(), ", expected int64 (torch.long)");
  TORCH_CHECK_VALUE(targets.dim() == 1 && targets.size(0) == hidden.size(0), "xsoftmax::", op,
                    ": targets has shape ", targets.sizes(), " but hidden has ", hidden.size(0),
                    " rows (expected shape [", hidden.size(0), "])");
  return targets.contiguous();
}

inline void check_weight(const at::Tensor& weight, const c10::optional<at::Tensor>& bias, const char* op) {
  TORCH_CHECK_VALUE(weight.device().is_cpu() || weight.device().is_cuda(), "xsoftmax::", op, ": weight is on ",
                    weight.device(), "; the heads run on CPU and CUDA tensors");
  TORCH_CHECK_VALUE(weight.dim() == 2, "xsoftmax::", op, ": weight must be 2-D (rows x dim), got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.size(0) > 0 && weight.size(1) > 0, "xsoftmax::", op, ": weight has shape ",
                    weight.sizes(), "; both sizes must be > 0");
  TORCH_CHECK_VALUE(weight.stride(1) == 1 && weight.stride(0) >= weight.size(1), "xsoftmax::", op,
                    ": weight must have unit column stride (row-major rows) to be used in place; got strides ",
                    weight.strides(), " (call .contiguous() on the parameter once)");
  if (bias.has_value() && bias->defined()) {
    check_same_device(*bias, weight, op, "bias");
    TORCH_CHECK_VALUE(bias->scalar_type() == weight.scalar_type(), "xsoftmax::", op, ": bias.dtype = ",
                      bias->scalar_type(), " differs from weight.dtype = ", weight.scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "xsoftmax::", op,
                      ": bias has shape ", bias->sizes(), ", expected [", weight.size(0), "]");
    TORCH_CHECK_VALUE(bias->is_contiguous(), "xsoftmax::", op, ": bias must be contiguous");
  }
}

inline xs::loss_options make_options(int64_t reduction, int64_t ignore_index, const char* op) {
  TORCH_CHECK_VALUE(reduction >= 0 && reduction <= 2, "xsoftmax::", op, ": reduction = ", reduction,
                    " must be 0 (none), 1 (mean) or 2 (sum)");
  xs::loss_options o;
  o.reduce = reduction == 0 ? xs::reduction::none : reduction == 1 ? xs::reduction::mean : xs::reduction::sum;
  o.ignore_index = ignore_index;
  return o;
}

template <class S>
xs::matrix_view<S> weight_view(const at::Tensor& w) {
  return {reinterpret_cast<S*>(w.data_ptr()), w.size(0), w.size(1), w.stride(0)};
}

template <class S>
S* bias_pointer(const c10::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? reinterpret_cast<S*>(bias->data_ptr()) : nullptr;
}

inline xs::matrix_view<const float> hidden_view(const at::Tensor& h) {
  return {h.data_ptr<float>(), h.size(0), h.size(1), h.size(0) > 0 ? h.stride(0) : h.size(1)};
}

inline xs::vector_view<const index_t> targets_view(const at::Tensor& t) {
  return {t.data_ptr<int64_t>(), t.size(0)};
}

inline int64_t step_value(const c10::optional<at::Tensor>& step) {
  if (!step.has_value() || !step->defined()) return 0;
  TORCH_CHECK_VALUE(step->numel() == 1, "xsoftmax: step must hold one value, got shape ", step->sizes());
  return step->to(at::kCPU).to(at::kLong).item<int64_t>();
}

template <class F>
decltype(auto) dispatch_precision(at::ScalarType t, const char* op, F&& f) {
  switch (t) {
    case at::kFloat:
      return f(xs::fp32{});
    case at::kBFloat16:
      return f(xs::bf16{});
    case at::kHalf:
      return f(xs::fp16{});
    default:
      TORCH_CHECK_VALUE(false, "xsoftmax::", op, ": weight.dtype = ", t,
                        " is not supported (float32, bfloat16 or float16)");
  }
}

// ------------------------------------------------------------------------------------------------
// Gradients -> tensors
// ------------------------------------------------------------------------------------------------

template <class Backend>
using gradient = xs::sparse_gradient<Backend, float>;

/// (rows, values, bias) of a weight gradient, on the weight's device: dense (rows empty, values
/// N x dim in the weight's dtype, bias float32) or sparse (values and bias float32). The sparse
/// tensors share the gradient's buffers (no copy); the gradient lives as long as the last of them.
/// `every_row_in_order`: the head produces every weight row in order (the full softmax), so that
/// for fp32 weights its values are the dense gradient as they are.
template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> gradient_tensors(const std::shared_ptr<gradient<Backend>>& g,
                                                                const at::Tensor& weight, bool has_bias, bool sparse,
                                                                bool every_row_in_order) {
  const int64_t weight_rows = weight.size(0), dim = weight.size(1);
  const int64_t r = g->num_rows();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(weight.device());
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(weight.device());
  auto keep = [g](void*) {};  // the deleter holds the gradient object alive
  at::Tensor rows, values, bias;
  if (r == 0) {
    rows = at::empty({0}, i64);
    values = at::empty({0, dim}, f32);
    bias = at::empty({0}, f32);
  } else {
    rows = at::from_blob(thrust::raw_pointer_cast(g->rows.data()), {r}, keep, i64);
    values = at::from_blob(thrust::raw_pointer_cast(g->values.data()), {r, dim}, keep, f32);
    bias = has_bias ? at::from_blob(thrust::raw_pointer_cast(g->bias_values.data()), {r}, keep, f32)
                    : at::empty({0}, f32);
  }
  if (!has_bias) bias = at::empty({0}, f32);
  if (sparse) return {rows, values, bias};
  if (every_row_in_order && r == weight_rows && weight.scalar_type() == at::kFloat)
    return {at::empty({0}, i64), values, bias};
  // Dense: in the weight's dtype (the gradient PyTorch keeps), as the full softmax's dense path.
  at::Tensor dense = at::zeros({weight_rows, dim}, weight.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor dense_bias = at::zeros({has_bias ? weight_rows : 0}, f32);
  if (r > 0) {
    dense.index_copy_(0, rows, values.to(weight.scalar_type()));
    if (has_bias) dense_bias.index_copy_(0, rows, bias);
  }
  return {at::empty({0}, i64), dense, dense_bias};
}

/// The empty `rows` of a dense weight gradient.
inline at::Tensor no_rows(const at::Tensor& weight) {
  return at::empty({0}, at::TensorOptions().dtype(at::kLong).device(weight.device()));
}

struct loss_args {
  at::Tensor hidden, targets;
  xs::loss_options options;
};

inline loss_args prepare(const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         const at::Tensor& targets, int64_t reduction, int64_t ignore_index, const char* op) {
  check_weight(weight, bias, op);
  loss_args a;
  a.hidden = prepare_hidden(hidden, weight, op);
  a.targets = prepare_targets(targets, a.hidden, weight, op);
  a.options = make_options(reduction, ignore_index, op);
  return a;
}

/// F.cross_entropy's mean over no sample (or, with class weights, over samples of total weight 0) is
/// NaN (the library returns 0; the gradients are 0 in both). Tensor operations on the loss's
/// device: no read-back. Call after the library has checked the targets and class weights.
inline at::Tensor nan_if_nothing_counts(const at::Tensor& loss, const loss_args& a,
                                        const at::Tensor& class_weight = {}) {
  if (a.options.reduce != xs::reduction::mean) return loss;
  const at::Tensor kept = a.targets.ne(a.options.ignore_index);
  at::Tensor counts = kept.any();
  if (class_weight.defined() && a.targets.numel() > 0) {
    const at::Tensor t = a.targets.clamp(0, class_weight.numel() - 1);
    counts = at::where(kept, class_weight.index_select(0, t), at::zeros({}, class_weight.options())).sum().gt(0);
  }
  return at::where(counts, loss, at::full({}, std::numeric_limits<float>::quiet_NaN(), loss.options()));
}

}  // namespace xsoftmax_torch
