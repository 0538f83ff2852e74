// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `group_by_key`: the items 0..n-1 grouped by a key in [0, num_keys): a stable sort of the item
/// indices by key (so each group lists its items ascending) and the start of every group (a
/// counting sort's offsets, found by binary search in the sorted keys). Thrust algorithms on the
/// execution's policy, so the result is the same on every backend and thread count. Used for the
/// IVF lists (items: vectors, keys: their list). (k-means does not use it: a Thrust OpenMP stable
/// sort is five parallel regions, too many per Lloyd iteration; see detail/selection/kmeans.hpp.)

#include <xsoftmax/detail/execution.hpp>

#include <thrust/binary_search.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sort.h>

namespace xsoftmax::detail {

/// sorted_keys[i] = keys[i], items[i] = i: the input of the stable sort, in one pass.
struct keys_and_indices {
  const index_t* keys;
  index_t* sorted_keys;
  index_t* items;
  XSOFTMAX_HD void operator()(index_t i) const {
    sorted_keys[i] = keys[i];
    items[i] = i;
  }
};

/// Groups the items by `keys` (n values in [0, num_keys), in the execution's memory; not changed).
/// `sorted_keys` (n) receives the keys ascending, `items` (n) the item indices in that order (ties
/// ascending), `offsets` (num_keys + 1) the start of each key's group and n last: key j's items are
/// items[offsets[j] .. offsets[j + 1]). All three are vectors of the execution's backend, resized.
template <class Ex, class IndexVector>
void group_by_key(const Ex& ex, const index_t* keys, index_t n, index_t num_keys, IndexVector& sorted_keys,
                  IndexVector& items, IndexVector& offsets) {
  const auto policy = policy_of(ex);
  sorted_keys.resize(static_cast<std::size_t>(n));
  items.resize(static_cast<std::size_t>(n));
  offsets.resize(static_cast<std::size_t>(num_keys + 1));
  parallel_for(ex, n, keys_and_indices{keys, thrust::raw_pointer_cast(sorted_keys.data()),
                                       thrust::raw_pointer_cast(items.data())});
  thrust::stable_sort_by_key(policy, sorted_keys.begin(), sorted_keys.end(), items.begin());
  thrust::lower_bound(policy, sorted_keys.begin(), sorted_keys.end(), thrust::counting_iterator<index_t>(0),
                      thrust::counting_iterator<index_t>(num_keys + 1), offsets.begin());
}

}  // namespace xsoftmax::detail
