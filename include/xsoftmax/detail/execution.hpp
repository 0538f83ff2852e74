// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `execution<Backend>`: what a generic algorithm needs from a backend, in one value — the Thrust
/// execution policy its loops run on, the backend's vectors for scratch buffers, and the backend's
/// operations that are not Thrust algorithms (`backend_ops<Backend>`: GEMM, reading one value back
/// to the host, waiting for queued work). Every head's algorithm is written once against it; the
/// host backends' operations are in detail/host/backend_ops.hpp, the cuda backend's in
/// detail/cuda/backend_ops.cuh.
///
/// Loops are `parallel_for(ex, n, f)` with `f` a function object or an `XSOFTMAX_HD_LAMBDA` lambda
/// that captures raw pointers and sizes (never containers), so that it runs on the host's threads
/// and in a CUDA kernel alike.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <type_traits>

/// The qualifier of a lambda a generic algorithm hands to `parallel_for`: `__host__ __device__`
/// under nvcc (extended lambdas: the `xsoftmax::xsoftmax` target adds `--extended-lambda` for CUDA
/// sources), nothing otherwise.
#if defined(__CUDACC__)
#define XSOFTMAX_HD_LAMBDA __host__ __device__
#else
#define XSOFTMAX_HD_LAMBDA
#endif

namespace xsoftmax::detail {

/// The operations of `Backend` that are not Thrust algorithms. Specialised per backend:
///   static void gemm(const resources&, const gemm_args&);    // fp32 row-major GEMM (see host/gemm.hpp)
///   template <class T> static T read(const resources&, const T* p);   // one value, to the host
///   template <class T> static void copy(const resources&, T* dst, const T* src, index_t n);
///                                                           // host <-> backend memory, blocking
///   static void synchronize(const resources&);              // wait for the work queued so far
template <class Backend>
struct backend_ops {
  static_assert(dependent_false<Backend>,
                "xsoftmax: no backend_ops for this backend (include <xsoftmax/cuda.cuh> for cuda)");
};

/// A backend and its resources, for the generic algorithms. Cheap to copy (holds a reference).
template <class Backend>
struct execution {
  using backend = Backend;
  using resources_type = backend_resources<Backend>;
  template <class T>
  using vector = backend_vector<Backend, T>;
  using ops = backend_ops<Backend>;

  const resources_type& res;

  [[nodiscard]] auto policy() const { return backend_traits<Backend>::policy(res); }
};

/// The execution of the calling thread alone (inside a parallel region of a host backend).
inline const execution<serial>& serial_execution() {
  static const host_resources none{};
  static const execution<serial> ex{none};
  return ex;
}

template <class T>
struct is_execution : std::false_type {};
template <class B>
struct is_execution<execution<B>> : std::true_type {};

/// The Thrust policy of an execution, or the policy itself (host algorithms that are handed a
/// Thrust host policy directly: `thrust::cpp::par`, `thrust::omp::par`).
template <class Ex>
[[nodiscard]] auto policy_of(const Ex& ex) {
  if constexpr (is_execution<Ex>::value) return ex.policy();
  else return ex;
}

/// The execution matching `ex`: itself, or for a Thrust host policy the host backend it names.
template <class Ex>
[[nodiscard]] decltype(auto) as_execution(const Ex& ex) {
  if constexpr (is_execution<Ex>::value) {
    return (ex);
  } else if constexpr (std::is_same_v<Ex, std::decay_t<decltype(thrust::omp::par)>>) {
    static const host_resources none{};
    return execution<omp>{none};
  } else {
    static_assert(std::is_same_v<Ex, std::decay_t<decltype(thrust::cpp::par)>>,
                  "xsoftmax: expected an execution<Backend> or thrust::cpp::par / thrust::omp::par");
    return serial_execution();
  }
}

/// f(i) for i in [0, n) on the execution's threads (or device); `ex` is an execution or a Thrust
/// host policy.
template <class Ex, class F>
void parallel_for(const Ex& ex, index_t n, F f) {
  if (n <= 0) return;
  thrust::for_each(policy_of(ex), thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(n), f);
}

/// The raw pointer of a backend vector.
template <class Vector>
[[nodiscard]] auto raw(Vector& v) {
  return thrust::raw_pointer_cast(v.data());
}

}  // namespace xsoftmax::detail
