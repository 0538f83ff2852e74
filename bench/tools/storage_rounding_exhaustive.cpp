// SPDX-License-Identifier: Apache-2.0
// The host's branch-free float -> bf16 and float -> fp16 rounding (detail::host_float_to_bf16,
// detail::host_float_to_half) against cuda_bf16.h's __float2bfloat16_rn and cuda_fp16.h's
// __float2half_rn on all 2^32 float bit patterns (bench/RESULTS.md, stops 51 and 52; CI checks the
// rounding boundaries and a sample: tests/primitives/storage_rounding_test.cpp). About 10 s.
//
// g++ -std=c++17 -O2 -Iinclude -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include
//   bench/tools/storage_rounding_exhaustive.cpp -o /tmp/storage_rounding_exhaustive && /tmp/storage_rounding_exhaustive

#include <xsoftmax/precision.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>

template <class T>
unsigned short bits(T v) {
  unsigned short b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

int main() {
  long bad_bf16 = 0, bad_fp16 = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; ++u) {
    const auto v = static_cast<std::uint32_t>(u);
    float x;
    std::memcpy(&x, &v, sizeof x);
    const unsigned short a = bits(xsoftmax::detail::host_float_to_bf16(x)), b = bits(__float2bfloat16_rn(x));
    if (a != b && bad_bf16++ < 5) std::printf("bf16 %08x: %04x vs %04x\n", v, a, b);
    const unsigned short c = bits(xsoftmax::detail::host_float_to_half(x)), d = bits(__float2half_rn(x));
    if (c != d && bad_fp16++ < 5) std::printf("fp16 %08x: %04x vs %04x\n", v, c, d);
  }
  std::printf("all 2^32 floats: %ld differ as bf16, %ld as fp16\n", bad_bf16, bad_fp16);
  return bad_bf16 != 0 || bad_fp16 != 0;
}
