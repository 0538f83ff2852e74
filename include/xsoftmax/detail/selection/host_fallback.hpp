// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Where a selector's index is built on the host whatever the backend: the KNN graph builder, the
/// IVF index (k-means and list assignment) and the IVF search are host algorithms (OpenMP threads,
/// a CBLAS GEMM). On a device backend their inputs are copied to the host first and their
/// results copied back; on a host backend nothing is copied. A device build of these indexes is
/// future work; the copies are stated in the selectors' documentation.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/system/omp/execution_policy.h>

#include <vector>

namespace xsoftmax::detail {

/// The Thrust host policy a host algorithm runs on for `ex`: its own on a host backend, OpenMP's
/// for a device backend.
template <class Ex>
[[nodiscard]] auto host_policy_for(const Ex& ex) {
  using B = typename std::decay_t<decltype(as_execution(ex))>::backend;
  if constexpr (is_host_backend<B>) return policy_of(ex);
  else return thrust::omp::par;
}

/// `m` (rows x cols, any stride) readable on the host: `m` itself on a host backend, otherwise a
/// copy in `storage` (rows x cols, contiguous).
template <class Ex, class T>
[[nodiscard]] matrix_view<const T> host_rows(const Ex& ex_in, matrix_view<const T> m, std::vector<T>& storage) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  if constexpr (is_host_backend<typename execution_type::backend>) {
    return m;
  } else {
    storage.resize(static_cast<std::size_t>(m.rows * m.cols));
    if (m.rows > 0 && m.stride == m.cols) {
      execution_type::ops::copy(ex.res, storage.data(), m.data, m.rows * m.cols);
    } else {
      for (index_t r = 0; r < m.rows; ++r) execution_type::ops::copy(ex.res, storage.data() + r * m.cols, m.row(r), m.cols);
    }
    return {storage.data(), m.rows, m.cols};
  }
}

}  // namespace xsoftmax::detail
