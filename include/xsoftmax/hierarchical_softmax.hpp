// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hierarchical_softmax`: p(c | h) = product over the internal nodes on c's path of the softmax over
/// that node's children. A step touches only the weight rows of the nodes on its targets' paths, and
/// its weight gradient exists only for those rows.
///
/// Samples are sorted once by their target's leaf rank; at every level the samples below one node
/// are then a contiguous run, scored against the node's block of child rows with one small GEMM
/// (the block read once per step, its gradient produced once, no atomics). Small runs use the
/// per-sample gather-dot path, which reads rows in place.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/detail/weight_store.hpp>
#include <xsoftmax/head_verbs.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/tree/tree_types.hpp>
#include <xsoftmax/types.hpp>

#include <memory>

namespace xsoftmax {

/// Node form: a softmax over each node's children, one weight row per child (default; any arity).
struct softmax_nodes {};
/// Node form of word2vec/fastText for binary trees: one weight row per internal node v, and
/// p(first child) = sigmoid(h . v), p(second child) = sigmoid(-h . v). Every node must have two
/// children (a binary Huffman tree does).
struct sigmoid_nodes {};

/// How a GPU backend issues the dense runs of one tree level (runs of at least `gemm_min_run()`
/// samples whose node block fits one chunk of scores). Host backends ignore it.
///  * `per_run`: each run on its own (about six kernel launches and cuBLAS calls per run).
///  * `grouped`: all of a level's such runs together: one grouped scores GEMM, one segmented
///    log-sum-exp / loss / dLoss-dscore kernel, grouped gradient GEMMs and one bias-sum kernel,
///    whatever the number of nodes. Costs memory for every grouped run's scores at once (bounded:
///    grouped runs are split into batches of a fixed budget).
///  * `automatic` (default): grouped when a level has at least two such runs.
/// All three give the same results up to floating-point summation order.
enum class dense_grouping { automatic, grouped, per_run };

/// Options of `hierarchical_softmax::topk`.
struct search_options {
  /// 0: exact best-first search. > 0: keep at most this many open nodes (faster, approximate).
  index_t beam_width = 0;
  /// Empty (default), or one entry per hidden row in the backend's memory: each row's count of
  /// node expansions -- nodes whose children the search scored, the search's work (a forward
  /// scores one node per level of the target's path). A sigmoid tree's exact search scores some
  /// children early (two levels per pop) and counts those too; on the host backends an exact
  /// search over softmax nodes runs level by level, many rows a node at once, and may expand a few
  /// nodes a one-row best-first search would not (its results are the same). Throws `shape_error`
  /// for another length.
  vector_view<index_t> expansions = {};
};

namespace detail {
/// Whether `T` offers the tree contract of tree/tree_types.hpp at the head's level: `view()`,
/// `num_classes()`, `num_rows()` and a `static constexpr int max_depth`.
template <class T, class = void>
struct is_tree_shape : std::false_type {};
template <class T>
struct is_tree_shape<T, std::void_t<decltype(std::declval<const T&>().view()),
                                    decltype(std::declval<const T&>().num_classes()),
                                    decltype(std::declval<const T&>().num_rows()), decltype(T::max_depth)>>
    : std::true_type {};

template <class T>
struct is_precision_policy : std::false_type {};
template <class S, class A>
struct is_precision_policy<precision<S, A>> : std::true_type {};
}  // namespace detail

/// Hierarchical softmax over the classes of `Tree` (`uniform_tree<Depth, Branching>` or
/// `runtime_tree<MaxDepth>`), with hidden batches of shape (B x dim).
///
/// \tparam Tree      a tree shape satisfying the contract in `tree/tree_types.hpp`.
/// \tparam Precision `fp32`, `bf16`, `fp16` weight storage; fp32 arithmetic.
/// \tparam Backend   `serial`, `omp` (or `cuda` under nvcc).
/// \tparam NodeForm  `softmax_nodes` or `sigmoid_nodes`.
///
/// Weight rows: `tree.num_rows()` for softmax nodes (one per child edge, stacked as the tree lays
/// them out), `tree.num_rows() / 2` for sigmoid nodes (one per internal node). Every verb validates
/// first and throws `shape_error`, `out_of_range`, `non_finite_error`, `invalid_argument` or
/// `tree_error` naming the argument and value; nothing is changed then.
template <class Tree, class Precision = fp32, class Backend = serial, class NodeForm = softmax_nodes>
class hierarchical_softmax
    : public head_verbs<hierarchical_softmax<Tree, Precision, Backend, NodeForm>, Backend, search_options> {
  static_assert(detail::is_tree_shape<Tree>::value,
                "xsoftmax: hierarchical_softmax<Tree, ...>: Tree must be a tree shape (uniform_tree<Depth, "
                "Branching>, runtime_tree<MaxDepth> or a type with view(), num_classes(), num_rows() and a "
                "static constexpr int max_depth; see tree/tree_types.hpp)");
  static_assert(detail::is_precision_policy<Precision>::value,
                "xsoftmax: hierarchical_softmax<Tree, Precision, ...>: Precision must be xsoftmax::fp32, bf16 or "
                "fp16 (a precision<Storage, Accum>)");
  static_assert(std::is_same_v<NodeForm, softmax_nodes> || std::is_same_v<NodeForm, sigmoid_nodes>,
                "xsoftmax: hierarchical_softmax<..., NodeForm>: NodeForm must be xsoftmax::softmax_nodes or "
                "xsoftmax::sigmoid_nodes");
  using verbs = head_verbs<hierarchical_softmax<Tree, Precision, Backend, NodeForm>, Backend, search_options>;
  friend verbs;

 public:
  static constexpr const char* head_name = "hierarchical_softmax";
  /// Whether `loss_options::label_smoothing`, `z_loss`, `margin` and `softcap` are defined for this head.
  static constexpr bool supports_loss_terms = false;
  /// Whether it takes `loss_options::class_weight`: yes, each sample's loss is scaled by its class's.
  static constexpr bool supports_class_weight = true;
  /// Whether it takes `loss_options::gradient_filter`.
  static constexpr bool supports_gradient_filter = false;
  using tree_type = Tree;
  using precision_type = Precision;
  using storage_type = typename Precision::storage_type;
  using node_form = NodeForm;
  using typename verbs::gradient_type;
  static constexpr bool sigmoid_form = std::is_same_v<NodeForm, sigmoid_nodes>;

  /// Owns weights for `tree` of width `dim`, initialised per `init`; a zero bias when `with_bias`.
  hierarchical_softmax(Tree tree, index_t dim, bool with_bias = false, init_options init = {},
                       backend_resources<Backend> resources = {});

  /// Attaches to a caller's `weights` (weight_rows(tree) x dim) and optional `bias`; no copy.
  hierarchical_softmax(Tree tree, matrix_view<storage_type> weights, storage_type* bias = nullptr,
                       backend_resources<Backend> resources = {});

  /// Weight rows a head over `tree` needs under this node form.
  [[nodiscard]] static index_t weight_rows(const Tree& tree);

  [[nodiscard]] const Tree& tree() const { return tree_; }
  [[nodiscard]] index_t num_classes() const { return tree_.num_classes(); }
  [[nodiscard]] index_t dim() const { return store_.cols(); }
  [[nodiscard]] bool has_bias() const { return store_.has_bias(); }
  [[nodiscard]] matrix_view<storage_type> weights() const { return store_.weights(); }
  [[nodiscard]] storage_type* bias() const { return store_.bias(); }
  [[nodiscard]] const backend_resources<Backend>& resources() const { return resources_; }
  [[nodiscard]] index_t gemm_min_run() const { return gemm_min_run_; }

  /// Runs at least this long go through the chunked GEMM path; shorter ones through gather-dot.
  /// Default: 1 (always GEMM) on a host backend with a CBLAS, whose kernels beat the per-sample
  /// loop even for one row; 16 with the built-in blocked GEMM and on the GPU.
  void set_gemm_min_run(index_t rows) { gemm_min_run_ = rows < 1 ? 1 : rows; }

  /// How the dense runs of a level are issued on a GPU backend (see `xsoftmax::dense_grouping`);
  /// for benchmarking and tests. Host backends ignore it.
  [[nodiscard]] xsoftmax::dense_grouping dense_grouping() const { return dense_grouping_; }
  void set_dense_grouping(xsoftmax::dense_grouping mode) {
    detail::expects(mode == xsoftmax::dense_grouping::automatic || mode == xsoftmax::dense_grouping::grouped ||
                        mode == xsoftmax::dense_grouping::per_run,
                    "hierarchical_softmax::set_dense_grouping: mode = ", static_cast<int>(mode),
                    " is not a dense_grouping (automatic = 0, grouped = 1, per_run = 2)");
    dense_grouping_ = mode;
  }

  /// \cond detail
  /// Backend state derived from the (immutable) tree, filled on first use by a device backend
  /// (the cuda backend keeps its device copy of a runtime_tree here) and shared by copies of the
  /// head, whose trees are equal. Not part of the API. Like the head's resources, not safe for
  /// concurrent use from several host threads.
  [[nodiscard]] std::shared_ptr<void>& backend_cache() const noexcept { return backend_cache_; }
  /// \endcond

  // The verbs (forward, forward_backward, backward, log_prob, topk, log_distribution, their `_async`
  /// For a head over a forest (`runtime_tree::forest`): the exact top-k of each row of `hidden`
  /// (fp32, B x dim, the backend's memory) among the classes of one tree of the forest,
  /// `trees[r]` for row r (B entries, the backend's memory), best first (ties: smaller class
  /// first). Classes are the forest's; a tree of fewer than k classes leaves its row's remaining
  /// slots at class -1 and log-probability -inf. `classes` and `log_probs` are B x k. Throws
  /// `shape_error` for sizes that disagree, `out_of_range` for a tree index outside
  /// [0, num_trees), `invalid_argument` unless k >= 1 (k may exceed a tree's classes: see above,
  /// as the sharded head asks each owner for k of a subtree), `non_finite_error` for a
  /// non-finite hidden value. The sharded hierarchical softmax's owners search their subtrees
  /// with it.
  void topk_in_trees(matrix_view<const float> hidden, vector_view<const index_t> trees, index_t k,
                     matrix_view<index_t> classes, matrix_view<float> log_probs) const;

  // forms, apply_sgd) are head_verbs'. What is particular to this head:
  // * `grad_weights` holds the rows of the nodes on the batch's paths, block by block, level by level.
  // * topk: exact best-first search over the tree (ties: smaller class first), or a beam search
  //   when `search_options::beam_width` > 0.
  // * `_async` on cuda: the blocking code path without its final wait (bit-identical results); it
  //   checks its data and plans each level's runs on the host, so it waits once per tree level.
  //   `topk_async` is blocking on every backend: the search's size is known only after it ran.

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
             search_options options) const;
  template <class H>
  void topk_async_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                   matrix_view<float> log_probs, search_options options) const {
    topk_(hidden, k, classes, log_probs, options);
  }
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
  Tree tree_;
  detail::weight_store<storage_type, Backend> store_;
  backend_resources<Backend> resources_;
  /// 1 on a host backend with a CBLAS; 16 otherwise (the built-in blocked GEMM, or a GPU, where a
  /// GEMM launch per short run costs more than a warp per sample).
  [[nodiscard]] static constexpr index_t default_gemm_min_run() {
    if constexpr (is_host_backend<Backend>) return detail::host::has_cblas() ? 1 : 16;
    else return 16;
  }

  index_t gemm_min_run_ = default_gemm_min_run();
  xsoftmax::dense_grouping dense_grouping_ = xsoftmax::dense_grouping::automatic;
  mutable std::shared_ptr<void> backend_cache_;
  mutable index_t widest_block_ = 0;  ///< the tree's widest block, found on the first search (0: not yet)
  /// The widest block a search may expand (its scratch per row): `widest_block_`, found once.
  [[nodiscard]] index_t widest_search_block_() const;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/hierarchical_softmax.inl>
