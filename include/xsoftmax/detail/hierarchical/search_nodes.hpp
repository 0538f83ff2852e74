// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The top-k search's building blocks (tree_search.hpp, sigmoid_pair_search.hpp): a node's child
/// log-probabilities (one row, or a group of lockstep rows scored together) and the open list, a
/// binary max-heap of packed (log-probability, weight row) keys.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/node_runs.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/detail/primitives/dot_rows.hpp>
#include <xsoftmax/detail/primitives/exp_rows.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>

#include <cstdint>

namespace xsoftmax::detail {
/// A node row's score from its dot product h . w_row: + bias_row when there is a bias (a sigmoid
/// node's score; a softmax node's child's).
template <class T>
XSOFTMAX_HD float score_of_dot(float dot, const T* bias, index_t row) {
  return bias ? dot + to_float(bias[row]) : dot;
}

/// A weight row's score: h . w_row (+ bias_row), the fp32 row `h`, in `dot_row8`'s order -- a
/// sigmoid node's score, or a softmax node's child's.
template <class T>
XSOFTMAX_HD float weight_row_score(const float* h, matrix_view<const T> w, const T* bias, index_t row) {
  return score_of_dot(dot_row8(h, w.row(row), w.cols), bias, row);
}

/// out[j] = `weight_row_score` of row first + j, for j < count: the block's rows in order, each
/// read once as a stream. (Four children a pass, `dot_rows8<4>`, was slower from memory: 33.8
/// against 18.2 us a 317-child expansion at d = 256, and within 10 % of it in cache;
/// bench/tools/search_expansion_kernels.cpp.)
template <class T>
XSOFTMAX_HD void softmax_child_scores(const float* h, matrix_view<const T> w, const T* bias, index_t first,
                                      index_t count, float* out) {
  for (index_t j = 0; j < count; ++j) out[j] = weight_row_score(h, w, bias, first + j);
}

/// The log-sum-exp of a node's n child scores: the max, then `sum_exp_shifted` (fast_exp in 8
/// lanes; AVX2 / AVX-512 on hosts that have them, the same bits); its value on every backend.
XSOFTMAX_HD inline float children_logsumexp(const float* s, index_t n) {
  float m = -INFINITY;
  for (index_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  return finish_logsumexp(m, sum_exp_shifted(s, n, m));
}

/// A node's n child scores into their log-probabilities: each less their `children_logsumexp`.
XSOFTMAX_HD inline void scores_to_child_log_probs(float* s, index_t n) {
  const float lse = children_logsumexp(s, n);
  for (index_t j = 0; j < n; ++j) s[j] -= lse;
}

/// log p(child j | node) for the node whose block is [block_begin, block_begin + block_size), of
/// the fp32 row `h`, into out[0, block_size) (two entries for sigmoid nodes).
template <bool Sigmoid, class T>
XSOFTMAX_HD void child_log_probs(const float* h, matrix_view<const T> w, const T* bias, index_t block_begin,
                                 index_t block_size, float* out) {
  if constexpr (Sigmoid) {
    // softplus(-s) and softplus(s) share log1p(exp(-|s|)) (see `softplus_pair`): one exp and one
    // log1p per node instead of two each, bitwise the same values.
    softplus_pair(weight_row_score(h, w, bias, block_begin / 2), out[0], out[1]);
    out[0] = -out[0];
    out[1] = -out[1];
  } else {
    softmax_child_scores(h, w, bias, block_begin, block_size, out);
    scores_to_child_log_probs(out, block_size);
  }
}

/// `child_log_probs<true>`'s values for m <= G rows at once, bitwise: the a-th is hidden row
/// h + slot[a] d at the node of block block_begin[slot[a]], into out[slot[a] stride, + 2).
/// In two loops: the m scores, then their softplus pairs, 8 lanes at a time when G allows
/// (`softplus_pair8`, lane for lane `softplus_pair`): independent chains side by side in the core
/// instead of one dot-exp-log1p chain at a time.
template <class T, index_t G>
XSOFTMAX_HD void sigmoid_child_log_probs_group(const float* h, index_t d, matrix_view<const T> w, const T* bias,
                                               const index_t* slot, const index_t* block_begin, index_t m, float* out,
                                               index_t stride) {
  static_assert(G < node_lanes || G % node_lanes == 0);
  constexpr index_t L = G < node_lanes ? node_lanes : G;
  float sc[L] = {}, minus[L], plus[L];
  index_t a = 0;
  for (; a + 4 <= m; a += 4) {  // four dots per pass (`dot_rows8`: each bitwise dot_row8's)
    const float* hr[4];
    const T* wr[4];
    for (int r = 0; r < 4; ++r) {
      hr[r] = h + slot[a + r] * d;
      wr[r] = w.row(block_begin[slot[a + r]] / 2);
    }
    dot_rows8<4>(hr, wr, w.cols, sc + a);
    for (int r = 0; r < 4; ++r) sc[a + r] = score_of_dot(sc[a + r], bias, block_begin[slot[a + r]] / 2);
  }
  for (; a < m; ++a) sc[a] = weight_row_score(h + slot[a] * d, w, bias, block_begin[slot[a]] / 2);
  if constexpr (G % node_lanes == 0)
    for (a = 0; a < m; a += node_lanes) softplus_pair8(sc + a, minus + a, plus + a);
  else
    for (a = 0; a < m; ++a) softplus_pair(sc[a], minus[a], plus[a]);
  for (a = 0; a < m; ++a) {
    out[slot[a] * stride] = -minus[a];
    out[slot[a] * stride + 1] = -plus[a];
  }
}

/// For m <= L entries a: the sigmoid node score s_a of the fp32 row hr[a] at weight row wrow[a]
/// (`weight_row_score`'s value), then minus[a] = softplus(-s_a) and plus[a] = softplus(s_a):
/// the node's children's log-probabilities negated, bitwise `child_log_probs<true>`'s (x + (-y)
/// and x - y are the same IEEE operation, so a caller may subtract them from a parent's value).
/// Rows are scored four at a time (`dot_rows8`), the softplus pairs 8 lanes at a time when L
/// allows (`softplus_pair8`, lane for lane `softplus_pair`). For callers whose entries are not one
/// per lockstep row (the paired search's grandchildren), and which read the lanes in place.
/// (hr and wrow are read only; they are not pointers to const because the callers' arrays are
/// filled only up to m, and GCC's -Wmaybe-uninitialized takes a pointer-to-const argument as a
/// read of the whole array; initialising them instead costs 2 % of a search's instructions.)
template <index_t L, class T>
XSOFTMAX_HD void sigmoid_pair_terms(const float** hr, index_t* wrow, index_t m, matrix_view<const T> w, const T* bias,
                                    float* minus, float* plus) {
  static_assert(L < node_lanes || L % node_lanes == 0);
  constexpr index_t lanes = L < node_lanes ? node_lanes : L;
  float sc[lanes] = {};
  index_t a = 0;
  for (; a + 4 <= m; a += 4) {
    const T* wr[4] = {w.row(wrow[a]), w.row(wrow[a + 1]), w.row(wrow[a + 2]), w.row(wrow[a + 3])};
    dot_rows8<4>(hr + a, wr, w.cols, sc + a);
    for (int r = 0; r < 4; ++r) sc[a + r] = score_of_dot(sc[a + r], bias, wrow[a + r]);
  }
  for (; a < m; ++a) sc[a] = weight_row_score(hr[a], w, bias, wrow[a]);
  if constexpr (L % node_lanes == 0)
    for (a = 0; a < m; a += node_lanes) softplus_pair8(sc + a, minus + a, plus + a);
  else
    for (a = 0; a < m; ++a) softplus_pair(sc[a], minus[a], plus[a]);
}

/// A row's open list: a binary max-heap of (log-probability, weight row) packed into one 64-bit key
/// each: the high half is the log-probability's bits mapped so that unsigned order is float order
/// (-0 taken as +0), the low half 2^32 - 1 - row. Key order is then exactly "larger
/// log-probability, then smaller row" (a total order, so the result does not depend on the heap's
/// layout), compared in one integer comparison; rows must be < 2^32 (checked by the head).
struct open_heap {
  std::uint64_t* key;
  index_t size, capacity;

  XSOFTMAX_HD static std::uint64_t pack(float lp, index_t row) {
    const std::uint32_t b = static_cast<std::uint32_t>(bits_of_float(lp + 0.f));  // + 0.f: -0 -> +0
    // Negative: all bits flipped; else the sign bit set. Without a branch: the xor mask is all
    // ones or the sign bit alone, from b's sign (an arithmetic shift).
    const std::uint32_t ordered = b ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(b) >> 31) | 0x80000000u);
    return (static_cast<std::uint64_t>(ordered) << 32) | (0xFFFFFFFFu - static_cast<std::uint32_t>(row));
  }
  XSOFTMAX_HD static float lp_of(std::uint64_t k) {
    const std::uint32_t ordered = static_cast<std::uint32_t>(k >> 32);
    // pack's map backwards: sign bit set (from a non-negative value): clear it; else flip all.
    return float_from_bits(static_cast<std::int32_t>(
        ordered ^ (~static_cast<std::uint32_t>(static_cast<std::int32_t>(ordered) >> 31) | 0x80000000u)));
  }
  XSOFTMAX_HD static index_t row_of(std::uint64_t k) {
    return static_cast<index_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(k));
  }
  /// Adds an entry; false (nothing added) when full.
  XSOFTMAX_HD bool push(float l, index_t r) {
    if (size == capacity) return false;
    push_key(pack(l, r));
    return true;
  }
  /// Adds the key x (`pack`'s); the caller has checked that there is room.
  XSOFTMAX_HD void push_key(std::uint64_t x) { rise_from(size++, x); }
  /// Puts x into the hole at i after moving the hole up past every parent smaller than x: the
  /// sift-up of both push_key and pop_to_back.
  XSOFTMAX_HD void rise_from(index_t i, std::uint64_t x) {
    while (i > 0) {
      const index_t p = (i - 1) / 2;
      if (key[p] >= x) break;
      key[i] = key[p];
      i = p;
    }
    key[i] = x;
  }
  /// Moves the best entry to position size - 1 and shrinks the heap by one (as std::pop_heap).
  /// Bottom-up: the hole left at the top walks down to a leaf along the larger children, picked
  /// without a branch (key[size], about to take the popped entry, is 0 meanwhile: below every key,
  /// so a last child without a sibling needs no test), then the last entry rises from there. The
  /// last entry is usually among the smallest, so it rises little; the child choices were a coin
  /// toss for the branch predictor.
  XSOFTMAX_HD void pop_to_back() {
    const std::uint64_t top = key[0], x = key[size - 1];
    --size;
    key[size] = 0;
    index_t i = 0;
    for (index_t c = 1; c < size; c = 2 * i + 1) {
      c += key[c + 1] > key[c] ? 1 : 0;
      key[i] = key[c];
      i = c;
    }
    rise_from(i, x);
    key[size] = top;
  }
  /// Appends the key x without restoring the heap order (`keep_best` restores it); the caller has
  /// checked that there is room.
  XSOFTMAX_HD void append_key(std::uint64_t x) { key[size++] = x; }
  /// The least key of a heap (size > 0): the least of its leaves, key[size / 2, size), which is
  /// all this scans (so it needs heap order: `keep_best` leaves it).
  [[nodiscard]] XSOFTMAX_HD std::uint64_t least() const {
    std::uint64_t m = key[size - 1];
    for (index_t i = size / 2; i + 1 < size; ++i) m = key[i] < m ? key[i] : m;
    return m;
  }
  /// Keeps the `keep` best of the entries key[0, size), which need not be in heap order (a heap
  /// whose last entries were appended), and leaves them a heap. Keys are distinct (each holds its
  /// row), so which entries stay is defined whatever the layout: a selection (quickselect, the
  /// middle of three as pivot) moves the `keep` largest to the front, then they are heapified.
  /// O(size) where sorting them all (a beam search's former way, one heap sort per expansion) was
  /// O(size log size) and most of a beam search's time.
  XSOFTMAX_HD void keep_best(index_t keep) {
    if (keep < size) {
      index_t lo = 0, hi = size - 1;  // the keep-th largest goes to position keep - 1
      while (lo < hi) {
        const index_t mid = lo + (hi - lo) / 2;
        // Middle of three (key[lo], key[mid], key[hi]) as pivot, moved to hi.
        if (key[mid] > key[lo]) swap_keys(mid, lo);
        if (key[hi] > key[lo]) swap_keys(hi, lo);
        if (key[mid] > key[hi]) swap_keys(mid, hi);
        const std::uint64_t pivot = key[hi];
        index_t store = lo;  // [lo, store): larger than the pivot
        for (index_t i = lo; i < hi; ++i)
          if (key[i] > pivot) swap_keys(i, store++);
        swap_keys(store, hi);
        if (store == keep - 1) break;
        if (store < keep - 1) lo = store + 1;
        else hi = store - 1;
      }
      size = keep;
    }
    for (index_t i = size / 2; i-- > 0;) sift_down(i);
  }

 private:
  XSOFTMAX_HD void swap_keys(index_t a, index_t b) {
    const std::uint64_t t = key[a];
    key[a] = key[b];
    key[b] = t;
  }
  /// Moves key[i] down below every larger child (heap construction).
  XSOFTMAX_HD void sift_down(index_t i) {
    const std::uint64_t x = key[i];
    for (index_t c = 2 * i + 1; c < size; c = 2 * i + 1) {
      if (c + 1 < size && key[c + 1] > key[c]) ++c;
      if (key[c] <= x) break;
      key[i] = key[c];
      i = c;
    }
    key[i] = x;
  }
};

}  // namespace xsoftmax::detail
