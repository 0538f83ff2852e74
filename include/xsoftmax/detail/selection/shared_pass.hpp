// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The shared-active-set pass of `selective_softmax`: the packed batch against one sorted class
/// list, through the dense-softmax primitive (chunks of classes scored with one GEMM each, read in
/// place when contiguous and gathered otherwise, logit offsets added, online log-sum-exp; the
/// backward pass recomputes each chunk and produces the hidden gradient and the chunk's
/// weight-gradient rows with two GEMMs). An all-classes set is exactly the full softmax's walk.

#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <vector>

namespace xsoftmax::detail {

/// Losses of the packed rows into `losses` (zeroed; rows entries) and, when `upstream` is non-null,
/// their hidden gradient into `grad_packed` (rows x dim, zeroed) and the weight gradient of the
/// set's classes (ascending) into `g`. `target_pos[r]` is row r's target's position in `set.classes`.
template <class Policy, class Batch, class T, class Gradient>
void shared_pass(const Policy& policy, const Batch& batch, const active_set& set,
                 const std::vector<index_t>& target_pos, matrix_view<const T> w, const T* bias, index_t chunk,
                 const float* upstream, std::vector<float>& losses, std::vector<float>& grad_packed, Gradient* g) {
  const index_t n = static_cast<index_t>(set.classes.size()), d = batch.dim;
  dense_softmax_args a;
  a.h = batch.hidden_view();
  a.target = target_pos.data();
  a.n = n;
  a.chunk = chunk;
  a.loss = losses.data();
  a.columns = set.classes.data();
  a.negative_offset = set.negative_offset.empty() ? nullptr : set.negative_offset.data();
  a.target_offset = set.target_offset.empty() ? nullptr : set.target_offset.data();
  if (upstream) {
    g->dim = d;
    g->rows.assign(set.classes.begin(), set.classes.end());
    g->values.resize(static_cast<std::size_t>(n * d));
    g->bias_values.resize(bias ? static_cast<std::size_t>(n) : 0);
    a.upstream = upstream;
    a.grad_h = grad_packed.data();
    a.grad_w = thrust::raw_pointer_cast(g->values.data());
    a.grad_b = bias ? thrust::raw_pointer_cast(g->bias_values.data()) : nullptr;
  }
  dense_softmax(policy, w, bias, a);
}

}  // namespace xsoftmax::detail
