// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Precision policies: the element type weights are stored in, and the type every product, softmax
/// and reduction accumulates in. Accumulation is fp32 (or wider) for every storage type.

#include <xsoftmax/config.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace xsoftmax {

/// Weights stored as `Storage`, arithmetic in `Accum`.
template <class Storage, class Accum = float>
struct precision {
  static_assert(std::is_same_v<Accum, float> || std::is_same_v<Accum, double>,
                "xsoftmax: precision<Storage, Accum>: Accum must be float or double");
  using storage_type = Storage;
  using accum_type = Accum;
};

using fp32 = precision<float>;          ///< fp32 storage, fp32 accumulation.
using bf16 = precision<__nv_bfloat16>;  ///< bf16 storage, fp32 accumulation.
using fp16 = precision<__half>;         ///< fp16 storage, fp32 accumulation.

/// True for the element types the library reads and writes: float, double, bf16, fp16.
template <class T>
inline constexpr bool is_supported_element =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, double> ||
    std::is_same_v<std::remove_cv_t<T>, __nv_bfloat16> || std::is_same_v<std::remove_cv_t<T>, __half>;

/// Widens any supported element to float.
XSOFTMAX_HD inline float to_float(float x) { return x; }
XSOFTMAX_HD inline float to_float(double x) { return static_cast<float>(x); }
XSOFTMAX_HD inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
namespace detail {
inline float host_half_to_float(__half x);
}  // namespace detail
XSOFTMAX_HD inline float to_float(__half x) {
#if defined(__CUDA_ARCH__)
  return __half2float(x);
#else
  return detail::host_half_to_float(x);
#endif
}

namespace detail {
/// fp16 -> float on the host without a branch (cuda_fp16.h's host `__half2float` branches on the
/// exponent and normalises a subnormal in a loop, which keeps a widening loop from vectorising: an
/// fp16 head's host step took three times a bf16 head's, bench/RESULTS.md). Normal values: the
/// exponent rebiased by 112; subnormal ones: their 10-bit integer times 2^-24 (exact, and never a
/// float subnormal, so denormals-are-zero modes do not change it); infinities kept; NaN ->
/// 0x7fffffff as there. Bitwise the same on all 65536 halves (tests/primitives/storage_rounding_test.cpp).
inline float host_half_to_float(__half x) {
  const std::uint32_t h = static_cast<__half_raw>(x).x;
  const std::uint32_t sign = (h & 0x8000u) << 16, exponent = h & 0x7c00u, mantissa = h & 0x3ffu;
  const float subnormal = static_cast<float>(mantissa) * 0x1p-24f;
  std::uint32_t sub_bits;
  std::memcpy(&sub_bits, &subnormal, sizeof sub_bits);
  const std::uint32_t normal = ((h & 0x7fffu) << 13) + 0x38000000u;
  const std::uint32_t special = mantissa ? 0x7fffffffu : (sign | 0x7f800000u);  // NaN loses its sign
  const std::uint32_t bits = exponent == 0x7c00u ? special : sign | (exponent ? normal : sub_bits);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// float -> bf16 on the host, round to nearest even, without a branch: cuda_bf16.h's host
/// `__float2bfloat16_rn` branches on the dropped bits, which real data mispredicts half the time
/// (2.8 ns a value where this takes 0.4: a bf16 weight gradient's rounding pass, bench/RESULTS.md).
/// Bitwise the same results, NaN -> 0x7fff as there (tests/primitives/storage_rounding_test.cpp).
inline __nv_bfloat16 host_float_to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  __nv_bfloat16_raw r;
  r.x = static_cast<unsigned short>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : rounded);
  return r;
}

/// float -> fp16 on the host, round to nearest even, without a data-dependent branch (cuda_fp16.h's
/// host `__float2half_rn` branches on the dropped bits, as its bf16 one does). Normal results: the
/// exponent rebiased and 13 bits rounded off in integer arithmetic (past the largest finite half,
/// infinity); subnormal ones: |x| + 0.5f, whose unit in the last place is 2^-24, has the FPU round
/// |x| to a multiple of 2^-24, the half's subnormal step. Bitwise the same results, NaN -> 0x7fff
/// as there (tests/primitives/storage_rounding_test.cpp; all 2^32 floats:
/// bench/tools/storage_rounding_exhaustive.cpp).
inline __half host_float_to_half(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  const std::uint32_t sign = (b >> 16) & 0x8000u, u = b & 0x7fffffffu;
  const std::uint32_t normal = (u - 0x38000000u + 0x0fffu + ((u >> 13) & 1u)) >> 13;
  float magnitude;
  std::memcpy(&magnitude, &u, sizeof magnitude);
  const float shifted = magnitude + 0.5f;  // exact RNE to a multiple of 2^-24 (|x| < 2^-14 here)
  std::uint32_t sb;
  std::memcpy(&sb, &shifted, sizeof sb);
  const std::uint32_t subnormal = sb - 0x3f000000u;  // 0.5f's bits
  const std::uint32_t finite = u >= 0x38800000u ? (normal < 0x7c00u ? normal : 0x7c00u) : subnormal;
  __half_raw r;
  r.x = static_cast<unsigned short>(u > 0x7f800000u ? 0x7fffu : sign | (u == 0x7f800000u ? 0x7c00u : finite));
  return r;
}
}  // namespace detail

/// Rounds a float to a supported element type (round-to-nearest-even for bf16/fp16).
template <class T>
XSOFTMAX_HD T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
#if defined(__CUDA_ARCH__)
    return __float2bfloat16_rn(x);
#else
    return detail::host_float_to_bf16(x);
#endif
  } else if constexpr (std::is_same_v<T, __half>) {
#if defined(__CUDA_ARCH__)
    return __float2half_rn(x);
#else
    return detail::host_float_to_half(x);
#endif
  } else {
    return static_cast<T>(x);
  }
}

/// Human-readable name of an element type, for messages and benchmark labels.
template <class T>
[[nodiscard]] constexpr const char* element_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, double>) return "fp64";
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bf16";
  else if constexpr (std::is_same_v<T, __half>) return "fp16";
  else return "unknown";
}

}  // namespace xsoftmax
