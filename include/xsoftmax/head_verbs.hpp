// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `head_verbs`: the verbs every head offers, declared and documented once. `full_softmax`,
/// `hierarchical_softmax` and `selective_softmax` (and `knn_softmax`) derive from it and add only
/// what is their own (constructors, tree or selector access, tuning knobs).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/backend_ops.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/shape_checks.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/types.hpp>

#include <limits>
#include <string>
#include <type_traits>

namespace xsoftmax {

/// The `topk` options of a head whose search is exact by construction (full and selective softmax):
/// nothing to choose.
struct exact_search {};

namespace detail {
/// "head::verb", the prefix of every message a verb throws.
inline std::string verb_where(const char* head, const char* verb) { return std::string(head) + "::" + verb; }

/// Options that make `run` compute log p(target) for every sample (log_prob): no reduction, no
/// target can be ignored.
/// v[i] = -v[i].
struct negate_in_place {
  float* v;
  XSOFTMAX_HD void operator()(index_t i) const { v[i] = -v[i]; }
};

inline loss_options log_prob_options() {
  loss_options o;
  o.reduce = reduction::none;
  o.ignore_index = std::numeric_limits<index_t>::min();
  return o;
}
}  // namespace detail

/// The verbs of a softmax head over `Backend`.
///
/// \tparam Head          the head deriving from this class (CRTP). It provides, privately (with
///                       `friend class head_verbs`):
///                       `run_(where, hidden, targets, options, per_sample, grad_hidden*, grad_weights*, grad_output)`
///                       (the loss and, when `grad_weights` is not null, the gradients; returns the
///                       reduced loss), `topk_(hidden, k, classes, log_probs, SearchOptions)`,
///                       `log_distribution_(hidden, class_begin, class_end, out)`, `store_` (its
///                       `detail::weight_store`) and `resources()`; on device backends also the
///                       `_async` forms `run_async_`, `topk_async_`, `log_distribution_async_`.
///                       Publicly: `head_name`, `supports_loss_terms` (whether label smoothing,
///                       z-loss, margins and soft-capping are defined for it) and
///                       `supports_class_weight` (whether it takes `loss_options::class_weight`) and
///                       `supports_gradient_filter` (`loss_options::gradient_filter`).
/// \tparam Backend       `serial`, `omp` or `cuda`.
/// \tparam SearchOptions what `topk` can be told (`exact_search`: nothing; HS: beam width).
///
/// Conventions of every verb:
/// * `hidden` is a B x dim matrix of float, double, bf16 or fp16 in the backend's memory, as a
///   `matrix_view<T>` or `matrix_view<const T>`. Targets are int64 class ids; a target equal to
///   `options.ignore_index` contributes no loss and no gradient.
/// * Inputs are validated before anything is written: shapes (`shape_error`), ranges
///   (`out_of_range`), non-finite values (`non_finite_error`), other bad arguments
///   (`invalid_argument`); each message names the verb, the argument and the offending value.
template <class Head, class Backend, class SearchOptions = exact_search>
class head_verbs {
 public:
  using backend_type = Backend;
  using accum_type = float;
  /// The sparse weight gradient the backward verbs produce (fp32 values, touched rows only).
  using gradient_type = sparse_gradient<Backend, float>;
  using search_options_type = SearchOptions;

  /// Per-sample negative log-likelihood, reduced per `options` and returned. With `reduction::none`
  /// the per-sample losses go to `per_sample` (B entries, required) and their sum is returned;
  /// `per_sample` may be given with any reduction. Ignored samples have loss 0. With
  /// `reduction::mean` the mean is over the samples that are not ignored (0 when all are).
  template <class H>
  float forward(matrix_view<H> hidden, vector_view<const index_t> targets, loss_options options = {},
                vector_view<float> per_sample = {}) const {
    const std::string w = where("forward");
    check_loss_inputs(w.c_str(), as_const(hidden), targets, options, per_sample, nullptr, false, {});
    return self().run_(w.c_str(), as_const(hidden), targets, options, per_sample, nullptr, nullptr, {});
  }

  /// `forward` and the gradients in one call. `grad_hidden` (B x dim, fp32) is overwritten;
  /// `grad_weights` receives the rows the batch touched (its buffers are reused between calls).
  /// `grad_output` is the upstream gradient: empty (1), a scalar for mean/sum, or B values for
  /// reduction none.
  template <class H>
  float forward_backward(matrix_view<H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                         gradient_type& grad_weights, loss_options options = {}, vector_view<float> per_sample = {},
                         vector_view<const float> grad_output = {}) const {
    const std::string w = where("forward_backward");
    check_loss_inputs(w.c_str(), as_const(hidden), targets, options, per_sample, &grad_hidden, true, grad_output);
    return self().run_(w.c_str(), as_const(hidden), targets, options, per_sample, &grad_hidden, &grad_weights,
                       grad_output);
  }

  /// The gradients only; see `forward_backward`.
  template <class H>
  void backward(matrix_view<H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                gradient_type& grad_weights, loss_options options = {},
                vector_view<const float> grad_output = {}) const {
    const std::string w = where("backward");
    check_loss_inputs(w.c_str(), as_const(hidden), targets, options, {}, &grad_hidden, true, grad_output);
    self().run_(w.c_str(), as_const(hidden), targets, options, {}, &grad_hidden, &grad_weights, grad_output);
  }

  /// log p(targets[i] | hidden[i]) into `out` (B entries). Every target must be a valid class.
  template <class H>
  void log_prob(matrix_view<H> hidden, vector_view<const index_t> targets, vector_view<float> out) const {
    const std::string w = where("log_prob");
    check_log_prob_inputs(w.c_str(), as_const(hidden), targets, out);
    self().run_(w.c_str(), as_const(hidden), targets, detail::log_prob_options(), out, nullptr, nullptr, {});
    negate(out, /*wait=*/true);
  }

  /// The k most probable classes of each row, best first (ties: smaller class first), and their
  /// log-probabilities; `classes` and `log_probs` are B x k. Throws `invalid_argument` unless
  /// 1 <= k <= num_classes.
  template <class H>
  void topk(matrix_view<H> hidden, index_t k, matrix_view<index_t> classes, matrix_view<float> log_probs,
            SearchOptions options = {}) const {
    check_topk_inputs(where("topk").c_str(), as_const(hidden), k, classes, log_probs);
    self().topk_(as_const(hidden), k, classes, log_probs, options);
  }

  /// log p(c | hidden[i]) for c in [class_begin, class_end) into `out` (B x (class_end - class_begin)):
  /// the full distribution, one class range at a time, for evaluation.
  template <class H>
  void log_distribution(matrix_view<H> hidden, index_t class_begin, index_t class_end,
                        matrix_view<float> out) const {
    check_range_inputs(where("log_distribution").c_str(), as_const(hidden), class_begin, class_end, out);
    self().log_distribution_(as_const(hidden), class_begin, class_end, out);
  }

  /// \name `_async` verbs
  /// The same computations as the blocking verbs, for device pipelines; generic code can call them
  /// on every backend. Arguments are the blocking verb's; a verb that returns a loss writes it to
  /// `loss` instead (1 element, in the backend's memory). Errors that need no data (sizes, null
  /// pointers, k, class ranges) are thrown at once.
  ///
  /// Every backend runs the same path: validate as the blocking verb does (data checks run where
  /// the data lives and wait for their answer; errors are thrown from the call), then the head's
  /// queue-only form (`run_async_`, `topk_async_`, `log_distribution_async_`), which differs from
  /// the blocking verb only in where the loss goes and in not waiting at the end.
  /// * Host backends (serial, omp): the work is done when the call returns.
  /// * cuda: the work is queued on the head's stream. Outputs are valid once the stream is
  ///   synchronised (`resources().synchronize()`); inputs and outputs must stay alive until then.
  ///   What each head's queue-only form still waits for is said in its own documentation.
  /// @{
  template <class H>
  void forward_async(matrix_view<H> hidden, vector_view<const index_t> targets, vector_view<float> loss,
                     loss_options options = {}, vector_view<float> per_sample = {}) const {
    detail::check_async_loss(where("forward_async").c_str(), loss);
    const std::string w = where("forward");
    check_loss_inputs(w.c_str(), as_const(hidden), targets, options, per_sample, nullptr, false, {});
    self().run_async_(w.c_str(), as_const(hidden), targets, options, per_sample, nullptr, nullptr, {}, loss.data);
  }

  template <class H>
  void forward_backward_async(matrix_view<H> hidden, vector_view<const index_t> targets,
                              matrix_view<float> grad_hidden, gradient_type& grad_weights, vector_view<float> loss,
                              loss_options options = {}, vector_view<float> per_sample = {},
                              vector_view<const float> grad_output = {}) const {
    detail::check_async_loss(where("forward_backward_async").c_str(), loss);
    const std::string w = where("forward_backward");
    check_loss_inputs(w.c_str(), as_const(hidden), targets, options, per_sample, &grad_hidden, true, grad_output);
    self().run_async_(w.c_str(), as_const(hidden), targets, options, per_sample, &grad_hidden, &grad_weights,
                      grad_output, loss.data);
  }

  template <class H>
  void backward_async(matrix_view<H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                      gradient_type& grad_weights, loss_options options = {},
                      vector_view<const float> grad_output = {}) const {
    const std::string w = where("backward");
    check_loss_inputs(w.c_str(), as_const(hidden), targets, options, {}, &grad_hidden, true, grad_output);
    self().run_async_(w.c_str(), as_const(hidden), targets, options, {}, &grad_hidden, &grad_weights, grad_output,
                      nullptr);
  }

  template <class H>
  void log_prob_async(matrix_view<H> hidden, vector_view<const index_t> targets, vector_view<float> out) const {
    const std::string w = where("log_prob");
    check_log_prob_inputs(w.c_str(), as_const(hidden), targets, out);
    self().run_async_(w.c_str(), as_const(hidden), targets, detail::log_prob_options(), out, nullptr, nullptr, {},
                      nullptr);
    negate(out, /*wait=*/false);
  }

  template <class H>
  void topk_async(matrix_view<H> hidden, index_t k, matrix_view<index_t> classes, matrix_view<float> log_probs,
                  SearchOptions options = {}) const {
    check_topk_inputs(where("topk").c_str(), as_const(hidden), k, classes, log_probs);
    self().topk_async_(as_const(hidden), k, classes, log_probs, options);
  }

  template <class H>
  void log_distribution_async(matrix_view<H> hidden, index_t class_begin, index_t class_end,
                              matrix_view<float> out) const {
    check_range_inputs(where("log_distribution").c_str(), as_const(hidden), class_begin, class_end, out);
    self().log_distribution_async_(as_const(hidden), class_begin, class_end, out);
  }
  /// @}

  /// weights[rows] -= lr * gradient (and the bias). The whole gradient is checked first (rows in
  /// range and unique, shapes, finite values); a bad gradient changes nothing. Blocking on every
  /// backend. On a device backend it first waits for the head's stream (an `_async` verb may still
  /// be writing `grad`).
  void apply_sgd(const gradient_type& grad, float lr) {
    Head& h = static_cast<Head&>(*this);
    h.store_.apply_sgd(where("apply_sgd").c_str(), grad, lr, h.resources());
  }

 protected:
  head_verbs() = default;

  /// The loss verbs' checks of a batch of `rows` rows, in order; `check_data(execution)` checks the
  /// hidden rows and the targets in their place (a prefetching head's checks only the targets: its
  /// rows were checked at the prefetch).
  template <class CheckData>
  void check_loss_rows(const char* w, index_t rows, CheckData check_data, const loss_options& options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                       bool backward, vector_view<const float> grad_output) const {
    const detail::execution<Backend> ex = checked_execution();
    detail::check_reduction(w, options.reduce);
    detail::check_loss_terms(w, options, Head::supports_loss_terms, Head::head_name);
    detail::check_margin(w, options.margin, Head::supports_loss_terms, Head::head_name, self().bias() != nullptr);
    detail::check_softcap(w, options, Head::supports_loss_terms, Head::head_name);
    detail::check_gradient_filter(w, options, Head::supports_gradient_filter, Head::head_name);
    detail::check_class_weight_shape(w, options, self().num_classes(), Head::supports_class_weight, Head::head_name);
    check_data(ex);
    detail::check_class_weight_values(ex, w, options.class_weight);
    if ((options.reduce == reduction::none && !backward) || per_sample.size != 0)  // backward has no per_sample
      detail::check_output(w, "per_sample", per_sample, rows);
    if (grad_hidden) detail::check_output(w, "grad_hidden", *grad_hidden, rows, self().dim());
    if (backward) detail::check_grad_output_shape(w, options.reduce, grad_output, rows);
  }

  /// `hidden` as read-only, of a supported element type.
  template <class H>
  [[nodiscard]] static matrix_view<const std::remove_const_t<H>> as_const(matrix_view<H> m) {
    static_assert(is_supported_element<std::remove_const_t<H>>,
                  "xsoftmax: hidden must be a matrix_view of float, double, bf16 or fp16");
    return m;
  }

  /// A loss verb's checks (see `check_loss_rows`) of `hidden` in its place: its values and the
  /// targets in one scan (one read-back).
  template <class H>
  void check_loss_inputs(const char* w, matrix_view<const H> hidden, vector_view<const index_t> targets,
                         const loss_options& options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                         bool backward, vector_view<const float> grad_output) const {
    check_loss_rows(w, hidden.rows, [&](const detail::execution<Backend>& ex) {
      detail::check_hidden_and_targets(ex, w, hidden, self().dim(), targets, self().num_classes(), options.ignore_index);
    }, options, per_sample, grad_hidden, backward, grad_output);
  }

  /// `topk`'s k and its outputs' shapes for `rows` rows.
  void check_topk_outputs(const char* w, index_t rows, index_t k, matrix_view<index_t> classes,
                          matrix_view<float> log_probs) const {
    const index_t n = self().num_classes();
    detail::expects(k >= 1 && k <= n, w, ": k = ", k, " must be in [1, num_classes = ", n, "]");
    detail::check_output(w, "classes", classes, rows, k);
    detail::check_output(w, "log_probs", log_probs, rows, k);
  }

 private:
  [[nodiscard]] const Head& self() const { return static_cast<const Head&>(*this); }
  [[nodiscard]] static std::string where(const char* verb) { return detail::verb_where(Head::head_name, verb); }

  // The checks every head shares, run before any work is queued or any output written: the one
  // validation layer of every head and backend. Data checks (finite hidden values, targets in
  // range) run where the data lives and wait for their answer.

  [[nodiscard]] detail::execution<Backend> checked_execution() const {
    return detail::execution<Backend>{self().resources()};
  }

  /// log_prob ignores nothing: every target must be a class (even one equal to some ignore_index).
  template <class H>
  void check_log_prob_inputs(const char* w, matrix_view<const H> hidden, vector_view<const index_t> targets,
                             vector_view<float> out) const {
    const detail::execution<Backend> ex = checked_execution();
    detail::check_hidden(ex, w, hidden, self().dim());
    detail::check_targets(ex, w, targets, hidden.rows, self().num_classes());
    detail::check_output(w, "out", out, hidden.rows);
  }

  template <class H>
  void check_topk_inputs(const char* w, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                         matrix_view<float> log_probs) const {
    const detail::execution<Backend> ex = checked_execution();
    detail::check_hidden(ex, w, hidden, self().dim());
    check_topk_outputs(w, hidden.rows, k, classes, log_probs);
  }

  template <class H>
  void check_range_inputs(const char* w, matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                          matrix_view<float> out) const {
    const detail::execution<Backend> ex = checked_execution();
    detail::check_hidden(ex, w, hidden, self().dim());
    const index_t n = self().num_classes();
    detail::expects<out_of_range>(class_begin >= 0 && class_begin < class_end && class_end <= n, w,
                                  ": class range [", class_begin, ", ", class_end, ") is empty or outside [0, ", n,
                                  ")");
    detail::check_output(w, "out", out, hidden.rows, class_end - class_begin);
  }

  /// out = -out: `run_` wrote per-sample losses, log_prob wants log-probabilities.
  void negate(vector_view<float> out, bool wait) const {
    const detail::execution<Backend> ex{self().resources()};
    detail::parallel_for(ex, out.size, detail::negate_in_place{out.data});
    if (wait) detail::backend_ops<Backend>::synchronize(self().resources());
  }
};

}  // namespace xsoftmax
