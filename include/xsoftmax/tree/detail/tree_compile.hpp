// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Compiles a validated parent-array tree into the flat arrays a `runtime_tree` serves the tree
/// contract from (see tree_types.hpp). Every builder (user parents, Huffman) ends here, so
/// the layout rules live in one place.
///
/// Layout. Internal nodes are numbered 0..I-1 in breadth-first order (root = 0). Node k's children
/// are the weight rows [block_offset[k], block_offset[k + 1]), in child order; stacking the blocks
/// in that order makes the rows the breadth-first order of the non-root nodes, so the root's block
/// is rows [0, block_offset[1]). Paths are CSR: class c's rows, root to leaf, are
/// path_row[path_offset[c], path_offset[c + 1]). One index per step (not a whole path_step) keeps
/// the largest array 3x smaller; the step's block comes from the row's owner in O(1).

#include <xsoftmax/config.hpp>
#include <xsoftmax/tree/detail/parent_validation.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace xsoftmax::detail {

/// The arrays behind a runtime tree, all on the host.
struct runtime_tree_data {
  index_t num_classes = 0;
  index_t num_rows = 0;  ///< non-root nodes = weight rows
  int height = 0;        ///< max over classes of depth(c)
  bool is_binary = false;
  std::vector<index_t> path_offset;  ///< N + 1
  std::vector<index_t> path_row;     ///< sum over classes of depth(c)
  std::vector<index_t> leaf_rank;    ///< N, a permutation of 0..N-1
  std::vector<index_t> row_parent;   ///< R: internal node (BFS number) whose block holds the row
  std::vector<index_t> row_child;    ///< R: internal node (BFS number) >= 0, or -(class + 1)
  std::vector<index_t>
      block_offset;  ///< I + 1: node k's block is [block_offset[k], block_offset[k+1])
  /// The internal node of each tree's root: {0} for a tree, one per tree for a forest
  /// (tree_forest.hpp), whose paths start at their own tree's root block.
  std::vector<index_t> root_node{0};

  [[nodiscard]] index_t num_internal_nodes() const {
    return static_cast<index_t>(block_offset.size()) - 1;
  }
};

/// Encodes a leaf in `row_child`: negative values are classes, so one array serves both cases.
[[nodiscard]] XSOFTMAX_HD constexpr index_t encode_leaf(index_t c) { return -(c + 1); }
/// Inverse of `encode_leaf`.
[[nodiscard]] XSOFTMAX_HD constexpr index_t decode_leaf(index_t code) { return -code - 1; }

/// Builds the arrays from a tree that passed `validate_parent_structure`, `validate_leaf_classes`
/// (giving `leaf_node`) and `validate_depths` (giving `depth`). O(M + total path length); throws
/// only `std::bad_alloc`.
[[nodiscard]] inline runtime_tree_data compile_tree(const parent_topology& t,
                                                    const std::vector<index_t>& leaf_class,
                                                    const std::vector<index_t>& leaf_node,
                                                    const std::vector<int>& depth) {
  using std::size_t;
  const index_t m = t.num_nodes();
  const index_t n = static_cast<index_t>(leaf_node.size());
  runtime_tree_data d;
  d.num_classes = n;
  d.num_rows = m - 1;

  // node_id[v]: v's internal-node number, -1 for leaves. (Node v's row is its breadth-first
  // position - 1, so rows are assigned by iterating bfs_order.)
  std::vector<index_t> node_id(static_cast<size_t>(m), -1);

  d.is_binary = true;
  index_t rows_so_far = 0;
  for (index_t v : t.bfs_order) {
    const index_t kids = t.num_children(v);
    if (kids == 0) continue;
    node_id[static_cast<size_t>(v)] = static_cast<index_t>(d.block_offset.size());
    d.block_offset.push_back(rows_so_far);
    rows_so_far += kids;
    d.is_binary = d.is_binary && kids == 2;
  }
  d.block_offset.push_back(rows_so_far);  // == m - 1

  d.row_parent.resize(static_cast<size_t>(m - 1));
  d.row_child.resize(static_cast<size_t>(m - 1));
  for (index_t k = 0; k < d.num_internal_nodes(); ++k) {
    const auto first = d.block_offset[static_cast<size_t>(k)];
    const auto last = d.block_offset[static_cast<size_t>(k) + 1];
    std::fill(d.row_parent.begin() + first, d.row_parent.begin() + last, k);
  }
  for (index_t r = 0; r < m - 1; ++r) {
    const auto v = static_cast<size_t>(t.bfs_order[static_cast<size_t>(r + 1)]);
    d.row_child[static_cast<size_t>(r)] = node_id[v] >= 0 ? node_id[v] : encode_leaf(leaf_class[v]);
  }

  d.path_offset.resize(static_cast<size_t>(n) + 1);
  d.path_offset[0] = 0;
  for (index_t c = 0; c < n; ++c) {
    const int dc = depth[static_cast<size_t>(leaf_node[static_cast<size_t>(c)])];
    d.height = std::max(d.height, dc);
    d.path_offset[static_cast<size_t>(c) + 1] = d.path_offset[static_cast<size_t>(c)] + dc;
  }
  d.path_row.resize(static_cast<size_t>(d.path_offset[static_cast<size_t>(n)]));
  d.leaf_rank.resize(static_cast<size_t>(n));

  // One iterative depth-first walk yields both the leaf order and the paths. It runs over the
  // compiled rows, not the nodes: a node's children are consecutive rows, so the walk reads
  // row_child nearly sequentially, and the current root -> node path is a stack of at most
  // `height` rows that each leaf copies out in one go. (Walking up from every leaf through the
  // node arrays costs several cache misses per step: about 3x slower at N = 1e6.)
  std::vector<index_t> path(static_cast<size_t>(d.height));
  std::vector<index_t> next_row(static_cast<size_t>(d.height));
  std::vector<index_t> end_row(static_cast<size_t>(d.height));
  index_t rank = 0;
  std::ptrdiff_t top = 0;  // the block being walked at depth `top` is [next_row, end_row)[top]
  next_row[0] = 0;
  end_row[0] = d.block_offset[1];
  while (top >= 0) {
    const auto level = static_cast<size_t>(top);
    if (next_row[level] == end_row[level]) {
      --top;
      continue;
    }
    const index_t r = next_row[level]++;
    path[level] = r;
    const index_t code = d.row_child[static_cast<size_t>(r)];
    if (code < 0) {
      const auto c = static_cast<size_t>(decode_leaf(code));
      d.leaf_rank[c] = rank++;
      index_t* out = d.path_row.data() + d.path_offset[c];
      for (std::ptrdiff_t l = 0; l <= top; ++l) out[l] = path[static_cast<size_t>(l)];
    } else {
      ++top;
      next_row[level + 1] = d.block_offset[static_cast<size_t>(code)];
      end_row[level + 1] = d.block_offset[static_cast<size_t>(code) + 1];
    }
  }
  return d;
}

}  // namespace xsoftmax::detail
