// SPDX-License-Identifier: Apache-2.0
//
// The class-sharded full softmax's functions on CUDA tensors (dispatched to by sharded_ops.cpp):
// the bodies of sharded_op_bodies.hpp on the library's `cuda` backend, with torch's stream,
// allocator and cuBLAS handle (torch_cuda.cuh), over the process group's NCCL backend (or host
// copies for a group without NCCL: process_group_communicator.hpp).
//
// Compiled by nvcc only when the extension is built with its CUDA operators (setup.py,
// XSOFTMAX_WITH_CUDA).

#include <xsoftmax/cuda.cuh>  // first: the cuda backend's traits before any head is instantiated

#include "sharded_op_bodies.hpp"
#include "torch_cuda.cuh"

namespace xsoftmax_torch {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sharded_full_run_cuda(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t margin, double margin_scale, double margin_m,
    double gradient_filter, const c10::optional<at::Tensor>& grad_output, bool want_gradients) {
  return sharded_full_run_on<xs::cuda>(group, hidden, weight, bias, targets, num_classes, layout, reduction,
                                       ignore_index, label_smoothing, z_loss, margin, margin_scale, margin_m,
                                       gradient_filter, grad_output, want_gradients);
}

std::tuple<at::Tensor, at::Tensor> sharded_full_topk_cuda(const group_ptr& group, const at::Tensor& hidden,
                                                          const at::Tensor& weight,
                                                          const c10::optional<at::Tensor>& bias, int64_t num_classes,
                                                          int64_t layout, int64_t k) {
  return sharded_full_topk_on<xs::cuda>(group, hidden, weight, bias, num_classes, layout, k);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_full_evaluate_cuda(
    const group_ptr& group, const at::Tensor& hidden, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    const at::Tensor& targets, int64_t num_classes, int64_t layout, int64_t reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, int64_t k) {
  return sharded_full_evaluate_on<xs::cuda>(group, hidden, weight, bias, targets, num_classes, layout, reduction,
                                            ignore_index, label_smoothing, z_loss, k);
}

}  // namespace xsoftmax_torch
