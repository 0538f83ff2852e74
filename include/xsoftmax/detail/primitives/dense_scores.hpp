// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Dense scores of packed fp32 rows against a contiguous range of weight rows:
/// S(rows x n) = H(rows x d) * W[first : first + n]^T + bias[first : first + n], by the backend's
/// GEMM. Storage rows are widened to fp32 into `scratch` first (fp32 rows are read in place).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/backend_ops.hpp>
#include <xsoftmax/detail/primitives/convert.hpp>

#include <thrust/memory.h>

namespace xsoftmax::detail {

/// The backend's fp32 GEMM on `ex` (an execution or a Thrust host policy).
template <class Ex>
void gemm(const Ex& ex, const host::gemm_args& g) {
  const auto& e = as_execution(ex);
  using ops = typename std::decay_t<decltype(e)>::ops;
  ops::gemm(e.res, g);
}

/// Returns the fp32 view of the weight rows it used, so a backward pass can reuse it. `scratch` is a
/// vector of float in the execution's memory.
template <class Ex, class T, class Scratch>
matrix_view<const float> dense_scores(const Ex& ex, matrix_view<const float> h, matrix_view<const T> w,
                                      const T* bias, index_t first, index_t n, float* s, index_t lds,
                                      Scratch& scratch) {
  const matrix_view<const float> wf = rows_as_float(ex, w, first, n, scratch);
  host::gemm_args g;
  g.op_b = host::op::transpose;
  g.m = h.rows;
  g.n = n;
  g.k = h.cols;
  g.a = h.data;
  g.lda = h.stride;
  g.b = wf.data;
  g.ldb = wf.stride;
  g.c = s;
  g.ldc = lds;
  g.low_precision_inputs = !std::is_same_v<std::remove_cv_t<T>, float>;
  gemm(ex, g);
  if (bias) {
    const T* b = bias + first;
    XSOFTMAX_PARALLEL_FOR(ex, h.rows, r, {
      for (index_t j = 0; j < n; ++j) s[r * lds + j] += to_float(b[j]);
    });
  }
  return wf;
}

}  // namespace xsoftmax::detail
