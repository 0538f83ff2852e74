// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Test support: a small sparse weight gradient with constant values, for the tests (and fuzz
/// targets) that need an optimizer with some state before they save or load it.

#include <xsoftmax/types.hpp>

#include <vector>

namespace xsoftmax_test {

/// Rows `rows` of a `dim`-wide layer with a bias, every value `value`.
template <class B>
xsoftmax::sparse_gradient<B, float> small_gradient(xsoftmax::index_t dim, const std::vector<xsoftmax::index_t>& rows,
                                                   float value) {
  xsoftmax::sparse_gradient<B, float> g;
  g.dim = dim;
  g.rows.assign(rows.begin(), rows.end());
  g.values.assign(rows.size() * static_cast<std::size_t>(dim), value);
  g.bias_values.assign(rows.size(), value);
  return g;
}

}  // namespace xsoftmax_test
