// SPDX-License-Identifier: Apache-2.0
#pragma once
// The runtime-tree contract, checked on any built tree (Huffman, k-means, user parents).

#include <xsoftmax/types.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

namespace xsoftmax_test {

/// Checks the tree contract: rows tiled once by the blocks reachable from the root block, each
/// class's path leading from the root block to its own leaf, leaf ranks a permutation in which
/// every block's and every row's subtree is a contiguous range. Returns the classes below each row.
template <class Tree>
std::vector<xsoftmax::index_t> check_tree_contract(const Tree& t) {
  using xsoftmax::index_t;
  using std::size_t;
  const index_t n = t.num_classes();
  std::vector<int> rows_used(static_cast<size_t>(t.num_rows()), 0);
  std::vector<std::pair<index_t, index_t>> blocks{{0, t.root_block_size()}};
  for (size_t b = 0; b < blocks.size(); ++b)
    for (index_t r = blocks[b].first; r < blocks[b].first + blocks[b].second; ++r) {
      ++rows_used[static_cast<size_t>(r)];
      const auto ch = t.child(r);
      if (!ch.is_leaf) blocks.emplace_back(ch.block_begin, ch.block_size);
    }
  CHECK(std::all_of(rows_used.begin(), rows_used.end(), [](int k) { return k == 1; }));
  struct range {
    index_t lo = std::numeric_limits<index_t>::max(), hi = -1, count = 0;
    void add(index_t rank) {
      lo = std::min(lo, rank);
      hi = std::max(hi, rank);
      ++count;
    }
  };
  std::vector<range> below_block(static_cast<size_t>(t.num_rows())), below_row(below_block.size());
  std::vector<index_t> ranks(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) {
    const int d = t.depth(c);
    REQUIRE(d >= 1);
    CHECK(t.step(c, 0).block_begin == 0);
    for (int l = 0; l < d; ++l) {
      const auto s = t.step(c, l);
      REQUIRE(s.child < s.block_size);
      const index_t r = s.block_begin + s.child;
      const auto ch = t.child(r);
      if (l + 1 < d) {
        REQUIRE_FALSE(ch.is_leaf);
        CHECK(ch.block_begin == t.step(c, l + 1).block_begin);
      } else {
        REQUIRE(ch.is_leaf);
        CHECK(ch.leaf_class == c);
      }
      below_block[static_cast<size_t>(s.block_begin)].add(t.leaf_rank(c));
      below_row[static_cast<size_t>(r)].add(t.leaf_rank(c));
    }
    ranks[static_cast<size_t>(c)] = t.leaf_rank(c);
  }
  std::sort(ranks.begin(), ranks.end());
  for (index_t i = 0; i < n; ++i) REQUIRE(ranks[static_cast<size_t>(i)] == i);
  std::vector<index_t> below(below_row.size(), 0);
  for (size_t r = 0; r < below_row.size(); ++r) {
    if (below_block[r].count > 0) CHECK(below_block[r].hi - below_block[r].lo + 1 == below_block[r].count);
    if (below_row[r].count > 0) CHECK(below_row[r].hi - below_row[r].lo + 1 == below_row[r].count);
    below[r] = below_row[r].count;
  }
  return below;
}

/// Checks that two runtime trees are the same tree, array for array (rows, paths, leaf order,
/// blocks), as a tree rebuilt from a checkpoint or a parent array must be.
template <class Tree>
void check_same_tree_arrays(const Tree& a, const Tree& b) {
  CHECK(a.num_classes() == b.num_classes());
  CHECK(a.height() == b.height());
  CHECK(a.is_binary() == b.is_binary());
  CHECK(a.path_offsets() == b.path_offsets());
  CHECK(a.path_rows() == b.path_rows());
  CHECK(a.leaf_ranks() == b.leaf_ranks());
  CHECK(a.row_parents() == b.row_parents());
  CHECK(a.row_children() == b.row_children());
  CHECK(a.block_offsets() == b.block_offsets());
}

}  // namespace xsoftmax_test
