// SPDX-License-Identifier: Apache-2.0
// The host's branch-free float -> bf16 rounding (detail::host_float_to_bf16) against cuda_bf16.h's
// __float2bfloat16_rn on all 2^32 float bit patterns (bench/RESULTS.md, stop 51; CI checks a
// sample: tests/primitives/bf16_rounding_test.cpp). About 3 s.
//
// g++ -std=c++17 -O2 -Iinclude -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include
//   bench/tools/bf16_rounding_exhaustive.cpp -o /tmp/bf16_rounding_exhaustive && /tmp/bf16_rounding_exhaustive

#include <xsoftmax/precision.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>

int main() {
  long bad = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; ++u) {
    const auto v = static_cast<std::uint32_t>(u);
    float x;
    std::memcpy(&x, &v, sizeof x);
    const __nv_bfloat16 a = xsoftmax::detail::host_float_to_bf16(x), b = __float2bfloat16_rn(x);
    unsigned short ab, bb;
    std::memcpy(&ab, &a, sizeof ab);
    std::memcpy(&bb, &b, sizeof bb);
    if (ab != bb && bad++ < 5) std::printf("%08x: %04x vs %04x\n", v, ab, bb);
  }
  std::printf("all 2^32 floats: %ld differ\n", bad);
  return bad != 0;
}
