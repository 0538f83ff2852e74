// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Evaluation of a hierarchical softmax, on every backend: the top-k classes of each row by
/// best-first search over the tree (or a beam search), and the log-probabilities of a class range
/// (the latter in range_log_probs.hpp).
///
/// top-k: one search per row, its open nodes in a binary max-heap of fixed capacity in the
/// execution's memory (log-probability, then the smaller row first, packed into one integer key:
/// a total order, so the result does not depend on the heap's layout). An exact search that outgrows its capacity stops and
/// flags the row; the call then runs again with four times the capacity. A beam search keeps at
/// most `beam_width` open nodes and never outgrows beam + widest block. An exact search on a
/// sigmoid (binary) tree expands two levels per pop (sigmoid_pair_search.hpp), with the same
/// result; the node scores and the open list are in search_nodes.hpp.
///
/// log_distribution: the range's paths are planned once on the host (the unique nodes they pass
/// through, and per class the offsets of its path's children); then per row every such node's child
/// log-probabilities are computed once, and each class sums its path. Rows are processed in tiles
/// whose node log-probabilities fit a fixed budget.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/exact_push.hpp>
#include <xsoftmax/detail/hierarchical/search_nodes.hpp>
#include <xsoftmax/detail/hierarchical/sigmoid_pair_search.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <thrust/extrema.h>
#include <thrust/fill.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// How many rows one search task runs in lockstep: on a host backend 16, so that their node scores
/// (a dot product and an exp/log1p chain, each latency-bound: two 8-lane chains) overlap in the
/// core; on a device backend 1 (a thread per row is the parallelism there).
template <class B>
inline constexpr index_t search_rows_per_task = is_host_backend<B> ? 2 * node_lanes : 1;

/// The best-first (or beam) searches of rows [G t, G t + G) of a tile, in lockstep: each round
/// every unfinished row pops its best open entries until it takes a leaf into its output or meets
/// an internal node, then the round's nodes are scored together (sigmoid nodes: four dots per
/// pass), then their children pushed. Each row's search is exactly the one-row search (the same pops, expansions and pushes
/// in the same order). Sets overflow[i] when an exact search outgrew row i's open list (its
/// outputs are then rewritten by the retry).
template <bool Sigmoid, class T, class View, index_t G>
struct topk_search_step {
  View tv;
  const float* h;
  index_t d;
  matrix_view<const T> w;
  const T* bias;
  index_t k, beam, capacity, max_block, row0, n;  ///< n: the tile's rows
  std::uint64_t* open_key;
  float* child_lp;  ///< max_block per row
  float* leaf_lp;   ///< k per row: an exact search's k best leaf log-probabilities pushed so far
  matrix_view<index_t> classes;
  matrix_view<float> log_probs;
  int* overflow;
  /// Per row, or null: the block (first row, size) the search starts at instead of the root's
  /// (a forest's rows, each searched in its own tree).
  const index_t* start_begin = nullptr;
  const index_t* start_size = nullptr;
  /// Per row of the call, or null: the row's node expansions (`search_options::expansions`).
  index_t* expansions = nullptr;

  XSOFTMAX_HD void operator()(index_t t) const {
    const index_t i0 = t * G, m = n - i0 < G ? n - i0 : G;
    open_heap heap[G];
    index_t found[G], node[G], size[G], leaves[G], expanded[G];
    float base[G];
    // The rows still searching (and not overflowed), as a list: a round's loops visit only those
    // (the searches' lengths vary a lot, so most rounds have finished rows).
    index_t live[G], nlive = m;
    for (index_t j = 0; j < m; ++j) {
      heap[j] = open_heap{open_key + (i0 + j) * capacity, 0, capacity};
      found[j] = 0;
      leaves[j] = 0;
      expanded[j] = 0;
      node[j] = start_begin ? start_begin[row0 + i0 + j] : 0;
      size[j] = start_begin ? start_size[row0 + i0 + j] : tv.root_block_size();
      base[j] = 0.f;
      live[j] = j;
      overflow[i0 + j] = 0;
    }
    for (bool first = true;; first = false) {
      // Each live row's next node to expand (the root in the first round).
      if (!first) {
        index_t q = 0;
        for (index_t a = 0; a < nlive; ++a) {
          const index_t j = live[a];
          if (next_node(heap[j], row0 + i0 + j, found[j], node[j], size[j], base[j])) live[q++] = j;
        }
        nlive = q;
      }
      if (nlive == 0) break;
      for (index_t a = 0; a < nlive; ++a) ++expanded[live[a]];
      if constexpr (Sigmoid) {
        sigmoid_child_log_probs_group<T, G>(h + (row0 + i0) * d, d, w, bias, live, node, nlive,
                                            child_lp + i0 * max_block, max_block);
      } else {
        for (index_t a = 0; a < nlive; ++a) {
          const index_t j = live[a];
          child_log_probs<Sigmoid>(h + (row0 + i0 + j) * d, w, bias, node[j], size[j], child_lp + (i0 + j) * max_block);
        }
      }
      index_t q = 0;
      for (index_t a = 0; a < nlive; ++a) {
        const index_t j = live[a];
        if (push_children(heap[j], child_lp + (i0 + j) * max_block, node[j], size[j], base[j], leaf_lp + (i0 + j) * k,
                          leaves[j]))
          live[q++] = j;
        else
          overflow[i0 + j] = 1;
      }
      nlive = q;
    }
    for (index_t j = 0; j < m; ++j) finish_row(row0 + i0 + j, found[j], expanded[j]);
  }

  /// A finished search of row r (of the call), `found` classes out after `expanded` expansions: the
  /// slots past them at class -1 / -inf (only a narrow beam, or an overflow that is retried, leaves
  /// slots), and its expansions counted.
  XSOFTMAX_HD void finish_row(index_t r, index_t found, index_t expanded) const {
    for (index_t f = found; f < k; ++f) {
      classes(r, f) = -1;
      log_probs(r, f) = -INFINITY;
    }
    if (expansions) expansions[r] = expanded;
  }

  /// Pops row r's best entries into its output while they are leaves; false when the search is
  /// over (k found, or nothing open), else the internal node to expand next.
  XSOFTMAX_HD bool next_node(open_heap& heap, index_t r, index_t& found, index_t& block_begin, index_t& block_size,
                             float& lp) const {
    while (found < k && heap.size > 0) {
      heap.pop_to_back();
      const float best_lp = open_heap::lp_of(heap.key[heap.size]);
      const child_ref c = tv.child(open_heap::row_of(heap.key[heap.size]));
      if (c.is_leaf) {
        classes(r, found) = c.leaf_class;
        log_probs(r, found) = best_lp;
        ++found;
      } else {
        block_begin = c.block_begin;
        block_size = c.block_size;
        lp = best_lp;
        return true;
      }
    }
    return false;
  }

  /// Pushes the expanded node's children. An exact search skips a child whose log-probability is
  /// below the k-th best leaf pushed so far (`best`: the `leaves` <= k best, descending): those k
  /// leaves come out of the heap before it, so it would never be popped (log-probabilities only
  /// fall along a path, so nothing below it could either). Ties are pushed: the result is the
  /// unpruned search's, entry for entry, with a smaller heap.
  XSOFTMAX_HD bool push_children(open_heap& heap, const float* lp, index_t block_begin, index_t block_size,
                                 float base, float* best, index_t& leaves) const {
    const index_t children = Sigmoid ? 2 : block_size;  // known: the compiler unrolls a sigmoid node's pair
    if (beam > 0) {  // appended in any order, then the beam's best kept as a heap
      if (heap.size + children > heap.capacity) return false;
      // Whenever 2 beam + 32 entries are held, only the beam's best are kept and the least of them
      // is a floor: a later child below it cannot be among the beam's best. The same entries stay
      // (keys are distinct) with a few appends and small selections per expansion instead of one
      // over every child (beam 1 over 317 children: 317 appends and a selection among 317).
      const index_t compact_at = 2 * beam + 32;
      bool floored = false;
      std::uint64_t floor = 0;
      for (index_t j = 0; j < children; ++j) {
        const std::uint64_t key = open_heap::pack(base + lp[j], block_begin + j);
        if (floored && key < floor) continue;
        heap.append_key(key);
        if (heap.size >= compact_at) {
          heap.keep_best(beam);
          floor = heap.least();
          floored = true;
        }
      }
      heap.keep_best(beam);
      return true;
    }
    for (index_t j = 0; j < children; ++j) {
      const float v = base + lp[j];
      if (leaves == k && v < best[k - 1]) continue;
      if (tv.child(block_begin + j).is_leaf) keep_best_leaf(best, leaves, k, v);
      if (!heap.push(v, block_begin + j)) return false;
    }
    return true;
  }
};

/// A backend's tuned runner of the softmax-node searches of one tile (`topk_search_step` with G = 1,
/// rows [0, step.n)): `available` when there is one; then `run(ex, step)` must give the step's
/// classes and log-probabilities bit for bit, for every row it does not flag as overflowed (a
/// runner that needs no open list flags none; expansions may differ, at least the step's). The
/// cuda backend's (detail/cuda/hs_search_tuned.cuh) gives each row a block whose threads score the
/// expanded node's children side by side: a thread alone per row scored every child of a
/// 1024-child node in turn, and a top-10 over 65536 classes took over 10 s on an H100
/// (bench/RESULTS.md, "second GPU session"). The host backends' (search_levels.hpp) runs an exact
/// search level by level, each level's nodes for all the rows that reach them at once, and a beam
/// search in lockstep rounds whose expansions go node by node (search_rounds.hpp), so that rows at
/// the same node read its weights once.
template <class B>
struct tree_search_tuning {
  static constexpr bool available = false;
};

/// The widest block of the tree (children of one node), from its host view.
template <class View>
index_t widest_block(const View& tv) {
  index_t widest = tv.root_block_size();
  for (index_t r = 0; r < tv.num_rows(); ++r) {
    const child_ref c = tv.child(r);
    if (!c.is_leaf) widest = std::max(widest, c.block_size);
  }
  return widest;
}


/// Memory for one call's open lists and node log-probabilities; rows are processed in tiles.
inline constexpr std::size_t tree_search_budget_bytes = std::size_t(256) << 20;

/// Top-k classes and their log-probabilities of every row of `h` (fp32, the execution's memory).
/// `start_begin` / `start_size`: null (every search starts at the root), or per row the block its
/// search starts at (a forest's root blocks; `max_block` must cover them). `expansions`: null, or
/// per row (the execution's memory) its count of node expansions.
template <bool Sigmoid, class B, class T, class View>
void tree_topk(const execution<B>& ex, const View& tv, matrix_view<const float> h, matrix_view<const T> w,
               const T* bias, index_t max_block, index_t k, index_t beam, matrix_view<index_t> classes,
               matrix_view<float> log_probs, const index_t* start_begin = nullptr,
               const index_t* start_size = nullptr, index_t* expansions = nullptr) {
  const index_t rows = h.rows;
  if (rows == 0 || k == 0) return;
  // An exact search grows by (block - 1) per expansion and may expand many nodes before its k-th
  // leaf (a binary tree: hundreds for top-5); an overflow reruns the call, so start roomy: only
  // the entries a search uses are touched.
  index_t capacity = beam > 0 ? beam + max_block : 1024 + 4 * (k + 1) * max_block;
  for (;;) {
    const std::size_t per_row = static_cast<std::size_t>(capacity) * sizeof(std::uint64_t) +
                                static_cast<std::size_t>(max_block + k) * sizeof(float) + sizeof(int);
    const index_t tile =
        std::clamp<index_t>(static_cast<index_t>(tree_search_budget_bytes / per_row), 1, rows);
    scratch_buffer<B, std::uint64_t> open_key(static_cast<std::size_t>(tile * capacity), ex);
    scratch_buffer<B, float> child_lp(static_cast<std::size_t>(tile * max_block), ex),
        leaf_lp(static_cast<std::size_t>(tile * k), ex);
    scratch_buffer<B, int> overflow(static_cast<std::size_t>(tile), ex, 0);  // 0: the rounds flag a row, never clear it
    bool outgrown = false;
    for (index_t row0 = 0; row0 < rows && !outgrown; row0 += tile) {
      const index_t n = std::min(tile, rows - row0);
      constexpr index_t G = search_rows_per_task<B>;
      if (Sigmoid && beam == 0) {  // exact on a binary tree: two levels per pop (sigmoid_pair_search.hpp)
        parallel_for(ex, (n + G - 1) / G,
                     sigmoid_pair_step<T, View, G>{tv, h.data, h.cols, w, bias, k, capacity, row0, n, open_key.data(),
                                                   leaf_lp.data(), classes, log_probs, raw(overflow), start_begin,
                                                   expansions});
      } else {
        // The one-row search of this tile, `Rows` rows a task.
        const auto step_of = [&](auto rows) {
          return topk_search_step<Sigmoid, T, View, decltype(rows)::value>{
              tv,        h.data,    h.cols,         w,           bias,       k,         beam,
              capacity,  max_block, row0,           n,           open_key.data(), child_lp.data(), leaf_lp.data(),
              classes,   log_probs, raw(overflow),  start_begin, start_size, expansions};
        };
        if constexpr (!Sigmoid && tree_search_tuning<B>::available)  // a row a step, the backend's runner
          tree_search_tuning<B>::run(ex, step_of(std::integral_constant<index_t, 1>{}));
        else
          parallel_for(ex, (n + G - 1) / G, step_of(std::integral_constant<index_t, G>{}));
      }
      count_host_read();  // whether any row's open list overflowed
      outgrown = *thrust::max_element(ex.policy(), overflow.begin(), overflow.begin() + n) != 0;
    }
    if (!outgrown) return;
    capacity *= 4;
  }
}

}  // namespace xsoftmax::detail
