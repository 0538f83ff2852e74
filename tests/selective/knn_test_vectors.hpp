// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Class vectors of the KNN graph tests: small integers (every dot product exact in fp32, so ties
/// are real and broken by id) and points around random centres (so that IVF lists and neighbours
/// of neighbours mean something).

#include "support/reference.hpp"

#include <vector>

namespace xsoftmax_test {

/// n x d integers in [-3, 3].
inline std::vector<float> integer_weights(test_rng& rng, index_t n, index_t d) {
  std::vector<float> w(static_cast<size_t>(n * d));
  for (auto& x : w) x = static_cast<float>(rng.integer(-3, 3));
  return w;
}

/// n points around `clusters` random centres, each coordinate within `spread` of its centre's.
inline std::vector<float> clustered_weights(test_rng& rng, index_t n, index_t d, index_t clusters, double spread) {
  const auto centres = random_floats(rng, clusters * d, 1.0);
  std::vector<float> w(static_cast<size_t>(n * d));
  for (index_t i = 0; i < n; ++i) {
    const index_t c = rng.integer(0, clusters - 1);
    for (index_t p = 0; p < d; ++p)
      w[static_cast<size_t>(i * d + p)] =
          centres[static_cast<size_t>(c * d + p)] + static_cast<float>(rng.uniform(-spread, spread));
  }
  return w;
}

}  // namespace xsoftmax_test
