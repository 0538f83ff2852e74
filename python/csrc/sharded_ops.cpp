// SPDX-License-Identifier: Apache-2.0
//
// The class-sharded full softmax over a torch.distributed process group (Python module functions,
// called by xsoftmax.distributed.ShardedFullSoftmaxLoss; not traceable operators, since a process
// group is not a tensor):
//
//   sharded_full_run(group, hidden, weight, bias?, targets, num_classes, layout, reduction,
//                    ignore_index, label_smoothing, z_loss, margin, margin_scale, margin_m,
//                    grad_output?, want_gradients)
//       -> (loss, grad_hidden, grad_weight, grad_bias)
//   sharded_full_topk(group, hidden, weight, bias?, num_classes, layout, k) -> (log_probs, classes)
//
// `weight` / `bias` are this rank's block of classes [class_begin, class_end) (the library's
// split: the first num_classes % size ranks hold one class more). `layout` 0: data-parallel (each
// rank passes its own rows and gets their loss and gradients), 1: replicated (every rank passes the
// same rows). With `want_gradients`, grad_hidden (B x dim) and this rank's dense weight gradient
// (local rows x dim, and the bias's) are returned, for the upstream gradient `grad_output` (None:
// 1; a scalar, or B values for reduction none). `margin` 0: none, 1: ArcFace, 2: CosFace (scale s,
// margin m; the library checks them and that there is no bias). Every rank must call with the
// same options.

#include "process_group_communicator.hpp"
#include "tensor_args.hpp"

#include <torch/extension.h>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>

namespace xsoftmax_torch {

namespace {

using group_ptr = c10::intrusive_ptr<c10d::ProcessGroup>;
using sharding = xs::class_sharding<process_group_communicator>;

xs::hidden_layout layout_of(int64_t layout, const char* op) {
  TORCH_CHECK_VALUE(layout == 0 || layout == 1, "xsoftmax::", op, ": layout = ", layout,
                    " must be 0 (data_parallel) or 1 (replicated)");
  return layout == 0 ? xs::hidden_layout::data_parallel : xs::hidden_layout::replicated;
}

/// Calls `f(head)` with this rank's sharded head over `weight` / `bias`.
template <class F>
void with_sharded_head(const group_ptr& group, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       int64_t num_classes, int64_t layout, const char* op, F&& f) {
  TORCH_CHECK_VALUE(group, "xsoftmax::", op, ": group is None; pass a torch.distributed process group");
  dispatch_precision(weight.scalar_type(), op, [&](auto precision) {
    using P = decltype(precision);
    using S = typename P::storage_type;
    xs::full_softmax<P, host_backend, sharding> head(
        sharding(process_group_communicator(group), num_classes, layout_of(layout, op)), weight_view<S>(weight),
        bias_pointer<S>(bias));
    f(head);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sharded_full_run(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t margin, double margin_scale, double margin_m,
    const c10::optional<at::Tensor>& grad_output, bool want_gradients) {
  return guarded([&] {
    const char* op = "sharded_full_run";
    check_cpu(weight, op, "weight");
    loss_args a = prepare(hidden, weight, bias, targets, reduction, ignore_index, op);
    a.options.label_smoothing = static_cast<float>(label_smoothing);
    a.options.z_loss = static_cast<float>(z_loss);
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 2, "xsoftmax::", op, ": margin = ", margin,
                      " must be 0 (none), 1 (arcface) or 2 (cosface)");
    a.options.margin.kind = margin == 1 ? xs::margin_kind::arcface : margin == 2 ? xs::margin_kind::cosface
                                                                                 : xs::margin_kind::none;
    a.options.margin.scale = static_cast<float>(margin_scale);
    a.options.margin.m = static_cast<float>(margin_m);
    const int64_t b = a.hidden.size(0), d = a.hidden.size(1);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor per_sample = at::empty({b}, f32), grad_hidden, grad_weight, grad_bias;
    const xs::vector_view<float> ps(per_sample.data_ptr<float>(), b);
    float loss = 0;
    at::Tensor go;
    if (grad_output.has_value() && grad_output->defined()) {
      check_cpu(*grad_output, op, "grad_output");
      go = grad_output->to(at::kFloat).contiguous();
    }
    with_sharded_head(group, weight, bias, num_classes, layout, op, [&](auto& head) {
      if (!want_gradients) {
        loss = head.forward(hidden_view(a.hidden), targets_view(a.targets), a.options, ps);
        return;
      }
      grad_hidden = at::empty({b, d}, f32);
      auto g = std::make_shared<gradient<host_backend>>();
      const xs::vector_view<const float> upstream =
          go.defined() ? xs::vector_view<const float>(go.data_ptr<float>(), go.numel()) : xs::vector_view<const float>{};
      loss = head.forward_backward(hidden_view(a.hidden), targets_view(a.targets),
                                   xs::matrix_view<float>(grad_hidden.data_ptr<float>(), b, d), *g, a.options, ps,
                                   upstream);
      const bool has_bias = bias.has_value() && bias->defined();
      auto [rows, values, gbias] = gradient_tensors<host_backend>(g, weight, has_bias, false, /*every_row_in_order=*/true);
      grad_weight = values;
      grad_bias = gbias;
    });
    at::Tensor out = a.options.reduce == xs::reduction::none
                         ? per_sample
                         : nan_if_nothing_counts(at::scalar_tensor(loss, f32), a);
    if (!want_gradients) grad_hidden = grad_weight = grad_bias = at::empty({0}, f32);
    return std::make_tuple(out, grad_hidden, grad_weight, grad_bias);
  });
}

std::tuple<at::Tensor, at::Tensor> sharded_full_topk(const group_ptr& group, const at::Tensor& hidden,
                                                     const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                                     int64_t num_classes, int64_t layout, int64_t k) {
  return guarded([&] {
    const char* op = "sharded_full_topk";
    check_cpu(weight, op, "weight");
    check_weight(weight, bias, op);
    const at::Tensor h = prepare_hidden(hidden, weight, op);
    const int64_t b = h.size(0);
    TORCH_CHECK_VALUE(k >= 1, "xsoftmax::", op, ": k = ", k, " must be >= 1");
    at::Tensor log_probs = at::empty({b, k}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor classes = at::empty({b, k}, at::TensorOptions().dtype(at::kLong));
    with_sharded_head(group, weight, bias, num_classes, layout, op, [&](auto& head) {
      head.topk(hidden_view(h), k, xs::matrix_view<index_t>(classes.data_ptr<int64_t>(), b, k),
                xs::matrix_view<float>(log_probs.data_ptr<float>(), b, k));
    });
    return std::make_tuple(log_probs, classes);
  });
}

/// One `all_to_all` of the communicator (for tests): `send` (int64) split by `send_counts`; the
/// receive counts are exchanged first, as the library does.
at::Tensor communicator_all_to_all(const group_ptr& group, const at::Tensor& send, std::vector<int64_t> send_counts) {
  return guarded([&] {
    TORCH_CHECK_VALUE(group, "xsoftmax::communicator_all_to_all: group is None");
    process_group_communicator comm(group);
    TORCH_CHECK_VALUE(static_cast<int>(send_counts.size()) == comm.size(), "xsoftmax::communicator_all_to_all: ",
                      send_counts.size(), " send counts for ", comm.size(), " ranks");
    const at::Tensor in = send.to(at::kLong).contiguous();
    std::vector<int64_t> ones(send_counts.size(), 1), recv_counts(send_counts.size());
    comm.all_to_all(send_counts.data(), ones.data(), recv_counts.data(), ones.data());
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    at::Tensor out = at::empty({total}, at::TensorOptions().dtype(at::kLong));
    comm.all_to_all(in.data_ptr<int64_t>(), send_counts.data(), out.data_ptr<int64_t>(), recv_counts.data());
    return out;
  });
}

}  // namespace

void register_sharded_ops(pybind11::module& m) {
  namespace py = pybind11;
  m.def("sharded_full_run", &sharded_full_run, py::arg("group"), py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("targets"), py::arg("num_classes"), py::arg("layout"), py::arg("reduction"),
        py::arg("ignore_index"), py::arg("label_smoothing"), py::arg("z_loss"), py::arg("margin"),
        py::arg("margin_scale"), py::arg("margin_m"), py::arg("grad_output"),
        py::arg("want_gradients"), py::call_guard<py::gil_scoped_release>());
  m.def("sharded_full_topk", &sharded_full_topk, py::arg("group"), py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("num_classes"), py::arg("layout"), py::arg("k"),
        py::call_guard<py::gil_scoped_release>());
  m.def("communicator_all_to_all", &communicator_all_to_all, py::arg("group"), py::arg("send"),
        py::arg("send_counts"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace xsoftmax_torch
