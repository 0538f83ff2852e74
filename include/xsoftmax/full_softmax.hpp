// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax`: the exact softmax cross-entropy over all N classes, the baseline every other head
/// is measured against. The B x N logits matrix is never materialised: scores are produced chunk by
/// chunk of classes and folded into an online log-sum-exp; the backward pass recomputes each chunk
/// that does not fit the score-cache budget (`set_score_cache_bytes`), which can hold every score of
/// a block of rows when the batch is solved in row blocks (`set_row_block`). Peak extra memory is
/// O(B x chunk_size) plus that budget. By default the head picks blocks and budget itself
/// (`training_plan`): on a host backend at most as many kept scores as the weight gradient has
/// entries (N x d), at least 64 MiB.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/class_range_weights.hpp>
#include <xsoftmax/detail/full_softmax_plan.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/sharding/prefetch.hpp>
#include <xsoftmax/detail/weight_store.hpp>
#include <xsoftmax/head_verbs.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax {

/// Exact softmax over `num_classes` classes of a (B x dim) hidden batch:
/// loss_i = logsumexp_c(h_i . w_c + b_c) - (h_i . w_{t_i} + b_{t_i}).
///
/// \tparam Precision `fp32`, `bf16` or `fp16` storage of the weights; arithmetic is fp32.
/// \tparam Backend   `serial`, `omp` (or `cuda` under nvcc).
/// \tparam Sharding  `no_sharding` (all classes here) or `class_sharding<Communicator>`: this
///                   rank holds the classes [class_begin(), class_end()) of num_classes(); every
///                   verb is collective (call it on every rank, in the same order) and gives what
///                   the unsharded head gives — loss, log_prob and top-k over all classes (with
///                   label smoothing, z-loss and angular margins), `grad_hidden` of this rank's rows — with the
///                   weight gradient and `apply_sgd` on the local rows (row 0 = class_begin()).
///                   In the `data_parallel` layout each rank passes its own batch; its weight
///                   gradient is that of the sum over ranks of each rank's reduced loss.
///                   `log_distribution` is not offered sharded yet (it throws `invalid_argument`).
///
/// Every verb validates its inputs first and throws `shape_error`, `out_of_range`,
/// `non_finite_error` or `invalid_argument` naming the argument and value; nothing is changed then.
/// Hidden rows may be any of float/double/bf16/fp16 in the backend's memory.
template <class Precision = fp32, class Backend = serial, class Sharding = no_sharding>
class full_softmax
    : public head_verbs<full_softmax<Precision, Backend, Sharding>, Backend>,
      public detail::class_range_weights<typename Precision::storage_type, Backend, Sharding> {
  using verbs = head_verbs<full_softmax<Precision, Backend, Sharding>, Backend>;
  using weights_base = detail::class_range_weights<typename Precision::storage_type, Backend, Sharding>;
  static constexpr bool sharded = is_class_sharding<Sharding>;
  static_assert(sharded || std::is_same_v<Sharding, no_sharding>,
                "xsoftmax: full_softmax's Sharding must be no_sharding or class_sharding<Communicator>");
  friend verbs;

 public:
  static constexpr const char* head_name = "full_softmax";
  /// Whether `loss_options::label_smoothing`, `z_loss`, `margin` and `softcap` are defined for this head.
  static constexpr bool supports_loss_terms = true;
  /// Whether it takes `loss_options::class_weight` (not class-sharded).
  static constexpr bool supports_class_weight = !sharded;
  /// Whether it takes `loss_options::gradient_filter`.
  static constexpr bool supports_gradient_filter = true;
  using precision_type = Precision;
  using storage_type = typename Precision::storage_type;
  using sharding_type = Sharding;
  using typename verbs::gradient_type;

  /// Owns `num_classes x dim` weights initialised per `init`, and a zero bias when `with_bias`.
  /// Throws `invalid_argument` when a size is not positive.
  full_softmax(index_t num_classes, index_t dim, bool with_bias = false, init_options init = {},
               backend_resources<Backend> resources = {});

  /// Attaches to a caller's `weights` (num_classes x dim) and optional `bias` (num_classes): no copy,
  /// the caller keeps ownership; `apply_sgd` writes into them.
  explicit full_softmax(matrix_view<storage_type> weights, storage_type* bias = nullptr,
                        backend_resources<Backend> resources = {});

  /// Sharded: owns this rank's `sharding.local_classes() x dim` weights, initialised per `init` with
  /// seed `init.seed + rank` (not a slice of the unsharded initialisation), and a zero bias.
  full_softmax(Sharding sharding, index_t dim, bool with_bias = false, init_options init = {},
               backend_resources<Backend> resources = {});
  /// Sharded: attaches to this rank's `local_weights` (local_classes() x dim) and `local_bias`.
  /// Throws `shape_error` when local_weights.rows is not `sharding.local_classes()`.
  full_softmax(Sharding sharding, matrix_view<storage_type> local_weights, storage_type* local_bias = nullptr,
               backend_resources<Backend> resources = {});

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


  /// Classes scored per chunk (0 = automatic: about 32 MiB of fp32 scores per chunk on a host
  /// backend, about 256 MiB and at most 16384 classes on a device; see `training_plan` for the
  /// training verbs' automatic layout on a device).
  void set_chunk_size(index_t classes);
  [[nodiscard]] index_t chunk_size_for(index_t batch_rows) const;

  /// How `forward_backward` and `backward` solve a batch of `batch_rows` packed rows: row block,
  /// score-cache budget (per block) and chunk width. What `set_row_block`, `set_score_cache_bytes`
  /// and `set_chunk_size` set; until either of the first two is called, the head chooses for itself
  /// (`automatic_plan()`, detail/full_softmax_plan.hpp), so that the backward recomputes no score
  /// where memory allows:
  /// * device backends (cuda): every score kept when B x N x 4 bytes fit 2 GiB, else blocks of the
  ///   most rows (a multiple of 256) whose scores fit 2 GiB when that is at least 1024, else one
  ///   block with the 64 MiB cache; 16384-class chunks when a block keeps every score. At
  ///   8192 x 2304 x 256K bf16 on an H200 that is blocks of 2048 rows: 59.8 ms a step in 6.3 GB
  ///   against 85.0 ms in 4.2 GB for one block with the 64 MiB cache (bench/RESULTS.md).
  /// * host backends (serial, omp): every score kept when the batch's scores fit the larger of
  ///   64 MiB and the N x d fp32 weight gradient, else blocks of the most rows (a multiple of 64)
  ///   whose scores fit it, each keeping every score, when that is at least 128 rows; else one
  ///   block with the 64 MiB cache. At B = 1024, N = 1e5 or 1e6, d = 256 that is blocks of 256 rows
  ///   (bench/RESULTS.md, "Full softmax on the CPU: blocks that keep every score").
  /// Class-sharded heads keep one block and the 64 MiB cache unless told otherwise. Forward-only
  /// verbs keep nothing.
  [[nodiscard]] dense_step_plan training_plan(index_t batch_rows) const;
  /// Whether the training verbs' layout is the backend's automatic one (neither `set_row_block`
  /// nor `set_score_cache_bytes` has been called; `use_automatic_plan` returns to it).
  [[nodiscard]] bool automatic_plan() const { return automatic_plan_; }
  /// Returns to the automatic layout: the default row block (0) and cache budget, chosen per call
  /// on a device backend (see `training_plan`).
  void use_automatic_plan();

  /// \name Evaluation: the loss and the top-k from one pass over the scores
  /// `forward(hidden, targets, options, per_sample)` and `topk(hidden, k, classes, log_probs)` in one
  /// call that scores every class once: the top-k is kept from the forward's own score chunks, so
  /// a validation step that wants its loss and its accuracy@k pays one score GEMM (2 B x N x dim
  /// FLOPs), not two. The loss and per-sample losses are the forward's, bitwise. Each row's top-k
  /// (best first, ties: smaller class first) is that of the distribution the loss is taken over:
  /// with `options.softcap` the capped logits' (the order is the uncapped one); label smoothing,
  /// z-loss and class weights change the loss, not the distribution. A row whose target is
  /// `options.ignore_index` is not scored: its `classes` row is -1 and its `log_probs` row -inf.
  /// Checks: those of `forward` and `topk`; `invalid_argument` with an angular margin (its target
  /// logit is not a prediction). A class-sharded head keeps each rank's top-k of its own classes
  /// from its score chunks, then all-gathers and merges the candidates as its `topk` does (the row
  /// statistics are combined once, by the loss): collective, every rank gets its own rows' top-k.
  /// `forward_topk_async` writes the loss to `loss` (1 element, backend memory) and queues the rest
  /// (see the `_async` verbs).
  /// @{
  template <class H>
  float forward_topk(matrix_view<H> hidden, vector_view<const index_t> targets, index_t k,
                     matrix_view<index_t> classes, matrix_view<float> log_probs, loss_options options = {},
                     vector_view<float> per_sample = {}) const;
  template <class H>
  void forward_topk_async(matrix_view<H> hidden, vector_view<const index_t> targets, index_t k,
                          matrix_view<index_t> classes, matrix_view<float> log_probs, vector_view<float> loss,
                          loss_options options = {}, vector_view<float> per_sample = {}) const;
  /// @}

  /// \name Training into a dense weight gradient (unsharded heads)
  /// `forward_backward`, `backward` and their `_async` forms with the weight gradient written into
  /// the caller's `grad_weights` (`dense_gradient<G>`: num_classes x dim, contiguous, G float or
  /// the storage type; the bias gradient as floats, when the head has a bias) instead of a
  /// `sparse_gradient`: the same arguments otherwise, the same loss and `grad_hidden`. With G =
  /// float the weight gradient is bitwise the sparse gradient's values; with G = bf16 / fp16 each
  /// element is rounded to G from its fp32 sum once per row block (`training_plan`; once when the
  /// batch is one block), so a bf16 model needs neither an fp32 N x dim buffer nor a conversion pass.
  /// When every sample is ignored the gradient is zero. Throws `shape_error` for a gradient that is
  /// not num_classes x dim with stride dim, or a bias that is not num_classes floats (or not empty
  /// for a head without a bias); `invalid_argument` for a null pointer. Nothing is written then.
  /// @{
  template <class H, class G>
  float forward_backward(matrix_view<H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                         dense_gradient<G> grad_weights, loss_options options = {},
                         vector_view<float> per_sample = {}, vector_view<const float> grad_output = {}) const;
  template <class H, class G>
  void backward(matrix_view<H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                dense_gradient<G> grad_weights, loss_options options = {},
                vector_view<const float> grad_output = {}) const;
  template <class H, class G>
  void forward_backward_async(matrix_view<H> hidden, vector_view<const index_t> targets,
                              matrix_view<float> grad_hidden, dense_gradient<G> grad_weights, vector_view<float> loss,
                              loss_options options = {}, vector_view<float> per_sample = {},
                              vector_view<const float> grad_output = {}) const;
  template <class H, class G>
  void backward_async(matrix_view<H> hidden, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                      dense_gradient<G> grad_weights, loss_options options = {},
                      vector_view<const float> grad_output = {}) const;
  /// @}

  /// \name Prefetch (class-sharded heads): the next micro-batch's gather while this one computes
  /// `auto next = head.gather_rows_async(hidden_next);` starts gathering `hidden_next`'s rows from
  /// every rank (data-parallel layout: the communicator's `start_all_gather`, see
  /// class_sharding.hpp; replicated: nothing to move) and returns at once with a `gathered_batch`;
  /// the current batch's verbs run meanwhile; then `head.forward_backward(next, targets, ...)`
  /// (or `forward`, `backward`, `log_prob`, `topk`, `forward_topk`) scores the gathered rows
  /// without gathering them again: the same arguments as the verb taking `hidden`, the same results
  /// bit for bit.
  /// Collective, as every verb: every rank starts and uses its batches in the same order. The
  /// targets (and upstream gradients) are gathered by the verb, blocking (a few bytes a row).
  /// `gather_rows_async` checks `hidden` as the verbs do; the verbs throw `invalid_argument` for a
  /// batch gathered by another head, used already, moved from or default-constructed, and
  /// `shape_error` when `targets` (or an output) does not have `next.rows()` rows. A training loop:
  ///
  ///     auto next = head.gather_rows_async(h[0]);
  ///     for (int s = 0; s < steps; ++s) {
  ///       auto current = std::move(next);
  ///       if (s + 1 < steps) next = head.gather_rows_async(h[s + 1]);  // moves while `current` computes
  ///       head.forward_backward(current, t[s], grad_h, grad_w);
  ///       head.apply_sgd(grad_w, lr);
  ///     }
  ///
  /// The overlap is the transport's: NCCL runs the gather on its own stream; OpenMPI over shared
  /// memory moves a started gather only inside MPI calls (the verb's own collectives), so the copy
  /// is not hidden behind the GEMMs; over TCP with `btl_tcp_progress_thread 1` it is (bench/RESULTS.md,
  /// "Prefetching the next micro-batch's rows" and "Overlap with a transport that progresses by
  /// itself"). The step gets faster only where the transport's copies do not take the ranks' cores.
  /// @{
  using gathered_batch = xsoftmax::gathered_batch<Backend, typename detail::communicator_of<Sharding>::type>;
  template <class H>
  [[nodiscard]] gathered_batch gather_rows_async(matrix_view<H> hidden) const;
  using verbs::backward;
  using verbs::backward_async;
  using verbs::forward;
  using verbs::forward_backward;
  using verbs::forward_backward_async;
  using verbs::log_prob;
  using verbs::topk;
  float forward(gathered_batch& rows, vector_view<const index_t> targets, loss_options options = {},
                vector_view<float> per_sample = {}) const;
  float forward_backward(gathered_batch& rows, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                         gradient_type& grad_weights, loss_options options = {}, vector_view<float> per_sample = {},
                         vector_view<const float> grad_output = {}) const;
  void backward(gathered_batch& rows, vector_view<const index_t> targets, matrix_view<float> grad_hidden,
                gradient_type& grad_weights, loss_options options = {},
                vector_view<const float> grad_output = {}) const;
  void log_prob(gathered_batch& rows, vector_view<const index_t> targets, vector_view<float> out) const;
  void topk(gathered_batch& rows, index_t k, matrix_view<index_t> classes, matrix_view<float> log_probs) const;
  float forward_topk(gathered_batch& rows, vector_view<const index_t> targets, index_t k, matrix_view<index_t> classes,
                     matrix_view<float> log_probs, loss_options options = {},
                     vector_view<float> per_sample = {}) const;
  /// @}
  /// The default score-cache budget of `set_score_cache_bytes`: 64 MiB.
  static constexpr index_t default_score_cache_bytes = index_t(64) << 20;
  /// Workspace (bytes) that `forward_backward` and `backward` may spend keeping the first pass's
  /// scores for the second: chunks of batch_rows x chunk_size fp32 scores are kept in class order
  /// while each fits what is left of the budget, and the backward pass takes them instead of
  /// recomputing them (one GEMM of 2 B x chunk x dim FLOPs saved per chunk kept); the rest are recomputed. The
  /// results are bitwise the same at every budget. A budget of B x num_classes x 4 bytes or more keeps
  /// every score (then no separate chunk buffer is needed either); 0 keeps none, the lowest memory.
  /// Until it or `set_row_block` is called the head's automatic layout chooses the budget
  /// (`training_plan`); after `use_automatic_plan` the setting reads `default_score_cache_bytes`
  /// (on cuda, device memory). Forward-only verbs keep nothing. The budget is per row block when
  /// the batch is solved in blocks (`set_row_block`). A class-sharded head keeps its own columns'
  /// scores (the budget is per rank). Setting it ends the automatic layout (`training_plan`).
  /// Throws `invalid_argument` when `bytes` < 0.
  void set_score_cache_bytes(index_t bytes);
  [[nodiscard]] index_t score_cache_bytes() const { return score_cache_bytes_; }

  /// Packed rows that `forward_backward` and `backward` solve together (0, the default: the whole
  /// batch at once). With blocks of R rows each block is a complete softmax over every class (its
  /// own log-sum-exp, losses and hidden-gradient rows) and its weight (and bias) gradient is added
  /// to the earlier blocks'. Paired with a score cache that holds a block's every score
  /// (`keep_scores_in_row_blocks` sets both), the backward pass recomputes nothing: it saves
  /// one of the step's four GEMMs (2 B x N x dim FLOPs) and pays one more read and write of the
  /// N x dim fp32 weight gradient per extra block. That pays while R is above about 4 F / W rows
  /// for a GEMM rate F and memory bandwidth W: tens of rows on a CPU, about a thousand on an H100
  /// (bench/RESULTS.md, "Row blocks"). A block's chunks are sized for its rows (`chunk_size_for`)
  /// and the weight gradient's sums over rows are grouped by block: results are within rounding of,
  /// not bitwise, those without blocks. Not used by forward-only verbs or class-sharded heads.
  /// Setting it ends the automatic layout (`training_plan`).
  /// Throws `invalid_argument` when `rows` < 0.
  void set_row_block(index_t rows);
  [[nodiscard]] index_t row_block() const { return row_block_; }
  /// `set_row_block(rows)` with the score cache that keeps every score of a block:
  /// `set_score_cache_bytes(rows * local classes * 4)` (0 rows: one block, no cache). The backward
  /// then recomputes nothing. Throws `invalid_argument` when `rows` < 0 (nothing changed).
  void keep_scores_in_row_blocks(index_t rows);

  // The verbs (forward, forward_backward, backward, log_prob, topk, log_distribution, their `_async`
  // forms, apply_sgd) are head_verbs'. What is particular to this head:
  // * forward_backward / backward: `grad_weights` receives every class (the exact softmax touches
  //   all of them), or no row when every sample is ignored.
  // * `_async` on cuda: the blocking verb's path without its final wait. It still waits for the
  //   stream twice before the GEMMs (the data checks, finite `hidden` values and targets in range
  //   in one scan, and the count of kept rows, which sizes the call's buffers:
  //   tests/heads/call_cost_test.cpp counts them), once more to check `options.class_weight` and
  //   once more to read a scalar `grad_output`; after that nothing waits, unless
  //   `options.gradient_filter` is set: its backward then reads back each chunk's count of kept
  //   classes (which sizes that chunk's GEMMs), a wait per chunk. The first call of a
  //   batch size may grow the workspace and create the cuBLAS handle, and resizing a
  //   `sparse_gradient` allocates (a `dense_gradient` is the caller's memory).

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

  /// A dense weight gradient, handed to `run_into_`: fp32 `weights`, or `storage_weights` in the
  /// storage type (bf16 / fp16 heads); `bias` (fp32) or null.
  struct dense_outputs {
    float* weights = nullptr;
    storage_type* storage_weights = nullptr;
    float* bias = nullptr;
  };
  template <class G>
  [[nodiscard]] dense_outputs check_dense_gradient_(const char* where, dense_gradient<G> g) const;
  /// The dense-gradient verbs' body: the gradient's checks, the loss checks, the step (`loss`: the
  /// reduced loss, backend memory, or null).
  template <class H, class G>
  void run_dense_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                  const loss_options& options, vector_view<float> per_sample, matrix_view<float> grad_hidden,
                  dense_gradient<G> grad_weights, vector_view<const float> grad_output, float* loss) const;

  /// `forward_topk`'s outputs, handed to `run_into_`.
  struct topk_outputs {
    index_t k;
    matrix_view<index_t> classes;
    matrix_view<float> log_probs;
  };
  template <class H>
  void run_into_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                 loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                 gradient_type* grad_weights, vector_view<const float> grad_output, float* loss,
                 const topk_outputs* topk = nullptr, const dense_outputs* dense = nullptr) const;
  template <class H>
  void check_forward_topk_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                           index_t k, matrix_view<index_t> classes, matrix_view<float> log_probs,
                           const loss_options& options, vector_view<float> per_sample) const;
  /// forward_topk's checks that read no data: k and the outputs' shapes for `rows` rows, no margin.
  void check_topk_without_margin_(const char* where, index_t rows, index_t k, matrix_view<index_t> classes,
                                  matrix_view<float> log_probs, const loss_options& options) const;
  template <class H>
  void topk_into_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                  matrix_view<float> log_probs) const;
  template <class H>
  void log_distribution_into_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                              matrix_view<float> out) const;

  template <class H>
  void run_sharded_into_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                         loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                         gradient_type* grad_weights, vector_view<const float> grad_output, float* loss,
                         const topk_outputs* topk = nullptr) const;
  void run_gathered_(detail::sharded_rows<Backend>& rows, const detail::batch_rows<Backend>& own, loss_options options,
                     vector_view<float> per_sample, matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                     float* loss, const topk_outputs* topk = nullptr) const;
  void topk_gathered_(detail::sharded_rows<Backend>& rows, index_t own_rows, index_t k, matrix_view<index_t> classes,
                      matrix_view<float> log_probs) const;
  void merge_topk_candidates_(const detail::sharded_rows<Backend>& rows, index_t own_rows,
                              detail::basic_row_topk_state<Backend>& best, const float* row_lse, index_t k,
                              matrix_view<index_t> classes, matrix_view<float> log_probs,
                              const index_t* own_sample) const;
  float run_prefetched_(const char* where, gathered_batch& g, vector_view<const index_t> targets, loss_options options,
                        vector_view<float> per_sample, matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                        vector_view<const float> grad_output, const topk_outputs* topk = nullptr) const;
  [[nodiscard]] detail::gathered_state<Backend, typename detail::communicator_of<Sharding>::type>& usable_(
      const char* where, const gathered_batch& g) const;
  void check_prefetched_loss_(const char* where, const gathered_batch& g, vector_view<const index_t> targets,
                              const loss_options& options, vector_view<float> per_sample,
                              matrix_view<float>* grad_hidden, bool backward,
                              vector_view<const float> grad_output) const;
  template <class H>
  void topk_sharded_into_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                          matrix_view<float> log_probs) const;

  using weights_base::resources_;
  using weights_base::sharding_;
  using weights_base::store_;
  index_t chunk_size_ = 0;
  index_t score_cache_bytes_ = default_score_cache_bytes;
  index_t row_block_ = 0;
  bool automatic_plan_ = true;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/full_softmax.inl>
#include <xsoftmax/detail/full_softmax_sharded.inl>
#include <xsoftmax/detail/full_softmax_prefetch.inl>
