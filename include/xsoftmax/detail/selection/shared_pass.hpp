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

#include <functional>

namespace xsoftmax::detail {

/// Losses of the packed rows into `losses` (rows entries, zeroed) and, when `upstream` is non-null,
/// their hidden gradient into `grad_packed` (rows x dim, zeroed) and the weight gradient of the
/// set's classes (ascending) into `g`. `target_pos[r]` is row r's target's position in
/// `set.classes`. `terms`: label smoothing, z-loss, margin. Every pointer is in the execution's memory.
/// Class-sharded heads pass their slice of the set (local weight rows; target position -1 where
/// another rank holds the target) and `combine` (see `dense_softmax_args::combine_rows`).
template <class Backend, class Set, class T, class Gradient>
void shared_pass(const execution<Backend>& ex, const batch_rows<Backend>& batch, const Set& set,
                 const index_t* target_pos, matrix_view<const T> w, const T* bias, index_t chunk,
                 const loss_options& terms, const float* upstream, float* losses, float* grad_packed, Gradient* g,
                 const std::function<void(const dense_row_statistics&)>& combine = {}) {
  const index_t n = static_cast<index_t>(set.classes.size()), d = batch.dim;
  dense_softmax_args a;
  a.h = batch.hidden_view();
  a.target = target_pos;
  a.n = n;
  a.chunk = chunk;
  a.loss = losses;
  a.label_smoothing = terms.label_smoothing;  // over each row's finite-offset classes
  a.z_loss = terms.z_loss;
  a.margin = terms.margin;  // margin logits first, then the set's offsets
  a.softcap = terms.softcap;  // capped logits, then the set's offsets
  if (batch.weights_in_pass) {  // class weights with label smoothing: the pass weighs the losses
    a.class_weight = terms.class_weight.data;
    a.row_weight = batch.weight.data();
  }
  a.columns = thrust::raw_pointer_cast(set.classes.data());
  a.negative_offset = set.negative_offset.empty() ? nullptr : thrust::raw_pointer_cast(set.negative_offset.data());
  a.target_offset = set.target_offset.empty() ? nullptr : thrust::raw_pointer_cast(set.target_offset.data());
  a.combine_rows = combine;
  if (upstream) {
    g->dim = d;
    g->rows.assign(set.classes.begin(), set.classes.end());
    g->values.resize(static_cast<std::size_t>(n * d));
    g->bias_values.resize(bias ? static_cast<std::size_t>(n) : 0);
    a.upstream = upstream;
    a.grad_h = grad_packed;
    a.grad_w = raw(g->values);
    a.grad_b = bias ? raw(g->bias_values) : nullptr;
  }
  dense_softmax(ex, w, bias, a);
}

}  // namespace xsoftmax::detail
