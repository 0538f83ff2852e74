// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `to_parent_array`: a `runtime_tree` as the parent array that `runtime_tree::from_parents`
/// takes, to hand a tree built in C++ (`kmeans_label_tree`, `runtime_tree::huffman`) to another
/// program (the PyTorch package's `Tree.kmeans` uses it), or to store it beside a checkpoint.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <vector>

namespace xsoftmax {

/// A tree as `runtime_tree::from_parents(parent, leaf_class, num_classes)` takes it: over M
/// nodes, `parent[i]` is node i's parent (-1 for the root) and `leaf_class[i]` the class of leaf
/// i (-1 for an internal node).
struct tree_parent_array {
  std::vector<index_t> parent;
  std::vector<index_t> leaf_class;
  index_t num_classes = 0;
};

/// The parent array of `tree` (M = num_rows() + 1 nodes): node 0 is the root and node r + 1 the
/// node below weight row r. Children are thus numbered in row order, which is their child order,
/// and both this tree and `from_parents` lay internal nodes out breadth first, so
/// `from_parents(a.parent, a.leaf_class, a.num_classes)` rebuilds `tree` with the same arrays:
/// the same weight rows, paths and leaf order. O(M). Throws `invalid_argument` for an empty
/// (default-constructed) tree and `tree_error` for a forest of several trees (it has no single
/// root; export each tree).
template <int MaxDepth>
[[nodiscard]] tree_parent_array to_parent_array(const runtime_tree<MaxDepth>& tree) {
  constexpr const char* who = "to_parent_array: ";
  detail::expects(tree.num_classes() >= 1, who, "the tree is empty (default-constructed)");
  detail::expects<tree_error>(tree.num_trees() == 1, who, "the tree is a forest of ", tree.num_trees(),
                              " trees, which has no single root; export each tree");
  const index_t rows = tree.num_rows();
  const std::vector<index_t>& row_parent = tree.row_parents();
  const std::vector<index_t>& row_child = tree.row_children();
  // The node of each internal node: the root is node 0, any other is below the row leading to it.
  std::vector<index_t> node_of(static_cast<std::size_t>(tree.num_internal_nodes()), 0);
  for (index_t r = 0; r < rows; ++r)
    if (row_child[r] >= 0) node_of[row_child[r]] = r + 1;
  tree_parent_array out;
  out.num_classes = tree.num_classes();
  out.parent.assign(static_cast<std::size_t>(rows + 1), -1);
  out.leaf_class.assign(out.parent.size(), -1);
  for (index_t r = 0; r < rows; ++r) {
    out.parent[r + 1] = node_of[row_parent[r]];
    if (row_child[r] < 0) out.leaf_class[r + 1] = -(row_child[r] + 1);
  }
  return out;
}

}  // namespace xsoftmax
