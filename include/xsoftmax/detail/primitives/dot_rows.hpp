// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `dot_rows8<N>`: N independent dot products h[r] . w[r] at once, each bitwise `dot_row8`'s (the
/// oracle, and the generic version: a loop of `dot_row8` calls). For callers that have several
/// unrelated rows to score together (a search's lockstep rows, each at its own node).
///
/// Host tuning: on hosts where `dot_row8` runs its AVX2 kernel (row_kernels.hpp: selected at run
/// time, no FMA), `dot_rows8_avx2<N>` runs the N rows in one loop, N accumulators side by side:
/// the same products and sums in the same order per row as `dot_row8_avx2` (lanes p mod 8; the
/// 4-wide and scalar tails and the reduction exactly as there), with one loop's control and one
/// call instead of N. tests/hierarchical/dot_rows_test.cpp checks it bitwise against `dot_row8`.

#include <xsoftmax/detail/primitives/row_kernels.hpp>

#include <type_traits>

namespace xsoftmax::detail {

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
/// N rows of `dot_row8_avx2` in one loop (see the file comment).
template <int N>
__attribute__((target("avx2"), noinline)) void dot_rows8_avx2(const float* const* h, const float* const* w, index_t d,
                                                               float* out) {
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  index_t p = 0;
  for (; p + 16 <= d; p += 16) {
    for (int r = 0; r < N; ++r)
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_loadu_ps(h[r] + p), _mm256_loadu_ps(w[r] + p)));
    for (int r = 0; r < N; ++r)
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_loadu_ps(h[r] + p + 8), _mm256_loadu_ps(w[r] + p + 8)));
  }
  if (p + 8 <= d) {
    for (int r = 0; r < N; ++r)
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_loadu_ps(h[r] + p), _mm256_loadu_ps(w[r] + p)));
    p += 8;
  }
  for (int r = 0; r < N; ++r) out[r] = dot_row8_avx2_finish(acc[r], h[r], w[r], p, d);
}
#endif

/// out[r] = dot_row8(h[r], w[r], d) for r < N, bitwise.
template <int N, class T>
XSOFTMAX_HD inline void dot_rows8(const float* const* h, const T* const* w, index_t d, float* out) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if constexpr (std::is_same_v<T, float>)
    if (row_simd::has_avx2) return dot_rows8_avx2<N>(h, w, d, out);
#endif
  for (int r = 0; r < N; ++r) out[r] = dot_row8(h[r], w[r], d);
}

}  // namespace xsoftmax::detail
