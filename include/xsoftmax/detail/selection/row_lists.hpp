// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Building blocks of the selectors, on any backend: a sorted set of classes (the union of lists),
/// and per-row class lists (CSR) sorted and free of duplicates, made with Thrust's sorts and
/// searches so that they run where the batch lives.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/remove.h>
#include <thrust/sort.h>
#include <thrust/tuple.h>
#include <thrust/unique.h>

namespace xsoftmax::detail {

struct is_empty_slot {
  XSOFTMAX_HD bool operator()(index_t id) const { return id < 0; }
};

/// Sorts `classes` ascending, drops duplicates, and shrinks it. Every id must be a class: a selector
/// fills a slot it has nothing for with a class the set holds anyway (its row's target), so that one
/// count comes back to the host (removing empty slots first was a second).
template <class Backend, class Vector>
void sort_unique(const execution<Backend>& ex, Vector& classes) {
  thrust::sort(ex.policy(), classes.begin(), classes.end());
  count_host_read();  // the unique count
  const auto end = thrust::unique(ex.policy(), classes.begin(), classes.end());
  classes.resize(static_cast<std::size_t>(end - classes.begin()));
}

/// Per-row lists given as entries (`row_of[e]`, `ids[e]`) in any order, with empty slots (negative
/// ids): writes `out.offsets` (rows + 1) and `out.ids`, each row ascending without duplicates.
/// `row_of` and `ids` are consumed (reordered).
template <class Backend, class IndexVector, class Set>
void sorted_rows(const execution<Backend>& ex, index_t rows, IndexVector& row_of, IndexVector& ids, Set& out) {
  auto pairs = thrust::make_zip_iterator(thrust::make_tuple(row_of.begin(), ids.begin()));
  count_host_read();  // the kept count, then the unique count
  const auto kept_end = thrust::remove_if(ex.policy(), pairs, pairs + static_cast<index_t>(ids.size()),
                                          ids.begin(), is_empty_slot{});
  const index_t kept = static_cast<index_t>(kept_end - pairs);
  // (row, id) order from two stable sorts: by id, then by row.
  thrust::stable_sort_by_key(ex.policy(), ids.begin(), ids.begin() + kept, row_of.begin());
  thrust::stable_sort_by_key(ex.policy(), row_of.begin(), row_of.begin() + kept, ids.begin());
  count_host_read();
  const index_t unique = static_cast<index_t>(thrust::unique(ex.policy(), pairs, pairs + kept) - pairs);
  out.offsets.resize(static_cast<std::size_t>(rows + 1));
  const thrust::counting_iterator<index_t> first(0);
  thrust::lower_bound(ex.policy(), row_of.begin(), row_of.begin() + unique, first, first + rows + 1,
                      out.offsets.begin());
  out.ids.resize(static_cast<std::size_t>(unique));
  thrust::copy(ex.policy(), ids.begin(), ids.begin() + unique, out.ids.begin());
}

}  // namespace xsoftmax::detail
