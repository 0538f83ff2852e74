// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The checks a sparse weight gradient passes before anything writes with it (`apply_sgd`, the
/// sparse optimizers): its shape against the weights, its rows in range and unique (so the row
/// updates are independent: no races, no lost updates), and every value finite once scaled by the
/// learning rate. Each failure throws a typed error naming the value; the weights are untouched.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/extrema.h>
#include <thrust/find.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/host_vector.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

#include <algorithm>
#include <cmath>

namespace xsoftmax::detail {

/// Every lr * v in `values` (rows of `width`) is finite; otherwise throws `non_finite_error` naming
/// the gradient row and column.
template <class Backend, class Vector>
void check_finite_gradient_values(const char* where, const execution<Backend>& ex, const Vector& values,
                                  const char* name, index_t width, float lr) {
  const index_t n = static_cast<index_t>(values.size());
  const auto* v = thrust::raw_pointer_cast(values.data());
  const index_t i = first_non_finite(ex, v, n, lr);
  if (i == n) return;
  const float bad = static_cast<float>(backend_ops<Backend>::read(ex.res, v + i));
  expects<non_finite_error>(false, where, ": gradient ", name, "[", i / width, "][", i % width, "] = ", bad,
                            " (times lr = ", lr, ") is not finite");
}

/// True where rows[i] does not exceed rows[i - 1] (i >= 1): the rows are not strictly increasing.
struct not_above_previous {
  const index_t* rows;
  XSOFTMAX_HD bool operator()(index_t i) const { return rows[i] <= rows[i - 1]; }
};

/// Checks `g` against weights of `rows` x `cols` (with a bias when `has_bias`) and a finite `lr`.
template <class Backend, class Accum>
void check_sparse_gradient(const char* where, const execution<Backend>& ex, const sparse_gradient<Backend, Accum>& g,
                           index_t rows, index_t cols, bool has_bias, float lr) {
  expects<non_finite_error>(std::isfinite(lr), where, ": learning rate ", lr, " is not finite");
  expects<shape_error>(g.dim == cols, where, ": gradient dim = ", g.dim, " but weights have ", cols, " columns");
  const index_t n = g.num_rows();
  expects<shape_error>(static_cast<index_t>(g.values.size()) == n * cols, where, ": gradient has ", g.values.size(),
                       " values for ", n, " rows of dim ", cols);
  expects<shape_error>(g.bias_values.empty() || static_cast<index_t>(g.bias_values.size()) == n, where,
                       ": gradient has ", g.bias_values.size(), " bias values for ", n, " rows");
  expects(g.bias_values.empty() || has_bias, where, ": gradient carries bias values but the head has no bias");
  if (n == 0) return;
  const auto mm = with_light_policy(ex, n, [&](auto policy) {  // light: one compare a row
    return thrust::minmax_element(policy, g.rows.begin(), g.rows.end());
  });
  const index_t lo = *mm.first, hi = *mm.second;
  expects<out_of_range>(lo >= 0 && hi < rows, where, ": gradient row[",
                        (lo < 0 ? mm.first : mm.second) - g.rows.begin(), "] = ", lo < 0 ? lo : hi,
                        " is out of range [0, ", rows, ")");
  // Rows in strictly increasing order are unique: one O(n) pass, no copy. Otherwise checked on a
  // sorted copy, O(n log n) against the update's O(n * dim).
  const index_t* rp = thrust::raw_pointer_cast(g.rows.data());
  if (first_index_where_light(ex, 1, n, not_above_previous{rp}) != n) {
    backend_vector<Backend, index_t> sorted(g.rows);
    thrust::sort(ex.policy(), sorted.begin(), sorted.end());
    if (thrust::unique_count(ex.policy(), sorted.begin(), sorted.end()) != n) {
      const thrust::host_vector<index_t> host(sorted);  // error path only
      const auto dup = std::adjacent_find(host.begin(), host.end());
      expects(false, where, ": gradient rows are not unique (row ", *dup, " appears more than once)");
    }
  }
  // A non-finite value (or one that lr scales past the float range) would poison its weight row for
  // good: rejected before anything is written, like every other bad input.
  check_finite_gradient_values(where, ex, g.values, "values", cols, lr);
  check_finite_gradient_values(where, ex, g.bias_values, "bias_values", 1, lr);
}

}  // namespace xsoftmax::detail
