// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `dot_rows8<N>`: N independent dot products h[r] . w[r] at once, each bitwise `dot_row8`'s (the
/// oracle, and the generic version: a loop of `dot_row8` calls). For callers that have several
/// unrelated rows to score together (a search's lockstep rows, each at its own node).
/// `dot_grid8<R, C>`: every product of R hidden rows and C weight rows (rows that share a node).
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

/// The reduction of four rows' 8-lane sums c0..c3 after their 8-steps (elements from p on: none,
/// or a last 4), written to out[0, 4): `dot_row8_avx2_finish`'s sums per row (the 4-wide tail into
/// lanes 0-3, then lanes l + (l + 4), then ((l0 + l2) + (l1 + l3))), the four side by side after a
/// 4x4 transpose. Row r's elements are h[r] . w[r].
__attribute__((target("avx2"), always_inline)) inline void dot_rows4_avx2_finish(__m256 c0, __m256 c1, __m256 c2,
                                                                              __m256 c3, const float* const* h,
                                                                              const float* const* w, index_t p,
                                                                              index_t d, float* out) {
  __m128 a0 = _mm256_castps256_ps128(c0), a1 = _mm256_castps256_ps128(c1);
  __m128 a2 = _mm256_castps256_ps128(c2), a3 = _mm256_castps256_ps128(c3);
  if (p + 4 <= d) {
    a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(h[0] + p), _mm_loadu_ps(w[0] + p)));
    a1 = _mm_add_ps(a1, _mm_mul_ps(_mm_loadu_ps(h[1] + p), _mm_loadu_ps(w[1] + p)));
    a2 = _mm_add_ps(a2, _mm_mul_ps(_mm_loadu_ps(h[2] + p), _mm_loadu_ps(w[2] + p)));
    a3 = _mm_add_ps(a3, _mm_mul_ps(_mm_loadu_ps(h[3] + p), _mm_loadu_ps(w[3] + p)));
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

/// The 4-row form, written out: named accumulators (GCC keeps an array of them in memory), and
/// the 4 rows' reductions side by side (`dot_rows4_avx2_finish`). Widths with a last 1-3 elements
/// (d % 4 != 0) take the general form: that tail goes through memory.
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
  dot_rows4_avx2_finish(c0, c1, c2, c3, h, w, p, d, out);
}

/// `dot_grid8<4, 2>`'s AVX2 form (d % 4 == 0): the 4 x 2 products side by side, eight accumulators
/// (eight add chains in flight where four rows had four: the 4-row form waits on its adds' latency)
/// and six loads a step where four separate dots of each weight row took eight.
__attribute__((target("avx2"), noinline)) inline void dot_grid8_avx2_4x2(const float* const* h, const float* const* w,
                                                                         index_t d, float* out) {
  const float *h0 = h[0], *h1 = h[1], *h2 = h[2], *h3 = h[3], *w0 = w[0], *w1 = w[1];
  __m256 c00 = _mm256_setzero_ps(), c10 = c00, c20 = c00, c30 = c00, c01 = c00, c11 = c00, c21 = c00, c31 = c00;
  index_t p = 0;
  for (; p + 8 <= d; p += 8) {
    const __m256 u = _mm256_loadu_ps(w0 + p), v = _mm256_loadu_ps(w1 + p);
    __m256 x = _mm256_loadu_ps(h0 + p);
    c00 = _mm256_add_ps(c00, _mm256_mul_ps(x, u));
    c01 = _mm256_add_ps(c01, _mm256_mul_ps(x, v));
    x = _mm256_loadu_ps(h1 + p);
    c10 = _mm256_add_ps(c10, _mm256_mul_ps(x, u));
    c11 = _mm256_add_ps(c11, _mm256_mul_ps(x, v));
    x = _mm256_loadu_ps(h2 + p);
    c20 = _mm256_add_ps(c20, _mm256_mul_ps(x, u));
    c21 = _mm256_add_ps(c21, _mm256_mul_ps(x, v));
    x = _mm256_loadu_ps(h3 + p);
    c30 = _mm256_add_ps(c30, _mm256_mul_ps(x, u));
    c31 = _mm256_add_ps(c31, _mm256_mul_ps(x, v));
  }
  const float* const w00[4] = {w0, w0, w0, w0};
  const float* const w11[4] = {w1, w1, w1, w1};
  float col0[4], col1[4];
  dot_rows4_avx2_finish(c00, c10, c20, c30, h, w00, p, d, col0);
  dot_rows4_avx2_finish(c01, c11, c21, c31, h, w11, p, d, col1);
  for (int r = 0; r < 4; ++r) {
    out[2 * r] = col0[r];
    out[2 * r + 1] = col1[r];
  }
}
#endif

/// out[r * C + c] = dot_row8(h[r], w[c], d) for r < R, c < C, bitwise: R hidden rows against C
/// weight rows (a node's children for a group of rows at it). AVX2 form for 4 x 2 fp32 rows.
template <int R, int C, class T>
XSOFTMAX_HD inline void dot_grid8(const float* const* h, const T* const* w, index_t d, float* out) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if constexpr (std::is_same_v<T, float> && R == 4 && C == 2)
    if (row_simd::has_avx2 && d % 4 == 0) return dot_grid8_avx2_4x2(h, w, d, out);
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * C + c] = dot_row8(h[r], w[c], d);
}

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
