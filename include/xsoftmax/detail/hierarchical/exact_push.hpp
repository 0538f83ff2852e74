// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// An exact top-k search's push decision for each child of an expansion, made for many children at
/// once (the cuda search runner: a thread per child) instead of in order: the same children as
/// `topk_search_step::push_children`, and the same k best leaf log-probabilities after them.
///
/// push_children goes through the children j = 0, 1, ... of the expanded node with v_j = base +
/// lp[j] and pushes child j unless the row already holds k leaf values (`best`, descending) and
/// v_j < best[k - 1]; a pushed leaf enters `best`. So child j is pushed exactly when fewer than k
/// values of S_j = {best before the expansion} + {v_i of the leaf children i < j} are above v_j:
/// with fewer than k values in S_j that holds trivially; else best[k - 1] is S_j's k-th largest
/// (a leaf it skipped was below k of S_i's values already, so it is below k of S_j's and changes
/// neither the count nor the k-th largest), and v_j < best[k - 1] exactly when k values of S_j
/// are above v_j. A runner may take the children in chunks: S_j's first part is then `best` after
/// the chunks before (their pushed leaves entered in order by `keep_best_leaf`), the second the
/// leaf children of the chunk before j.

#include <xsoftmax/types.hpp>

namespace xsoftmax::detail {

/// Whether child j (of the node whose children are weight rows block_begin + i, log-probabilities
/// lp[i] given the node, reached with `base`) is pushed, given `best` (the row's `leaves` <= k
/// best leaf values so far, descending) after the children before `chunk_begin`.
template <class View>
XSOFTMAX_HD bool exact_child_pushed(const View& tv, const float* lp, float base, index_t block_begin,
                                    index_t chunk_begin, index_t j, const float* best, index_t leaves, index_t k) {
  const float v = base + lp[j];
  index_t above = 0;
  while (above < leaves && best[above] > v) ++above;  // descending: the values above v come first
  for (index_t i = chunk_begin; i < j && above < k; ++i)
    if (base + lp[i] > v && tv.child(block_begin + i).is_leaf) ++above;
  return above < k;
}

/// A pushed leaf's value v into the row's k best (`best`, descending, `leaves` of them): the
/// insertion `topk_search_step::push_children` makes (and the cuda runner, for each chunk's pushed
/// leaves in order).
XSOFTMAX_HD inline void keep_best_leaf(float* best, index_t& leaves, index_t k, float v) {
  index_t i = leaves < k ? leaves++ : k - 1;
  for (; i > 0 && best[i - 1] < v; --i) best[i] = best[i - 1];
  best[i] = v;
}

}  // namespace xsoftmax::detail
