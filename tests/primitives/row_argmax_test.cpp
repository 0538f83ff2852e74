// SPDX-License-Identifier: Apache-2.0
// row_argmax (row_argmax.hpp): the portable function against a float64 first-maximum reference, and
// the dispatched (AVX2 where the CPU and build have it) function equal to the portable one on rows
// of every length 1..80, with and without a bias, with ties, -inf, NaN (first and elsewhere) and
// all-NaN rows -- the cases where eight lanes could pick another column than one running maximum.

#include "support/reference.hpp"

#include <xsoftmax/detail/primitives/row_argmax.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {

using xsoftmax::index_t;
using xsoftmax_test::test_rng;
namespace xd = xsoftmax::detail;

/// The first column of the largest non-NaN value, or 0 when value 0 is NaN (row_argmax's rule),
/// in double.
index_t first_maximum(const std::vector<float>& s, const std::vector<float>* bias) {
  const auto v = [&](std::size_t j) { return static_cast<double>(s[j]) + (bias ? (*bias)[j] : 0.0); };
  if (std::isnan(v(0))) return 0;
  index_t best = 0;
  for (std::size_t j = 1; j < s.size(); ++j)
    if (!std::isnan(v(j)) && v(j) > v(static_cast<std::size_t>(best))) best = static_cast<index_t>(j);
  return best;
}

/// A row of n scores: few distinct values (ties), some -inf and NaN depending on `kind`.
std::vector<float> row(test_rng& rng, index_t n, int kind) {
  std::vector<float> s(static_cast<std::size_t>(n));
  for (float& x : s) {
    x = static_cast<float>(rng.integer(-3, 3));  // ties everywhere
    if (kind >= 1 && rng.coin(0.2)) x = -INFINITY;
    if (kind >= 2 && rng.coin(0.2)) x = NAN;
    if (kind == 3) x = rng.coin(0.9) ? NAN : -INFINITY;
  }
  if (kind == 4) s[0] = NAN;
  if (kind == 5) s[0] = -INFINITY, s[static_cast<std::size_t>(n - 1)] = NAN;
  return s;
}

}  // namespace

TEST_CASE("row_argmax: the first maximum, vector lanes equal to one running maximum") {
  test_rng rng(41);
  index_t checked = 0;
  for (index_t n = 1; n <= 80; ++n)
    for (int kind = 0; kind <= 5; ++kind)
      for (int with_bias = 0; with_bias <= 1; ++with_bias)
        for (int rep = 0; rep < 6; ++rep) {
          const std::vector<float> s = row(rng, n, kind);
          std::vector<float> bias(static_cast<std::size_t>(n));
          for (float& b : bias) b = static_cast<float>(rng.integer(-1, 1));  // integers: sums exact in fp32
          const std::vector<float>* b = with_bias ? &bias : nullptr;
          const index_t want = first_maximum(s, b);
          const float* bp = with_bias ? bias.data() : nullptr;
          CAPTURE(n);
          CAPTURE(kind);
          CAPTURE(with_bias);
          REQUIRE(xd::row_argmax_portable(s.data(), bp, n) == want);
          REQUIRE(xd::row_argmax(s.data(), bp, n) == want);
          ++checked;
        }
  CHECK(checked == 80 * 6 * 2 * 6);
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (!xd::row_simd::has_avx2) MESSAGE("no AVX2 on this CPU: only the portable row_argmax was checked");
#else
  MESSAGE("this build has no AVX2 dispatch: only the portable row_argmax was checked");
#endif
}

TEST_CASE("row_argmax: a late maximum in every lane position and the tail") {
  for (index_t n : {16, 17, 23, 24, 64, 1000, 1003})
    for (index_t at = 0; at < n; ++at) {
      std::vector<float> s(static_cast<std::size_t>(n), 0.5f);
      s[static_cast<std::size_t>(at)] = 2.f;
      if (at + 1 < n) s[static_cast<std::size_t>(at + 1)] = 2.f;  // a tie after it: the first wins
      CAPTURE(n);
      CAPTURE(at);
      REQUIRE(xd::row_argmax(s.data(), nullptr, n) == at);
    }
}
