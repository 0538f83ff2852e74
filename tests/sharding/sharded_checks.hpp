// SPDX-License-Identifier: Apache-2.0
#pragma once
// The comparison of a sharded head's results with the unsharded head's, shared by the MPI tests.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace xsoftmax_test {

/// Norm-wise relative error ||a - b|| / max(||b||, floor) <= tol (the cancellations of a softmax
/// gradient make element-wise relative errors meaningless for entries near 0), and every element
/// within 10 tol of the largest.
inline void check_close(const std::vector<float>& a, const std::vector<float>& b, double tol, double floor,
                        const std::string& what) {
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

}  // namespace xsoftmax_test
