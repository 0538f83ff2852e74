// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Neighbours-of-neighbours passes over a KNN graph (NN-descent's local join in its "pull" form):
/// class c rescores its own list, then scores the first `sample` neighbours of each of its first
/// `fanout` neighbours and of up to `reverse` classes that have c among their first `fanout`
/// (the reverse half), and keeps its K best. A neighbour of a neighbour is likely a neighbour, so a
/// pass lifts an approximate graph's recall, and a graph built from weights that have since moved
/// is refreshed from where it stands instead of from nothing (bench/RESULTS.md, "KNN graph
/// refresh"). One pass reads the last graph and writes a new one, so every row is computed from the
/// same input: the result does not depend on the backend or its thread count. Written once on the
/// generic primitives (serial, omp, cuda: one thread per class, its heap in the output row).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/group_by_key.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>

#include <thrust/copy.h>

#include <math.h>

#include <algorithm>
#include <type_traits>
#include <utility>

namespace xsoftmax::detail {

/// Class c's refined row (see the file comment), from `old_ids` (N x k, -1 past a row's entries)
/// into row c of new_ids / new_sims, best first (ties: smaller id), -1 / -inf past the candidates
/// found. `x`: the rows whose inner products are the similarities (unit rows under cosine).
struct refine_knn_row {
  matrix_view<const float> x;
  const index_t* old_ids;
  index_t k, fanout, sample;
  const index_t* rev;  ///< N x rev_width reverse neighbours (-1 past them); null when rev_width = 0
  index_t rev_width;
  index_t* new_ids;
  float* new_sims;

  /// Whether id m is in the heap: a linear scan (K is small, and only candidates reach it).
  XSOFTMAX_HD static bool holds(const index_t* ids, index_t n, index_t m) {
    for (index_t i = 0; i < n; ++i)
      if (ids[i] == m) return true;
    return false;
  }
  XSOFTMAX_HD void offer_new(topk_heap& heap, const float* q, index_t m) const {
    if (m >= 0 && !holds(heap.hi, heap.n, m)) heap.offer(dot_row8(q, x.row(m), x.cols), m, k);
  }
  /// The first `sample` neighbours of class r as candidates.
  XSOFTMAX_HD void offer_list_of(topk_heap& heap, const float* q, index_t r) const {
    for (index_t b = 0; b < sample; ++b) offer_new(heap, q, old_ids[r * k + b]);
  }

  XSOFTMAX_HD void operator()(index_t c) const {
    const index_t* row = old_ids + c * k;
    topk_heap heap{new_sims + c * k, new_ids + c * k, 0};
    const float* q = x.row(c);
    for (index_t j = 0; j < k; ++j) offer_new(heap, q, row[j]);  // rescored: the rows may have moved
    for (index_t a = 0; a < fanout; ++a)
      if (row[a] >= 0) offer_list_of(heap, q, row[a]);
    for (index_t a = 0; a < rev_width && rev[c * rev_width + a] >= 0; ++a) {
      offer_new(heap, q, rev[c * rev_width + a]);
      offer_list_of(heap, q, rev[c * rev_width + a]);
    }
    heap.sort_best_first();
    for (index_t j = heap.n; j < k; ++j) new_ids[c * k + j] = -1, new_sims[c * k + j] = -INFINITY;
  }
};

/// keys[i] = the class of pair i = (c, j) = (i / fanout, i % fanout), c's j-th neighbour; `n` (one
/// past the classes) for an empty slot.
struct reverse_pair_keys {
  const index_t* ids;
  index_t k, fanout, n;
  index_t* keys;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t r = ids[(i / fanout) * k + i % fanout];
    keys[i] = r < 0 ? n : r;
  }
};

/// Row r of rev (width slots): the first `width` classes of r's group (ascending; -1 past them).
struct first_reverse_neighbours {
  const index_t* offsets;
  const index_t* items;  ///< pair indices grouped by class
  index_t fanout, width;
  index_t* rev;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t begin = offsets[r], count = offsets[r + 1] - begin;
    for (index_t a = 0; a < width; ++a) rev[r * width + a] = a < count ? items[begin + a] / fanout : -1;
  }
};

/// `passes` neighbours-of-neighbours passes over the graph `ids` / `sims` (N x k, the execution's
/// memory; updated) for the rows `x` (N x d fp32, the execution's memory; unit under cosine):
/// fanout, sample clipped to k; reverse: reverse neighbours a class (0: none), the classes with the
/// smallest ids when more have it among their first `fanout`.
template <class Ex>
void refine_knn_graph(const Ex& ex_in, matrix_view<const float> x, index_t* ids, float* sims, index_t k,
                      index_t fanout, index_t sample, index_t reverse, index_t passes) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using index_vector = typename execution_type::template vector<index_t>;
  const index_t n = x.rows;
  fanout = std::min(fanout, k);
  sample = std::min(sample, k);
  index_vector next_ids(static_cast<std::size_t>(n * k)), keys(static_cast<std::size_t>(reverse > 0 ? n * fanout : 0)),
      sorted, items, offsets, rev(static_cast<std::size_t>(n * reverse));
  typename execution_type::template vector<float> next_sims(static_cast<std::size_t>(n * k));
  index_t *in_ids = ids, *out_ids = raw(next_ids);
  float *in_sims = sims, *out_sims = raw(next_sims);
  for (index_t p = 0; p < passes; ++p) {
    if (reverse > 0 && fanout > 0) {  // the current graph's reverse lists, classes ascending
      parallel_for(ex, n * fanout, reverse_pair_keys{in_ids, k, fanout, n, raw(keys)});
      group_by_key(ex, raw(keys), n * fanout, n + 1, sorted, items, offsets);
      parallel_for(ex, n, first_reverse_neighbours{raw(offsets), raw(items), fanout, reverse, raw(rev)});
    }
    parallel_for(ex, n, refine_knn_row{x, in_ids, k, fanout, sample, raw(rev), reverse > 0 ? reverse : 0, out_ids,
                                       out_sims});
    std::swap(in_ids, out_ids);
    std::swap(in_sims, out_sims);
  }
  if (in_ids != ids) {  // an odd number of passes: the last graph is in the scratch buffers
    thrust::copy(ex.policy(), in_ids, in_ids + n * k, ids);
    thrust::copy(ex.policy(), in_sims, in_sims + n * k, sims);
  }
}

/// The rows whose inner products are the graph's similarities, in `ex`'s memory as fp32: `w`
/// scaled to unit rows under cosine, `w` itself under the inner product.
template <class Ex, class T>
auto similarity_rows(const Ex& ex_in, matrix_view<const T> w, bool cosine) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  typename execution_type::template vector<float> x(static_cast<std::size_t>(w.rows * w.cols)), inv;
  if (cosine) {
    inv.resize(static_cast<std::size_t>(w.rows));
    inverse_row_norms(ex, w, raw(inv));
  }
  widen_rows(ex, w, 0, w.rows, cosine ? raw(inv) : static_cast<const float*>(nullptr), raw(x));
  return x;
}

}  // namespace xsoftmax::detail
