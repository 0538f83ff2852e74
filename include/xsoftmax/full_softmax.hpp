// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax`: the exact softmax cross-entropy over all N classes, the baseline every other head
/// is measured against. The B x N logits matrix is never materialised: scores are produced chunk by
/// chunk of classes and folded into an online log-sum-exp; the backward pass recomputes each chunk.
/// Peak extra memory is O(B x chunk_size).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/weight_store.hpp>
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
class full_softmax {
 public:
  using precision_type = Precision;
  using storage_type = typename Precision::storage_type;
  using accum_type = float;
  using backend_type = Backend;
  using gradient_type = sparse_gradient<Backend, float>;

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

  /// Per-sample negative log-likelihood, reduced per `options` and returned. With `reduction::none`
  /// the per-sample losses go to `per_sample` (B entries, required) and their sum is returned;
  /// `per_sample` may be given with any reduction. Ignored samples have loss 0.
  template <class H>
  float forward(matrix_view<const H> hidden, vector_view<const index_t> targets, loss_options options = {},
                vector_view<float> per_sample = {}) const;

  /// `forward` and the gradients in two passes over the weights (the log-sum-exp pass of the
  /// forward is shared). `grad_hidden` (B x dim, fp32) is overwritten; `grad_weights` receives every
  /// row (the exact softmax touches all classes). `grad_output` is the upstream gradient: empty
  /// (1), a scalar for mean/sum, or B values for reduction none.
  template <class H>
  float forward_backward(matrix_view<const H> hidden, vector_view<const index_t> targets,
                         matrix_view<float> grad_hidden, gradient_type& grad_weights,
                         loss_options options = {}, vector_view<float> per_sample = {},
                         vector_view<const float> grad_output = {}) const;

  /// Gradients only (recomputes the log-sum-exp); see `forward_backward`.
  template <class H>
  void backward(matrix_view<const H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                gradient_type& grad_weights, loss_options options = {},
                vector_view<const float> grad_output = {}) const;

  /// log p(targets[i] | hidden[i]) into `out` (B entries). Every target must be a valid class.
  template <class H>
  void log_prob(matrix_view<const H> hidden, vector_view<const index_t> targets, vector_view<float> out) const;

  /// The k most probable classes of each row, best first (ties: smaller class first), and their
  /// log-probabilities. `classes` and `log_probs` are B x k. Throws `invalid_argument` unless
  /// 1 <= k <= num_classes.
  template <class H>
  void topk(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
            matrix_view<float> log_probs) const;

  /// log p(c | hidden[i]) for c in [class_begin, class_end) into `out` (B x (class_end - class_begin)):
  /// the full distribution, one class range at a time, for evaluation.
  template <class H>
  void log_distribution(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                        matrix_view<float> out) const;

  /// \name `_async` verbs
  /// The same computations as the blocking verbs, for the cuda backend's pipelines; generic code can
  /// call them on every backend.
  ///
  /// Arguments are the blocking verb's; a verb that returns a loss instead writes it to `loss`
  /// (1 element, in the backend's memory: device memory on cuda). Throws `shape_error` (and the
  /// other errors that need no data: sizes, null pointers, k, class ranges) at once.
  ///
  /// * Host backends (serial, omp): run the blocking verb to completion, then write the loss to
  ///   `loss[0]`. Everything, including data errors, is thrown from the call.
  /// * cuda: only queues the work on the head's stream and returns without waiting for it (no
  ///   stream synchronisation, no blocking device-to-host copy). Outputs are valid once the stream
  ///   is synchronised (`resources().synchronize()` / `check()`, or any synchronisation of the
  ///   stream); inputs and outputs must stay alive and unchanged until then. Checks that need the
  ///   data (finite hidden values, targets in range, finite upstream gradients) run on the device
  ///   and record the first failure in the resources; `resources().check()`, `synchronize()` and
  ///   the next blocking verb on those resources throw it with the blocking verb's type and message.
  ///   Ignored samples are masked (zero hidden row, upstream and loss) rather than packed out, and
  ///   fp16 heads fold their gradient scale into the upstream gradients rather than into the
  ///   GEMMs' alpha (one extra pass over grad_hidden and over the num_classes x dim weight
  ///   gradient; bf16 and fp32 heads need no scale), so the values equal the blocking verb's up to the GEMMs' summation order (the
  ///   same kernels and shapes, hence bit for bit, for an fp32 head when no sample is ignored; the
  ///   loss reduction and the masking are exact), with one difference: `grad_weights` always
  ///   holds every class, with zero rows when every sample is ignored (the blocking verbs return
  ///   no rows then). The calls are free of host
  ///   synchronisation once their buffers exist: the first call of a batch size may grow the
  ///   workspace, create the cuBLAS handle and the status word, and resizing `grad_weights` to
  ///   num_classes x dim allocates synchronously (so from the second step on, reusing the same
  ///   gradient object, nothing does).
  /// @{
  template <class H>
  void forward_async(matrix_view<const H> hidden, vector_view<const index_t> targets, vector_view<float> loss,
                     loss_options options = {}, vector_view<float> per_sample = {}) const;

  template <class H>
  void forward_backward_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                              matrix_view<float> grad_hidden, gradient_type& grad_weights, vector_view<float> loss,
                              loss_options options = {}, vector_view<float> per_sample = {},
                              vector_view<const float> grad_output = {}) const;

  template <class H>
  void backward_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                      matrix_view<float> grad_hidden, gradient_type& grad_weights, loss_options options = {},
                      vector_view<const float> grad_output = {}) const;

  template <class H>
  void log_prob_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                      vector_view<float> out) const;

  template <class H>
  void topk_async(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                  matrix_view<float> log_probs) const;

  template <class H>
  void log_distribution_async(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                              matrix_view<float> out) const;
  /// @}

  /// weights[rows] -= lr * gradient (and the bias). Checks the whole gradient first. Blocking on
  /// every backend: the weights are updated when it returns. On a device backend it first waits
  /// for the head's stream (an `_async` verb may still be writing `grad`) and throws a data error
  /// such a verb recorded, so a gradient computed from bad input is never applied.
  void apply_sgd(const gradient_type& grad, float lr) {
    store_.apply_sgd("full_softmax::apply_sgd", grad, lr, resources_);
  }

 private:
  template <class H>
  float run_host(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                 loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                 gradient_type* grad_weights, vector_view<const float> grad_output) const;
  template <class H>
  void topk_host(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                 matrix_view<float> log_probs) const;
  template <class H>
  void log_distribution_host(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                             matrix_view<float> out) const;
  template <class H>
  float run(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
            loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
            gradient_type* grad_weights, vector_view<const float> grad_output) const;

  detail::weight_store<storage_type, Backend> store_;
  backend_resources<Backend> resources_;
  index_t chunk_size_ = 0;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/full_softmax.inl>
