// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sharded_hierarchical_softmax`: a hierarchical softmax split across the ranks of a communicator
/// by an `hs_shard_plan` — the top tree replicated, each subtree on one rank — with data-parallel
/// rows (each rank passes its own batch).
///
/// A step, on every rank (the loss factorises at the frontier: see hs_shard_plan.hpp):
///  1. the top tree's head runs on the rank's own rows (targets mapped to their top leaves);
///  2. each row whose target lies below the frontier goes to the owner of its subtree
///     (`all_to_all`; started one micro-batch ahead by `route_rows_async`), then its class in the
///     owner's forest of subtrees and its upstream gradient (two small `all_to_all`s);
///  3. the owner runs the rows it received through one head over all of its subtrees (a forest:
///     `hs_shard_plan::local_forest`; calls of a few dozen rows, see the cost), each row scored in
///     its own subtree only (reduction none);
///  4. the per-row losses and hidden gradients go back (the reverse `all_to_all`) and are added to
///     the top part's; the top tree's weight gradient is summed over the ranks (rank order), so the
///     replicas receive the same update.
/// Everything but the sums is data movement, so the result equals the unsharded head's up to the
/// order of floating-point additions, and repeated runs are bitwise equal. `log_prob` routes the
/// same way; `topk` is an exact search in two routed rounds (see its documentation).
///
/// Traffic per step: each routed row's hidden vector and upstream gradient out (plus one index),
/// in four all-to-alls (row counts, hidden rows, indices, upstream gradients),
/// its loss and hidden gradient back, and an all-reduce over the union of the ranks' touched top
/// rows (`mpi_communicator` sums in rank order: S times the data, see mpi_communicator.hpp).
///
/// Cost: the rows a rank receives go through one head over all of its subtrees (`local_head()`,
/// a forest) in calls of whole subtrees of at least `rows_per_call()` rows (default: 32 KiB of
/// hidden rows). Not one call per subtree, as the first version did: each call's fixed cost
/// (packing, sorting, planning its rows) added up when a rank owns many subtrees with few rows
/// each; nor one call for all of them, which walks the tree level by level over every row (at
/// d = 256, 2.6k rows per rank, slower than a call per subtree: presumably the rows leave the
/// core's caches between levels). Measured on 2 ranks over a 1M-class Huffman tree cut into 653 to
/// 2217 subtrees, d = 128 and 256: the subtrees' compute per step 20 to 39 % below the first
/// version's (bench/RESULTS.md, "one head call per rank"). `topk` is one search call per round on
/// the owner, each row started at its subtree's root. On a GPU (cuda backend) the default is one
/// call for all the received rows.
///
/// Memory: the verbs take and return the backend's memory, as every head's. The routing's
/// bookkeeping (which row goes to which rank, row counts, each routed row's class and upstream
/// gradient: a few bytes a row) is done on the host; hidden rows, losses and gradients stay in the
/// backend's memory and are handed to a device-memory communicator (`nccl_communicator`) as they
/// are, or staged through host copies for a host-memory one (`mpi_communicator` on cuda).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/sharding/prefetch.hpp>
#include <xsoftmax/detail/sharding/routing.hpp>
#include <xsoftmax/detail/sharding/sharded_rows.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/sharding/hs_shard_plan.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/types.hpp>

#include <utility>
#include <vector>

namespace xsoftmax {

namespace detail {
/// What a routed step computes: losses, losses and gradients, or log-probabilities.
enum class hs_route_mode { forward, train, log_prob };
/// A top-k search request: the best classes of subtree `subtree` for row `row`, whose top-tree
/// log-probability of that subtree is `base`.
struct hs_topk_request {
  index_t row = 0, subtree = 0;
  float base = 0.f;
};
/// (log-probability, class) candidates of each row.
using hs_topk_candidates = std::vector<std::vector<std::pair<float, index_t>>>;
}  // namespace detail

/// Hierarchical softmax over the full tree of `plan`, sharded across `Communicator`'s ranks (see
/// the file comment).
///
/// \tparam Communicator `mpi_communicator`, `solo_communicator`, `nccl_communicator` (cuda backend;
///                      see class_sharding.hpp).
/// \tparam NodeForm     `softmax_nodes` or `sigmoid_nodes` (the plan's).
/// \tparam Precision    `fp32`, `bf16`, `fp16` weight storage (only fp32 is tested).
/// \tparam Backend      `serial`, `omp` or `cuda` (under nvcc).
/// \tparam MaxDepth     the plan's trees' depth bound.
///
/// Weights: the replicated top tree's (`plan.top_rows()`, in that order) and this rank's local rows
/// (`plan.local_rows(rank)`), both as views into the caller's buffers (no copy). Gradients: two
/// sparse gradients, `grad_top` (top-tree rows, summed over every rank's batch, identical on every
/// rank) and `grad_local` (local rows, from every rank's rows routed here).
///
/// Not offered yet: `backward` alone, `log_distribution`, the replicated hidden layout, the
/// `_async` verbs, `topk` of prefetched rows, hidden rows other than fp32.
template <class Communicator, class NodeForm = softmax_nodes, class Precision = fp32, class Backend = serial,
          int MaxDepth = 64>
class sharded_hierarchical_softmax {
  static_assert(!detail::takes_device_memory<Communicator> || !is_host_backend<Backend> ||
                    detail::device_communicator_on_host<Communicator>,
                "xsoftmax: a device-memory communicator (nccl_communicator) needs a device backend (cuda)");

 public:
  /// The prefix of every message a verb throws.
  static constexpr const char* head_name = "sharded_hierarchical_softmax";
  using plan_type = hs_shard_plan<MaxDepth, NodeForm>;
  using tree_type = runtime_tree<MaxDepth>;
  using head_type = hierarchical_softmax<tree_type, Precision, Backend, NodeForm>;
  using storage_type = typename head_type::storage_type;
  using gradient_type = typename head_type::gradient_type;

  /// Attaches to the caller's `top_weights` (plan.top_rows().size() x dim) and `local_weights`
  /// (plan.local_rows(rank).size() x dim) and optional biases (both or neither). Throws
  /// `invalid_argument` when the communicator's size is not `plan.ranks()` or only one bias is
  /// given, `shape_error` when a weight view has the wrong number of rows or the two widths differ.
  sharded_hierarchical_softmax(plan_type plan, Communicator communicator, matrix_view<storage_type> top_weights,
                               matrix_view<storage_type> local_weights, storage_type* top_bias = nullptr,
                               storage_type* local_bias = nullptr, backend_resources<Backend> resources = {});

  /// The plan (a copy of the constructor's).
  [[nodiscard]] const plan_type& plan() const { return plan_; }
  /// This rank, and the number of ranks.
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return plan_.ranks(); }
  /// Classes of the full tree (targets and top-k classes are its class ids).
  [[nodiscard]] index_t num_classes() const { return plan_.num_classes(); }
  /// Width of the hidden rows and of every weight row.
  [[nodiscard]] index_t dim() const { return top_.dim(); }
  /// The replicated top tree's head (weights: `plan().top_rows()`).
  [[nodiscard]] const head_type& top_head() const { return top_; }
  /// The head over this rank's subtrees as one forest (`plan().local_forest(rank())`; weights: the
  /// local rows). Its classes are the subtrees' classes (`plan().local_class_offset(s)` + the
  /// class in subtree s); it scores each row in its own subtree.
  [[nodiscard]] const head_type& local_head() const { return local_; }
  /// Rows per call of `local_head()` in a step: whole subtrees, until a call has at least this
  /// many rows (see the file comment's cost). Default on a host backend max(1, 8192 / dim): 32 KiB
  /// of hidden rows; on a device backend the largest index_t (one call).
  /// The results do not depend on it (each row is scored alone in its subtree); for benchmarking
  /// and tests. `set_rows_per_call` throws `invalid_argument` when rows < 1.
  [[nodiscard]] index_t rows_per_call() const { return rows_per_call_; }
  void set_rows_per_call(index_t rows) {
    detail::expects(rows >= 1, head_name, "::set_rows_per_call: rows = ", rows, " must be >= 1");
    rows_per_call_ = rows;
  }
  /// The communicator (collectives are not const: they change the transport's state).
  [[nodiscard]] Communicator& communicator() const { return comm_; }

  /// Per-sample negative log-likelihood of this rank's batch (B x dim hidden, B targets), reduced
  /// per `options` (mean, sum, none; `ignore_index`) over this rank's rows, as
  /// `hierarchical_softmax::forward`. Collective: every rank calls it, with its own batch of at
  /// least one row. Bad input throws (`shape_error`, `out_of_range`, `non_finite_error`,
  /// `invalid_argument`, naming the argument) before the first collective; a rank that throws
  /// leaves the others waiting in it, as for every sharded head (see class_sharding.hpp).
  float forward(matrix_view<const float> hidden, vector_view<const index_t> targets, loss_options options = {},
                vector_view<float> per_sample = {}) const {
    return run_(detail::hs_route_mode::forward, hidden, targets, options, per_sample, nullptr, nullptr, nullptr, {},
                nullptr);
  }

  /// `forward` with the gradients: `grad_hidden` (B x dim, this rank's rows) is overwritten;
  /// `grad_top` gets the top tree's touched rows (ascending), of the sum over every rank's loss,
  /// the same on every rank; `grad_local` this rank's local rows touched by any rank's rows (each
  /// once; in the order of `local_head()`'s calls, see the file comment's cost). `grad_output` as
  /// in `hierarchical_softmax::forward_backward`.
  float forward_backward(matrix_view<const float> hidden, vector_view<const index_t> targets,
                         matrix_view<float> grad_hidden, gradient_type& grad_top, gradient_type& grad_local,
                         loss_options options = {}, vector_view<float> per_sample = {},
                         vector_view<const float> grad_output = {}) const {
    return run_(detail::hs_route_mode::train, hidden, targets, options, per_sample, &grad_hidden, &grad_top,
                &grad_local, grad_output, nullptr);
  }

  /// log p(targets[i] | hidden[i]) of this rank's rows into `out` (B entries); every target must
  /// be a class. Collective.
  void log_prob(matrix_view<const float> hidden, vector_view<const index_t> targets, vector_view<float> out) const;

  /// \name Prefetch: the next micro-batch's routing while this one computes (issue 14)
  /// `auto next = head.route_rows_async(hidden_next, targets_next);` sends `hidden_next`'s rows to
  /// the owners of their targets' subtrees (the row counts blocking, the rows with the
  /// communicator's `start_all_to_all` when it has one: MPI `MPI_Ialltoallv`; else at once) and
  /// returns with a `routed_batch`; the current batch's verbs run meanwhile; then
  /// `head.forward_backward(next, grad_hidden, grad_top, grad_local, ...)` (or `forward`,
  /// `log_prob`) scores the routed rows: the arguments of the verb taking `hidden` and `targets`
  /// less those two, the same results bit for bit. The rows are routed before the verb's
  /// `ignore_index` is known, so every row whose target is a class below the frontier travels;
  /// the verb sends, blocking, each routed row's class (or "ignored") and upstream gradient (a few
  /// bytes a row). Collective, as every verb: every rank routes and uses its batches in the same
  /// order. `route_rows_async` checks `hidden`'s shape and values and `targets`' size; a target
  /// out of range is reported by the verb (as by the verb taking `targets`), which also throws
  /// `invalid_argument` for a batch routed by another head, used already, moved from or
  /// default-constructed, and `shape_error` for an output without `next.rows()` rows. As for the
  /// full softmax's `gather_rows_async`, the overlap is the transport's: OpenMPI over shared memory
  /// progresses a started exchange only inside MPI calls, over TCP with `btl_tcp_progress_thread 1`
  /// by itself (bench/RESULTS.md, the sharded HS's prefetch, and "Overlap with a transport that
  /// progresses by itself"); with NCCL (no `start_all_to_all`) the routing runs at once.
  /// @{
  using routed_batch = xsoftmax::routed_batch<Backend, Communicator>;
  [[nodiscard]] routed_batch route_rows_async(matrix_view<const float> hidden, vector_view<const index_t> targets) const;
  float forward(routed_batch& rows, loss_options options = {}, vector_view<float> per_sample = {}) const;
  float forward_backward(routed_batch& rows, matrix_view<float> grad_hidden, gradient_type& grad_top,
                         gradient_type& grad_local, loss_options options = {}, vector_view<float> per_sample = {},
                         vector_view<const float> grad_output = {}) const;
  void log_prob(routed_batch& rows, vector_view<float> out) const;
  /// @}

  /// weights -= lr * gradient for the replicated top tree (`grad_top`, identical on every rank,
  /// so the replicas stay equal) and this rank's local rows (`grad_local`), as the two gradients
  /// of `forward_backward` give them. Both are checked before anything changes (rows in range and
  /// unique, shapes, finite values; `lr` finite): `out_of_range`, `shape_error`,
  /// `non_finite_error`, `invalid_argument`. Local: no collective.
  void apply_sgd(const gradient_type& grad_top, const gradient_type& grad_local, float lr);

  /// The k most probable classes of each of this rank's rows, best first (ties: smaller class
  /// first), and their log-probabilities; `classes` and `log_probs` are B x k. Exact, in two
  /// rounds: the top tree's best min(k, top classes) leaves are explored (their subtrees searched
  /// by their owners), then every other top leaf whose log-probability reaches the k-th best found
  /// (a class below it cannot beat its subtree's root). Throws `invalid_argument` unless
  /// 1 <= k <= num_classes, `shape_error` for outputs of the wrong shape. Collective.
  void topk(matrix_view<const float> hidden, index_t k, matrix_view<index_t> classes,
            matrix_view<float> log_probs) const;

 private:
  float run_(detail::hs_route_mode mode, matrix_view<const float> hidden, vector_view<const index_t> targets,
             loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
             gradient_type* grad_top, gradient_type* grad_local, vector_view<const float> grad_output,
             detail::hs_routed_state<Backend, Communicator>* pre) const;
  /// Step 4 of the routed step: the received rows through `local_` (see its definition).
  void score_subtrees_(detail::hs_route_mode mode, const backend_vector<Backend, float>& recv_h,
                       const std::vector<index_t>& recv_i, const std::vector<float>& recv_up,
                       detail::scratch_vector<Backend, float>& reply, gradient_type* grad_local) const;
  void route_(detail::hs_routed_state<Backend, Communicator>& st, matrix_view<const float> hidden,
              const std::vector<index_t>& targets, bool can_ignore, index_t ignore_index, bool start) const;
  /// The state of `rows` when this head may use it (see the prefetch verbs), marked used.
  detail::hs_routed_state<Backend, Communicator>& take_(const char* where, routed_batch& rows) const;
  /// Sends each request's row to its subtree's owner, which searches the subtree's best k classes;
  /// adds them (base + log p_sub) to the row's candidates. Collective (every rank calls it).
  void explore_(matrix_view<const float> hidden, index_t k, const std::vector<detail::hs_topk_request>& requests,
                detail::hs_topk_candidates& candidates) const;

  plan_type plan_;
  mutable Communicator comm_;
  int rank_ = 0;
  head_type top_;
  head_type local_;                  ///< this rank's subtrees as one forest (plan_.local_forest(rank_))
  std::vector<index_t> slot_;        ///< subtree -> its tree in local_ (-1 when another rank owns it)
  std::vector<index_t> local_classes_;  ///< the full tree's class of each of local_'s classes
  std::vector<index_t> class_begin_;    ///< first class in local_ of each of its trees (ascending)
  index_t rows_per_call_ = 1;           ///< see rows_per_call()
  mutable detail::buffer_pool<backend_vector<Backend, float>> pool_;  ///< the routing's row buffers, reused step to step
  // The top head's and the forest head's gradients within a step (each verb is collective: one
  // call at a time), reused step to step so that their memory is not allocated per step.
  mutable gradient_type top_gradient_, subtree_gradient_;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/sharding/sharded_hierarchical_softmax.inl>
#include <xsoftmax/detail/sharding/sharded_hierarchical_softmax_topk.inl>
#include <xsoftmax/detail/sharding/sharded_hierarchical_softmax_prefetch.inl>
