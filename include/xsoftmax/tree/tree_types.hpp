// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The contract every tree shape offers to `hierarchical_softmax`.
///
/// A tree over N classes is stored as one weight matrix with one row per *edge* (per non-root node):
/// the children of an internal node are a contiguous block of rows `[block_begin, block_begin +
/// block_size)`; the root's block starts at row 0. Leaves are classes. A leaf order exists in which
/// every subtree is a contiguous range, so sorting samples by `leaf_rank(target)` makes the samples
/// below any node one contiguous run at every level.
///
/// A tree *view* (`tree.view()`, trivially copyable, usable in device code) provides:
///   index_t num_classes() const;            // N
///   index_t num_rows() const;               // rows of the weight matrix
///   int depth(index_t c) const;             // internal nodes on the path root -> class c (>= 1)
///   path_step step(index_t c, int level) const;   // level 0 = root, level < depth(c)
///   index_t leaf_rank(index_t c) const;     // position of c in the contiguous leaf order
///   child_ref child(index_t row) const;     // what hangs below weight row `row`
///   index_t root_block_size() const;        // the root's block is rows [0, root_block_size())
///   static constexpr int max_depth;         // compile-time bound on depth(c)

#include <xsoftmax/config.hpp>

namespace xsoftmax {

/// One internal node on a class's path: the node's block of child rows and which child is taken.
struct path_step {
  index_t block_begin = 0;  ///< first weight row of the node's children (unique per node)
  index_t block_size = 0;   ///< number of children (masked children are not counted)
  index_t child = 0;        ///< the child on the path, in [0, block_size)
};

/// What a weight row leads to: a class (leaf) or an internal node with its own block.
struct child_ref {
  bool is_leaf = false;
  index_t leaf_class = -1;   ///< the class when `is_leaf`
  index_t block_begin = 0;   ///< the child's own block when not a leaf
  index_t block_size = 0;
};

}  // namespace xsoftmax
