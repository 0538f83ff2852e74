// SPDX-License-Identifier: Apache-2.0
#pragma once
// The comparison of a sharded head's results with the unsharded head's, shared by the MPI tests.
// The buffers a head views are `test_vector`s (support/test_memory.hpp): host memory in the host
// build, CUDA managed memory when a test is compiled by nvcc for the cuda backend
// (xsoftmax_cuda_mpi_tests: the sharded heads over MPI with every rank on the GPU).

#include "support/test_memory.hpp"

#include <xsoftmax/types.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace xsoftmax_test {

/// The unsharded layer every rank builds identically: weights (classes x dim, N(0, 0.5)) then
/// bias (N(0, 0.05)), from one seeded stream.
struct seeded_layer {
  test_vector<float> w, b;
  seeded_layer(xsoftmax::index_t classes, xsoftmax::index_t dim, unsigned seed)
      : w(static_cast<std::size_t>(classes * dim)), b(static_cast<std::size_t>(classes)) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.f, 0.5f);
    for (auto& x : w) x = nd(g);
    for (auto& x : b) x = 0.1f * nd(g);
  }
};

/// A rank's batch: hidden rows (rows x dim, row-major) and targets.
struct row_batch {
  test_vector<float> h;
  test_vector<xsoftmax::index_t> t;
  xsoftmax::index_t rows = 0;
};

/// The loss options every sharded head is compared under: plain mean; sum with label smoothing and
/// z-loss; none (with z-loss `none_z_loss`).
inline std::vector<xsoftmax::loss_options> sharded_option_sets(float none_z_loss = 0.f) {
  xsoftmax::loss_options plain, smooth, none;
  smooth.reduce = xsoftmax::reduction::sum;
  smooth.label_smoothing = 0.1f;
  smooth.z_loss = 1e-3f;
  none.reduce = xsoftmax::reduction::none;
  none.z_loss = none_z_loss;
  return {plain, smooth, none};
}

/// Norm-wise relative error ||a - b|| / max(||b||, floor) <= tol (the cancellations of a softmax
/// gradient make element-wise relative errors meaningless for entries near 0), and every element
/// within 10 tol of the largest.
template <class A, class B>
void check_close(const A& a, const B& b, double tol, double floor, const std::string& what) {
  REQUIRE(a.size() == b.size());
  double err = 0, norm = 0, largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    err += e * e, norm += static_cast<double>(b[i]) * b[i];
    largest = std::max(largest, std::abs(static_cast<double>(b[i])));
  }
  const double rel = std::sqrt(err) / std::max(std::sqrt(norm), floor);
  INFO(what, ": relative error ", rel);
  CHECK(rel <= tol);
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::abs(static_cast<double>(a[i]) - b[i]) > 10 * tol * std::max(largest, floor))
      FAIL_CHECK(what, "[", i, "] = ", a[i], " vs unsharded ", b[i]);
}

/// The same for lists of values (`check_close({loss}, {ref_loss}, ...)`).
inline void check_close(const std::vector<float>& a, const std::vector<float>& b, double tol, double floor,
                        const std::string& what) {
  check_close<std::vector<float>, std::vector<float>>(a, b, tol, floor, what);
}

/// A backend vector's values (a sparse gradient's rows or values: host or device memory) in a
/// std::vector.
template <class V>
std::vector<typename V::value_type> host_values(const V& v) {
  const auto h = on_host(v);
  return std::vector<typename V::value_type>(h.begin(), h.end());
}

}  // namespace xsoftmax_test
