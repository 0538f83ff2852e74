// SPDX-License-Identifier: Apache-2.0
// An exact search's push decisions made child by child without the sequential state
// (detail/hierarchical/exact_push.hpp: `exact_child_pushed`, `keep_best_leaf`; the cuda search
// runner's thread-per-child form) against `topk_search_step::push_children` itself: the same
// children pushed and the same k best leaf values after the expansion, for chunks of 1, 7, 64
// children and the whole block, k = 1, 3, 10, 40, with and without leaves held before, with many
// equal values (log-probabilities drawn from a few) and blocks of leaves only, nodes only, or both.

#include <xsoftmax/detail/hierarchical/exact_push.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using xsoftmax::index_t;
namespace xd = xsoftmax::detail;

/// A tree view whose weight row r is a leaf when leaf[r] (only `child` is used here).
struct masked_view {
  const std::vector<char>* leaf;
  xsoftmax::child_ref child(index_t r) const {
    xsoftmax::child_ref c;
    c.is_leaf = (*leaf)[static_cast<size_t>(r)] != 0;
    c.leaf_class = c.is_leaf ? r : -1;
    c.block_begin = c.is_leaf ? 0 : r + 1;
    c.block_size = c.is_leaf ? 0 : 2;
    return c;
  }
};

struct pushed_state {
  std::vector<index_t> rows;  ///< the pushed children's weight rows, ascending
  std::vector<float> best;    ///< the k best leaf values after, descending
};

TEST_CASE("exact_child_pushed / keep_best_leaf: the children and best leaves of push_children, in any chunks") {
  std::mt19937 g(91);
  const index_t nb = 5;  // the block's first weight row
  for (int trial = 0; trial < 400; ++trial) {
    const index_t ns = 1 + static_cast<index_t>(g() % 150), k = std::vector<index_t>{1, 3, 10, 40}[g() % 4];
    const int kinds = static_cast<int>(g() % 3);  // 0: leaves only, 1: nodes only, 2: both
    std::vector<char> leaf(static_cast<size_t>(nb + ns + 1), 0);
    for (index_t j = 0; j < ns; ++j) leaf[static_cast<size_t>(nb + j)] = kinds == 0 || (kinds == 2 && g() % 2);
    const bool few_values = g() % 2;  // ties everywhere
    std::vector<float> lp(static_cast<size_t>(ns));
    for (float& x : lp)
      x = few_values ? -0.25f * static_cast<float>(g() % 6) : -std::uniform_real_distribution<float>(0.f, 6.f)(g);
    const float base = -std::uniform_real_distribution<float>(0.f, 2.f)(g);
    // Leaves held before: none, some, or k, from values around the children's.
    std::vector<float> best0(static_cast<size_t>(k));
    index_t leaves0 = std::min<index_t>(k, static_cast<index_t>(g() % (k + 2)));
    for (index_t q = 0; q < leaves0; ++q)
      best0[static_cast<size_t>(q)] = base - (few_values ? 0.25f * static_cast<float>(g() % 6) : 6.f * std::uniform_real_distribution<float>(0.f, 1.f)(g));
    std::sort(best0.begin(), best0.begin() + leaves0, std::greater<>());
    const masked_view tv{&leaf};

    // push_children itself.
    pushed_state want;
    {
      std::vector<std::uint64_t> keys(static_cast<size_t>(ns + 1));
      std::vector<float> best = best0;
      index_t leaves = leaves0;
      xd::topk_search_step<false, float, masked_view, 1> step{};
      step.tv = tv;
      step.k = k;
      step.beam = 0;
      xd::open_heap heap{keys.data(), 0, ns + 1};
      REQUIRE(step.push_children(heap, lp.data(), nb, ns, base, best.data(), leaves));
      for (index_t e = 0; e < heap.size; ++e) want.rows.push_back(xd::open_heap::row_of(keys[static_cast<size_t>(e)]));
      std::sort(want.rows.begin(), want.rows.end());
      want.best.assign(best.begin(), best.begin() + leaves);
    }
    for (const index_t chunk : {index_t(1), index_t(7), index_t(64), ns}) {
      pushed_state got;
      std::vector<float> best = best0;
      index_t leaves = leaves0;
      for (index_t c0 = 0; c0 < ns; c0 += chunk) {
        const index_t c1 = std::min(ns, c0 + chunk);
        std::vector<char> pushed(static_cast<size_t>(c1 - c0));
        for (index_t j = c0; j < c1; ++j)  // "in parallel": each decision from the state before the chunk
          pushed[static_cast<size_t>(j - c0)] = xd::exact_child_pushed(tv, lp.data(), base, nb, c0, j, best.data(), leaves, k);
        for (index_t j = c0; j < c1; ++j) {  // then the chunk's pushed leaves enter, in order
          if (!pushed[static_cast<size_t>(j - c0)]) continue;
          got.rows.push_back(nb + j);
          if (leaf[static_cast<size_t>(nb + j)]) xd::keep_best_leaf(best.data(), leaves, k, base + lp[static_cast<size_t>(j)]);
        }
      }
      got.best.assign(best.begin(), best.begin() + leaves);
      INFO("trial ", trial, ", ns ", ns, ", k ", k, ", kinds ", kinds, ", chunk ", chunk, ", leaves before ", leaves0);
      CHECK(got.rows == want.rows);
      CHECK(got.best == want.best);
    }
  }
}

}  // namespace
