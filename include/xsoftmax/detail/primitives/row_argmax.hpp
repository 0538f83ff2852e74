// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The column of a row's highest score, `row_argmax(s, bias, n)`: the first j of the largest
/// s[j] + bias[j] (bias may be null) among the values that are not NaN, or 0 when s[0] (+ bias[0])
/// is NaN -- a running `v > best` from j = 0, which is the top-1 of `row_topk` and the k-means
/// assignment (`best_column`).
///
/// Why a vector version: the k-means assignment reads every (point, centroid) score once per
/// iteration, and the scalar loop (a compare and a dependent select per score) took 12 % of an
/// `ivf_class_probes` KNN-graph build (perf, N = 1e5, 1000 lists; bench/RESULTS.md, "KNN graph
/// builds"). On x86-64 hosts with AVX2 (selected at run time, under `row_kernels.hpp`'s guard) eight
/// lanes each keep their own first maximum; a maximum is exact, so the result is the portable
/// function's whatever the lanes (tests/primitives/row_argmax_test.cpp).

#include <xsoftmax/detail/primitives/row_kernels.hpp>

#include <cstdint>
#include <math.h>

namespace xsoftmax::detail {

/// `row_argmax`, one score at a time (the oracle of the AVX2 version, and the device code).
XSOFTMAX_HD inline index_t row_argmax_portable(const float* s, const float* bias, index_t n) {
  index_t best = 0;
  float best_s = bias ? s[0] + bias[0] : s[0];
  for (index_t j = 1; j < n; ++j) {
    const float v = bias ? s[j] + bias[j] : s[j];
    if (v > best_s) best_s = v, best = j;
  }
  return best;
}

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
namespace avx2 {
/// `row_argmax_portable` on 8 lanes (n >= 8, n < 2^31): lane l starts at score l (a NaN there
/// starts as -inf: only a row whose s[0] is -inf can end on a -inf, and lane 0 holds index 0 then)
/// and keeps the first index of its largest score under `>` (NaN never wins); the lanes' best is
/// the largest value, ties to the smaller index; the tail continues it one score at a time.
/// Scores j .. j + 7 (plus their bias when `Bias`).
template <bool Bias>
__attribute__((target("avx2"), always_inline)) inline __m256 scores_at(const float* s, const float* bias, index_t j) {
  if constexpr (Bias) return _mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_loadu_ps(bias + j));
  return _mm256_loadu_ps(s + j);
}

template <bool Bias>
__attribute__((target("avx2"), noinline)) inline index_t row_argmax(const float* s, const float* bias, index_t n) {
  __m256 best = scores_at<Bias>(s, bias, 0);
  best = _mm256_blendv_ps(best, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(best, best, _CMP_UNORD_Q));
  __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i column = index;
  const __m256i step = _mm256_set1_epi32(8);
  index_t j = 8;
  for (; j + 8 <= n; j += 8) {
    column = _mm256_add_epi32(column, step);
    const __m256 v = scores_at<Bias>(s, bias, j);
    const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, gt);
    index = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(index), _mm256_castsi256_ps(column), gt));
  }
  alignas(32) float lane_s[8];
  alignas(32) std::int32_t lane_i[8];
  _mm256_store_ps(lane_s, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_i), index);
  float best_s = lane_s[0];
  index_t best_j = lane_i[0];
  for (int l = 1; l < 8; ++l)
    if (lane_s[l] > best_s || (lane_s[l] == best_s && lane_i[l] < best_j)) best_s = lane_s[l], best_j = lane_i[l];
  for (; j < n; ++j) {
    const float v = bias ? s[j] + bias[j] : s[j];
    if (v > best_s) best_s = v, best_j = j;
  }
  return best_j;
}
}  // namespace avx2
#endif

/// The first column of the row's highest score (see the file comment): AVX2 on a host that has it.
XSOFTMAX_HD inline index_t row_argmax(const float* s, const float* bias, index_t n) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  // A NaN first score decides the row (portable rule); the vector lanes need 8 scores.
  if (row_simd::has_avx2 && n >= 16 && n < (index_t(1) << 31)) {
    const float first = bias ? s[0] + bias[0] : s[0];
    if (first == first) return bias ? avx2::row_argmax<true>(s, bias, n) : avx2::row_argmax<false>(s, bias, n);
  }
#endif
  return row_argmax_portable(s, bias, n);
}

}  // namespace xsoftmax::detail
