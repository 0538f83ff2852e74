// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `uniform_tree<Depth, Branching>`: a static tree shape in which every internal node has
/// `Branching` children and every class sits at depth `Depth`. N need not be `Branching^Depth`:
/// children with no class beneath them are masked (left out of their node's block).

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/tree/tree_types.hpp>

namespace xsoftmax {

/// A complete `Branching`-ary tree of depth `Depth` over `num_classes` classes, leaf order = class
/// order. Level `l` (root = 0) has `ceil(N / Branching^(Depth-1-l))` live child rows; the levels' rows
/// are stacked in one weight matrix, level 0 first. `Depth == 1` is the flat (full) softmax.
/// The object is its own view: trivially copyable, usable in device code.
/// Throws `invalid_argument` when N < 1 or N > Branching^Depth.
template <int Depth, int Branching>
class uniform_tree {
  static_assert(Depth >= 1, "xsoftmax: uniform_tree<Depth, Branching>: Depth must be >= 1");
  static_assert(Branching >= 2, "xsoftmax: uniform_tree<Depth, Branching>: Branching must be >= 2");

 public:
  static constexpr int max_depth = Depth;
  static constexpr int depth_value = Depth;
  static constexpr int branching = Branching;
  using view_type = uniform_tree;

  uniform_tree() = default;

  /// Builds the shape for `num_classes` classes.
  explicit uniform_tree(index_t num_classes) : n_(num_classes) {
    detail::expects(num_classes >= 1, "uniform_tree<", Depth, ", ", Branching,
                    ">: num_classes = ", num_classes, " must be >= 1");
    const index_t capacity = span(0);
    detail::expects(num_classes <= capacity, "uniform_tree<", Depth, ", ", Branching,
                    ">: num_classes = ", num_classes, " exceeds Branching^Depth = ", capacity,
                    "; use a deeper tree or a larger branching factor");
    index_t offset = 0;
    for (int l = 0; l < Depth; ++l) {
      level_offset_[l] = offset;
      level_rows_[l] = ceil_div(n_, span(l + 1));
      offset += level_rows_[l];
    }
    level_offset_[Depth] = offset;
  }

  [[nodiscard]] XSOFTMAX_HD index_t num_classes() const { return n_; }
  [[nodiscard]] XSOFTMAX_HD index_t num_rows() const { return level_offset_[Depth]; }
  [[nodiscard]] XSOFTMAX_HD int depth(index_t) const { return Depth; }
  [[nodiscard]] XSOFTMAX_HD index_t leaf_rank(index_t c) const { return c; }
  [[nodiscard]] XSOFTMAX_HD index_t root_block_size() const { return level_rows_[0]; }
  /// Live child rows at level `l` (the rows of level l's weight slab).
  [[nodiscard]] XSOFTMAX_HD index_t level_rows(int l) const { return level_rows_[l]; }
  /// First weight row of level `l`.
  [[nodiscard]] XSOFTMAX_HD index_t level_offset(int l) const { return level_offset_[l]; }
  [[nodiscard]] uniform_tree view() const { return *this; }

  [[nodiscard]] XSOFTMAX_HD path_step step(index_t c, int level) const {
    const index_t child_global = c / span(level + 1);  // index among level's child rows
    const index_t node = child_global / Branching;
    const index_t first = node * Branching;
    const index_t live = level_rows_[level] - first;
    path_step s;
    s.block_begin = level_offset_[level] + first;
    s.block_size = live < Branching ? live : Branching;
    s.child = child_global - first;
    return s;
  }

  [[nodiscard]] XSOFTMAX_HD child_ref child(index_t row) const {
    int level = 0;
    while (level + 1 < Depth && row >= level_offset_[level + 1]) ++level;
    const index_t local = row - level_offset_[level];
    child_ref r;
    if (level == Depth - 1) {
      r.is_leaf = true;
      r.leaf_class = local;
    } else {
      const index_t first = local * Branching;
      const index_t live = level_rows_[level + 1] - first;
      r.block_begin = level_offset_[level + 1] + first;
      r.block_size = live < Branching ? live : Branching;
    }
    return r;
  }

 private:
  /// Classes below one child row at level `level - 1`, i.e. Branching^(Depth - level), saturated
  /// at 2^62 (any span larger than N behaves the same: every class index divides to 0).
  [[nodiscard]] XSOFTMAX_HD static index_t span(int level) {
    constexpr index_t saturated = index_t(1) << 62;
    index_t s = 1;
    for (int l = level; l < Depth; ++l) s = s > saturated / Branching ? saturated : s * Branching;
    return s;
  }
  [[nodiscard]] XSOFTMAX_HD static index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

  index_t n_ = 0;
  index_t level_offset_[Depth + 1] = {};
  index_t level_rows_[Depth] = {};
};

}  // namespace xsoftmax
