// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The dense softmax's two exponential loops over a row of scores, written once for every backend:
///   `sum_exp_shifted(s, n, m)`        = sum_j e^(s_j - m)   (the log-sum-exp's pass)
///   `exp_shifted_scaled(s, n, l, u)`:  s_j <- e^(s_j - l) u  (the gradient's p_j u)
///   `exp_shifted_sum(s, n, m)`:        s_j <- e^(s_j - m), returning their sum (bitwise
///                                      `sum_exp_shifted`'s): the log-sum-exp's pass when the
///                                      gradient is later taken from the kept exponentials
/// with `fast_exp` (fast_exp.hpp). The sum runs in 8 lanes (lane k takes j = k mod 8 in order, then
/// the lanes add in a fixed tree), so that it is the same function on every backend and thread count.
///
/// Why not a plain loop under `#pragma omp simd`: GCC 12 does not vectorise `fast_exp` (its
/// integer selects stay branches: "control flow in loop"), so both loops ran one score at a time
/// and took 47 % of a CPU full-softmax step, as much as its three GEMMs (perf, N = 1e5, d = 128,
/// B = 1024, 2 threads; bench/RESULTS.md, "Full softmax on the CPU: blocks that keep every
/// score"). On x86-64 hosts with AVX2 (selected at run time, as `row_kernels.hpp`'s kernels, and
/// under the same guard: no FMA in the build) the loops run on 8 lanes with `avx2::fast_exp`, and
/// on 16 with `avx512::fast_exp` where the CPU has AVX-512F (the sums still in the same 8 lanes),
/// bitwise the portable functions' results (tests/primitives/exp_rows_test.cpp).

#include <xsoftmax/detail/primitives/fast_exp.hpp>

namespace xsoftmax::detail {

/// Lanes of `sum_exp_shifted`'s partial sums.
inline constexpr index_t exp_sum_lanes = 8;

/// The lanes' sum in `sum_exp_shifted`'s fixed order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
XSOFTMAX_HD inline float add_exp_lanes(const float* l) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

/// sum_j e^(s[j] - m) over j < n, the portable version (and the oracle of the AVX2 one).
XSOFTMAX_HD inline float sum_exp_shifted_portable(const float* s, index_t n, float m) {
  float lane[exp_sum_lanes] = {};
  index_t j = 0;
  for (; j + exp_sum_lanes <= n; j += exp_sum_lanes)
    for (index_t k = 0; k < exp_sum_lanes; ++k) lane[k] += fast_exp(s[j + k] - m);
  for (index_t k = 0; j + k < n; ++k) lane[k] += fast_exp(s[j + k] - m);
  return add_exp_lanes(lane);
}

/// s[j] = e^(s[j] - l) u for j < n, the portable version.
XSOFTMAX_HD inline void exp_shifted_scaled_portable(float* s, index_t n, float l, float u) {
  for (index_t j = 0; j < n; ++j) s[j] = fast_exp(s[j] - l) * u;
}

/// s[j] = e^(s[j] - m) for j < n, returning their sum in `sum_exp_shifted_portable`'s lanes and
/// order (so the same bits), the portable version.
XSOFTMAX_HD inline float exp_shifted_sum_portable(float* s, index_t n, float m) {
  float lane[exp_sum_lanes] = {};
  index_t j = 0;
  for (; j + exp_sum_lanes <= n; j += exp_sum_lanes)
    for (index_t k = 0; k < exp_sum_lanes; ++k) lane[k] += s[j + k] = fast_exp(s[j + k] - m);
  for (index_t k = 0; j + k < n; ++k) lane[k] += s[j + k] = fast_exp(s[j + k] - m);
  return add_exp_lanes(lane);
}

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
namespace avx2 {
/// `sum_exp_shifted_portable` on 8-float vectors: the same lanes, the tail added lane by lane with
/// the scalar `fast_exp` (bitwise the vector lanes' values).
__attribute__((target("avx2"), noinline)) inline float sum_exp_shifted(const float* s, index_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  index_t j = 0;
  for (; j + exp_sum_lanes <= n; j += exp_sum_lanes)
    acc = _mm256_add_ps(acc, fast_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv)));
  alignas(32) float lane[exp_sum_lanes];
  _mm256_store_ps(lane, acc);
  for (index_t k = 0; j + k < n; ++k) lane[k] += detail::fast_exp(s[j + k] - m);
  return add_exp_lanes(lane);
}

/// `exp_shifted_scaled_portable` on 8-float vectors (the tail one by one).
__attribute__((target("avx2"), noinline)) inline void exp_shifted_scaled(float* s, index_t n, float l, float u) {
  const __m256 lv = _mm256_set1_ps(l), uv = _mm256_set1_ps(u);
  index_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(s + j, _mm256_mul_ps(fast_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), lv)), uv));
  for (; j < n; ++j) s[j] = detail::fast_exp(s[j] - l) * u;
}

/// `exp_shifted_sum_portable` on 8-float vectors (the tail lane by lane, as `sum_exp_shifted`).
__attribute__((target("avx2"), noinline)) inline float exp_shifted_sum(float* s, index_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  index_t j = 0;
  for (; j + exp_sum_lanes <= n; j += exp_sum_lanes) {
    const __m256 e = fast_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lane[exp_sum_lanes];
  _mm256_store_ps(lane, acc);
  for (index_t k = 0; j + k < n; ++k) lane[k] += s[j + k] = detail::fast_exp(s[j + k] - m);
  return add_exp_lanes(lane);
}
}  // namespace avx2

namespace avx512 {
// Why no scalar tail here: inside an AVX-512F function GCC would inline the scalar `fast_exp` and
// contract its multiply-adds into FMAs (the target has them), changing its bits; the last n mod 16
// scores take one masked vector instead.

/// Lanes [0, count) of 16 set.
__attribute__((target("avx512f"), always_inline)) inline __mmask16 first_lanes(index_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

/// 8-lane sums of 16-float vectors, lanes in `sum_exp_shifted_portable`'s order: e's low half
/// (j .. j + 7) then its high half (j + 8 .. j + 15). A lane past the row's end holds +0, which
/// leaves its sum of non-negative terms as it is.
__attribute__((target("avx512f"), always_inline)) inline __m256 add_halves(__m256 acc, __m512 e) {
  // zero-masked, every lane kept (see avx512::nearest in fast_exp.hpp; GCC 12 casts through an
  // unmasked extract too)
  const __m256 low = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(e), 0));
  const __m256 high = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(e), 1));
  return _mm256_add_ps(_mm256_add_ps(acc, low), high);
}

/// The 8 lanes' sum in `add_exp_lanes`'s order.
__attribute__((target("avx512f"), always_inline)) inline float lane_total(__m256 acc) {
  alignas(32) float lane[exp_sum_lanes];
  _mm256_store_ps(lane, acc);
  return add_exp_lanes(lane);
}

/// `sum_exp_shifted_portable` on 16-float vectors (half the instructions of the AVX2 loop's).
__attribute__((target("avx512f"), noinline)) inline float sum_exp_shifted(const float* s, index_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  index_t j = 0;
  for (; j + 16 <= n; j += 16) acc = add_halves(acc, fast_exp(sub(_mm512_loadu_ps(s + j), mv)));
  if (j < n) {
    const __mmask16 tail = first_lanes(n - j);
    acc = add_halves(acc, _mm512_maskz_mov_ps(tail, fast_exp(sub(_mm512_maskz_loadu_ps(tail, s + j), mv))));
  }
  return lane_total(acc);
}

/// `exp_shifted_sum_portable` on 16-float vectors.
__attribute__((target("avx512f"), noinline)) inline float exp_shifted_sum(float* s, index_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  index_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = fast_exp(sub(_mm512_loadu_ps(s + j), mv));
    _mm512_storeu_ps(s + j, e);
    acc = add_halves(acc, e);
  }
  if (j < n) {
    const __mmask16 tail = first_lanes(n - j);
    const __m512 e = _mm512_maskz_mov_ps(tail, fast_exp(sub(_mm512_maskz_loadu_ps(tail, s + j), mv)));
    _mm512_mask_storeu_ps(s + j, tail, e);
    acc = add_halves(acc, e);
  }
  return lane_total(acc);
}

/// `exp_shifted_scaled_portable` on 16-float vectors.
__attribute__((target("avx512f"), noinline)) inline void exp_shifted_scaled(float* s, index_t n, float l, float u) {
  const __m512 lv = _mm512_set1_ps(l), uv = _mm512_set1_ps(u);
  index_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(s + j, mul(fast_exp(sub(_mm512_loadu_ps(s + j), lv)), uv));
  if (j < n) {
    const __mmask16 tail = first_lanes(n - j);
    _mm512_mask_storeu_ps(s + j, tail, mul(fast_exp(sub(_mm512_maskz_loadu_ps(tail, s + j), lv)), uv));
  }
}
}  // namespace avx512
#endif

/// sum_j e^(s[j] - m) over j < n (see the file comment): AVX2 on a host that has it.
XSOFTMAX_HD inline float sum_exp_shifted(const float* s, index_t n, float m) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (row_simd::has_avx512) return avx512::sum_exp_shifted(s, n, m);
  if (row_simd::has_avx2) return avx2::sum_exp_shifted(s, n, m);
#endif
  return sum_exp_shifted_portable(s, n, m);
}

/// s[j] = e^(s[j] - l) u for j < n: AVX2 on a host that has it.
XSOFTMAX_HD inline void exp_shifted_scaled(float* s, index_t n, float l, float u) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (row_simd::has_avx512) {
    avx512::exp_shifted_scaled(s, n, l, u);
    return;
  }
  if (row_simd::has_avx2) {
    avx2::exp_shifted_scaled(s, n, l, u);
    return;
  }
#endif
  exp_shifted_scaled_portable(s, n, l, u);
}

/// s[j] = e^(s[j] - m) for j < n, returning `sum_exp_shifted(s, n, m)` of the scores they replace
/// (the same bits): AVX2 on a host that has it.
XSOFTMAX_HD inline float exp_shifted_sum(float* s, index_t n, float m) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (row_simd::has_avx512) return avx512::exp_shifted_sum(s, n, m);
  if (row_simd::has_avx2) return avx2::exp_shifted_sum(s, n, m);
#endif
  return exp_shifted_sum_portable(s, n, m);
}

}  // namespace xsoftmax::detail
