// SPDX-License-Identifier: Apache-2.0
#pragma once
// The plain one-row best-first search the exact top-k tests compare against (a std::priority_queue,
// no pruning, no lockstep): pop the best open entry; a leaf goes to the output, an internal node's
// children are pushed with the parent's log-probability added. Ties: the smaller row first, the
// rule the library's search keeps. And `bits`, for bit-for-bit comparisons of floats.

#include <xsoftmax/detail/hierarchical/search_nodes.hpp>
#include <xsoftmax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <queue>
#include <vector>

namespace xsoftmax_test {

/// The IEEE bits of `f` (bitwise comparisons that tell -0 from +0 and compare NaNs).
inline std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

/// An open entry of the reference search: a row's log-probability and the row.
struct open_entry {
  float lp;
  xsoftmax::index_t row;
};
/// priority_queue's "less": the top is the larger log-probability, then the smaller row.
struct worse {
  bool operator()(const open_entry& a, const open_entry& b) const {
    return a.lp < b.lp || (a.lp == b.lp && a.row > b.row);
  }
};

/// The pop loop both reference searches share: while fewer than k classes are found and something
/// is open, take the best open entry (`take_best()`): a leaf goes to the output, an internal node is
/// expanded (`expand(lp, block_begin, block_size)`); then -1 / -inf past the last class found.
template <class View, class HasOpen, class TakeBest, class Expand>
void pop_best_until_k(const View& tv, xsoftmax::index_t k, xsoftmax::index_t* cls, float* lps, HasOpen has_open,
                      TakeBest take_best, Expand expand) {
  xsoftmax::index_t found = 0;
  while (found < k && has_open()) {
    const open_entry e = take_best();
    const xsoftmax::child_ref c = tv.child(e.row);
    if (c.is_leaf) {
      cls[found] = c.leaf_class;
      lps[found++] = e.lp;
    } else {
      expand(e.lp, c.block_begin, c.block_size);
    }
  }
  for (; found < k; ++found) {
    cls[found] = -1;
    lps[found] = -INFINITY;
  }
}

/// The k best classes of one fp32 row `h` (cls, lps: k entries each; -1 / -inf past the tree's
/// classes) over the tree view `tv` with one weight row per child (softmax nodes) or per internal
/// node (sigmoid nodes). `ties`, when given, counts the children pushed below the root whose value
/// equals their parent's (float saturation); `expansions`, when given, is set to the number of
/// nodes whose children were scored (the root included).
template <bool Sigmoid, class View>
void plain_search(const View& tv, const float* h, xsoftmax::matrix_view<const float> w, const float* bias,
                  xsoftmax::index_t k, xsoftmax::index_t* cls, float* lps, xsoftmax::index_t* ties = nullptr,
                  xsoftmax::index_t* expansions = nullptr) {
  using xsoftmax::index_t;
  std::priority_queue<open_entry, std::vector<open_entry>, worse> open;
  std::vector<float> child(64);
  if (expansions) *expansions = 0;
  const auto expand = [&](float base, index_t block_begin, index_t block_size) {
    if (expansions) ++*expansions;
    child.resize(static_cast<std::size_t>(block_size));
    xsoftmax::detail::child_log_probs<Sigmoid>(h, w, bias, block_begin, block_size, child.data());
    for (index_t j = 0; j < block_size; ++j) {
      const float v = base + child[static_cast<std::size_t>(j)];
      open.push({v, block_begin + j});
      if (ties && block_begin > 0 && v == base) ++*ties;
    }
  };
  expand(0.f, 0, tv.root_block_size());
  pop_best_until_k(
      tv, k, cls, lps, [&] { return !open.empty(); },
      [&] {
        const open_entry e = open.top();
        open.pop();
        return e;
      },
      expand);
}

/// The beam search the library's beam option runs, written plainly: the open entries in a vector;
/// the best one is taken out (a leaf to the output, an internal node expanded: its children added,
/// then all but the `beam` best dropped, by a full sort). Same arguments as `plain_search`, plus
/// `beam` (>= 1); `expansions`, when given, counts the nodes expanded (the root included).
template <bool Sigmoid, class View>
void plain_beam_search(const View& tv, const float* h, xsoftmax::matrix_view<const float> w, const float* bias,
                       xsoftmax::index_t k, xsoftmax::index_t beam, xsoftmax::index_t* cls, float* lps,
                       xsoftmax::index_t* expansions = nullptr) {
  using xsoftmax::index_t;
  std::vector<open_entry> open;
  std::vector<float> child(64);
  const auto better = [](const open_entry& a, const open_entry& b) { return worse{}(b, a); };
  if (expansions) *expansions = 0;
  const auto expand = [&](float base, index_t block_begin, index_t block_size) {
    if (expansions) ++*expansions;
    child.resize(static_cast<std::size_t>(block_size));
    xsoftmax::detail::child_log_probs<Sigmoid>(h, w, bias, block_begin, block_size, child.data());
    for (index_t j = 0; j < block_size; ++j) open.push_back({base + child[static_cast<std::size_t>(j)], block_begin + j});
    if (static_cast<index_t>(open.size()) > beam) {
      std::sort(open.begin(), open.end(), better);
      open.resize(static_cast<std::size_t>(beam));
    }
  };
  expand(0.f, 0, tv.root_block_size());
  pop_best_until_k(
      tv, k, cls, lps, [&] { return !open.empty(); },
      [&] {
        const auto best = std::min_element(open.begin(), open.end(), better);
        const open_entry e = *best;
        open.erase(best);
        return e;
      },
      expand);
}

}  // namespace xsoftmax_test
