// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `fast_exp(x)`: e^x in fp32 without a branch or a library call (a scalar `expf` call per score
/// was the largest cost of the CPU full softmax after the GEMMs: two exponentials per score per
/// step). Cephes' range reduction and degree-6 polynomial: within 2 ulp of `expf` over [-87, 88];
/// 0 below (so masked -inf scores contribute nothing), +inf above, NaN for NaN. The same function
/// runs in device code. GCC does not vectorise loops over it (its integer selects stay branches),
/// so the host's hot loops call the 8-lane version below (`avx2::fast_exp`, bitwise the same
/// values) through `exp_rows.hpp` and the hierarchical softmax's node kernels.
///
/// `XSOFTMAX_SIMD_REDUCTION(op, var)`: `#pragma omp simd reduction(op: var)` for host compilers with
/// OpenMP, nothing elsewhere. It lets the compiler keep several partial maxima in vector lanes: a
/// fixed order for a given binary, so results stay bitwise equal across backends and thread counts.

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>  // XSOFTMAX_ROW_KERNELS_AVX2, row_simd::has_avx2

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#define XSOFTMAX_PRAGMA(x) _Pragma(#x)
#define XSOFTMAX_SIMD_REDUCTION(op, var) XSOFTMAX_PRAGMA(omp simd reduction(op : var))
#else
#define XSOFTMAX_SIMD_REDUCTION(op, var)
#endif

namespace xsoftmax::detail {

/// The float whose bits are `i`, and back.
XSOFTMAX_HD inline float float_from_bits(std::int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
#endif
}
XSOFTMAX_HD inline std::int32_t bits_of_float(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(f);
#else
  std::int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
#endif
}

/// Why the odd shape: a host compiler that must respect floating-point traps (the default) does
/// not if-convert a select whose arms compute or compare floats, and a loop with control flow does
/// not vectorise. So the range tests compare bit patterns as integers, every float operation runs
/// unconditionally on clamped values, and the selects choose between integers already computed.
XSOFTMAX_HD inline float fast_exp(float x) {
  constexpr std::int32_t hi_bits = 0x42B0C0A5;  // 88.3762626647949f: e^hi is the largest float
  constexpr std::int32_t lo_bits = static_cast<std::int32_t>(0xC2AEAC50u);  // -87.3365447504020f: e^lo = 2^-126
  constexpr std::int32_t inf_bits = 0x7F800000;
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const std::int32_t xb = bits_of_float(x);
  // Negative floats' bit patterns, read unsigned, grow with the magnitude; -inf is the largest.
  const bool below = static_cast<std::uint32_t>(xb) > static_cast<std::uint32_t>(lo_bits);
  const bool above = xb > hi_bits;  // positive floats order like their patterns; +inf is above
  const std::int32_t upper_clamped = above ? hi_bits : xb;
  const float xc = float_from_bits(below ? lo_bits : upper_clamped);
  // n = round(x / ln 2); r = x - n ln 2 in two steps (ln2_hi is exact in a few bits).
  const float n = (xc * log2e + round_magic) - round_magic;
  const float r = (xc - n * ln2_hi) - n * ln2_lo;
  // e^r on [-ln2/2, ln2/2].
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  // times 2^n: n + 127 in the exponent bits (n is in [-126, 127] after the clamp); 0 below lo.
  const std::int32_t scale_bits = (static_cast<std::int32_t>(n) + 127) << 23;
  const std::int32_t y_bits = bits_of_float(p * float_from_bits(below ? 0 : scale_bits));
  // NaN in, NaN out (a NaN weight or hidden value must give a NaN loss, as expf and PyTorch do;
  // the range tests above read a positive NaN as above the range, a negative one as below).
  const bool nan = (static_cast<std::uint32_t>(xb) & 0x7FFFFFFFu) > static_cast<std::uint32_t>(inf_bits);
  const std::int32_t finite_bits = above ? inf_bits : y_bits;
  return float_from_bits(nan ? xb : finite_bits);
}

/// log(1 + e) for e in [0, 1] (what softplus and log-sigmoid need: e = exp(-|x|)), without a
/// library call: with u = e / (2 + e) in [0, 1/3], log(1 + e) = 2 atanh(u) = 2 (u + u^3/3 + ... +
/// u^15/15 + ...), truncated after u^15 (relative truncation error < 2e-9). Within 2.4 ulp of the
/// float64 value over e = exp(-x), x in [0, 85] (libm's log1pf: 1.4 ulp); relative accuracy holds
/// for tiny e (no 1 + e rounding). Branch-free, so loops over it vectorise like `fast_exp`'s.
XSOFTMAX_HD inline float fast_log1p_unit(float e) {
  const float u = e / (2.f + e), u2 = u * u;
  float p = 1.f / 15.f;
  p = p * u2 + 1.f / 13.f;
  p = p * u2 + 1.f / 11.f;
  p = p * u2 + 1.f / 9.f;
  p = p * u2 + 1.f / 7.f;
  p = p * u2 + 1.f / 5.f;
  p = p * u2 + 1.f / 3.f;
  p = p * u2;
  return 2.f * u + 2.f * u * p;
}

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
/// `fast_exp` and `fast_log1p_unit` on 8 lanes (host tuning, AVX2 CPUs only: callers check
/// `row_simd::has_avx2`): the same float operations in the same order lane by lane, the selects as
/// blends, no FMA, so each lane is bitwise the scalar function's value (tests/primitives/
/// row_kernels_avx2_test.cpp). Inlined only into AVX2 functions.
namespace avx2 {
__attribute__((target("avx2"), always_inline)) inline __m256 fast_exp(__m256 x) {
  const __m256i sign = _mm256_set1_epi32(static_cast<std::int32_t>(0x80000000u));
  const __m256i hi = _mm256_set1_epi32(0x42B0C0A5), lo = _mm256_set1_epi32(static_cast<std::int32_t>(0xC2AEAC50u));
  const __m256i xb = _mm256_castps_si256(x);
  // unsigned xb > lo as a signed comparison of both with the top bit flipped
  const __m256i below = _mm256_cmpgt_epi32(_mm256_xor_si256(xb, sign), _mm256_xor_si256(lo, sign));
  const __m256i above = _mm256_cmpgt_epi32(xb, hi);
  const __m256 xc = _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_blendv_epi8(xb, hi, above), lo, below));
  const __m256 magic = _mm256_set1_ps(12582912.f);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), magic), magic);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_andnot_si256(below, scale)));
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i finite = _mm256_blendv_epi8(_mm256_castps_si256(y), inf, above);
  // NaN in, NaN out, as the scalar function: |x|'s bits above infinity's
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(xb, _mm256_set1_epi32(0x7FFFFFFF)), inf);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(finite, xb, nan));
}

__attribute__((target("avx2"), always_inline)) inline __m256 fast_log1p_unit(__m256 e) {
  const __m256 u = _mm256_div_ps(e, _mm256_add_ps(_mm256_set1_ps(2.f), e)), u2 = _mm256_mul_ps(u, u);
  __m256 p = _mm256_set1_ps(1.f / 15.f);
  p = _mm256_add_ps(_mm256_mul_ps(p, u2), _mm256_set1_ps(1.f / 13.f));
  p = _mm256_add_ps(_mm256_mul_ps(p, u2), _mm256_set1_ps(1.f / 11.f));
  p = _mm256_add_ps(_mm256_mul_ps(p, u2), _mm256_set1_ps(1.f / 9.f));
  p = _mm256_add_ps(_mm256_mul_ps(p, u2), _mm256_set1_ps(1.f / 7.f));
  p = _mm256_add_ps(_mm256_mul_ps(p, u2), _mm256_set1_ps(1.f / 5.f));
  p = _mm256_add_ps(_mm256_mul_ps(p, u2), _mm256_set1_ps(1.f / 3.f));
  p = _mm256_mul_ps(p, u2);
  const __m256 two_u = _mm256_mul_ps(_mm256_set1_ps(2.f), u);
  return _mm256_add_ps(two_u, _mm256_mul_ps(two_u, p));
}
}  // namespace avx2

namespace avx512 {
/// The arithmetic of `fast_exp` below, with explicit rounding (to nearest, the default mode): GCC
/// contracts a plain multiply and add into an FMA wherever the target has one (-ffp-contract=fast,
/// and AVX-512F has them), which would change the bits; it leaves these alone.
/// (Here and below, the zero-masked forms with every lane kept: GCC 12's unmasked ones start from
/// an `_mm512_undefined_*` that -Wmaybe-uninitialized reports.)
constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr __mmask16 all_lanes = 0xFFFF;
__attribute__((target("avx512f"), always_inline)) inline __m512 mul(__m512 a, __m512 b) {
  return _mm512_maskz_mul_round_ps(all_lanes, a, b, nearest);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 add(__m512 a, __m512 b) {
  return _mm512_maskz_add_round_ps(all_lanes, a, b, nearest);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 sub(__m512 a, __m512 b) {
  return _mm512_maskz_sub_round_ps(all_lanes, a, b, nearest);
}
/// `avx2::fast_exp` on 16 lanes (AVX-512F CPUs only: callers check `row_simd::has_avx512`), each
/// lane bitwise the scalar function's value (tests/primitives/exp_rows_test.cpp). Inlined only into
/// AVX-512F functions.
__attribute__((target("avx512f"), always_inline)) inline __m512 fast_exp(__m512 x) {
  const __m512i sign = _mm512_set1_epi32(static_cast<std::int32_t>(0x80000000u));
  const __m512i hi = _mm512_set1_epi32(0x42B0C0A5), lo = _mm512_set1_epi32(static_cast<std::int32_t>(0xC2AEAC50u));
  const __m512i xb = _mm512_castps_si512(x);
  const __mmask16 below = _mm512_cmpgt_epi32_mask(_mm512_xor_si512(xb, sign), _mm512_xor_si512(lo, sign));
  const __mmask16 above = _mm512_cmpgt_epi32_mask(xb, hi);
  const __m512 xc = _mm512_castsi512_ps(_mm512_mask_blend_epi32(below, _mm512_mask_blend_epi32(above, xb, hi), lo));
  const __m512 magic = _mm512_set1_ps(12582912.f);
  const __m512 n = sub(add(mul(xc, _mm512_set1_ps(1.44269504088896341f)), magic), magic);
  const __m512 r = sub(sub(xc, mul(n, _mm512_set1_ps(0.693359375f))), mul(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = add(mul(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = add(mul(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = add(mul(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = add(mul(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = add(mul(p, r), _mm512_set1_ps(5.0000001201e-1f));
  p = add(add(mul(mul(p, r), r), r), _mm512_set1_ps(1.f));
  const __m512i biased = _mm512_add_epi32(_mm512_maskz_cvttps_epi32(all_lanes, n), _mm512_set1_epi32(127));
  const __m512i scale = _mm512_maskz_slli_epi32(all_lanes, biased, 23);
  const __m512 y = mul(p, _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~below), scale)));
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  const __m512i finite = _mm512_mask_blend_epi32(above, _mm512_castps_si512(y), inf);
  // NaN in, NaN out, as the scalar function: |x|'s bits above infinity's
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(xb, _mm512_set1_epi32(0x7FFFFFFF)), inf);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, finite, xb));
}
}  // namespace avx512
#endif

}  // namespace xsoftmax::detail
