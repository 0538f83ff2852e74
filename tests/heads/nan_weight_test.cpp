// SPDX-License-Identifier: Apache-2.0
// A NaN in the weights makes every row's loss NaN, as F.cross_entropy's does (the log-sum-exp of a
// row that scores a NaN is NaN): never a finite or infinite loss that hides the broken weights.
// (The host exponential once mapped NaN to +inf, so rows whose target was not the NaN class
// reported a loss of inf.)

#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using xsoftmax::index_t;
using xsoftmax::matrix_view;
using xsoftmax::vector_view;

template <class B>
void check_nan_weight_gives_nan_losses() {
  const index_t n = 300, d = 8, rows = 5;
  std::vector<float> w(static_cast<std::size_t>(n * d));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  w[static_cast<std::size_t>(5 * d + 3)] = std::numeric_limits<float>::quiet_NaN();  // class 5
  xsoftmax::full_softmax<xsoftmax::fp32, B> head(matrix_view<float>(w.data(), n, d), nullptr);
  std::vector<float> h(static_cast<std::size_t>(rows * d), 0.25f);
  const std::vector<index_t> t{1, 5, 7, 9, 299};  // one row's target is the NaN class, the others not
  std::vector<float> per(static_cast<std::size_t>(rows));
  const float mean = head.forward(matrix_view<const float>(h.data(), rows, d), vector_view<const index_t>(t.data(), rows),
                                  xsoftmax::loss_options{}, vector_view<float>(per.data(), rows));
  CHECK(std::isnan(mean));
  for (index_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    CHECK(std::isnan(per[static_cast<std::size_t>(r)]));
  }
}

TEST_CASE("full_softmax: a NaN weight gives a NaN loss on every row (serial, omp), as F.cross_entropy does") {
  check_nan_weight_gives_nan_losses<xsoftmax::serial>();
  check_nan_weight_gives_nan_losses<xsoftmax::omp>();
}

}  // namespace
