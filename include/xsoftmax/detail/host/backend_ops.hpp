// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `backend_ops` of the host backends (serial, omp): the GEMM is CBLAS when found (one call that the
/// BLAS threads itself; on omp, a long-k GEMM as one call per part of its sum over k on each OpenMP
/// thread) or the blocked loop split over the backend's threads; memory is host memory, so reading a
/// value is a load and there is nothing to wait for.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/host_gemm.hpp>

#include <algorithm>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace xsoftmax::detail {

template <class Backend>
struct host_backend_ops {
  static void gemm(const host_resources& res, const host::gemm_args& g) {
    gemm_parallel(backend_traits<Backend>::policy(res), g, threads());
  }
  /// Threads a GEMM's parts take (`gemm_parallel`): the OpenMP team a parallel region would
  /// start for the omp backend (1 inside one already); 1 for serial, whose one BLAS call threads itself.
  [[nodiscard]] static index_t threads() {
#if defined(_OPENMP)
    if constexpr (std::is_same_v<Backend, omp>) return omp_in_parallel() ? 1 : omp_get_max_threads();
#endif
    return 1;
  }
  template <class T>
  [[nodiscard]] static T read(const host_resources&, const T* p) {
    count_host_read();
    return *p;
  }
  /// `n` elements from `src` to `dst`, either of them host or backend memory (the same here).
  template <class T>
  static void copy(const host_resources&, T* dst, const T* src, index_t n) {
    count_host_read();
    std::copy(src, src + n, dst);
  }
  /// `n` elements of host memory `src` to backend memory `dst` (the same memory here): a copy.
  template <class T>
  static void upload(const host_resources&, T* dst, const T* src, index_t n) {
    if (n <= 0) return;
    count_upload();
    std::copy(src, src + n, dst);
  }
  static void synchronize(const host_resources&) { ++call_counters::local().synchronizations; }
};

template <>
struct backend_ops<serial> : host_backend_ops<serial> {};
template <>
struct backend_ops<omp> : host_backend_ops<omp> {};

}  // namespace xsoftmax::detail
