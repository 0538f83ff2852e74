// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Concatenates compiled trees into one *forest*: the arrays of `runtime_tree_data` with tree i's
/// classes, weight rows and internal nodes shifted past those of trees 0..i-1. Every array keeps
/// its meaning (a class's path, its leaf rank, a row's block and child), so the generic
/// hierarchical-softmax step, which only follows paths and sorts by leaf rank, runs a forest as it
/// runs a tree: a class's path starts at its own tree's root block, and rows of different trees
/// never share a node. What a forest lacks is a single root: `root_node` lists one per tree.

#include <xsoftmax/config.hpp>
#include <xsoftmax/tree/detail/tree_compile.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace xsoftmax::detail {

/// The forest of `trees` (each non-null and non-empty: checked by the caller), in that order.
/// O(total size of the trees); throws only `std::bad_alloc`.
[[nodiscard]] inline runtime_tree_data concatenate_trees(const std::vector<const runtime_tree_data*>& trees) {
  runtime_tree_data f;
  f.is_binary = true;
  f.path_offset.push_back(0);
  f.block_offset.push_back(0);
  f.root_node.clear();
  for (const runtime_tree_data* t : trees) {
    // Tree t's first class, row and internal node in the forest.
    const index_t classes = f.num_classes, rows = f.num_rows, nodes = f.num_internal_nodes(),
                  steps = static_cast<index_t>(f.path_row.size());
    for (index_t r : t->root_node) f.root_node.push_back(r + nodes);
    for (std::size_t c = 1; c < t->path_offset.size(); ++c) f.path_offset.push_back(t->path_offset[c] + steps);
    for (index_t r : t->path_row) f.path_row.push_back(r + rows);
    for (index_t k : t->leaf_rank) f.leaf_rank.push_back(k + classes);
    for (index_t k : t->row_parent) f.row_parent.push_back(k + nodes);
    for (index_t code : t->row_child) f.row_child.push_back(code >= 0 ? code + nodes : encode_leaf(decode_leaf(code) + classes));
    for (std::size_t k = 1; k < t->block_offset.size(); ++k) f.block_offset.push_back(t->block_offset[k] + rows);
    f.num_classes += t->num_classes;
    f.num_rows += t->num_rows;
    f.height = std::max(f.height, t->height);
    f.is_binary = f.is_binary && t->is_binary;
  }
  return f;
}

}  // namespace xsoftmax::detail
