// SPDX-License-Identifier: Apache-2.0
//
// The operators on CUDA tensors: the bodies of op_bodies.hpp on the library's `cuda` backend, run
// as a PyTorch citizen. Every head runs on torch's current stream of the weight's device, with the
// calling thread's torch cuBLAS handle (and its workspace and math mode) and takes every working
// buffer from torch's caching allocator (`torch_device_memory`, torch_cuda.cuh), so that
// torch.cuda.max_memory_allocated counts it and nothing is cached beside torch's own cache; the
// weight gradients (the library's vectors) come from it too (`torch_vector_memory`).
//
// Compiled by nvcc only when the extension is built with its CUDA operators (setup.py,
// XSOFTMAX_WITH_CUDA); schemas and the CPU registration are in ops.cpp.

#include <xsoftmax/cuda.cuh>  // first: the cuda backend's traits before any head is instantiated

#include "op_bodies.hpp"
#include "torch_cuda.cuh"

#include <torch/library.h>

#include <memory>

namespace {
/// From the moment the extension loads, the library's vectors (the weight gradients, which the
/// operators return as tensors over their buffers) come from torch's caching allocator.
const bool vectors_from_torch = [] {
  xsoftmax::set_vector_memory_resource(std::make_shared<xsoftmax_torch::torch_vector_memory>());
  return true;
}();
}  // namespace

TORCH_LIBRARY_IMPL(xsoftmax, CUDA, m) {
  using xsoftmax_torch::backward_op;
  using xsoftmax_torch::loss_fused_op;
  using xsoftmax_torch::loss_op;
  using xsoftmax_torch::loss_topk_op;
  using xsoftmax_torch::topk_op;
  m.impl("loss", &loss_op<xsoftmax::cuda>);
  m.impl("loss_fused", &loss_fused_op<xsoftmax::cuda>);
  m.impl("backward", &backward_op<xsoftmax::cuda>);
  m.impl("topk", &topk_op<xsoftmax::cuda>);
  m.impl("loss_topk", &loss_topk_op<xsoftmax::cuda>);
}
