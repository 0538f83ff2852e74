// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `runtime_tree<MaxDepth>`: a tree shape chosen at run time (user-given parents, or Huffman codes
/// from class counts), stored in host `std::vector`s, and `runtime_tree_view<MaxDepth>`, the
/// trivially copyable view that serves the tree contract of tree_types.hpp from raw pointers (host
/// arrays, or device copies of them).
///
/// Layout (the contract of tree_types.hpp, made concrete): one weight row per non-root node; the
/// children of an internal node are one contiguous block of rows, in child order; blocks are
/// stacked in breadth-first order of their internal nodes, so the root's block is rows [0,
/// root_block_size()). Leaves are ranked in depth-first order (children in child order), so every
/// subtree is a contiguous range of leaf ranks.
///
/// Raw arrays (all `index_t`; N classes, R = num_rows() rows, I = num_internal_nodes() internal
/// nodes numbered 0..I-1 in breadth-first order, the root being 0):
///   path_offset  N + 1   class c's path is path_row[path_offset[c], path_offset[c + 1])
///   path_row     sum of depths   the weight row taken at each level, root -> leaf
///   leaf_rank    N       position of each class in the depth-first leaf order
///   row_parent   R       internal node whose block holds the row
///   row_child    R       internal node below the row (>= 0), or -(class + 1) for a leaf
///   block_offset I + 1   node k's block is rows [block_offset[k], block_offset[k + 1])

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/tree/detail/huffman.hpp>
#include <xsoftmax/tree/detail/parent_validation.hpp>
#include <xsoftmax/tree/detail/tree_compile.hpp>
#include <xsoftmax/tree/detail/tree_forest.hpp>
#include <xsoftmax/tree/tree_types.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {

/// Non-owning view of a runtime tree: scalars by value, arrays by `const index_t*` (layout in the
/// file comment). Trivially copyable and usable in device code when the pointers point at device
/// memory. Every query is O(1); none checks its argument (c in [0, N), level in [0, depth(c)),
/// row in [0, num_rows())). Valid as long as the arrays it points at.
template <int MaxDepth = 64>
class runtime_tree_view {
  static_assert(MaxDepth >= 1, "xsoftmax: runtime_tree_view<MaxDepth>: MaxDepth must be >= 1");

 public:
  /// Compile-time bound on depth(c); the builders reject deeper trees.
  static constexpr int max_depth = MaxDepth;

  /// An empty view (no classes); only assignable.
  runtime_tree_view() = default;

  /// A view over raw arrays with the layout of the file comment, e.g. device copies of a
  /// `runtime_tree`'s arrays (`runtime_tree::view_over` fills in the scalars). `binary`: every
  /// internal node has exactly two children (`runtime_tree::is_binary`), so that node k's block is
  /// rows [2k, 2k + 2) and a row's block needs no lookup. Checks nothing.
  XSOFTMAX_HD runtime_tree_view(index_t num_classes, index_t num_rows, index_t num_internal_nodes,
                                index_t root_block_size, int height, const index_t* path_offset,
                                const index_t* path_row, const index_t* leaf_rank,
                                const index_t* row_parent, const index_t* row_child,
                                const index_t* block_offset, bool binary = false)
      : binary_(binary),
        num_classes_(num_classes),
        num_rows_(num_rows),
        num_internal_nodes_(num_internal_nodes),
        root_block_size_(root_block_size),
        height_(height),
        path_offset_(path_offset),
        path_row_(path_row),
        leaf_rank_(leaf_rank),
        row_parent_(row_parent),
        row_child_(row_child),
        block_offset_(block_offset) {}

  /// Number of classes N (leaves).
  [[nodiscard]] XSOFTMAX_HD index_t num_classes() const { return num_classes_; }
  /// Rows of the weight matrix: one per non-root node.
  [[nodiscard]] XSOFTMAX_HD index_t num_rows() const { return num_rows_; }
  /// Internal nodes, the root included (= number of blocks).
  [[nodiscard]] XSOFTMAX_HD index_t num_internal_nodes() const { return num_internal_nodes_; }
  /// The root's block is rows [0, root_block_size()). Read from a scalar, so host code may ask a
  /// view over device arrays.
  [[nodiscard]] XSOFTMAX_HD index_t root_block_size() const { return root_block_size_; }
  /// Maximum of depth(c) over all classes, in [1, MaxDepth].
  [[nodiscard]] XSOFTMAX_HD int height() const { return height_; }

  /// Internal nodes on the path root -> class `c` (>= 1, <= MaxDepth).
  [[nodiscard]] XSOFTMAX_HD int depth(index_t c) const {
    return static_cast<int>(path_offset_[c + 1] - path_offset_[c]);
  }

  /// Weight row that class `c`'s path takes at `level` (level 0 = the root's block):
  /// `step(c, level).block_begin + step(c, level).child`.
  [[nodiscard]] XSOFTMAX_HD index_t path_row(index_t c, int level) const {
    return path_row_[path_offset_[c] + level];
  }

  /// The internal node at `level` on class `c`'s path: its block of child rows and the child taken.
  /// A binary tree's blocks are the row pairs (one load: the path's row; else three, the last two
  /// depending on the first: a third of a binary Huffman training step's planning went to waiting
  /// on them, bench/RESULTS.md).
  [[nodiscard]] XSOFTMAX_HD path_step step(index_t c, int level) const {
    const index_t row = path_row(c, level);
    path_step s;
    if (binary_) {
      s.block_begin = row & ~index_t(1);
      s.block_size = 2;
      s.child = row & 1;
      return s;
    }
    const index_t node = row_parent_[row];
    s.block_begin = block_offset_[node];
    s.block_size = block_offset_[node + 1] - s.block_begin;
    s.child = row - s.block_begin;
    return s;
  }

  /// Position of class `c` in the depth-first leaf order (a permutation of 0..N-1 in which every
  /// subtree is a contiguous range).
  [[nodiscard]] XSOFTMAX_HD index_t leaf_rank(index_t c) const { return leaf_rank_[c]; }

  /// What hangs below weight row `row`: a class, or an internal node with its block.
  [[nodiscard]] XSOFTMAX_HD child_ref child(index_t row) const {
    const index_t code = row_child_[row];
    child_ref r;
    if (code < 0) {
      r.is_leaf = true;
      r.leaf_class = detail::decode_leaf(code);
    } else {
      r.block_begin = binary_ ? 2 * code : block_offset_[code];
      r.block_size = binary_ ? 2 : block_offset_[code + 1] - r.block_begin;
    }
    return r;
  }

 private:
  bool binary_ = false;
  index_t num_classes_ = 0;
  index_t num_rows_ = 0;
  index_t num_internal_nodes_ = 0;
  index_t root_block_size_ = 0;
  int height_ = 0;
  const index_t* path_offset_ = nullptr;
  const index_t* path_row_ = nullptr;
  const index_t* leaf_rank_ = nullptr;
  const index_t* row_parent_ = nullptr;
  const index_t* row_child_ = nullptr;
  const index_t* block_offset_ = nullptr;
};

/// A tree over N classes whose shape is known only at run time, with its arrays in host
/// `std::vector`s. Build one with `from_parents` (any user tree) or `huffman` (from class counts);
/// every internal node may have any number (>= 1) of children and classes may sit at any depth in
/// [1, MaxDepth]. Queries forward to `view()`; pass `view()` (or `view_over` device copies of the
/// arrays) to kernels. A default-constructed tree is empty (N = 0) and only assignable.
/// Memory: 8 bytes per path step (sum of depths, about N log2 N for a binary Huffman tree) plus
/// about 24 bytes per row and 16 per class.
template <int MaxDepth = 64>
class runtime_tree {
  static_assert(MaxDepth >= 1, "xsoftmax: runtime_tree<MaxDepth>: MaxDepth must be >= 1");

 public:
  /// Compile-time bound on depth(c); the builders throw `tree_error` for deeper trees.
  static constexpr int max_depth = MaxDepth;
  using view_type = runtime_tree_view<MaxDepth>;

  runtime_tree() = default;

  /// Tree given as a parent array over M nodes 0..M-1: `parent[i]` is node i's parent, -1 for the
  /// root; `leaf_class[i]` is the class of node i when i is a leaf, -1 when it is internal. A
  /// node's children are ordered by node index (that order fixes its block and the leaf order).
  /// Throws (message naming the argument and the offending node or value):
  /// `invalid_argument` when num_classes < 1; `shape_error` when the two sizes differ;
  /// `tree_error` for num_classes > M (checked before anything is allocated, so a huge
  /// num_classes is a `tree_error`, never `std::bad_alloc`), no root or more than one root, a
  /// parent outside [-1, M), a root that is a
  /// leaf, a cycle, an orphan (a node not reachable from the root), a class id outside
  /// [0, num_classes), an internal node that carries a class, a leaf that is not a class, a class
  /// listed twice, a class missing, and a class deeper than MaxDepth. O(M + total path length).
  [[nodiscard]] static runtime_tree from_parents(std::vector<index_t> parent,
                                                 std::vector<index_t> leaf_class,
                                                 index_t num_classes) {
    return compile(parent, leaf_class, num_classes, "runtime_tree::from_parents: ");
  }

  /// Same with nodes 0..num_classes-1 being the classes (node i is class i and must be a leaf) and
  /// nodes >= num_classes internal. Throws as above, and `shape_error` when
  /// `parent.size() < num_classes`.
  [[nodiscard]] static runtime_tree from_parents(std::vector<index_t> parent, index_t num_classes) {
    return from_class_parents(std::move(parent), num_classes, "runtime_tree::from_parents: ");
  }

  /// Huffman tree of the given arity over N = counts.size() classes: the tree minimising
  /// sum_c counts[c] * depth(c) among trees whose nodes have at most `arity` children. Classes with
  /// larger counts never get longer paths. Every internal node has `arity` children except at most
  /// one (k-ary padding), and except the root of a 1-class tree, which has one child.
  /// Deterministic: equal counts are ordered by class id. `Count` is any arithmetic type (integers
  /// are summed exactly in 64 bits, floating-point in double). O(N log N); N = 1e6 takes a fraction
  /// of a second. Throws `invalid_argument` for an empty `counts`, `arity < 2`, a negative count,
  /// an integer sum that overflows 64 bits; `non_finite_error` for a NaN or infinite count (index
  /// and value named); `tree_error` naming the depth and MaxDepth when some class ends up deeper
  /// than MaxDepth.
  template <class Count>
  [[nodiscard]] static runtime_tree huffman(const std::vector<Count>& counts, int arity = 2) {
    constexpr const char* who = "runtime_tree::huffman: ";
    auto parent = detail::huffman_parents(counts, arity, who);
    return from_class_parents(std::move(parent), static_cast<index_t>(counts.size()), who);
  }

  /// `huffman` for a braced list or a `std::vector<double>` of counts.
  [[nodiscard]] static runtime_tree huffman(const std::vector<double>& counts, int arity = 2) {
    return huffman<double>(counts, arity);
  }

  /// The *forest* of `trees`, in that order: one runtime_tree whose classes, weight rows and
  /// internal nodes are trees[0]'s, then trees[1]'s, ... (tree i's class j and row r become
  /// j + the classes, r + the rows of the trees before it), every class's path starting at its
  /// own tree's root block. A `hierarchical_softmax` over a forest scores each row in its
  /// target's tree only: its loss, gradients and `log_prob` are those of a head over that tree
  /// alone on that row, bitwise (the step never mixes rows of different trees' nodes); one call
  /// thus serves rows of many trees at a single call's fixed cost (the sharded hierarchical
  /// softmax's subtrees on one rank). There is no single root: `num_trees()` says how many,
  /// `root_nodes()` where each starts, `root_block_size()` is the first tree's, and
  /// `hierarchical_softmax::topk` refuses a forest of several trees. A forest of one tree equals
  /// that tree. Throws `invalid_argument` for an empty list, a null pointer or an empty
  /// (default-constructed) tree, naming its index. O(total size of the trees).
  [[nodiscard]] static runtime_tree forest(const std::vector<const runtime_tree*>& trees) {
    constexpr const char* who = "runtime_tree::forest: ";
    detail::expects(!trees.empty(), who, "trees is empty");
    std::vector<const detail::runtime_tree_data*> data;
    for (std::size_t i = 0; i < trees.size(); ++i) {
      detail::expects(trees[i] != nullptr, who, "trees[", i, "] is null");
      detail::expects(trees[i]->num_classes() >= 1, who, "trees[", i, "] is empty (default-constructed)");
      data.push_back(&trees[i]->data_);
    }
    return runtime_tree(detail::concatenate_trees(data));
  }

  /// Trees in this forest: 1 for a tree built by `from_parents` or `huffman`, 0 when empty.
  [[nodiscard]] index_t num_trees() const {
    return data_.num_classes == 0 ? 0 : static_cast<index_t>(data_.root_node.size());
  }
  /// The internal node of each tree's root (its block: `block_offsets()[k]` to `[k + 1]`); {0}
  /// for a tree.
  [[nodiscard]] const std::vector<index_t>& root_nodes() const { return data_.root_node; }

  /// The trivially copyable view over this tree's arrays; valid while the tree lives unmodified.
  [[nodiscard]] view_type view() const {
    return view_over(data_.path_offset.data(), data_.path_row.data(), data_.leaf_rank.data(),
                     data_.row_parent.data(), data_.row_child.data(), data_.block_offset.data());
  }

  /// A view with this tree's scalars over other copies of its arrays (e.g. device memory holding
  /// `path_offsets()`, `path_rows()`, ... copied verbatim). Checks nothing.
  [[nodiscard]] view_type view_over(const index_t* path_offset, const index_t* path_row,
                                    const index_t* leaf_rank, const index_t* row_parent,
                                    const index_t* row_child, const index_t* block_offset) const {
    return view_type(num_classes(), num_rows(), num_internal_nodes(), root_block_size(), height(),
                     path_offset, path_row, leaf_rank, row_parent, row_child, block_offset, is_binary());
  }

  /// Number of classes N.
  [[nodiscard]] index_t num_classes() const { return data_.num_classes; }
  /// Rows of the weight matrix: one per non-root node.
  [[nodiscard]] index_t num_rows() const { return data_.num_rows; }
  /// Internal nodes, the root included (= number of blocks).
  [[nodiscard]] index_t num_internal_nodes() const {
    return data_.block_offset.empty() ? 0 : data_.num_internal_nodes();
  }
  /// The root's block is rows [0, root_block_size()).
  [[nodiscard]] index_t root_block_size() const {
    return data_.block_offset.size() < 2 ? 0 : data_.block_offset[1];
  }
  /// Maximum of depth(c) over all classes.
  [[nodiscard]] int height() const { return data_.height; }
  /// True when every internal node has exactly two children.
  [[nodiscard]] bool is_binary() const { return data_.is_binary; }

  /// Internal nodes on the path root -> class `c`. See `runtime_tree_view`.
  [[nodiscard]] int depth(index_t c) const { return view().depth(c); }
  /// The internal node at `level` on class `c`'s path. See `runtime_tree_view`.
  [[nodiscard]] path_step step(index_t c, int level) const { return view().step(c, level); }
  /// Weight row class `c`'s path takes at `level`. See `runtime_tree_view`.
  [[nodiscard]] index_t path_row(index_t c, int level) const { return view().path_row(c, level); }
  /// Position of class `c` in the depth-first leaf order. See `runtime_tree_view`.
  [[nodiscard]] index_t leaf_rank(index_t c) const { return view().leaf_rank(c); }
  /// What hangs below weight row `row`. See `runtime_tree_view`.
  [[nodiscard]] child_ref child(index_t row) const { return view().child(row); }

  /// Raw arrays (layout in the file comment), e.g. to copy to a device and `view_over` them.
  [[nodiscard]] const std::vector<index_t>& path_offsets() const { return data_.path_offset; }
  [[nodiscard]] const std::vector<index_t>& path_rows() const { return data_.path_row; }
  [[nodiscard]] const std::vector<index_t>& leaf_ranks() const { return data_.leaf_rank; }
  [[nodiscard]] const std::vector<index_t>& row_parents() const { return data_.row_parent; }
  [[nodiscard]] const std::vector<index_t>& row_children() const { return data_.row_child; }
  [[nodiscard]] const std::vector<index_t>& block_offsets() const { return data_.block_offset; }

 private:
  explicit runtime_tree(detail::runtime_tree_data data) : data_(std::move(data)) {}

  /// The one path every builder takes: validate everything, then lay out.
  [[nodiscard]] static runtime_tree compile(const std::vector<index_t>& parent,
                                            const std::vector<index_t>& leaf_class,
                                            index_t num_classes, const char* who) {
    detail::validate_parent_sizes(parent, leaf_class, num_classes, who);
    const auto topology = detail::validate_parent_structure(parent, who);
    const auto leaf_node = detail::validate_leaf_classes(topology, leaf_class, num_classes, who);
    const auto depth = detail::validate_depths(topology, parent, leaf_node, MaxDepth, who);
    return runtime_tree(detail::compile_tree(topology, leaf_class, leaf_node, depth));
  }

  [[nodiscard]] static runtime_tree from_class_parents(std::vector<index_t> parent,
                                                       index_t num_classes, const char* who) {
    detail::expects(num_classes >= 1, who, "num_classes = ", num_classes, " must be >= 1");
    detail::expects<shape_error>(
        static_cast<index_t>(parent.size()) >= num_classes, who, "parent.size() = ", parent.size(),
        " < num_classes = ", num_classes, " (nodes 0..num_classes-1 are the classes)");
    std::vector<index_t> leaf_class(parent.size(), -1);
    for (index_t c = 0; c < num_classes; ++c) leaf_class[static_cast<std::size_t>(c)] = c;
    return compile(parent, leaf_class, num_classes, who);
  }

  detail::runtime_tree_data data_;
};

static_assert(std::is_trivially_copyable_v<runtime_tree_view<>>,
              "xsoftmax: runtime_tree_view must be trivially copyable to be passed to kernels");

}  // namespace xsoftmax
