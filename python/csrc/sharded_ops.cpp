// SPDX-License-Identifier: Apache-2.0
//
// The class-sharded full softmax over a torch.distributed process group (Python module functions,
// called by xsoftmax.distributed.ShardedFullSoftmaxLoss; not traceable operators, since a process
// group is not a tensor):
//
//   sharded_full_run(group, hidden, weight, bias?, targets, num_classes, layout, reduction,
//                    ignore_index, label_smoothing, z_loss, margin, margin_scale, margin_m,
//                    gradient_filter, grad_output?, want_gradients)
//       -> (loss, grad_hidden, grad_weight, grad_bias)
//   sharded_full_topk(group, hidden, weight, bias?, num_classes, layout, k) -> (log_probs, classes)
//   sharded_full_evaluate(group, hidden, weight, bias?, targets, num_classes, layout, reduction,
//                         ignore_index, label_smoothing, z_loss, k) -> (loss, log_probs, classes)
//       the loss and the top-k from one pass over each rank's scores (forward_topk); ignored rows:
//       classes -1, log_probs -inf
//
// On CPU tensors the `omp` backend's head; on CUDA tensors (a build with the CUDA operators) the
// `cuda` backend's, over the group's NCCL backend or through host copies
// (process_group_communicator.hpp); one body for both (sharded_op_bodies.hpp). `weight` / `bias`
// are this rank's block of classes [class_begin, class_end) (the library's split: the first
// num_classes % size ranks hold one class more). `layout` 0: data-parallel (each rank passes its
// own rows and gets their loss and gradients), 1: replicated (every rank passes the same rows).
// With `want_gradients`, grad_hidden (B x dim) and this rank's dense weight gradient (local rows x
// dim, and the bias's) are returned, for the upstream gradient `grad_output` (None: 1; a scalar, or
// B values for reduction none). `margin` 0: none, 1: ArcFace, 2: CosFace (scale s, margin m; the
// library checks them and that there is no bias). Every rank must call with the same options.

#include "sharded_op_bodies.hpp"

#include <torch/extension.h>

namespace xsoftmax_torch {

namespace {

/// A CUDA weight given to a build without the CUDA operators.
[[noreturn]] void no_cuda_sharded(const char* op) {
  TORCH_CHECK_VALUE(false, "xsoftmax::", op, ": weight is a CUDA tensor but this build of xsoftmax has no CUDA ",
                    "operators (xsoftmax.build_info()); rebuild with torch's CUDA and nvcc, or use CPU tensors");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sharded_full_run(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t margin, double margin_scale, double margin_m,
    double gradient_filter, const c10::optional<at::Tensor>& grad_output, bool want_gradients) {
  if (weight.is_cuda()) {
#if defined(XSOFTMAX_TORCH_WITH_CUDA)
    return sharded_full_run_cuda(group, hidden, weight, bias, targets, num_classes, layout, reduction, ignore_index,
                                 label_smoothing, z_loss, margin, margin_scale, margin_m, gradient_filter, grad_output,
                                 want_gradients);
#else
    no_cuda_sharded("sharded_full_run");
#endif
  }
  guarded([&] { check_cpu(weight, "sharded_full_run", "weight"); });
  return sharded_full_run_on<host_backend>(group, hidden, weight, bias, targets, num_classes, layout, reduction,
                                           ignore_index, label_smoothing, z_loss, margin, margin_scale, margin_m,
                                           gradient_filter, grad_output, want_gradients);
}

std::tuple<at::Tensor, at::Tensor> sharded_full_topk(const group_ptr& group, const at::Tensor& hidden,
                                                     const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                                     int64_t num_classes, int64_t layout, int64_t k) {
  if (weight.is_cuda()) {
#if defined(XSOFTMAX_TORCH_WITH_CUDA)
    return sharded_full_topk_cuda(group, hidden, weight, bias, num_classes, layout, k);
#else
    no_cuda_sharded("sharded_full_topk");
#endif
  }
  guarded([&] { check_cpu(weight, "sharded_full_topk", "weight"); });
  return sharded_full_topk_on<host_backend>(group, hidden, weight, bias, num_classes, layout, k);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_full_evaluate(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t k) {
  if (weight.is_cuda()) {
#if defined(XSOFTMAX_TORCH_WITH_CUDA)
    return sharded_full_evaluate_cuda(group, hidden, weight, bias, targets, num_classes, layout, reduction,
                                      ignore_index, label_smoothing, z_loss, k);
#else
    no_cuda_sharded("sharded_full_evaluate");
#endif
  }
  guarded([&] { check_cpu(weight, "sharded_full_evaluate", "weight"); });
  return sharded_full_evaluate_on<host_backend>(group, hidden, weight, bias, targets, num_classes, layout, reduction,
                                                ignore_index, label_smoothing, z_loss, k);
}

/// One `all_to_all` of the communicator (for tests): `send` (int64, on the CPU or a CUDA device)
/// split by `send_counts`; the receive counts are exchanged first, as the library does.
at::Tensor communicator_all_to_all(const group_ptr& group, const at::Tensor& send, std::vector<int64_t> send_counts) {
  return guarded([&] {
    TORCH_CHECK_VALUE(group, "xsoftmax::communicator_all_to_all: group is None");
    const at::Tensor in = send.to(at::kLong).contiguous();
    const auto exchange = [&](auto comm) {
      TORCH_CHECK_VALUE(static_cast<int>(send_counts.size()) == comm.size(), "xsoftmax::communicator_all_to_all: ",
                        send_counts.size(), " send counts for ", comm.size(), " ranks");
      std::vector<int64_t> ones(send_counts.size(), 1), recv_counts(send_counts.size());
      at::Tensor counts_in = at::tensor(send_counts, in.options()), counts_out = at::empty_like(counts_in);
      comm.all_to_all(counts_in.data_ptr<int64_t>(), ones.data(), counts_out.data_ptr<int64_t>(), ones.data());
      const at::Tensor host_counts = counts_out.cpu();
      int64_t total = 0;
      for (int64_t q = 0; q < host_counts.numel(); ++q) {
        recv_counts[static_cast<std::size_t>(q)] = host_counts.data_ptr<int64_t>()[q];
        total += recv_counts[static_cast<std::size_t>(q)];
      }
      at::Tensor out = at::empty({total}, in.options());
      comm.all_to_all(in.data_ptr<int64_t>(), send_counts.data(), out.data_ptr<int64_t>(), recv_counts.data());
      return out;
    };
    if (in.is_cuda()) {
      const c10::DeviceGuard on_device(in.device());
      return exchange(process_group_device_communicator(group, in.device()));
    }
    return exchange(process_group_communicator(group));
  });
}

}  // namespace

void register_sharded_ops(pybind11::module& m) {
  namespace py = pybind11;
  m.def("sharded_full_run", &sharded_full_run, py::arg("group"), py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("targets"), py::arg("num_classes"), py::arg("layout"), py::arg("reduction"),
        py::arg("ignore_index"), py::arg("label_smoothing"), py::arg("z_loss"), py::arg("margin"),
        py::arg("margin_scale"), py::arg("margin_m"), py::arg("gradient_filter"), py::arg("grad_output"),
        py::arg("want_gradients"), py::call_guard<py::gil_scoped_release>());
  m.def("sharded_full_topk", &sharded_full_topk, py::arg("group"), py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("num_classes"), py::arg("layout"), py::arg("k"),
        py::call_guard<py::gil_scoped_release>());
  m.def("sharded_full_evaluate", &sharded_full_evaluate, py::arg("group"), py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("targets"), py::arg("num_classes"), py::arg("layout"), py::arg("reduction"),
        py::arg("ignore_index"), py::arg("label_smoothing"), py::arg("z_loss"), py::arg("k"),
        py::call_guard<py::gil_scoped_release>());
  m.def("communicator_all_to_all", &communicator_all_to_all, py::arg("group"), py::arg("send"),
        py::arg("send_counts"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace xsoftmax_torch
