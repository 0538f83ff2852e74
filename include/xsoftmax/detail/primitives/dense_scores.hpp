// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Dense scores of packed fp32 rows against a contiguous range of weight rows:
/// S(rows x n) = H(rows x d) * W[first : first + n]^T + bias[first : first + n].
/// Storage rows are widened to fp32 into `scratch` first (fp32 rows are read in place).

#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/host_gemm.hpp>

#include <vector>

namespace xsoftmax::detail {

/// Returns the fp32 view of the weight rows it used, so a backward pass can reuse it.
template <class Policy, class T>
matrix_view<const float> dense_scores(const Policy& policy, matrix_view<const float> h,
                                      matrix_view<const T> w, const T* bias, index_t first, index_t n,
                                      float* s, index_t lds, std::vector<float>& scratch) {
  const matrix_view<const float> wf = rows_as_float(w, first, n, scratch);
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
  gemm_parallel(policy, g);
  if (bias) {
    const T* b = bias + first;
    parallel_for(policy, h.rows, [=](index_t r) {
      for (index_t j = 0; j < n; ++j) s[r * lds + j] += to_float(b[j]);
    });
  }
  return wf;
}

/// Scores of `h` against weight rows [first, first + n), `chunk` columns at a time, handed to
/// `on_chunk(c0, cn, scores)` (scores: h.rows x cn, relative column c0). The buffer is reused, so the
/// scores of a chunk are valid only inside its call.
template <class Policy, class T, class OnChunk>
void for_each_score_chunk(const Policy& policy, matrix_view<const float> h, matrix_view<const T> w, const T* bias,
                          index_t first, index_t n, index_t chunk, OnChunk on_chunk) {
  if (h.rows == 0 || n == 0) return;
  chunk = chunk < n ? chunk : n;
  std::vector<float> scores(static_cast<std::size_t>(h.rows * chunk)), scratch;
  for (index_t c0 = 0; c0 < n; c0 += chunk) {
    const index_t cn = chunk < n - c0 ? chunk : n - c0;
    dense_scores(policy, h, w, bias, first + c0, cn, scores.data(), cn, scratch);
    on_chunk(c0, cn, static_cast<const float*>(scores.data()));
  }
}

}  // namespace xsoftmax::detail
