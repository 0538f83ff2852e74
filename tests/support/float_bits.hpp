// SPDX-License-Identifier: Apache-2.0
#pragma once
// Bitwise comparison of floats for the tests that hold a tuned kernel to its portable twin.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace xsoftmax_test {

/// The bits of `f`.
inline std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

/// Bitwise equal, except that any NaN equals any NaN (a NaN's payload is not part of the contract).
inline bool same_bits(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

}  // namespace xsoftmax_test
