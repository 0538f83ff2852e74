// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a head on the library's `cuda` backend runs with inside PyTorch (`torch_backend<xs::cuda>`,
// see op_bodies.hpp): torch's current stream of the current device, the calling thread's torch
// cuBLAS handle, and torch's caching allocator for every working buffer (`torch_device_memory`),
// so that torch.cuda.max_memory_allocated counts it and nothing is cached beside torch's own cache.
// Shared by the operators (ops_cuda.cu) and the class-sharded functions (sharded_ops_cuda.cu).

#include <xsoftmax/cuda.cuh>

#include "op_bodies.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <memory>

namespace xsoftmax_torch {

/// torch's CUDA caching allocator as the library's `device_memory_resource`: blocks are tied to the
/// stream they were allocated on and reused on it at once, on another stream only when free, which
/// is the resource contract.
class torch_device_memory final : public xs::device_memory_resource {
 public:
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
  }
  void deallocate(void* p, std::size_t, cudaStream_t) noexcept override {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
};

/// torch's CUDA caching allocator for the library's vectors (`xs::set_vector_memory_resource`):
/// the weight gradients the operators hand torch as tensors, without a copy. Each block is tied to
/// torch's current stream when it is made, the stream of the operator that writes it; so
/// torch.cuda.memory_allocated counts a gradient, and dropping one (`zero_grad(set_to_none=True)`)
/// returns it to torch's cache instead of a cudaFree that waits for the whole device.
class torch_vector_memory final : public xs::device_memory_resource {
 public:
  void* allocate(std::size_t bytes, cudaStream_t) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, at::cuda::getCurrentCUDAStream().stream());
  }
  void deallocate(void* p, std::size_t, cudaStream_t) noexcept override {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
};

template <>
struct torch_backend<xs::cuda> {
  static std::shared_ptr<xs::device_memory_resource> memory() {
    static const auto shared = std::make_shared<torch_device_memory>();
    return shared;
  }
  /// torch's current stream of the current device (the operator made the weight's device current),
  /// torch's allocator and this thread's torch cuBLAS handle (bound to that stream by torch).
  static xs::cuda_resources resources() {
    xs::cuda_resources r(at::cuda::getCurrentCUDAStream().stream(), memory());
    r.use_cublas(at::cuda::getCurrentCUDABlasHandle());
    return r;
  }
  /// A cached head keeps its stream (it is keyed on it); the cuBLAS handle is the calling thread's.
  static void refresh(const xs::cuda_resources& r) { r.use_cublas(at::cuda::getCurrentCUDABlasHandle()); }
  static const void* stream() { return at::cuda::getCurrentCUDAStream().stream(); }
};

}  // namespace xsoftmax_torch
