// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The exact top-k search of a sigmoid (binary) tree, two levels per pop: `sigmoid_pair_step`.
///
/// Why: on a binary tree a best-first search pops, pushes and sifts once per node it expands, and
/// an untrained or unsure head (node probabilities near 1/2) expands nearly every node above its
/// k-th leaf, so each expanded node's children are usually expanded too. Expanding a popped node
/// and at once its internal children (the grandchildren go to the open list) nearly halves the
/// pops and the lockstep rounds. On huffman_bench's head (5 calls of 1024 rows, counted in a -g
/// build) the node scores are the one-level search's exactly (114,235 for top-1, 401,860 for
/// top-5: no child scored early goes unused there) and the pops fall from 114,235 to 63,035 and
/// from 422,340 to 227,780. A child that the one-level search would not have expanded costs one
/// node score (a very confident head, where the search runs nearly greedily, has more of those).
///
/// Exactness: the result is the one-level search's (tree_search.hpp's `topk_search_step`), entry
/// for entry and bit for bit. A child c is expanded early only when both its children's keys are
/// below c's own (`open_heap::pack`'s order: log-probability, then the smaller row; it holds
/// unless a child's log-probability rounds to its parent's and the tree numbers it before its
/// parent, or a value is NaN); then taking c out and its children in changes no other entry's
/// pop order: any entry popped while c would have been open is above c, so above c's children, and
/// c itself outputs nothing. Otherwise c goes to the open list as in the one-level search (its
/// score is then computed again when it is popped). The leaf bound prunes as there: a child below
/// the k-th best leaf pushed so far cannot reach the output. A child's value is its parent's minus
/// the softplus lane (`sigmoid_pair_terms`), the same float sums along every path as the
/// one-level search's base + log p.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/search_nodes.hpp>

#include <cstdint>

namespace xsoftmax::detail {

/// The exact (no beam) top-k searches of rows [G t, G t + G) of a tile on a sigmoid tree, in
/// lockstep, two levels per pop (see the file comment). A round: every live row pops its best
/// entries until it takes a leaf into its output or meets an internal node X; X's scores (all rows
/// together), then its children: a leaf or a pruned child is handled as in the one-level search,
/// an internal one is scored in a second pass (all rows' such children together) and its children
/// pushed in its place. Sets overflow[i] when row i's open list outgrew `capacity` (the call then
/// runs again, larger).
template <class T, class View, index_t G>
struct sigmoid_pair_step {
  View tv;                 ///< the tree
  const float* h;          ///< fp32 hidden rows, d apart
  index_t d;               ///< hidden width
  matrix_view<const T> w;  ///< one weight row per internal node (block_begin / 2)
  const T* bias;           ///< one per internal node, or null
  index_t k, capacity, row0, n;  ///< k; open-list entries per row; the tile's first row and its rows
  std::uint64_t* open_key;       ///< `capacity` keys per row of the tile
  float* leaf_lp;  ///< k per row: the k best leaf log-probabilities pushed so far, descending
  matrix_view<index_t> classes;  ///< output classes (all rows of the call)
  matrix_view<float> log_probs;  ///< output log-probabilities
  int* overflow;                 ///< per row of the tile: set when its open list outgrew `capacity`
  /// Per row of the call, or null: the first row of the block its search starts at instead of the
  /// root's (a forest's rows, each searched in its own tree; every sigmoid block has 2 rows).
  const index_t* start_begin = nullptr;
  /// Per row of the call, or null: the row's node expansions (both passes' nodes; see
  /// `search_options::expansions`).
  index_t* expansions = nullptr;

  /// One lockstep row's search state, together (one base address per row in the round's loops).
  struct row_state {
    open_heap heap;
    float* best;    ///< its `leaf_lp` row
    index_t found;  ///< output entries taken (-1: the open list would overflow; the call reruns)
    index_t leaves; ///< entries of `best` filled (<= k)
    index_t node;   ///< the node being expanded: its block's first row
    float base;     ///< its log-probability
    index_t expanded;  ///< nodes scored (both passes)
  };

  /// Second-pass entries (internal children being expanded early) per round: two per row.
  static constexpr index_t E = 2 * G;

  /// Runs task t: rows [G t, G t + G) of the tile.
  XSOFTMAX_HD void operator()(index_t t) const {
    const index_t i0 = t * G, m = n - i0 < G ? n - i0 : G;
    row_state st[G];
    const float* hrow[G];
    // The rows still searching (and not overflowed): a round's loops visit only those.
    index_t live[G], nlive = m;
    for (index_t j = 0; j < m; ++j) {
      st[j] = row_state{open_heap{open_key + (i0 + j) * capacity, 0, capacity}, leaf_lp + (i0 + j) * k, 0, 0,
                        start_begin ? start_begin[row0 + i0 + j] : 0, 0.f, 0};
      hrow[j] = h + (row0 + i0 + j) * d;
      live[j] = j;
      overflow[i0 + j] = 0;
    }
    for (bool first = true;; first = false) {
      if (!first) {  // each live row's next node (the root in the first round)
        index_t q = 0;
        for (index_t a = 0; a < nlive; ++a) {
          const index_t j = live[a];
          if (next_node(st[j], row0 + i0 + j)) live[q++] = j;
        }
        nlive = q;
      }
      if (nlive == 0) break;
      // Pass 1: the popped nodes' child terms, in `live` order.
      const float* hr1[G];
      index_t wr1[G];
      for (index_t a = 0; a < nlive; ++a) {
        hr1[a] = hrow[live[a]];
        wr1[a] = st[live[a]].node / 2;
        ++st[live[a]].expanded;
      }
      constexpr index_t L1 = G < node_lanes ? G : (G + node_lanes - 1) / node_lanes * node_lanes;
      float minus1[L1 < node_lanes ? node_lanes : L1], plus1[L1 < node_lanes ? node_lanes : L1];
      sigmoid_pair_terms<L1>(hr1, wr1, nlive, w, bias, minus1, plus1);
      // The children: leaves and pruned ones as the one-level search; internal ones queued.
      const float* hr2[E];
      index_t wr2[E], e_block[E], e_row[E], e_slot[E];
      float e_lp[E];
      index_t m2 = 0;
      for (index_t a = 0; a < nlive; ++a) {
        row_state& s = st[live[a]];
        if (s.heap.size + 4 > capacity) {  // at most two pushes per child below
          s.found = -1;  // marks the overflow (the row leaves `live` below)
          continue;
        }
        const float v[2] = {s.base - minus1[a], s.base - plus1[a]};
        for (index_t c = 0; c < 2; ++c) {
          const index_t row = s.node + c;
          if (s.leaves == k && v[c] < s.best[k - 1]) continue;
          const child_ref ch = tv.child(row);
          if (ch.is_leaf) {
            note_leaf(s, v[c]);
            s.heap.push_key(open_heap::pack(v[c], row));
          } else {
            hr2[m2] = hr1[a];
            wr2[m2] = ch.block_begin / 2;
            e_block[m2] = ch.block_begin;
            e_row[m2] = row;
            e_slot[m2] = live[a];
            e_lp[m2] = v[c];
            ++m2;
            ++s.expanded;
          }
        }
      }
      // Pass 2: the internal children's terms; their children go in (or, rarely, they do).
      constexpr index_t L2 = E < node_lanes ? E : (E + node_lanes - 1) / node_lanes * node_lanes;
      float minus2[L2 < node_lanes ? node_lanes : L2], plus2[L2 < node_lanes ? node_lanes : L2];
      sigmoid_pair_terms<L2>(hr2, wr2, m2, w, bias, minus2, plus2);
      for (index_t e = 0; e < m2; ++e) {
        row_state& s = st[e_slot[e]];
        const index_t cb = e_block[e];
        const float g0 = e_lp[e] - minus2[e], g1 = e_lp[e] - plus2[e];
        const std::uint64_t k0 = open_heap::pack(g0, cb), k1 = open_heap::pack(g1, cb + 1);
        // Keys below the child's: a smaller value is enough (the usual case: no key to build).
        if ((g0 < e_lp[e] && g1 < e_lp[e]) || below(k0, k1, open_heap::pack(e_lp[e], e_row[e]))) {
          consider(s, g0, cb, k0);
          consider(s, g1, cb + 1, k1);
        } else {
          s.heap.push_key(open_heap::pack(e_lp[e], e_row[e]));  // kept whole (see the file comment)
        }
      }
      index_t q = 0;
      for (index_t a = 0; a < nlive; ++a) {
        const index_t j = live[a];
        if (st[j].found >= 0)
          live[q++] = j;
        else
          overflow[i0 + j] = 1;
      }
      nlive = q;
    }
    for (index_t j = 0; j < m; ++j) {
      for (index_t f = st[j].found < 0 ? k : st[j].found; f < k; ++f) {  // nothing open before k leaves
        classes(row0 + i0 + j, f) = -1;
        log_probs(row0 + i0 + j, f) = -INFINITY;
      }
      if (expansions) expansions[row0 + i0 + j] = st[j].expanded;
    }
  }

  /// Whether both keys are below kc.
  XSOFTMAX_HD static bool below(std::uint64_t k0, std::uint64_t k1, std::uint64_t kc) { return k0 < kc && k1 < kc; }

  /// Records a pushed leaf's log-probability v among the row's k best (descending).
  XSOFTMAX_HD void note_leaf(row_state& s, float v) const {
    index_t i = s.leaves < k ? s.leaves++ : k - 1;
    for (; i > 0 && s.best[i - 1] < v; --i) s.best[i] = s.best[i - 1];
    s.best[i] = v;
  }

  /// Pushes a grandchild (value v, weight row `row`, key x) unless the leaf bound prunes it.
  XSOFTMAX_HD void consider(row_state& s, float v, index_t row, std::uint64_t x) const {
    if (s.leaves == k && v < s.best[k - 1]) return;
    if (tv.child(row).is_leaf) note_leaf(s, v);
    s.heap.push_key(x);
  }

  /// Pops row r's best entries into its output while they are leaves; false when the search is
  /// over (k found, or nothing open), else s.node / s.base: the internal node to expand next.
  XSOFTMAX_HD bool next_node(row_state& s, index_t r) const {
    while (s.found < k && s.heap.size > 0) {
      s.heap.pop_to_back();
      const std::uint64_t top = s.heap.key[s.heap.size];
      const child_ref c = tv.child(open_heap::row_of(top));
      if (c.is_leaf) {
        classes(r, s.found) = c.leaf_class;
        log_probs(r, s.found) = open_heap::lp_of(top);
        ++s.found;
      } else {
        s.node = c.block_begin;
        s.base = open_heap::lp_of(top);
        return true;
      }
    }
    return false;
  }
};

}  // namespace xsoftmax::detail
