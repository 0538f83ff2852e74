// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A tree's view in device memory, for the hierarchical softmax's loops on the cuda backend
/// (`tree_access<cuda, Tree>`).
///
/// `uniform_tree` is its own view: trivially copyable, it is passed to kernels by value and needs
/// no memory. A `runtime_tree` keeps its arrays in host vectors; `runtime_tree_mirror` copies them
/// to the device once per head (one device vector, held by the head's backend cache and shared by
/// its copies) and builds a `runtime_tree_view` over the copies (`runtime_tree::view_over`). Later
/// verbs copy nothing. The mirror cannot go stale: a head's tree is immutable (only `tree() const`
/// is exposed; assigning a head replaces tree and cache together), and copies of a head hold equal
/// trees. It is rebuilt only when the head is used on a different device than the one it was built
/// on. Size: 8 bytes per path step plus ~24 per weight row and ~16 per class (a binary Huffman tree
/// over 1M classes: about 0.2 GB).

#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/detail/cuda/vector_memory.cuh>
#include <xsoftmax/detail/hierarchical/tree_access.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <thrust/device_vector.h>

#include <memory>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

template <class Tree>
struct tree_access<::xsoftmax::cuda, Tree> {
  static_assert(dependent_false<Tree>,
                "xsoftmax: the cuda backend supports hierarchical_softmax over uniform_tree and runtime_tree");
};

template <int Depth, int Branching>
struct tree_access<::xsoftmax::cuda, uniform_tree<Depth, Branching>> {
  static_assert(std::is_trivially_copyable_v<uniform_tree<Depth, Branching>>,
                "uniform_tree must be trivially copyable");
  [[nodiscard]] static auto view(const uniform_tree<Depth, Branching>& tree, std::shared_ptr<void>& /*cache*/,
                                 const cuda_resources& /*res*/) {
    return tree.view();
  }
};

/// A runtime_tree's arrays in device memory (one vector) and the view over them; built once per head.
template <int MaxDepth>
struct runtime_tree_mirror {
  /// Copies the tree's arrays to the current device (complete on return). Throws `cuda_error`.
  explicit runtime_tree_mirror(const runtime_tree<MaxDepth>& tree) {
    XSOFTMAX_CUDA_TRY(cudaGetDevice(&device));
    const std::vector<index_t>* parts[] = {&tree.path_offsets(), &tree.path_rows(),     &tree.leaf_ranks(),
                                           &tree.row_parents(),  &tree.row_children(), &tree.block_offsets()};
    std::vector<index_t> host;
    std::size_t offset[6];
    for (int i = 0; i < 6; ++i) {
      offset[i] = host.size();
      host.insert(host.end(), parts[i]->begin(), parts[i]->end());
    }
    data = host;
    const index_t* p = thrust::raw_pointer_cast(data.data());
    view = tree.view_over(p + offset[0], p + offset[1], p + offset[2], p + offset[3], p + offset[4], p + offset[5]);
  }

  thrust::device_vector<index_t, gpu::vector_allocator<index_t>> data;  // memory as the head's vectors'
  runtime_tree_view<MaxDepth> view;
  int device = 0;
};

/// The view over the device copy kept in the head's backend cache: built on first use, or again
/// when the current device differs from the copy's.
template <int MaxDepth>
struct tree_access<::xsoftmax::cuda, runtime_tree<MaxDepth>> {
  [[nodiscard]] static runtime_tree_view<MaxDepth> view(const runtime_tree<MaxDepth>& tree,
                                                        std::shared_ptr<void>& cache, const cuda_resources& /*res*/) {
    int device = 0;
    XSOFTMAX_CUDA_TRY(cudaGetDevice(&device));
    auto mirror = std::static_pointer_cast<runtime_tree_mirror<MaxDepth>>(cache);
    if (!mirror || mirror->device != device) {
      mirror = std::make_shared<runtime_tree_mirror<MaxDepth>>(tree);
      cache = mirror;
    }
    return mirror->view;
  }
};

}  // namespace xsoftmax::detail
