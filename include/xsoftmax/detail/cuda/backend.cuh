// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `backend_traits<cuda>`: device vectors (from `set_vector_memory_resource`'s resource when one is
/// set), `cuda_resources`, and Thrust's CUDA system on the resources' stream.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/detail/cuda/vector_memory.cuh>

#include <thrust/device_vector.h>
#include <thrust/system/cuda/execution_policy.h>

namespace xsoftmax {

template <>
struct backend_traits<cuda> {
  /// Device vectors whose memory comes from `set_vector_memory_resource`'s resource, if any
  /// (detail/cuda/vector_memory.cuh), else cudaMalloc.
  template <class T>
  using vector = thrust::device_vector<T, detail::gpu::vector_allocator<T>>;
  using resources = cuda_resources;
  static constexpr bool is_host = false;
  static constexpr const char* name = "cuda";

  /// Thrust's CUDA system on the resources' stream, without the synchronisation Thrust's `par` does
  /// after every algorithm: work queued on one stream runs in order, and the verbs synchronise the
  /// stream once, before they read a result on the host and before they return. (Algorithms that
  /// return a value, such as `find_if` or `copy_if`'s end iterator, still wait for that value.)
  /// Temporary storage comes from the resources' caching allocator, so that algorithms needing it
  /// (sort, reduce_by_key, copy_if, ...) do not cudaMalloc / cudaFree (which synchronises the
  /// device) on every call; see detail/cuda/workspace.cuh for why reuse is stream-safe.
  [[nodiscard]] static auto policy(const resources& r) {
    return thrust::cuda::par_nosync(r.thrust_allocator()).on(r.stream());
  }

  /// Without resources (as `weight_store::apply_sgd` calls it): the default stream, and *blocking*
  /// (Thrust's `par` synchronises after each algorithm), so an update is complete when the call
  /// returns and whatever stream the next verb runs on sees the new weights.
  [[nodiscard]] static auto policy() { return thrust::cuda::par.on(cudaStream_t{}); }
};

}  // namespace xsoftmax
