// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mix_seed`: the splitmix64 step, the library's one integer mixer: it decorrelates (seed, step)
/// pairs into independent generator seeds (samplers, k-means, IVF) and makes the counter-based
/// initial weights (weight_store.hpp). Host and device.

#include <xsoftmax/config.hpp>

#include <cstdint>

namespace xsoftmax::detail {

/// splitmix64: x plus the golden-ratio increment, then its finaliser.
XSOFTMAX_HD inline std::uint64_t mix_seed(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace xsoftmax::detail
