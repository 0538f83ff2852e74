// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Compiles a validated parent-array tree into the flat arrays a `runtime_tree` serves the tree
/// contract from (see tree_types.hpp). Every builder (user parents, Huffman, balanced) ends here, so
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
  std::vector<index_t> path_offset;   ///< N + 1
  std::vector<index_t> path_row;      ///< sum over classes of depth(c)
  std::vector<index_t> leaf_rank;     ///< N, a permutation of 0..N-1
  std::vector<index_t> row_parent;    ///< R: internal node (BFS number) whose block holds the row
  std::vector<index_t> row_child;     ///< R: internal node (BFS number) >= 0, or -(class + 1)
  std::vector<index_t> block_offset;  ///< I + 1: node k's block is [block_offset[k], block_offset[k+1])

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
                                                    const std::vector<index_t>& parent,
                                                    const std::vector<index_t>& leaf_class,
                                                    const std::vector<index_t>& leaf_node,
                                                    const std::vector<int>& depth) {
  using std::size_t;
  const index_t m = t.num_nodes();
  const index_t n = static_cast<index_t>(leaf_node.size());
  runtime_tree_data d;
  d.num_classes = n;
  d.num_rows = m - 1;

  // row_of[v]: v's weight row = its breadth-first position - 1 (the root has none).
  // node_id[v]: v's internal-node number; later reused for leaf ranks.
  std::vector<index_t> row_of(static_cast<size_t>(m));
  std::vector<index_t> node_id(static_cast<size_t>(m), -1);
  for (index_t i = 0; i < m; ++i) row_of[static_cast<size_t>(t.bfs_order[static_cast<size_t>(i)])] = i - 1;

  d.is_binary = true;
  index_t next_row = 0;
  for (index_t v : t.bfs_order) {
    const index_t kids = t.num_children(v);
    if (kids == 0) continue;
    node_id[static_cast<size_t>(v)] = static_cast<index_t>(d.block_offset.size());
    d.block_offset.push_back(next_row);
    next_row += kids;
    d.is_binary = d.is_binary && kids == 2;
  }
  d.block_offset.push_back(next_row);  // == m - 1

  d.row_parent.resize(static_cast<size_t>(m - 1));
  d.row_child.resize(static_cast<size_t>(m - 1));
  for (index_t r = 0; r < m - 1; ++r) {
    const auto v = static_cast<size_t>(t.bfs_order[static_cast<size_t>(r + 1)]);
    d.row_parent[static_cast<size_t>(r)] = node_id[static_cast<size_t>(parent[v])];
    d.row_child[static_cast<size_t>(r)] =
        node_id[v] >= 0 ? node_id[v] : encode_leaf(leaf_class[v]);
  }

  d.path_offset.resize(static_cast<size_t>(n) + 1);
  d.path_offset[0] = 0;
  for (index_t c = 0; c < n; ++c) {
    const int dc = depth[static_cast<size_t>(leaf_node[static_cast<size_t>(c)])];
    d.height = std::max(d.height, dc);
    d.path_offset[static_cast<size_t>(c) + 1] = d.path_offset[static_cast<size_t>(c)] + dc;
  }
  d.path_row.resize(static_cast<size_t>(d.path_offset[static_cast<size_t>(n)]));
  for (index_t c = 0; c < n; ++c) {
    index_t v = leaf_node[static_cast<size_t>(c)];
    // Walk leaf -> root, writing the path back to front so it reads root -> leaf.
    for (index_t k = d.path_offset[static_cast<size_t>(c) + 1] - 1;
         k >= d.path_offset[static_cast<size_t>(c)]; --k) {
      d.path_row[static_cast<size_t>(k)] = row_of[static_cast<size_t>(v)];
      v = parent[static_cast<size_t>(v)];
    }
  }

  // Leaf ranks in depth-first order without a stack: count the leaves under every node bottom-up,
  // then hand each child, in child order, the next range of its parent's range top-down. `acc`
  // holds a node's leaf count until its parent is processed, its first leaf rank afterwards.
  std::vector<index_t>& acc = node_id;
  for (index_t v = 0; v < m; ++v) acc[static_cast<size_t>(v)] = t.num_children(v) == 0 ? 1 : 0;
  for (index_t i = m - 1; i > 0; --i) {
    const auto v = static_cast<size_t>(t.bfs_order[static_cast<size_t>(i)]);
    acc[static_cast<size_t>(parent[v])] += acc[v];
  }
  acc[static_cast<size_t>(t.root)] = 0;
  d.leaf_rank.resize(static_cast<size_t>(n));
  for (index_t v : t.bfs_order) {
    const auto vs = static_cast<size_t>(v);
    if (t.num_children(v) == 0) {
      d.leaf_rank[static_cast<size_t>(leaf_class[vs])] = acc[vs];
      continue;
    }
    index_t next = acc[vs];
    for (index_t k = t.child_offset[vs]; k < t.child_offset[vs + 1]; ++k) {
      const auto u = static_cast<size_t>(t.children[static_cast<size_t>(k)]);
      const index_t leaves_below = acc[u];
      acc[u] = next;
      next += leaves_below;
    }
  }
  return d;
}

}  // namespace xsoftmax::detail
