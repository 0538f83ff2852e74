// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Where the head tests keep their buffers, and which backends they run on.
///
/// The head tests (tests/heads/*_test.cpp) are compiled twice:
///  * by the host compiler into `xsoftmax_tests`, for the `serial` and `omp` backends;
///  * by nvcc into `xsoftmax_cuda_tests` with `XSOFTMAX_TEST_ON_CUDA` defined, for the `cuda`
///    backend (tests/cuda/heads_on_cuda_*.cu include them).
/// The sources are the same. What differs is here:
///  * `XSOFTMAX_TEST_BACKENDS`, the backend list of every `TEST_CASE_TEMPLATE` over backends;
///  * `test_vector<T>`, the container of every buffer a test hands to a head (hidden rows, targets,
///    weights it views, outputs): `std::vector<T>` on the host; on cuda a `std::vector` whose
///    allocator returns CUDA managed memory, which kernels and the host can both address, so the
///    test reads a head's outputs exactly as it does on the host. (A verb is blocking: its outputs
///    are complete when it returns.)
///  * memory a head allocates itself (owned weights, `sparse_gradient` vectors) is device memory on
///    cuda: tests read and write it through `read_back`, `write_into` and `dense_copy`, which copy
///    with `cudaMemcpyDefault` there (the runtime tells host from device pointers by UVA) and plain
///    loops on the host.

#include <xsoftmax/types.hpp>

#include <thrust/host_vector.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(XSOFTMAX_TEST_ON_CUDA)
#include <xsoftmax/cuda.cuh>

#include <cuda_runtime_api.h>
#endif

#if defined(XSOFTMAX_TEST_ON_CUDA)
/// The backends every backend-generic head test runs on in this build.
#define XSOFTMAX_TEST_BACKENDS xsoftmax::cuda
/// 1 in the build for the host backends, 0 in the cuda build: guards the few checks that only
/// make sense with host memory or with several host backends (omp thread counts, serial vs omp).
#define XSOFTMAX_TEST_HOST_BUILD 0
#else
#define XSOFTMAX_TEST_BACKENDS xsoftmax::serial, xsoftmax::omp
#define XSOFTMAX_TEST_HOST_BUILD 1
#endif

namespace xsoftmax_test {

#if defined(XSOFTMAX_TEST_ON_CUDA)
/// The backend of tests that run one head at a time, and the one they alternate with: on the host
/// serial and omp, in the cuda build both cuda.
using primary_backend = xsoftmax::cuda;
using secondary_backend = xsoftmax::cuda;
#else
using primary_backend = xsoftmax::serial;
using secondary_backend = xsoftmax::omp;
#endif

#if defined(XSOFTMAX_TEST_ON_CUDA)
/// Where the cuda build's test buffers live: CUDA managed memory by default; page-locked host memory
/// mapped into the device's address space with XSOFTMAX_TEST_MEMORY=pinned. Both are read and
/// written by the host code of the tests and by the kernels through the same pointer. Managed
/// memory must not be touched by the host while any kernel runs on a device whose
/// concurrentManagedAccess is 0 (the runner prints it); pinned memory has no such rule.
[[nodiscard]] inline bool test_memory_pinned() {
  static const bool pinned = [] {
    const char* v = std::getenv("XSOFTMAX_TEST_MEMORY");
    return v != nullptr && std::string(v) == "pinned";
  }();
  return pinned;
}

/// A std allocator over that memory (cudaMallocManaged / cudaHostAlloc, freed by cudaFree /
/// cudaFreeHost). Throws std::bad_alloc when the runtime refuses (for example when no GPU is
/// present: the cuda test runner exits with "skipped" before any test runs).
template <class T>
struct managed_allocator {
  using value_type = T;
  managed_allocator() = default;
  template <class U>
  managed_allocator(const managed_allocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    void* p = nullptr;
    const std::size_t bytes = (n == 0 ? 1 : n) * sizeof(T);
    const cudaError_t e = test_memory_pinned() ? cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable)
                                               : cudaMallocManaged(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { (void)(test_memory_pinned() ? cudaFreeHost(p) : cudaFree(p)); }

  template <class U>
  bool operator==(const managed_allocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const managed_allocator<U>&) const noexcept {
    return false;
  }
};

template <class T>
using test_vector = std::vector<T, managed_allocator<T>>;
#else
template <class T>
using test_vector = std::vector<T>;
#endif

/// n elements starting at `p`, which may be device memory (a head's owned weights or bias).
template <class T>
test_vector<std::remove_cv_t<T>> read_back(T* p, xsoftmax::index_t n) {
  test_vector<std::remove_cv_t<T>> out(static_cast<std::size_t>(n));
#if defined(XSOFTMAX_TEST_ON_CUDA)
  if (n > 0 && cudaMemcpy(out.data(), p, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDefault) != cudaSuccess)
    throw std::runtime_error("read_back: cudaMemcpy failed");
#else
  for (xsoftmax::index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = p[i];
#endif
  return out;
}

/// Copies `values` to `p`, which may be device memory.
template <class T, class V>
void write_into(T* p, const V& values) {
#if defined(XSOFTMAX_TEST_ON_CUDA)
  if (!values.empty() &&
      cudaMemcpy(p, values.data(), values.size() * sizeof(T), cudaMemcpyDefault) != cudaSuccess)
    throw std::runtime_error("write_into: cudaMemcpy failed");
#else
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
#endif
}

/// The elements of a (possibly strided) matrix view, which may be device memory, densely packed.
template <class T>
test_vector<std::remove_cv_t<T>> dense_copy(xsoftmax::matrix_view<T> m) {
  test_vector<std::remove_cv_t<T>> out(static_cast<std::size_t>(m.rows * m.cols));
#if defined(XSOFTMAX_TEST_ON_CUDA)
  if (m.rows > 0 && m.cols > 0 &&
      cudaMemcpy2D(out.data(), static_cast<std::size_t>(m.cols) * sizeof(T), m.data,
                   static_cast<std::size_t>(m.stride) * sizeof(T), static_cast<std::size_t>(m.cols) * sizeof(T),
                   static_cast<std::size_t>(m.rows), cudaMemcpyDefault) != cudaSuccess)
    throw std::runtime_error("dense_copy: cudaMemcpy2D failed");
#else
  for (xsoftmax::index_t i = 0; i < m.rows; ++i)
    for (xsoftmax::index_t j = 0; j < m.cols; ++j) out[static_cast<std::size_t>(i * m.cols + j)] = m(i, j);
#endif
  return out;
}

/// A host copy of a backend vector (`thrust::host_vector` or `thrust::device_vector`): sparse
/// gradients are compared element by element through it.
template <class V>
thrust::host_vector<typename V::value_type> on_host(const V& v) {
  return thrust::host_vector<typename V::value_type>(v);
}

}  // namespace xsoftmax_test
