// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `tree_access<Backend, Tree>`: the view of a head's tree that the generic hierarchical-softmax
/// algorithm hands to its loops. On the host backends it is the tree's own view (its arrays are
/// host memory). The cuda backend specialises it (detail/cuda/tree.cuh) with a view over a device
/// copy of the tree's arrays, made once per head and kept in the head's backend cache.

#include <xsoftmax/backend.hpp>

#include <memory>

namespace xsoftmax::detail {

/// The view of `tree` usable in `Backend`'s loops. `cache` is the head's backend cache (a device
/// backend keeps its copy of the tree there); host backends ignore it.
template <class Backend, class Tree>
struct tree_access {
  static_assert(is_host_backend<Backend>,
                "xsoftmax: no tree_access for this backend (include <xsoftmax/cuda.cuh> for cuda)");
  [[nodiscard]] static auto view(const Tree& tree, std::shared_ptr<void>& /*cache*/,
                                 const backend_resources<Backend>& /*res*/) {
    return tree.view();
  }
};

}  // namespace xsoftmax::detail
