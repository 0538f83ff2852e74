// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Backend policies. A backend is an empty tag type; `backend_traits<Backend>` maps it to a Thrust
/// execution policy, a vector type for its memory space and a resources object. Several backends can
/// be used in one program. `cuda` is usable only in translation units compiled by nvcc.

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/async.hpp>
#include <xsoftmax/detail/host/block_cache.hpp>
#include <xsoftmax/detail/host/counted_allocator.hpp>

#include <thrust/host_vector.h>
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>

#include <type_traits>

namespace xsoftmax {

/// Runs every loop on the calling thread (Thrust's `cpp` system). The reference backend.
struct serial {};
/// Runs loops on OpenMP threads (Thrust's `omp` system). Without `-fopenmp` it degrades to serial.
struct omp {};
/// Runs on a CUDA GPU (Thrust's `cuda` system, CUB, cuBLAS). Requires nvcc; see `xsoftmax/cuda.cuh`.
struct cuda {};

namespace detail {
template <class>
inline constexpr bool dependent_false = false;

template <class T>
struct type_identity {
  using type = T;
};
/// `T` in a position that takes no part in template argument deduction (a null pointer passed for
/// a `T*` parameter deduces nothing; T's parameters come from the other arguments).
template <class T>
using non_deduced = typename type_identity<T>::type;
}  // namespace detail

/// Maps a backend tag to its execution policy, vector type and resources. The primary template is
/// never instantiated for a valid backend.
template <class Backend>
struct backend_traits {
  static_assert(detail::dependent_false<Backend>,
                "xsoftmax: no specialisation of backend_traits for this backend. Valid backends are "
                "xsoftmax::serial, xsoftmax::omp and, in a translation unit compiled by nvcc that "
                "includes <xsoftmax/cuda.cuh>, xsoftmax::cuda.");
};

/// Per-head resources of a host backend: nothing to hold (GPU backends hold a stream, a cuBLAS
/// handle, a workspace, an allocator for Thrust's temporaries and the `_async` verbs' status word).
/// The host backends' Thrust temporaries and scratch come from a per-thread cache of blocks kept
/// between calls (detail/host/block_cache.hpp; `release_host_memory()` frees it).
struct host_resources {};

template <>
struct backend_traits<serial> {
  template <class T>
  using vector = thrust::host_vector<T, detail::counted_allocator<T>>;
  using resources = host_resources;
  static constexpr bool is_host = true;
  static constexpr const char* name = "serial";
  [[nodiscard]] static auto policy(const resources& = {}) { return thrust::cpp::par(detail::host_temporaries); }
};

template <>
struct backend_traits<omp> {
  template <class T>
  using vector = thrust::host_vector<T, detail::counted_allocator<T>>;
  using resources = host_resources;
  static constexpr bool is_host = true;
  static constexpr const char* name = "omp";
  [[nodiscard]] static auto policy(const resources& = {}) { return thrust::omp::par(detail::host_temporaries); }
};

/// The vector type a backend stores its buffers in.
template <class Backend, class T>
using backend_vector = typename backend_traits<Backend>::template vector<T>;

/// The resources type of a backend.
template <class Backend>
using backend_resources = typename backend_traits<Backend>::resources;

/// True for backends whose memory is host memory (serial, omp).
template <class Backend>
inline constexpr bool is_host_backend = backend_traits<Backend>::is_host;

}  // namespace xsoftmax
