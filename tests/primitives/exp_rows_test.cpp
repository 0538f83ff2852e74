// SPDX-License-Identifier: Apache-2.0
// The dense softmax's exponential row loops (exp_rows.hpp): the portable sums and scaled
// exponentials against float64 references (rows of every length 0..70, masked -inf scores, scores
// far below the shift, NaN), and the AVX2 and AVX-512 versions bitwise against the portable ones
// (skipped, with a message, on a CPU or build without them).

#include "support/float_bits.hpp"
#include "support/reference.hpp"

#include <xsoftmax/detail/primitives/exp_rows.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using xsoftmax::index_t;
using xsoftmax_test::test_rng;
namespace xd = xsoftmax::detail;

using xsoftmax_test::same_bits;

/// A row of n scores in [-20, 5], some of them -inf (masked classes) when `masked`.
std::vector<float> scores(test_rng& rng, index_t n, bool masked) {
  std::vector<float> s(static_cast<std::size_t>(n));
  for (float& x : s) x = masked && rng.coin(0.2) ? -INFINITY : static_cast<float>(rng.uniform(-20.0, 5.0));
  return s;
}

}  // namespace

TEST_CASE("sum_exp_shifted, exp_shifted_scaled and exp_shifted_sum: the portable loops against float64") {
  test_rng rng(17);
  for (index_t n = 0; n <= 70; ++n) {
    for (bool masked : {false, true}) {
      const std::vector<float> s = scores(rng, n, masked);
      const float m = 5.f;
      double want = 0;
      for (float x : s) want += std::exp(double(x) - m);
      const float got = xd::sum_exp_shifted_portable(s.data(), n, m);
      CHECK(got == doctest::Approx(want).epsilon(1e-6));
      CHECK(same_bits(xd::sum_exp_shifted(s.data(), n, m), got));  // the dispatching entry point too

      std::vector<float> e = s;
      xd::exp_shifted_scaled_portable(e.data(), n, 2.f, -0.5f);
      for (index_t j = 0; j < n; ++j)
        CHECK(e[j] == doctest::Approx(std::exp(double(s[j]) - 2.0) * -0.5).epsilon(1e-6));

      // The exponentials kept in place: the same sum to the bit, each term e^(s_j - m) (the
      // gradient's p_j u is then e_j times u e^(m - l)), and the same through the entry point.
      std::vector<float> kept = s, kept_too = s, one = s;
      CHECK(same_bits(xd::exp_shifted_sum_portable(kept.data(), n, m), got));
      CHECK(same_bits(xd::exp_shifted_sum(kept_too.data(), n, m), got));
      xd::exp_shifted_scaled_portable(one.data(), n, m, 1.f);
      for (index_t j = 0; j < n; ++j) {
        CHECK(kept[j] == doctest::Approx(std::exp(double(s[j]) - m)).epsilon(1e-6));
        CHECK(same_bits(kept[j], one[j]));
        CHECK(same_bits(kept_too[j], one[j]));
      }
    }
  }
  // Far below the shift: every term underflows to 0, as expf's does.
  const std::vector<float> low(13, -200.f);
  CHECK(xd::sum_exp_shifted_portable(low.data(), 13, 0.f) == 0.f);
  // A NaN score makes the sum NaN (a NaN weight gives a NaN loss, as in F.cross_entropy).
  std::vector<float> with_nan(20, 0.f);
  with_nan[11] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(xd::sum_exp_shifted_portable(with_nan.data(), 20, 0.f)));
  CHECK(std::isnan(xd::sum_exp_shifted(with_nan.data(), 20, 0.f)));
}

TEST_CASE("sum_exp_shifted, exp_shifted_scaled and exp_shifted_sum: AVX2 and AVX-512 bitwise the portable loops") {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (!xd::row_simd::has_avx2) {
    MESSAGE("this CPU has no AVX2: the AVX2 loops are not run");
    return;
  }
  test_rng rng(23);
  for (index_t n = 0; n <= 70; ++n) {
    for (bool masked : {false, true}) {
      std::vector<float> s = scores(rng, n, masked);
      if (n > 3 && rng.coin(0.1)) s[static_cast<std::size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
      for (float m : {5.f, -3.f, 80.f}) {
        CHECK(same_bits(xd::avx2::sum_exp_shifted(s.data(), n, m), xd::sum_exp_shifted_portable(s.data(), n, m)));
        std::vector<float> a = s, b = s;
        xd::avx2::exp_shifted_scaled(a.data(), n, m, 0.75f);
        xd::exp_shifted_scaled_portable(b.data(), n, m, 0.75f);
        for (index_t j = 0; j < n; ++j) CHECK(same_bits(a[j], b[j]));
        std::vector<float> c = s, e = s;
        CHECK(same_bits(xd::avx2::exp_shifted_sum(c.data(), n, m), xd::exp_shifted_sum_portable(e.data(), n, m)));
        for (index_t j = 0; j < n; ++j) CHECK(same_bits(c[j], e[j]));
        if (!xd::row_simd::has_avx512) continue;
        // The 16-lane loops (rows up to 70 cover every tail length after one and several vectors).
        CHECK(same_bits(xd::avx512::sum_exp_shifted(s.data(), n, m), xd::sum_exp_shifted_portable(s.data(), n, m)));
        std::vector<float> a16 = s, c16 = s;
        xd::avx512::exp_shifted_scaled(a16.data(), n, m, 0.75f);
        for (index_t j = 0; j < n; ++j) CHECK(same_bits(a16[j], b[j]));
        CHECK(same_bits(xd::avx512::exp_shifted_sum(c16.data(), n, m), xd::exp_shifted_sum_portable(s.data(), n, m)));
        for (index_t j = 0; j < n; ++j) CHECK(same_bits(c16[j], e[j]));
      }
    }
  }
  if (!xd::row_simd::has_avx512) MESSAGE("this CPU has no AVX-512F: the 16-lane loops are not run");
#else
  MESSAGE("no AVX2 path in this build (not x86-64 GCC/Clang, or a baseline ISA with FMA)");
#endif
}
