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
#include <thrust/fill.h>

#include <math.h>

#include <algorithm>
#include <type_traits>
#include <utility>

namespace xsoftmax::detail {

/// An open-addressing set of class ids over `slots` entries (a power of two, all -1 when empty),
/// for the few hundred candidates of one class: `insert` says whether an id is new; `erase_all`
/// empties the set again by visiting only the ids put in it (cheaper than clearing every slot).
struct small_id_set {
  index_t* slots;
  index_t mask;  ///< slot count - 1
  XSOFTMAX_HD index_t home(index_t id) const {  // Fibonacci hashing: ids spread over the slots
    return static_cast<index_t>((static_cast<unsigned long long>(id) * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  }
  XSOFTMAX_HD bool insert(index_t id) const {
    for (index_t s = home(id);; s = (s + 1) & mask) {
      if (slots[s] == id) return false;
      if (slots[s] < 0) {
        slots[s] = id;
        return true;
      }
    }
  }
  XSOFTMAX_HD void erase_all(const index_t* ids, index_t n) const {
    for (index_t j = 0; j < n; ++j) {
      index_t s = home(ids[j]);
      while (slots[s] != ids[j]) s = (s + 1) & mask;
      slots[s] = -1;
    }
    // (the search above does not stop at a slot emptied before: it runs on to the id, which is
    // in the set, so no tombstones are needed when every id put in is erased together)
  }
};

/// Asks the host's caches for the `bytes` at p ahead of their use; nothing on a device.
XSOFTMAX_HD inline void prefetch_bytes(const void* p, index_t bytes) {
#if !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__))
  for (index_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + b);
#else
  (void)p;
  (void)bytes;
#endif
}

/// Class c's refined row (see the file comment), from `old_ids` (N x k, -1 past a row's entries)
/// into row c of new_ids / new_sims, best first (ties: smaller id), -1 / -inf past the candidates
/// found. `x`: the rows whose inner products are the similarities (unit rows under cosine). The
/// candidates are made unique first (a small hash set), so each is scored once however many paths
/// lead to it, and the rows ahead are prefetched: a pass is bound by those rows' loads (random rows
/// of the N x d matrix), not by its arithmetic (bench/RESULTS.md, "KNN graph refresh").
struct refine_knn_row {
  matrix_view<const float> x;
  const index_t* old_ids;
  index_t k, fanout, sample;
  const index_t* rev;  ///< N x rev_width reverse neighbours (-1 past them); null when rev_width = 0
  index_t rev_width;
  index_t* new_ids;
  float* new_sims;
  index_t first;    ///< the class of item 0 (a pass runs in chunks of classes)
  index_t* scratch; ///< a chunk's scratch: `scratch_per_class` ids an item, its set's slots all -1
  index_t width;    ///< `candidate_width`
  index_t slots;    ///< the set's slots: a power of two >= 2 width

  /// The most candidates a class can have: its list, `sample` of each of `fanout` lists, and each
  /// reverse neighbour with `sample` of its list.
  static index_t candidate_width(index_t k, index_t fanout, index_t sample, index_t rev_width) {
    return k + fanout * sample + rev_width * (1 + sample);
  }
  static index_t set_slots(index_t width) {
    index_t s = 1;
    while (s < 2 * width) s *= 2;
    return s;
  }

  XSOFTMAX_HD void operator()(index_t i) const {
    constexpr index_t ahead = 4;  // rows prefetched ahead of the one scored
    const index_t c = first + i;
    index_t* unique = scratch + i * (width + slots);
    const small_id_set seen{unique + width, slots - 1};
    index_t n = 0;
    auto add = [&](index_t m) {
      if (m >= 0 && seen.insert(m)) unique[n++] = m;
    };
    auto add_list_of = [&](index_t r) {
      for (index_t b = 0; b < sample; ++b) add(old_ids[r * k + b]);
    };
    const index_t* row = old_ids + c * k;
    const index_t list_bytes = sample * static_cast<index_t>(sizeof(index_t));
    for (index_t a = 0; a < fanout; ++a)  // the lists read below: random rows, loaded in parallel
      if (row[a] >= 0) prefetch_bytes(old_ids + row[a] * k, list_bytes);
    for (index_t a = 0; a < rev_width && rev[c * rev_width + a] >= 0; ++a)
      prefetch_bytes(old_ids + rev[c * rev_width + a] * k, list_bytes);
    for (index_t j = 0; j < k; ++j) add(row[j]);  // rescored: the rows may have moved
    for (index_t a = 0; a < fanout; ++a)
      if (row[a] >= 0) add_list_of(row[a]);
    for (index_t a = 0; a < rev_width && rev[c * rev_width + a] >= 0; ++a) {
      add(rev[c * rev_width + a]);
      add_list_of(rev[c * rev_width + a]);
    }
    topk_heap heap{new_sims + c * k, new_ids + c * k, 0};
    const float* q = x.row(c);
    const index_t row_bytes = x.cols * static_cast<index_t>(sizeof(float));
    for (index_t j = 0; j < n && j < ahead; ++j) prefetch_bytes(x.row(unique[j]), row_bytes);
    for (index_t j = 0; j < n; ++j) {
      if (j + ahead < n) prefetch_bytes(x.row(unique[j + ahead]), row_bytes);
      heap.offer(dot_row8(q, x.row(unique[j]), x.cols), unique[j], k);
    }
    seen.erase_all(unique, n);
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
  const index_t width = refine_knn_row::candidate_width(k, fanout, sample, reverse);
  const index_t slots = refine_knn_row::set_slots(width), per_class = width + slots;
  const index_t chunk = std::min(n, std::max<index_t>(1, (index_t(4) << 20) / per_class));  // 32 MB of scratch
  index_vector next_ids(static_cast<std::size_t>(n * k)), keys(static_cast<std::size_t>(reverse > 0 ? n * fanout : 0)),
      sorted, items, offsets, rev(static_cast<std::size_t>(n * reverse)), scratch(static_cast<std::size_t>(chunk * per_class));
  thrust::fill(ex.policy(), scratch.begin(), scratch.end(), index_t(-1));  // every set empty
  typename execution_type::template vector<float> next_sims(static_cast<std::size_t>(n * k));
  index_t *in_ids = ids, *out_ids = raw(next_ids);
  float *in_sims = sims, *out_sims = raw(next_sims);
  for (index_t p = 0; p < passes; ++p) {
    if (reverse > 0 && fanout > 0) {  // the current graph's reverse lists, classes ascending
      parallel_for(ex, n * fanout, reverse_pair_keys{in_ids, k, fanout, n, raw(keys)});
      group_by_key(ex, raw(keys), n * fanout, n + 1, sorted, items, offsets);
      parallel_for(ex, n, first_reverse_neighbours{raw(offsets), raw(items), fanout, reverse, raw(rev)});
    }
    for (index_t first = 0; first < n; first += chunk)
      parallel_for(ex, std::min(chunk, n - first),
                   refine_knn_row{x, in_ids, k, fanout, sample, raw(rev), reverse, out_ids, out_sims, first,
                                  raw(scratch), width, slots});
    std::swap(in_ids, out_ids);
    std::swap(in_sims, out_sims);
  }
  if (in_ids != ids) {  // an odd number of passes: the last graph is in the scratch buffers
    thrust::copy(ex.policy(), in_ids, in_ids + n * k, ids);
    thrust::copy(ex.policy(), in_sims, in_sims + n * k, sims);
  }
}

/// How far row c turned between `then` and `now` (N x d each): 1 - cos under cosine (the rows are
/// unit), the squared distance under the inner product; `order[c]` = c, for the sort by turn.
struct row_turn {
  const float* now;
  const float* then;
  index_t d;
  bool cosine;
  float* turn;
  index_t* order;
  XSOFTMAX_HD void operator()(index_t c) const {
    double t = 0;
    for (index_t p = 0; p < d; ++p) {
      const double a = now[c * d + p], b = then[c * d + p];
      t += cosine ? a * b : (a - b) * (a - b);
    }
    turn[c] = static_cast<float>(cosine ? 1 - t : t);
    order[c] = c;
  }
};

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
