// SPDX-License-Identifier: Apache-2.0
// The dense softmax's exponential row loops (exp_rows.hpp): the portable sums and scaled
// exponentials against float64 references (rows of every length 0..70, masked -inf scores, scores
// far below the shift, NaN), and the AVX2 versions bitwise against the portable ones (skipped, with
// a message, on a CPU or build without the AVX2 path).

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

TEST_CASE("sum_exp_shifted and exp_shifted_scaled: the portable loops against float64") {
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

TEST_CASE("sum_exp_shifted and exp_shifted_scaled: AVX2 bitwise the portable loops") {
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
      }
    }
  }
#else
  MESSAGE("no AVX2 path in this build (not x86-64 GCC/Clang, or a baseline ISA with FMA)");
#endif
}
