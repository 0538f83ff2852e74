// SPDX-License-Identifier: Apache-2.0
// for_each_score_row (score_row_pass.hpp): every row of x visited exactly once with its scores
// against every row of c, on every backend (the omp form's per-thread cache tiles included: shapes
// below, at and above a tile, k from 1 to past a tile's width), the scores equal to float64 dot
// products within fp32 rounding, and bitwise the generic form's on integer-valued inputs.

#include "support/reference.hpp"
#include "support/test_memory.hpp"

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/primitives/score_row_pass.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <vector>

namespace {

using xsoftmax::index_t;
using xsoftmax_test::test_rng;
namespace xd = xsoftmax::detail;

/// Copies each visited row's scores into `out` (n x k) and counts its visits.
struct record_row {
  index_t k;
  float* out;
  index_t* visits;
  XSOFTMAX_HD void operator()(index_t r, const float* s) const {
    for (index_t j = 0; j < k; ++j) out[r * k + j] = s[j];
    visits[r] += 1;  // one task per row: no other thread touches visits[r]
  }
};

template <class B>
void check_shape(test_rng& rng, index_t n, index_t k, index_t d, bool integers) {
  xsoftmax_test::test_vector<float> x(static_cast<std::size_t>(n * d)), c(static_cast<std::size_t>(k * d)),
      out(static_cast<std::size_t>(n * k), NAN);
  xsoftmax_test::test_vector<index_t> visits(static_cast<std::size_t>(n), 0);
  for (float& v : x) v = integers ? static_cast<float>(rng.integer(-3, 3)) : static_cast<float>(rng.uniform(-1, 1));
  for (float& v : c) v = integers ? static_cast<float>(rng.integer(-3, 3)) : static_cast<float>(rng.uniform(-1, 1));
  const xsoftmax::backend_resources<B> res{};
  const xd::execution<B> ex{res};
  xd::for_each_score_row(ex, xsoftmax::matrix_view<const float>(x.data(), n, d),
                         xsoftmax::matrix_view<const float>(c.data(), k, d), record_row{k, out.data(), visits.data()});
  xd::backend_ops<B>::synchronize(res);
  for (index_t r = 0; r < n; ++r) REQUIRE(visits[static_cast<std::size_t>(r)] == 1);
  double worst = 0;
  for (index_t r = 0; r < n; ++r)
    for (index_t j = 0; j < k; ++j) {
      double want = 0, scale = 0;
      for (index_t p = 0; p < d; ++p) {
        const double prod = double(x[static_cast<std::size_t>(r * d + p)]) * c[static_cast<std::size_t>(j * d + p)];
        want += prod;
        scale += std::fabs(prod);
      }
      const double got = out[static_cast<std::size_t>(r * k + j)];
      if (integers) REQUIRE(got == want);  // exact in fp32 whatever the order of the sums
      worst = std::fmax(worst, std::fabs(got - want) / (scale + 1e-30));
    }
  CHECK(worst <= 1e-6);
}

}  // namespace

TEST_CASE_TEMPLATE("for_each_score_row visits every row once with its scores against every centroid", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(53);
  // The omp form's tiles hold score_pass_cache_floats / k rows: shapes below one tile, across
  // several (with a ragged last one), a k wider than a tile (one row a tile), and k = 1.
  const index_t tile_rows_1000 = xd::score_pass_cache_floats / 1000;
  for (const auto& [n, k, d] : std::vector<std::array<index_t, 3>>{
           {1, 1, 1}, {7, 3, 5}, {300, 17, 9}, {3 * tile_rows_1000 + 5, 1000, 8},
           {3, xd::score_pass_cache_floats + 3, 2}, {500, 1, 4}}) {
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(d);
    check_shape<B>(rng, n, k, d, false);
    check_shape<B>(rng, n, k, d, true);
  }
}
