// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Per-sample candidate lists for the explicit_candidates selector in the head tests: row r's
/// `per_row` classes (r * 13 + j * 71) mod num_classes, j < per_row (spread, some shared by rows).

#include <xsoftmax/selection/explicit_candidates.hpp>

#include <vector>

namespace xsoftmax_test {

inline xsoftmax::explicit_candidates per_sample_lists(xsoftmax::index_t rows, xsoftmax::index_t num_classes,
                                                      xsoftmax::index_t per_row) {
  std::vector<xsoftmax::index_t> offsets{0}, ids;
  for (xsoftmax::index_t r = 0; r < rows; ++r) {
    for (xsoftmax::index_t j = 0; j < per_row; ++j) ids.push_back((r * 13 + j * 71) % num_classes);
    offsets.push_back(static_cast<xsoftmax::index_t>(ids.size()));
  }
  xsoftmax::explicit_candidates lists;
  lists.set_per_sample(offsets, ids);
  return lists;
}

}  // namespace xsoftmax_test
