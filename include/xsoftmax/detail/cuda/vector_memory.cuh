// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Where the cuda backend's vectors (`backend_vector<cuda, T>`: a head's own weights, a
/// `sparse_gradient`'s rows and values) take their memory: `cudaMalloc` / `cudaFree` by default, or
/// a host framework's `device_memory_resource` set for the process
/// (`xsoftmax::set_vector_memory_resource`).
///
/// Why: a training step's weight gradient is such a vector, as large as the weights it covers (2.4
/// GB of fp32 for 262144 x 2304). A framework that hands the gradient over as its own tensor and
/// drops it after the optimizer step (PyTorch's `zero_grad(set_to_none=True)`) would otherwise
/// `cudaMalloc` it every step and `cudaFree` it, which waits for the whole device, outside the
/// framework's allocator and its memory statistics. The PyTorch package sets torch's caching
/// allocator here when it loads.

#include <xsoftmax/detail/cuda/memory_resource.cuh>

#include <thrust/device_malloc_allocator.h>
#include <thrust/device_ptr.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

namespace xsoftmax {
namespace detail::gpu {

struct vector_memory_setting {
  std::mutex mutex;
  std::shared_ptr<device_memory_resource> resource;  // null: cudaMalloc / cudaFree
  static vector_memory_setting& instance() {
    static vector_memory_setting s;
    return s;
  }
};

}  // namespace detail::gpu

/// Makes `resource` the source of every cuda backend vector made from now on (null: `cudaMalloc`
/// and `cudaFree`, the default). A vector keeps the resource it was made with, and returns its
/// memory there, whatever is set later. The resource is called with the legacy default stream
/// (a vector lives across calls and streams); one that ties blocks to streams, as PyTorch's
/// caching allocator does, should tie a vector's block to the stream the vector will be written on
/// (the PyTorch package uses torch's current stream). Thread-safe.
inline void set_vector_memory_resource(std::shared_ptr<device_memory_resource> resource) {
  detail::gpu::vector_memory_setting& s = detail::gpu::vector_memory_setting::instance();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.resource = std::move(resource);
}

/// The resource `set_vector_memory_resource` set (null: none, `cudaMalloc`).
[[nodiscard]] inline std::shared_ptr<device_memory_resource> vector_memory_resource() {
  detail::gpu::vector_memory_setting& s = detail::gpu::vector_memory_setting::instance();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.resource;
}

namespace detail::gpu {

/// Thrust's device allocator for the cuda backend's vectors: from the resource set for the process
/// when the vector (its allocator) was made, else `cudaMalloc` (Thrust's own device allocator).
template <class T>
class vector_allocator : public thrust::device_malloc_allocator<T> {
  using base = thrust::device_malloc_allocator<T>;

 public:
  using value_type = T;
  using pointer = typename base::pointer;
  using size_type = typename base::size_type;
  template <class U>
  struct rebind {
    using other = vector_allocator<U>;
  };

  vector_allocator() : memory_(vector_memory_resource()) {}
  template <class U>
  vector_allocator(const vector_allocator<U>& other) noexcept : memory_(other.memory()) {}  // NOLINT: as std allocators

  pointer allocate(size_type n) {
    if (!memory_) return base::allocate(n);
    if (n == 0) return pointer(static_cast<T*>(nullptr));
    return pointer(static_cast<T*>(memory_->allocate(n * sizeof(T), cudaStream_t{})));
  }
  void deallocate(pointer p, size_type n) noexcept {
    if (!memory_) return base::deallocate(p, n);
    if (p.get() != nullptr) memory_->deallocate(p.get(), n * sizeof(T), cudaStream_t{});
  }

  [[nodiscard]] const std::shared_ptr<device_memory_resource>& memory() const noexcept { return memory_; }
  template <class U>
  bool operator==(const vector_allocator<U>& other) const noexcept {
    return memory_ == other.memory();
  }
  template <class U>
  bool operator!=(const vector_allocator<U>& other) const noexcept {
    return !(*this == other);
  }

 private:
  std::shared_ptr<device_memory_resource> memory_;  // kept: the vector frees where it allocated
};

}  // namespace detail::gpu
}  // namespace xsoftmax
