// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A tree's view in device memory, for the hierarchical softmax's loops on the cuda backend
/// (`tree_access<cuda, Tree>`) and its search kernels.
///
/// `uniform_tree` is its own view: trivially copyable, it is passed to kernels by value and needs
/// no memory. A `runtime_tree` keeps its arrays in host vectors; `device_tree` copies them to the
/// device once per head (`runtime_tree_mirror`, one allocation, held by the head's backend cache
/// and shared by its copies) and builds a `runtime_tree_view` over the copies
/// (`runtime_tree::view_over`). Later verbs copy nothing. The mirror cannot go stale: a head's tree
/// is immutable (only `tree() const` is exposed; assigning a head replaces tree and cache
/// together), and copies of a head hold equal trees. It is rebuilt only when the head is used on a
/// different device than the one it was built on. Size: 8 bytes per path step plus ~24 per weight
/// row and ~16 per class (a binary Huffman tree over 1M classes: about 0.2 GB).

#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/detail/hierarchical/tree_access.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

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

  /// `cache` is unused: the view is the tree itself.
  device_tree(const uniform_tree<Depth, Branching>& tree, std::shared_ptr<void>& /*cache*/, cudaStream_t)
      : view_(tree) {}
  [[nodiscard]] view_type view() const { return view_; }
  /// Largest depth(c).
  [[nodiscard]] int height() const { return Depth; }
  /// Largest block (children of one node).
  [[nodiscard]] index_t max_block_size() const { return std::min<index_t>(Branching, view_.num_rows()); }

 private:
  view_type view_;
};

/// A runtime_tree's arrays in device memory (one allocation), owned; built once per head.
template <int MaxDepth>
class runtime_tree_mirror {
 public:
  using view_type = runtime_tree_view<MaxDepth>;

  /// Copies the tree's arrays to the current device (on `stream`, waited for). Throws `cuda_error`.
  runtime_tree_mirror(const runtime_tree<MaxDepth>& tree, cudaStream_t stream) : height_(tree.height()) {
    XSOFTMAX_CUDA_TRY(cudaGetDevice(&device_));
    const std::vector<index_t>* parts[] = {&tree.path_offsets(), &tree.path_rows(),     &tree.leaf_ranks(),
                                           &tree.row_parents(),  &tree.row_children(), &tree.block_offsets()};
    std::vector<index_t> host;
    std::size_t offset[6];
    for (int i = 0; i < 6; ++i) {
      offset[i] = host.size();
      host.insert(host.end(), parts[i]->begin(), parts[i]->end());
    }
    void* p = nullptr;
    XSOFTMAX_CUDA_TRY(cudaMalloc(&p, std::max<std::size_t>(host.size(), 1) * sizeof(index_t)));
    data_ = static_cast<index_t*>(p);
    try {
      to_device(data_, host, stream);  // waits: `host` is a temporary
    } catch (...) {
      XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(data_));
      throw;
    }
    view_ = tree.view_over(data_ + offset[0], data_ + offset[1], data_ + offset[2], data_ + offset[3],
                           data_ + offset[4], data_ + offset[5]);
    const std::vector<index_t>& bo = tree.block_offsets();
    for (std::size_t k = 0; k + 1 < bo.size(); ++k) max_block_ = std::max(max_block_, bo[k + 1] - bo[k]);
  }
  runtime_tree_mirror(const runtime_tree_mirror&) = delete;
  runtime_tree_mirror& operator=(const runtime_tree_mirror&) = delete;
  ~runtime_tree_mirror() { XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(data_)); }

  [[nodiscard]] view_type view() const { return view_; }
  [[nodiscard]] int height() const { return height_; }
  [[nodiscard]] index_t max_block_size() const { return max_block_; }
  [[nodiscard]] int device() const { return device_; }

 private:
  index_t* data_ = nullptr;
  view_type view_;
  int height_ = 0, device_ = 0;
  index_t max_block_ = 1;
};

template <int MaxDepth>
struct device_tree<runtime_tree<MaxDepth>> {
  using view_type = runtime_tree_view<MaxDepth>;
  using mirror_type = runtime_tree_mirror<MaxDepth>;

  /// Uses the mirror in `cache` (the head's backend cache), building it on first use or when the
  /// current device differs from the mirror's.
  device_tree(const runtime_tree<MaxDepth>& tree, std::shared_ptr<void>& cache, cudaStream_t stream) {
    int device = 0;
    XSOFTMAX_CUDA_TRY(cudaGetDevice(&device));
    auto mirror = std::static_pointer_cast<mirror_type>(cache);
    if (!mirror || mirror->device() != device) {
      mirror = std::make_shared<mirror_type>(tree, stream);
      cache = mirror;
    }
    mirror_ = std::move(mirror);
  }
  [[nodiscard]] view_type view() const { return mirror_->view(); }
  [[nodiscard]] int height() const { return mirror_->height(); }
  [[nodiscard]] index_t max_block_size() const { return mirror_->max_block_size(); }

 private:
  std::shared_ptr<const mirror_type> mirror_;  ///< kept alive for the call even if the cache changes
};

}  // namespace xsoftmax::detail::gpu

namespace xsoftmax::detail {

/// The tree view the generic hierarchical-softmax algorithm uses on the cuda backend: over the
/// device copy kept in the head's backend cache (nothing to copy for a `uniform_tree`).
template <class Tree>
struct tree_access<::xsoftmax::cuda, Tree> {
  [[nodiscard]] static auto view(const Tree& tree, std::shared_ptr<void>& cache, const cuda_resources& res) {
    return gpu::device_tree<Tree>(tree, cache, res.stream()).view();
  }
};

}  // namespace xsoftmax::detail
