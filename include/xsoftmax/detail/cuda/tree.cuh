// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A tree's view in device memory, for the kernels of the hierarchical softmax.
///
/// `uniform_tree` is its own view: trivially copyable, it is passed to kernels by value. A
/// `runtime_tree` keeps its arrays in host vectors; `device_tree` copies them into the call's
/// workspace and builds a `runtime_tree_view` over the copies (`runtime_tree::view_over`). The copy
/// is made per call: 8 bytes per path step plus ~24 per weight row and ~16 per class (for a binary
/// Huffman tree over 1M classes about 0.2 GB, a few ms over PCIe) — small next to a training step
/// over such a layer, and it can never go stale, unlike a cache keyed by the tree's address.

#include <xsoftmax/detail/cuda/common.cuh>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <algorithm>
#include <type_traits>

namespace xsoftmax::detail::gpu {

template <class Tree>
struct device_tree {
  static_assert(dependent_false<Tree>,
                "xsoftmax: the cuda backend supports hierarchical_softmax over uniform_tree and runtime_tree");
};

template <int Depth, int Branching>
struct device_tree<uniform_tree<Depth, Branching>> {
  using view_type = uniform_tree<Depth, Branching>;
  static_assert(std::is_trivially_copyable_v<view_type>, "uniform_tree must be trivially copyable");

  device_tree(const uniform_tree<Depth, Branching>& tree, arena&, cudaStream_t) : view_(tree) {}
  [[nodiscard]] view_type view() const { return view_; }
  /// Largest depth(c).
  [[nodiscard]] int height() const { return Depth; }
  /// Largest block (children of one node).
  [[nodiscard]] index_t max_block_size() const { return std::min<index_t>(Branching, view_.num_rows()); }

 private:
  view_type view_;
};

template <int MaxDepth>
struct device_tree<runtime_tree<MaxDepth>> {
  using view_type = runtime_tree_view<MaxDepth>;

  device_tree(const runtime_tree<MaxDepth>& tree, arena& a, cudaStream_t stream) : height_(tree.height()) {
    const auto copy = [&](const std::vector<index_t>& host) {
      index_t* p = a.take<index_t>(static_cast<index_t>(host.size()));
      to_device(p, host, stream);
      return static_cast<const index_t*>(p);
    };
    const index_t* path_offset = copy(tree.path_offsets());
    const index_t* path_row = copy(tree.path_rows());
    const index_t* leaf_rank = copy(tree.leaf_ranks());
    const index_t* row_parent = copy(tree.row_parents());
    const index_t* row_child = copy(tree.row_children());
    const index_t* block_offset = copy(tree.block_offsets());
    view_ = tree.view_over(path_offset, path_row, leaf_rank, row_parent, row_child, block_offset);
    const std::vector<index_t>& bo = tree.block_offsets();
    for (std::size_t k = 0; k + 1 < bo.size(); ++k) max_block_ = std::max(max_block_, bo[k + 1] - bo[k]);
  }
  [[nodiscard]] view_type view() const { return view_; }
  [[nodiscard]] int height() const { return height_; }
  [[nodiscard]] index_t max_block_size() const { return max_block_; }

 private:
  view_type view_;
  int height_ = 0;
  index_t max_block_ = 1;
};

}  // namespace xsoftmax::detail::gpu
