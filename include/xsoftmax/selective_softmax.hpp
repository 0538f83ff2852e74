// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `selective_softmax`: a softmax cross-entropy computed over a small *active set* of classes that
/// a selector chooses for each batch and that always holds the batch's targets. A step reads and
/// produces gradients for the active rows only. With every class active it is the full softmax.
///
/// Selectors (see `selection/selection_types.hpp` for the concept): `explicit_candidates`,
/// `sampled_negatives` (with the log-Q correction of TensorFlow's `sampled_softmax_loss`),
/// `knn_selector` (Alibaba's KNN softmax, see `knn_softmax.hpp`), `feature_query_selector` (each
/// sample's top-K classes, exact or through an IVF index).
///
/// A shared active set (one sorted class list per batch) is scored with one GEMM per chunk of
/// classes against the packed batch, as the full softmax scores its chunks (a chunk whose classes
/// are a contiguous range is read in place; others are gathered into an fp32 block first). A
/// per-sample active set is scored row by row with gather-dot, and its weight gradient rows, touched
/// by many samples, are summed with the deterministic sparse accumulation (no atomics).
///
/// Class-sharded (`Sharding = class_sharding<Communicator>`): every rank runs the selector on the
/// same gathered batch, so every rank has the same global active set; each rank scores the active
/// classes of its own range, and the rows' statistics are combined as the sharded `full_softmax`
/// combines them (one max and one sum all-reduce). See `selective_softmax`'s `Sharding`.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/class_range_weights.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/weight_store.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/head_verbs.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/selection/selection_types.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <type_traits>

namespace xsoftmax {

/// Softmax over a per-batch active set of classes of a (B x dim) hidden batch:
/// loss_i = logsumexp_{c in A_i}(h_i . w_c + b_c + o_ic) - (h_i . w_{t_i} + b_{t_i} + o_it),
/// where A_i (which contains t_i) and the logit offsets o (e.g. -log Q(c) for sampled negatives)
/// come from `Selector`.
///
/// \tparam Selector  a type satisfying the selector concept of `selection/selection_types.hpp`.
/// \tparam Precision `fp32`, `bf16` or `fp16` weight storage; arithmetic is fp32.
/// \tparam Backend   `serial`, `omp` (or `cuda` under nvcc). The algorithm is one for every
///                   backend; on cuda the active set lives in device memory (see `active_set_for`).
/// \tparam Sharding  `no_sharding` (all classes here) or `class_sharding<Communicator>`: this rank
///                   holds the classes [class_begin(), class_end()); every verb is collective (every
///                   rank calls it, in the same order) and gives what the unsharded head gives on
///                   the concatenated batch (data_parallel layout: rank 0's rows, then rank 1's, ...;
///                   replicated: the batch). The selector runs on every rank on that whole batch
///                   with the same state, so it must be the same on every rank (same seed and step,
///                   same explicit candidates; per-sample candidates are indexed by the sample's
///                   position in the concatenated batch, ignored samples included). Its request
///                   carries no weights (`weights` is empty, `bias` null), so a selector that scores
///                   the weights (`feature_query_selector`) is not offered sharded (compile error).
///                   The loss (label smoothing over the row's active set, z-loss, margins, logit
///                   offsets) and `grad_hidden` of this rank's rows are those of the unsharded head;
///                   `grad_weights` holds the active classes of the local range as local rows
///                   (class - class_begin(), ascending), the gradient of the sum over ranks of each
///                   rank's reduced loss; `apply_sgd` updates the local rows. `topk` and `log_prob`
///                   (over the active set, as unsharded) work sharded; `log_distribution` throws
///                   `invalid_argument` as the sharded `full_softmax` does. `next_step` of a selector
///                   whose step reads the weights gathers the whole matrix (N x dim, transiently; the KNN
///                   selector's exact build goes round a ring instead: see `knn_softmax`)
///                   for that step, unless its `next_step_rebuilds()` says the step does not read
///                   them (the KNN selector: only its scheduled rebuilds gather); see `knn_softmax`.
///
/// Every verb validates its inputs first and throws `shape_error`, `out_of_range`,
/// `non_finite_error` or `invalid_argument` naming the argument and value; selectors add their own
/// checks (k against N, a graph built for another head). Nothing is changed then. A selector that
/// returns a malformed active set (unsorted, a class out of range, a target missing) makes the verb
/// throw `invalid_argument` / `out_of_range`.
template <class Selector, class Precision = fp32, class Backend = serial, class Sharding = no_sharding>
class selective_softmax
    : public head_verbs<selective_softmax<Selector, Precision, Backend, Sharding>, Backend>,
      public detail::class_range_weights<typename Precision::storage_type, Backend, Sharding> {
  using verbs = head_verbs<selective_softmax<Selector, Precision, Backend, Sharding>, Backend>;
  using weights_base = detail::class_range_weights<typename Precision::storage_type, Backend, Sharding>;
  static constexpr bool sharded = is_class_sharding<Sharding>;
  static_assert(sharded || std::is_same_v<Sharding, no_sharding>,
                "xsoftmax: selective_softmax's Sharding must be no_sharding or class_sharding<Communicator>");
  static_assert(!sharded || !detail::selector_scores_weights<Selector>,
                "xsoftmax: this selector scores the weights in select (feature_query_selector): not offered sharded");
  friend verbs;

 public:
  static constexpr const char* head_name = "selective_softmax";
  /// Whether `loss_options::label_smoothing`, `z_loss`, `margin` and `softcap` are defined for this head.
  static constexpr bool supports_loss_terms = true;
  /// Whether it takes `loss_options::class_weight` (not class-sharded).
  static constexpr bool supports_class_weight = !sharded;
  /// Whether it takes `loss_options::gradient_filter`.
  static constexpr bool supports_gradient_filter = false;
  using selector_type = Selector;
  using precision_type = Precision;
  using storage_type = typename Precision::storage_type;
  using sharding_type = Sharding;
  using typename verbs::gradient_type;

  /// Owns `num_classes x dim` weights initialised per `init` (a zero bias when `with_bias`) and
  /// `selector`. Throws `invalid_argument` when a size is not positive.
  selective_softmax(Selector selector, index_t num_classes, index_t dim, bool with_bias = false,
                    init_options init = {}, backend_resources<Backend> resources = {});

  /// Attaches to a caller's `weights` (num_classes x dim) and optional `bias` (num_classes); no copy.
  selective_softmax(Selector selector, matrix_view<storage_type> weights, storage_type* bias = nullptr,
                    backend_resources<Backend> resources = {});

  /// Sharded: owns this rank's `sharding.local_classes() x dim` weights, initialised per `init` with
  /// seed `init.seed + rank`, and a zero bias when `with_bias`.
  selective_softmax(Selector selector, Sharding sharding, index_t dim, bool with_bias = false, init_options init = {},
                    backend_resources<Backend> resources = {});
  /// Sharded: attaches to this rank's `local_weights` (local_classes() x dim) and `local_bias`.
  /// Throws `shape_error` when local_weights.rows is not `sharding.local_classes()`.
  selective_softmax(Selector selector, Sharding sharding, matrix_view<storage_type> local_weights,
                    storage_type* local_bias = nullptr, backend_resources<Backend> resources = {});

  // The class range's accessors, documented in detail/class_range_weights.hpp (named here because
  // a dependent base's members are not found by unqualified names in the head's own code).
  using weights_base::bias;
  using weights_base::class_begin;
  using weights_base::dim;
  using weights_base::has_bias;
  using weights_base::local_classes;
  using weights_base::num_classes;
  using weights_base::resources;
  using weights_base::sharding;
  using weights_base::weights;
  /// The selector (mutable: set explicit candidates, swap a graph, set the sampling step).
  [[nodiscard]] Selector& selector() { return selector_; }
  [[nodiscard]] const Selector& selector() const { return selector_; }

  /// Classes of a shared active set scored per chunk (0 = automatic, as `full_softmax`).
  void set_chunk_size(index_t classes);
  /// The chunk used for `batch_rows` rows and a shared active set of `active` classes.
  [[nodiscard]] index_t chunk_size_for(index_t batch_rows, index_t active) const;

  /// The active set the selector produces for this batch (rows: the non-ignored samples, packed),
  /// after the head's checks. For inspection: the other verbs call the selector themselves.
  /// Sharded: collective; the global active set of the gathered batch (global class ids).
  template <class H>
  void select(matrix_view<const H> hidden, vector_view<const index_t> targets, active_set_for<Backend>& out,
              index_t ignore_index = loss_options{}.ignore_index) const;

  // The verbs (forward, forward_backward, backward, log_prob, topk, log_distribution, their `_async`
  // forms, apply_sgd) are head_verbs'. What is particular to this head: the loss is the softmax over
  // the step's active set (which always holds the targets), and `grad_weights` holds the active
  // rows; `topk` and `log_distribution` score every class (the exact full softmax's answer).

  /// Ends a training step: calls the selector's step hook (a new draw of sampled negatives, a KNN
  /// graph or IVF index rebuild when due), if it has one. Sharded: collective.
  void next_step();

 protected:
  /// Calls `f(matrix_view<const storage_type>, const knn_build_share*)` with every class's weights:
  /// the head's own unsharded (and a null share); sharded, this rank's share of a graph build with
  /// the local rows when the communicator has the ring step and the selector builds in shares (see
  /// `knn_build_share`), else the whole matrix gathered from the ranks (collective; N x dim x
  /// (4 + sizeof(storage)) bytes on every rank while `f` runs) and the gathered-weights share.
  template <class F>
  void with_all_weights_(F f) const;

 private:
  template <class H>
  float run_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
            loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
            gradient_type* grad_weights, vector_view<const float> grad_output) const;
  template <class H>
  void topk_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes, matrix_view<float> log_probs,
             exact_search) const;
  template <class H>
  void log_distribution_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                         matrix_view<float> out) const;
  template <class H>
  void topk_async_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                   matrix_view<float> log_probs, exact_search) const;
  template <class H>
  void log_distribution_async_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                               matrix_view<float> out) const;
  template <class H>
  void run_async_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                  loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                  gradient_type* grad_weights, vector_view<const float> grad_output, float* loss) const;
  template <class H>
  void run_into_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                 loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                 gradient_type* grad_weights, vector_view<const float> grad_output, float* loss) const;
  [[nodiscard]] selection_request<storage_type> request_(const char* where, const detail::batch_rows<Backend>& batch,
                                                         index_t batch_rows) const;
  template <class H>
  void run_sharded_into_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                         loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                         gradient_type* grad_weights, vector_view<const float> grad_output, float* loss) const;
  /// The full softmax over the same (local) weights: prediction scores every class.
  [[nodiscard]] full_softmax<Precision, Backend, Sharding> full_() const;

  using weights_base::resources_;
  using weights_base::sharding_;
  using weights_base::store_;
  Selector selector_;
  index_t chunk_size_ = 0;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/selective_softmax.inl>
#include <xsoftmax/detail/sharding/sharded_selective_softmax.inl>
