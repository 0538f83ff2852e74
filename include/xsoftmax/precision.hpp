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
XSOFTMAX_HD inline float to_float(__half x) { return __half2float(x); }

namespace detail {
/// float -> bf16 on the host, round to nearest even, without a branch: cuda_bf16.h's host
/// `__float2bfloat16_rn` branches on the dropped bits, which real data mispredicts half the time
/// (2.8 ns a value where this takes 0.4: a bf16 weight gradient's rounding pass, bench/RESULTS.md).
/// Bitwise the same results, NaN -> 0x7fff as there (tests/primitives/bf16_rounding_test.cpp).
inline __nv_bfloat16 host_float_to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  __nv_bfloat16_raw r;
  r.x = static_cast<unsigned short>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : rounded);
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
    return __float2half_rn(x);
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
