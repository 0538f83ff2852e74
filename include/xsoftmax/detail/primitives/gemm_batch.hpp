// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `gemm_batch`: many small independent fp32 GEMMs (disjoint outputs, e.g. the list-pair score
/// blocks of an IVF search) on an execution. Host backends run them in parallel, one whole GEMM per
/// thread: a threaded BLAS call per small GEMM costs a parallel region each and gains little, and
/// the same GEMM then runs single-threaded whatever the backend. A device backend queues them on
/// its stream one after another (each large enough to fill a part of the device).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>

namespace xsoftmax::detail {

/// The GEMMs g[0 .. count) (`g` on the host; their operands in the execution's memory).
template <class Ex>
void gemm_batch(const Ex& ex_in, const host::gemm_args* g, index_t count) {
  const auto& ex = as_execution(ex_in);
  using backend = typename std::decay_t<decltype(ex)>::backend;
  if constexpr (is_host_backend<backend>) {
    parallel_for(ex, count, [=](index_t i) { gemm(serial_execution(), g[i]); });
  } else {
    for (index_t i = 0; i < count; ++i) gemm(ex, g[i]);
  }
}

}  // namespace xsoftmax::detail
