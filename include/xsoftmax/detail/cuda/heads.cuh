// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `device_heads<cuda>`: the definition the heads dispatch to when their backend is `cuda` (declared
/// in backend.hpp). Each member forwards to the implementation in full_softmax.cuh or
/// hierarchical_softmax.cuh; all pointers in the views are device pointers.

#include <xsoftmax/detail/cuda/full_softmax.cuh>
#include <xsoftmax/detail/cuda/hierarchical_softmax.cuh>

namespace xsoftmax::detail {

template <>
struct device_heads<::xsoftmax::cuda> {
  template <class Head, class H>
  static float full_run(const Head& head, const char* where, matrix_view<const H> hidden,
                        vector_view<const index_t> targets, loss_options options, vector_view<float> per_sample,
                        matrix_view<float>* grad_hidden, sparse_gradient<::xsoftmax::cuda, float>* grad_weights,
                        vector_view<const float> grad_output) {
    return gpu::full_run(head, where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output);
  }

  template <class Head, class H>
  static void full_topk(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                        matrix_view<float> log_probs) {
    gpu::full_topk(head, hidden, k, classes, log_probs);
  }

  template <class Head, class H>
  static void full_log_distribution(const Head& head, matrix_view<const H> hidden, index_t class_begin,
                                    index_t class_end, matrix_view<float> out) {
    gpu::full_log_distribution(head, hidden, class_begin, class_end, out);
  }

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

  /// v = -v in device memory (log_prob turns the per-sample losses it computed into log-probs).
  static void negate(const cuda_resources& resources, vector_view<float> v) { gpu::negate(resources, v); }
};

}  // namespace xsoftmax::detail
