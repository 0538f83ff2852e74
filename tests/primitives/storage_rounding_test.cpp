// SPDX-License-Identifier: Apache-2.0
// The host's branch-free float -> bf16 and float -> fp16 rounding (detail::host_float_to_bf16 and
// detail::host_float_to_half, what from_float<bf16 / fp16> runs on the host) against cuda_bf16.h's
// __float2bfloat16_rn and cuda_fp16.h's __float2half_rn: bitwise the same for every sign and
// exponent, at every rounding boundary of the dropped bits (just below, at and above the halfway
// point, with an even and an odd kept bit), for zeros, denormals (fp16: every exponent of the
// half's subnormal range, sampled densely), the largest finite values (which round to infinity),
// infinities and NaNs of every payload class, and for a million random bit patterns. (Checked once
// over all 2^32 floats as well: bench/tools/storage_rounding_exhaustive.cpp.) And the host's
// branch-free fp16 -> float widening (detail::host_half_to_float) on all 65536 halves.

#include <xsoftmax/precision.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>

namespace {

template <class T>
std::uint16_t bits_of(T v) {
  std::uint16_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Counts float bit patterns whose rounding by `ours` and by `theirs` (float -> a 16-bit type)
/// differ, failing the first ten with their bits.
template <class Ours, class Theirs>
struct rounding_check {
  Ours ours;
  Theirs theirs;
  const char* type;
  int bad = 0;
  std::int64_t checked = 0;
  void operator()(std::uint32_t u) {
    const float x = float_of(u);
    const std::uint16_t got = bits_of(ours(x)), want = bits_of(theirs(x));
    ++checked;
    if (got != want && bad++ < 10) FAIL_CHECK("float bits ", u, ": got ", type, " ", got, ", want ", want);
  }
};
template <class Ours, class Theirs>
rounding_check<Ours, Theirs> make_check(Ours ours, Theirs theirs, const char* type) {
  return {ours, theirs, type};
}

}  // namespace

TEST_CASE("bf16 rounding on the host: bitwise cuda_bf16.h's round-to-nearest-even") {
  auto check = make_check([](float x) { return xsoftmax::detail::host_float_to_bf16(x); },
                          [](float x) { return __float2bfloat16_rn(x); }, "bf16");
  // Every upper half (sign, exponent, 7 kept mantissa bits) with the dropped bits at and around
  // the rounding boundaries.
  const std::uint32_t low[] = {0x0000u, 0x0001u, 0x3fffu, 0x7fffu, 0x8000u, 0x8001u, 0xbfffu, 0xfffeu, 0xffffu};
  for (std::uint32_t high = 0; high <= 0xffffu; ++high)
    for (std::uint32_t l : low) check((high << 16) | l);
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) check(static_cast<std::uint32_t>(rng()));
  CHECK(check.bad == 0);
  CHECK(check.checked == 65536 * 9 + 1000000);
  // And what from_float<bf16> gives on the host is it.
  CHECK(bits_of(xsoftmax::from_float<__nv_bfloat16>(1.00390625f)) == bits_of(__float2bfloat16_rn(1.00390625f)));
}

TEST_CASE("fp16 rounding on the host: bitwise cuda_fp16.h's round-to-nearest-even") {
  auto check = make_check([](float x) { return xsoftmax::detail::host_float_to_half(x); },
                          [](float x) { return __float2half_rn(x); }, "fp16");
  // Every sign, exponent and 10 kept mantissa bits (the top 19 bits) with the 13 dropped bits at
  // and around the halfway point: the normal halves' boundaries, overflow to infinity, infinities
  // and NaNs.
  const std::uint32_t low[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu};
  for (std::uint32_t high = 0; high < (1u << 19); ++high)
    for (std::uint32_t l : low) check((high << 13) | l);
  // The floats that round to a subnormal half or to zero (|x| < 2^-14), every 97th, both signs.
  for (std::uint32_t u = 0; u < 0x38800000u; u += 97) check(u), check(u | 0x80000000u);
  std::mt19937 rng(6);
  for (int i = 0; i < 1000000; ++i) check(static_cast<std::uint32_t>(rng()));
  CHECK(check.bad == 0);
  CHECK(check.checked > (std::int64_t(1) << 19) * 6 + 1000000);
  CHECK(bits_of(xsoftmax::from_float<__half>(1.00048828125f)) == bits_of(__float2half_rn(1.00048828125f)));
}

TEST_CASE("fp16 widening on the host: bitwise cuda_fp16.h's __half2float on every half") {
  int bad = 0;
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    __half_raw raw;
    raw.x = static_cast<unsigned short>(h);
    const __half x(raw);
    const float got = xsoftmax::to_float(x), want = __half2float(x);
    std::uint32_t g, w;
    std::memcpy(&g, &got, sizeof g);
    std::memcpy(&w, &want, sizeof w);
    if (g != w && bad++ < 10) FAIL_CHECK("half bits ", h, ": got float bits ", g, ", want ", w);
  }
  CHECK(bad == 0);
}
