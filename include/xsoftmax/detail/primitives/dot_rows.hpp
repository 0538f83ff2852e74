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

/// The 4-row form, written out: named accumulators (GCC keeps an array of them in memory), and
/// the 4 rows' reductions side by side after a 4x4 transpose (the same sums per row). Widths
/// with a last 1-3 elements (d % 4 != 0) take the general form: that tail goes through memory.
template <>
__attribute__((target("avx2"), noinline)) inline void dot_rows8_avx2<4>(const float* const* h, const float* const* w,
                                                                         index_t d, float* out) {
  if (d % 4 != 0) {
    for (int r = 0; r < 4; ++r) out[r] = dot_row8_avx2(h[r], w[r], d);
    return;
  }
  const float *h0 = h[0], *h1 = h[1], *h2 = h[2], *h3 = h[3];
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
#define XSOFTMAX_DOT_ROWS4_STEP(q)                                                              \
  c0 = _mm256_add_ps(c0, _mm256_mul_ps(_mm256_loadu_ps(h0 + (q)), _mm256_loadu_ps(w0 + (q)))); \
  c1 = _mm256_add_ps(c1, _mm256_mul_ps(_mm256_loadu_ps(h1 + (q)), _mm256_loadu_ps(w1 + (q)))); \
  c2 = _mm256_add_ps(c2, _mm256_mul_ps(_mm256_loadu_ps(h2 + (q)), _mm256_loadu_ps(w2 + (q)))); \
  c3 = _mm256_add_ps(c3, _mm256_mul_ps(_mm256_loadu_ps(h3 + (q)), _mm256_loadu_ps(w3 + (q))))
  index_t p = 0;
  for (; p + 16 <= d; p += 16) {
    XSOFTMAX_DOT_ROWS4_STEP(p);
    XSOFTMAX_DOT_ROWS4_STEP(p + 8);
  }
  if (p + 8 <= d) {
    XSOFTMAX_DOT_ROWS4_STEP(p);
    p += 8;
  }
#undef XSOFTMAX_DOT_ROWS4_STEP
  // `dot_row8_avx2_finish` (no last 1-3 elements): the 4-wide tail into lanes 0-3, then lanes
  // l + (l + 4), then ((l0 + l2) + (l1 + l3)).
  __m128 a0 = _mm256_castps256_ps128(c0), a1 = _mm256_castps256_ps128(c1);
  __m128 a2 = _mm256_castps256_ps128(c2), a3 = _mm256_castps256_ps128(c3);
  if (p + 4 <= d) {
    a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(h0 + p), _mm_loadu_ps(w0 + p)));
    a1 = _mm_add_ps(a1, _mm_mul_ps(_mm_loadu_ps(h1 + p), _mm_loadu_ps(w1 + p)));
    a2 = _mm_add_ps(a2, _mm_mul_ps(_mm_loadu_ps(h2 + p), _mm_loadu_ps(w2 + p)));
    a3 = _mm_add_ps(a3, _mm_mul_ps(_mm_loadu_ps(h3 + p), _mm_loadu_ps(w3 + p)));
  }
  a0 = _mm_add_ps(a0, _mm256_extractf128_ps(c0, 1));
  a1 = _mm_add_ps(a1, _mm256_extractf128_ps(c1, 1));
  a2 = _mm_add_ps(a2, _mm256_extractf128_ps(c2, 1));
  a3 = _mm_add_ps(a3, _mm256_extractf128_ps(c3, 1));
  // Transposed: l_j holds lane j of the 4 rows.
  const __m128 t0 = _mm_unpacklo_ps(a0, a1), t1 = _mm_unpackhi_ps(a0, a1);
  const __m128 t2 = _mm_unpacklo_ps(a2, a3), t3 = _mm_unpackhi_ps(a2, a3);
  const __m128 l0 = _mm_movelh_ps(t0, t2), l1 = _mm_movehl_ps(t2, t0);
  const __m128 l2 = _mm_movelh_ps(t1, t3), l3 = _mm_movehl_ps(t3, t1);
  _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(l0, l2), _mm_add_ps(l1, l3)));
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
