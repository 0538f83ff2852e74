// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The per-(sample, node) row kernels of the sigmoid hierarchical softmax (training and search) at
/// word2vec widths (d ~ 100-300): `dot_row8(h, w, d)` = h . w and `axpy_row(g, x, y, d)`: y += g x.
///
/// Why not `dot_row` and plain loops: on a 128-bit SIMD host without -march flags, `dot_row`'s 16
/// lanes, element-by-element tail and loop-shaped reduction cost about 230 instructions at
/// d = 100, and the compiler's vectorised `y[p] += g * x[p]` (alias checks, peeling) about 2.5 per
/// element; these run at a few thousand (sample, node) pairs per batch, so they are the step.
/// Both functions are written once for every backend as scalar code with a fixed order; host
/// builds with SSE2 (and no nvcc) run the same arithmetic on 4-float vectors (GCC/Clang vector
/// extensions): the same products and sums in the same order, so both paths give bitwise the
/// same results, deterministic and equal for every thread count.
///
/// AVX2 (host tuning, selected at run time): on x86-64 GCC/Clang host builds whose baseline ISA has
/// no FMA (the default: no -march flag; see the guard below for why not otherwise), the float versions
/// call `dot_row8_avx2` / `axpy_row_avx2` when the CPU has AVX2 (`row_simd::has_avx2`, read once
/// at start-up; nothing is built with -march). They compute the same products and sums in the same
/// order on 8-float vectors (lanes p mod 8 are exactly dot_row8's 8 partial sums) and use no FMA:
/// a fused multiply-add rounds once where the portable code rounds twice, so results would depend
/// on the CPU the program runs on; without it they are bitwise those of the portable path, which
/// stays the oracle (tests/primitives/row_kernels_avx2_test.cpp checks it bitwise). The dot's
/// single 8-lane add chain is latency-bound, where an FMA's longer latency would not pay anyway.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__) && !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__))
#define XSOFTMAX_ROW_KERNELS_SIMD 1
// Not when the whole build may use FMA (-march=haswell or later: __FMA__): GCC then contracts the
// portable code's a * b + c into FMAs (-ffp-contract=fast, its C++ default) and the AVX2 path
// could no longer match it bit for bit; such a build vectorises the portable code for its own ISA.
#if defined(__x86_64__) && !defined(__FMA__) && !defined(XSOFTMAX_NO_AVX2_DISPATCH)
#define XSOFTMAX_ROW_KERNELS_AVX2 1
#include <immintrin.h>
#endif
#endif

namespace xsoftmax::detail {

#if defined(XSOFTMAX_ROW_KERNELS_SIMD)
namespace row_simd {
typedef float v4 __attribute__((vector_size(16)));
inline v4 load(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, v4 v) { std::memcpy(p, &v, sizeof v); }
}  // namespace row_simd
#endif

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
namespace row_simd {
/// Whether this CPU runs AVX2 (and the OS saves its registers): decided once, at start-up.
inline const bool has_avx2 = [] {
  __builtin_cpu_init();  // may run before libgcc's own constructor (static initialisation order)
  return __builtin_cpu_supports("avx2") != 0;
}();
/// Whether this CPU runs AVX-512F (the dense softmax's exponential loops on 16 lanes, exp_rows.hpp).
inline const bool has_avx512 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}();
}  // namespace row_simd

/// `dot_row8_avx2`'s tail and reduction for one row: its 8-lane sums `acc` after the 8-steps, the
/// elements from p on (< 8 of them).
__attribute__((target("avx2"), always_inline)) inline float dot_row8_avx2_finish(__m256 acc, const float* h,
                                                                               const float* w, index_t p, index_t d) {
  __m128 a = _mm256_castps256_ps128(acc), b = _mm256_extractf128_ps(acc, 1);
  if (p + 4 <= d) {
    a = _mm_add_ps(a, _mm_mul_ps(_mm_loadu_ps(h + p), _mm_loadu_ps(w + p)));
    p += 4;
  }
  if (p < d) {
    alignas(16) float lb[4];  // the last 1-3 elements (through memory: rare, and exact)
    _mm_store_ps(lb, b);
    lb[0] += h[p] * w[p];
    if (p + 1 < d) lb[1] += h[p + 1] * w[p + 1];
    if (p + 2 < d) lb[2] += h[p + 2] * w[p + 2];
    b = _mm_load_ps(lb);
  }
  a = _mm_add_ps(a, b);
  const __m128 s = _mm_add_ps(a, _mm_movehl_ps(a, a));  // lanes 0, 1: l0 + l2, l1 + l3
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/// `dot_row8`'s sums on 8-float vectors: lane l of `acc` is dot_row8's partial sum l, its 4-wide
/// tail goes into lanes 0-3 and the last < 4 elements into lanes 4-6, as there (no FMA).
__attribute__((target("avx2"), noinline)) inline float dot_row8_avx2(const float* h, const float* w, index_t d) {
  __m256 acc = _mm256_setzero_ps();
  index_t p = 0;
  for (; p + 16 <= d; p += 16) {
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(h + p), _mm256_loadu_ps(w + p)));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(h + p + 8), _mm256_loadu_ps(w + p + 8)));
  }
  if (p + 8 <= d) {
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(h + p), _mm256_loadu_ps(w + p)));
    p += 8;
  }
  return dot_row8_avx2_finish(acc, h, w, p, d);
}

/// `axpy_row` on 8-float vectors (element by element: y[p] + g * x[p], no FMA).
__attribute__((target("avx2"), noinline)) inline void axpy_row_avx2(float g, const float* x, float* y, index_t d) {
  const __m256 gv = _mm256_set1_ps(g);
  index_t p = 0;
  for (; p + 16 <= d; p += 16) {
    const __m256 y0 = _mm256_add_ps(_mm256_loadu_ps(y + p), _mm256_mul_ps(gv, _mm256_loadu_ps(x + p)));
    const __m256 y1 = _mm256_add_ps(_mm256_loadu_ps(y + p + 8), _mm256_mul_ps(gv, _mm256_loadu_ps(x + p + 8)));
    _mm256_storeu_ps(y + p, y0);
    _mm256_storeu_ps(y + p + 8, y1);
  }
  if (p + 8 <= d) {
    _mm256_storeu_ps(y + p, _mm256_add_ps(_mm256_loadu_ps(y + p), _mm256_mul_ps(gv, _mm256_loadu_ps(x + p))));
    p += 8;
  }
  if (p + 4 <= d) {
    _mm_storeu_ps(y + p, _mm_add_ps(_mm_loadu_ps(y + p), _mm_mul_ps(_mm256_castps256_ps128(gv), _mm_loadu_ps(x + p))));
    p += 4;
  }
  for (; p < d; ++p) y[p] += g * x[p];
}

/// Whether scale * v[i] is NaN or infinite (all eight exponent bits set) for some i < n: the
/// finite scan's block test (`block_has_non_finite`, its portable oracle) on 8-float vectors, the
/// same products (no FMA), so the same answer.
__attribute__((target("avx2"), noinline)) inline bool any_non_finite_scaled_avx2(const float* v, index_t n,
                                                                                float scale) {
  const __m256 sv = _mm256_set1_ps(scale);
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  __m256i bad = _mm256_setzero_si256();
  index_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i e0 = _mm256_and_si256(_mm256_castps_si256(_mm256_mul_ps(sv, _mm256_loadu_ps(v + i))), exp_mask);
    const __m256i e1 = _mm256_and_si256(_mm256_castps_si256(_mm256_mul_ps(sv, _mm256_loadu_ps(v + i + 8))), exp_mask);
    bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_cmpeq_epi32(e0, exp_mask), _mm256_cmpeq_epi32(e1, exp_mask)));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(_mm256_mul_ps(sv, _mm256_loadu_ps(v + i))), exp_mask);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp_mask));
  }
  if (!_mm256_testz_si256(bad, bad)) return true;
  for (; i < n; ++i) {
    const float x = scale * v[i];
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7F800000u) == 0x7F800000u) return true;
  }
  return false;
}

/// `scale_row` on 8-float vectors.
__attribute__((target("avx2"), noinline)) inline void scale_row_avx2(float g, const float* x, float* y, index_t d) {
  const __m256 gv = _mm256_set1_ps(g);
  index_t p = 0;
  for (; p + 8 <= d; p += 8) _mm256_storeu_ps(y + p, _mm256_mul_ps(gv, _mm256_loadu_ps(x + p)));
  for (; p < d; ++p) y[p] = g * x[p];
}
#endif

/// h . w with 8 partial sums (lanes p mod 8; a 4-wide step into lanes 0-3, then lanes 4-6 take
/// the last < 4 elements), reduced as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); the
/// portable version (scalar, or SSE2 vectors on a host), the oracle of the AVX2 one.
template <class T>
XSOFTMAX_HD inline float dot_row8_portable(const float* h, const T* w, index_t d) {
#if defined(XSOFTMAX_ROW_KERNELS_SIMD)
  if constexpr (std::is_same_v<T, float>) {
    using namespace row_simd;
    v4 a = {0.f, 0.f, 0.f, 0.f}, b = {0.f, 0.f, 0.f, 0.f};
    index_t p = 0;
    for (; p + 16 <= d; p += 16) {  // two 8-steps per trip: less loop overhead, the same sums
      a += load(h + p) * load(w + p);
      b += load(h + p + 4) * load(w + p + 4);
      a += load(h + p + 8) * load(w + p + 8);
      b += load(h + p + 12) * load(w + p + 12);
    }
    for (; p + 8 <= d; p += 8) {
      a += load(h + p) * load(w + p);
      b += load(h + p + 4) * load(w + p + 4);
    }
    if (p + 4 <= d) {
      a += load(h + p) * load(w + p);
      p += 4;
    }
    if (p < d) b[0] += h[p] * w[p];
    if (p + 1 < d) b[1] += h[p + 1] * w[p + 1];
    if (p + 2 < d) b[2] += h[p + 2] * w[p + 2];
    a += b;
    return (a[0] + a[2]) + (a[1] + a[3]);
  }
#endif
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f, a4 = 0.f, a5 = 0.f, a6 = 0.f, a7 = 0.f;
  index_t p = 0;
  for (; p + 8 <= d; p += 8) {
    a0 += h[p] * to_float(w[p]);
    a1 += h[p + 1] * to_float(w[p + 1]);
    a2 += h[p + 2] * to_float(w[p + 2]);
    a3 += h[p + 3] * to_float(w[p + 3]);
    a4 += h[p + 4] * to_float(w[p + 4]);
    a5 += h[p + 5] * to_float(w[p + 5]);
    a6 += h[p + 6] * to_float(w[p + 6]);
    a7 += h[p + 7] * to_float(w[p + 7]);
  }
  if (p + 4 <= d) {
    a0 += h[p] * to_float(w[p]);
    a1 += h[p + 1] * to_float(w[p + 1]);
    a2 += h[p + 2] * to_float(w[p + 2]);
    a3 += h[p + 3] * to_float(w[p + 3]);
    p += 4;
  }
  if (p < d) a4 += h[p] * to_float(w[p]);
  if (p + 1 < d) a5 += h[p + 1] * to_float(w[p + 1]);
  if (p + 2 < d) a6 += h[p + 2] * to_float(w[p + 2]);
  a0 += a4;
  a1 += a5;
  a2 += a6;
  a3 += a7;
  return (a0 + a2) + (a1 + a3);
}

/// y[p] += g * x[p] for p in [0, d) (y and x do not overlap); the portable version.
template <class T>
XSOFTMAX_HD inline void axpy_row_portable(float g, const T* x, float* y, index_t d) {
  index_t p = 0;
#if defined(XSOFTMAX_ROW_KERNELS_SIMD)
  if constexpr (std::is_same_v<T, float>) {
    using namespace row_simd;
    const v4 gv = {g, g, g, g};
    for (; p + 16 <= d; p += 16) {
      const v4 y0 = load(y + p) + gv * load(x + p), y1 = load(y + p + 4) + gv * load(x + p + 4);
      const v4 y2 = load(y + p + 8) + gv * load(x + p + 8), y3 = load(y + p + 12) + gv * load(x + p + 12);
      store(y + p, y0);
      store(y + p + 4, y1);
      store(y + p + 8, y2);
      store(y + p + 12, y3);
    }
    for (; p + 8 <= d; p += 8) {
      const v4 y0 = load(y + p) + gv * load(x + p), y1 = load(y + p + 4) + gv * load(x + p + 4);
      store(y + p, y0);
      store(y + p + 4, y1);
    }
    for (; p + 4 <= d; p += 4) store(y + p, load(y + p) + gv * load(x + p));
  }
#endif
  for (; p < d; ++p) y[p] += g * to_float(x[p]);
}

/// y[p] = g * x[p] for p in [0, d) (y and x do not overlap); AVX2 when the host CPU has it.
XSOFTMAX_HD inline void scale_row(float g, const float* x, float* y, index_t d) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (row_simd::has_avx2) return scale_row_avx2(g, x, y, d);
#endif
  for (index_t p = 0; p < d; ++p) y[p] = g * x[p];
}

/// y[p] = g * x[p] for a row of another storage type (bf16, fp16), widened to float.
template <class T>
XSOFTMAX_HD inline void scale_row(float g, const T* x, float* y, index_t d) {
  for (index_t p = 0; p < d; ++p) y[p] = g * to_float(x[p]);
}

/// h . w in `dot_row8_portable`'s order; AVX2 when the host CPU has it (bitwise the same).
template <class T>
XSOFTMAX_HD inline float dot_row8(const float* h, const T* w, index_t d) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if constexpr (std::is_same_v<T, float>)
    if (row_simd::has_avx2) return dot_row8_avx2(h, w, d);
#endif
  return dot_row8_portable(h, w, d);
}

/// y[p] += g * x[p] for p in [0, d) (y and x do not overlap); AVX2 when the host CPU has it.
template <class T>
XSOFTMAX_HD inline void axpy_row(float g, const T* x, float* y, index_t d) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if constexpr (std::is_same_v<T, float>)
    if (row_simd::has_avx2) return axpy_row_avx2(g, x, y, d);
#endif
  axpy_row_portable(g, x, y, d);
}

}  // namespace xsoftmax::detail
