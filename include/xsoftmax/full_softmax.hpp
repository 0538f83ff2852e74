// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax`: the exact softmax cross-entropy over all N classes, the baseline every other head
/// is measured against. The B x N logits matrix is never materialised: scores are produced chunk by
/// chunk of classes and folded into an online log-sum-exp; the backward pass recomputes each chunk.
/// Peak extra memory is O(B x chunk_size).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/weight_store.hpp>
#include <xsoftmax/head_verbs.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax {

/// Exact softmax over `num_classes` classes of a (B x dim) hidden batch:
/// loss_i = logsumexp_c(h_i . w_c + b_c) - (h_i . w_{t_i} + b_{t_i}).
///
/// \tparam Precision `fp32`, `bf16` or `fp16` storage of the weights; arithmetic is fp32.
/// \tparam Backend   `serial`, `omp` (or `cuda` under nvcc).
///
/// Every verb validates its inputs first and throws `shape_error`, `out_of_range`,
/// `non_finite_error` or `invalid_argument` naming the argument and value; nothing is changed then.
/// Hidden rows may be any of float/double/bf16/fp16 in the backend's memory.
template <class Precision = fp32, class Backend = serial>
class full_softmax : public head_verbs<full_softmax<Precision, Backend>, Backend> {
  using verbs = head_verbs<full_softmax<Precision, Backend>, Backend>;
  friend verbs;

 public:
  static constexpr const char* head_name = "full_softmax";
  /// Whether `loss_options::label_smoothing`, `z_loss` and `margin` are defined for this head.
  static constexpr bool supports_loss_terms = true;
  using precision_type = Precision;
  using storage_type = typename Precision::storage_type;
  using typename verbs::gradient_type;

  /// Owns `num_classes x dim` weights initialised per `init`, and a zero bias when `with_bias`.
  /// Throws `invalid_argument` when a size is not positive.
  full_softmax(index_t num_classes, index_t dim, bool with_bias = false, init_options init = {},
               backend_resources<Backend> resources = {});

  /// Attaches to a caller's `weights` (num_classes x dim) and optional `bias` (num_classes): no copy,
  /// the caller keeps ownership; `apply_sgd` writes into them.
  explicit full_softmax(matrix_view<storage_type> weights, storage_type* bias = nullptr,
                        backend_resources<Backend> resources = {});

  [[nodiscard]] index_t num_classes() const { return store_.rows(); }
  [[nodiscard]] index_t dim() const { return store_.cols(); }
  [[nodiscard]] bool has_bias() const { return store_.has_bias(); }
  [[nodiscard]] matrix_view<storage_type> weights() const { return store_.weights(); }
  [[nodiscard]] storage_type* bias() const { return store_.bias(); }
  [[nodiscard]] const backend_resources<Backend>& resources() const { return resources_; }

  /// Classes scored per chunk (0 = automatic: about 32 MiB of fp32 scores per chunk).
  void set_chunk_size(index_t classes);
  [[nodiscard]] index_t chunk_size_for(index_t batch_rows) const;

  // The verbs (forward, forward_backward, backward, log_prob, topk, log_distribution, their `_async`
  // forms, apply_sgd) are head_verbs'. What is particular to this head:
  // * forward_backward / backward: `grad_weights` receives every class (the exact softmax touches
  //   all of them), or no row when every sample is ignored.
  // * `_async` on cuda: free of host synchronisation once buffers exist. Ignored samples are masked
  //   (zero hidden row, upstream and loss) rather than packed out, and fp16 heads fold their
  //   gradient scale into the upstream gradients rather than into the GEMMs' alpha (one extra pass
  //   over grad_hidden and over the num_classes x dim weight gradient; bf16 and fp32 heads need no
  //   scale), so the values equal the blocking verb's up to the GEMMs' summation order, with one
  //   difference: `grad_weights` always holds every class, with zero rows when every sample is
  //   ignored. The first call of a batch size may grow the workspace, create the cuBLAS handle and
  //   the status word, and resizing `grad_weights` allocates synchronously; from the second step on,
  //   reusing the same gradient object, nothing does.

 private:
  template <class H>
  float run_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
             loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
             gradient_type* grad_weights, vector_view<const float> grad_output) const;
  template <class H>
  void run_async_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                  loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                  gradient_type* grad_weights, vector_view<const float> grad_output, float* loss) const;
  template <class H>
  void topk_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes, matrix_view<float> log_probs,
             exact_search) const;
  template <class H>
  void topk_async_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                   matrix_view<float> log_probs, exact_search) const;
  template <class H>
  void log_distribution_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                         matrix_view<float> out) const;
  template <class H>
  void log_distribution_async_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                               matrix_view<float> out) const;

  template <class H>
  void run_into_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                 loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                 gradient_type* grad_weights, vector_view<const float> grad_output, float* loss) const;
  template <class H>
  void topk_into_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                  matrix_view<float> log_probs) const;
  template <class H>
  void log_distribution_into_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                              matrix_view<float> out) const;

  detail::weight_store<storage_type, Backend> store_;
  backend_resources<Backend> resources_;
  index_t chunk_size_ = 0;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/full_softmax.inl>
