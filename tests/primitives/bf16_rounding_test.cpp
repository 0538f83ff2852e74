// SPDX-License-Identifier: Apache-2.0
// The host's branch-free float -> bf16 rounding (detail::host_float_to_bf16, what from_float<bf16>
// runs on the host) against cuda_bf16.h's own __float2bfloat16_rn: bitwise the same bf16 for every
// sign and exponent, at every rounding boundary of the 16 dropped bits (just below, at and above
// the halfway point, with an even and an odd kept bit), for zeros, denormals, the largest finite
// values (which round to infinity), infinities and NaNs of every payload class, and for a million
// random bit patterns. (Checked here once over all 2^32 floats as well: bench/RESULTS.md.)

#include <xsoftmax/precision.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>

namespace {

std::uint16_t bits_of(__nv_bfloat16 v) {
  std::uint16_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

TEST_CASE("bf16 rounding on the host: bitwise cuda_bf16.h's round-to-nearest-even") {
  int bad = 0;
  std::int64_t checked = 0;
  const auto check = [&](std::uint32_t u) {
    const float x = float_of(u);
    const std::uint16_t got = bits_of(xsoftmax::detail::host_float_to_bf16(x));
    const std::uint16_t want = bits_of(__float2bfloat16_rn(x));
    ++checked;
    if (got != want && bad++ < 10) FAIL_CHECK("float bits ", u, ": got bf16 ", got, ", want ", want);
  };
  // Every upper half (sign, exponent, 7 kept mantissa bits) with the dropped bits at and around
  // the rounding boundaries.
  const std::uint32_t low[] = {0x0000u, 0x0001u, 0x3fffu, 0x7fffu, 0x8000u, 0x8001u, 0xbfffu, 0xfffeu, 0xffffu};
  for (std::uint32_t high = 0; high <= 0xffffu; ++high)
    for (std::uint32_t l : low) check((high << 16) | l);
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) check(static_cast<std::uint32_t>(rng()));
  CHECK(bad == 0);
  CHECK(checked == 65536 * 9 + 1000000);
  // And what from_float<bf16> gives on the host is it.
  CHECK(bits_of(xsoftmax::from_float<__nv_bfloat16>(1.00390625f)) == bits_of(__float2bfloat16_rn(1.00390625f)));
}
