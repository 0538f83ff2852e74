// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of the class-sharded full softmax's functions (sharded_ops.cpp), written once for
// every device as op_bodies.hpp's are: templates on the library's backend, instantiated for CPU
// tensors (`omp` with `process_group_communicator`, sharded_ops.cpp) and for CUDA tensors (`cuda`
// with `process_group_device_communicator`, sharded_ops_cuda.cu, when the extension is built with
// its CUDA operators). The head runs with `torch_backend<Backend>`'s resources (on CUDA: torch's
// current stream, allocator and cuBLAS handle) and the `_async` verbs: the loss stays on the device.

#include "op_bodies.hpp"
#include "process_group_communicator.hpp"

#include <torch/extension.h>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>

#include <memory>
#include <tuple>

namespace xsoftmax_torch {

using group_ptr = c10::intrusive_ptr<c10d::ProcessGroup>;

/// The communicator of a head on `Backend`: host buffers, or the cuda backend's device buffers.
template <class Backend>
using communicator_for = basic_process_group_communicator<!xs::is_host_backend<Backend>>;

inline xs::hidden_layout layout_of(int64_t layout, const char* op) {
  TORCH_CHECK_VALUE(layout == 0 || layout == 1, "xsoftmax::", op, ": layout = ", layout,
                    " must be 0 (data_parallel) or 1 (replicated)");
  return layout == 0 ? xs::hidden_layout::data_parallel : xs::hidden_layout::replicated;
}

/// Calls `f(head)` with this rank's sharded head on `Backend` over `weight` / `bias`.
template <class Backend, class F>
void with_sharded_head(const group_ptr& group, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       int64_t num_classes, int64_t layout, const char* op, F&& f) {
  TORCH_CHECK_VALUE(group, "xsoftmax::", op, ": group is None; pass a torch.distributed process group");
  using sharding = xs::class_sharding<communicator_for<Backend>>;
  dispatch_precision(weight.scalar_type(), op, [&](auto precision) {
    using P = decltype(precision);
    using S = typename P::storage_type;
    xs::full_softmax<P, Backend, sharding> head(
        sharding(communicator_for<Backend>(group, weight.device()), num_classes, layout_of(layout, op)),
        weight_view<S>(weight), bias_pointer<S>(bias), torch_backend<Backend>::resources());
    f(head);
  });
}

/// sharded_full_run (see sharded_ops.cpp) on `Backend`.
template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sharded_full_run_on(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t margin, double margin_scale, double margin_m,
    double gradient_filter, const c10::optional<at::Tensor>& grad_output, bool want_gradients) {
  return guarded([&] {
    const char* op = "sharded_full_run";
    loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    a.options.label_smoothing = static_cast<float>(label_smoothing);
    a.options.z_loss = static_cast<float>(z_loss);
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 2, "xsoftmax::", op, ": margin = ", margin,
                      " must be 0 (none), 1 (arcface) or 2 (cosface)");
    a.options.margin.kind = margin == 1 ? xs::margin_kind::arcface : margin == 2 ? xs::margin_kind::cosface
                                                                                 : xs::margin_kind::none;
    a.options.margin.scale = static_cast<float>(margin_scale);
    a.options.margin.m = static_cast<float>(margin_m);
    a.options.gradient_filter = static_cast<float>(gradient_filter);  // the library checks it
    at::Tensor go;
    if (grad_output.has_value() && grad_output->defined()) {
      check_same_device(*grad_output, weight, op, "grad_output");
      go = grad_output->to(at::kFloat).contiguous();
    }
    const c10::DeviceGuard on_device(weight.device());
    const int64_t b = a.hidden.size(0), d = a.hidden.size(1);
    at::Tensor per_sample = at::empty({b}, float_on(weight)), loss = at::empty({}, float_on(weight));
    at::Tensor grad_hidden, grad_weight, grad_bias;
    with_sharded_head<Backend>(group, weight, bias, num_classes, layout, op, [&](auto& head) {
      if (!want_gradients) {
        head.forward_async(hidden_view(a.hidden), targets_view(a.targets), vector_of(loss), a.options,
                           vector_of(per_sample));
        return;
      }
      grad_hidden = at::empty({b, d}, float_on(weight));
      auto g = call_gradient<Backend>();
      const xs::vector_view<const float> upstream =
          go.defined() ? xs::vector_view<const float>(go.data_ptr<float>(), go.numel()) : xs::vector_view<const float>{};
      head.forward_backward_async(hidden_view(a.hidden), targets_view(a.targets), matrix_of(grad_hidden), *g,
                                  vector_of(loss), a.options, vector_of(per_sample), upstream);
      const bool has_bias = bias.has_value() && bias->defined();
      auto [rows, values, gbias] = gradient_tensors<Backend>(g, weight, has_bias, false, /*every_row_in_order=*/true);
      grad_weight = values;
      grad_bias = gbias;
    });
    at::Tensor out = a.options.reduce == xs::reduction::none ? per_sample : nan_if_nothing_counts(loss, a);
    if (!want_gradients) grad_hidden = grad_weight = grad_bias = at::empty({0}, float_on(weight));
    return std::make_tuple(out, grad_hidden, grad_weight, grad_bias);
  });
}

/// sharded_full_topk (see sharded_ops.cpp) on `Backend`.
template <class Backend>
std::tuple<at::Tensor, at::Tensor> sharded_full_topk_on(const group_ptr& group, const at::Tensor& hidden,
                                                        const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                                        int64_t num_classes, int64_t layout, int64_t k) {
  return guarded([&] {
    const char* op = "sharded_full_topk";
    check_weight(weight, bias, op);
    const at::Tensor h = prepare_hidden(hidden, weight, op);
    const int64_t b = h.size(0);
    TORCH_CHECK_VALUE(k >= 1, "xsoftmax::", op, ": k = ", k, " must be >= 1");
    const c10::DeviceGuard on_device(weight.device());
    at::Tensor log_probs = at::empty({b, k}, float_on(weight));
    at::Tensor classes = at::empty({b, k}, at::TensorOptions().dtype(at::kLong).device(weight.device()));
    with_sharded_head<Backend>(group, weight, bias, num_classes, layout, op, [&](auto& head) {
      head.topk_async(hidden_view(h), k, xs::matrix_view<index_t>(classes.data_ptr<int64_t>(), b, k),
                      xs::matrix_view<float>(log_probs.data_ptr<float>(), b, k));
    });
    return std::make_tuple(log_probs, classes);
  });
}

/// sharded_full_evaluate (see sharded_ops.cpp) on `Backend`: the loss and top-k from one pass over
/// each rank's scores (the library's forward_topk): (loss, log_probs, classes).
template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_full_evaluate_on(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t k) {
  return guarded([&] {
    const char* op = "sharded_full_evaluate";
    loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    a.options.label_smoothing = static_cast<float>(label_smoothing);
    a.options.z_loss = static_cast<float>(z_loss);
    TORCH_CHECK_VALUE(k >= 1, "xsoftmax::", op, ": k = ", k, " must be >= 1");
    const c10::DeviceGuard on_device(weight.device());
    const int64_t b = a.hidden.size(0);
    at::Tensor per_sample = at::empty({b}, float_on(weight)), loss = at::empty({}, float_on(weight));
    at::Tensor log_probs = at::empty({b, k}, float_on(weight));
    at::Tensor classes = at::empty({b, k}, at::TensorOptions().dtype(at::kLong).device(weight.device()));
    with_sharded_head<Backend>(group, weight, bias, num_classes, layout, op, [&](auto& head) {
      head.forward_topk_async(hidden_view(a.hidden), targets_view(a.targets), k,
                              xs::matrix_view<index_t>(classes.data_ptr<int64_t>(), b, k), matrix_of(log_probs),
                              vector_of(loss), a.options, vector_of(per_sample));
    });
    at::Tensor out = a.options.reduce == xs::reduction::none ? per_sample : nan_if_nothing_counts(loss, a);
    return std::make_tuple(out, log_probs, classes);
  });
}

/// The CUDA instantiations (sharded_ops_cuda.cu; declared for the dispatch in sharded_ops.cpp).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sharded_full_run_cuda(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t margin, double margin_scale, double margin_m,
    double gradient_filter, const c10::optional<at::Tensor>& grad_output, bool want_gradients);
std::tuple<at::Tensor, at::Tensor> sharded_full_topk_cuda(const group_ptr& group, const at::Tensor& hidden,
                                                          const at::Tensor& weight,
                                                          const c10::optional<at::Tensor>& bias, int64_t num_classes,
                                                          int64_t layout, int64_t k);
std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_full_evaluate_cuda(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t k);

}  // namespace xsoftmax_torch
