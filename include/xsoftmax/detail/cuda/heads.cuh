// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `device_heads<cuda>`: the definition the heads dispatch to when their backend is `cuda` (declared
/// in backend.hpp) for the hierarchical softmax, whose CUDA implementation is still its own
/// (hierarchical_softmax.cuh); the full softmax runs its generic algorithm on cuda and needs no
/// entry here. All pointers in the views are device pointers; inputs were validated by head_verbs.
/// The `_async` members queue work without the final wait.

#include <xsoftmax/detail/cuda/hierarchical_softmax.cuh>

namespace xsoftmax::detail {

template <>
struct device_heads<::xsoftmax::cuda> {
  template <class Head, class H>
  static float hs_run(const Head& head, const char* where, matrix_view<const H> hidden,
                      vector_view<const index_t> targets, loss_options options, vector_view<float> per_sample,
                      matrix_view<float>* grad_hidden, sparse_gradient<::xsoftmax::cuda, float>* grad_weights,
                      vector_view<const float> grad_output) {
    return gpu::hs_run(head, where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output);
  }

  template <class Head, class H>
  static void hs_topk(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                      matrix_view<float> log_probs, search_options options) {
    gpu::hs_topk(head, hidden, k, classes, log_probs, options);
  }

  template <class Head, class H>
  static void hs_log_distribution(const Head& head, matrix_view<const H> hidden, index_t class_begin,
                                  index_t class_end, matrix_view<float> out) {
    gpu::hs_log_distribution(head, hidden, class_begin, class_end, out);
  }

  // The `_async` verbs (see head_verbs.hpp): queue the work on the head's stream and return.

  /// hs_run's queue-only form (its implementation's `wait = false`), the loss to `loss` (device).
  template <class Head, class H>
  static void hs_run_async(const Head& head, const char* where, matrix_view<const H> hidden,
                           vector_view<const index_t> targets, loss_options options, vector_view<float> per_sample,
                           matrix_view<float>* grad_hidden, sparse_gradient<::xsoftmax::cuda, float>* grad_weights,
                           vector_view<const float> grad_output, float* loss) {
    (void)gpu::hs_run(head, where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output,
                      /*wait=*/false, loss);
  }

  template <class Head, class H>
  static void hs_log_distribution_async(const Head& head, matrix_view<const H> hidden, index_t class_begin,
                                        index_t class_end, matrix_view<float> out) {
    gpu::hs_log_distribution(head, hidden, class_begin, class_end, out, /*wait=*/false);
  }
};

}  // namespace xsoftmax::detail
