// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `knn_selector`: the selector of KNN softmax (Alibaba, "Large-Scale Training System for
/// 100-Million Classification"): the active set of a batch is the union, over its targets, of each
/// target's K nearest classes in a graph over the class weight vectors. The classes a target is
/// most easily confused with are exactly the ones whose gradients matter most, so a softmax over
/// them approximates the full one. The graph is updated from the current weights every
/// `rebuild_every` steps: rebuilt, or refreshed from its last lists between rebuilds.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/selection/checks.hpp>
#include <xsoftmax/detail/selection/row_lists.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/selection/knn_graph.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <functional>
#include <type_traits>
#include <vector>

namespace xsoftmax {

namespace detail {

/// Row r's slots: its target, then the first `used` of the target's K neighbours (-1: empty).
struct target_and_neighbours {
  const index_t* targets;
  const index_t* graph;  ///< N x K
  index_t k, used;
  index_t* out;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t t = targets[r];
    index_t* o = out + r * (used + 1);
    o[0] = t;
    for (index_t j = 0; j < used; ++j) {  // an empty neighbour slot (-1): the target again (see sort_unique)
      const index_t c = graph[t * k + j];
      o[j + 1] = c >= 0 ? c : t;
    }
  }
};

}  // namespace detail

/// Options of `knn_selector` and `knn_softmax`.
struct knn_options {
  knn_build_options graph;     ///< how the graph is built (k, metric, exact or IVF)
  index_t neighbors_used = 0;  ///< neighbours taken per target, in [1, graph k]; 0: all K
  index_t rebuild_every = 100; ///< steps between graph rebuilds; 0: never rebuild automatically
  /// Scheduled updates that refresh the last graph (`knn_graph_builder::refresh`, with
  /// `graph.refine`) between full builds: 0, every update is a full build; r > 0, each full build
  /// is followed by r refreshes. A graph holding only a ring-built share of the rows (exact method
  /// on a ring) is always rebuilt: a refresh reads every class's list.
  index_t refreshes_between_rebuilds = 0;
};

/// Shared active set = sorted union over the batch of { t } U neighbours(t)[0 : neighbors_used].
/// No logit offsets: the loss is the softmax over the active set. Before use the graph must be
/// built (`rebuild`) or given; `select` throws `invalid_argument` when it is empty, `shape_error`
/// when it was built for another N or dim than the head's, and `invalid_argument` naming both
/// element types when it was built from weights of another precision than the head's.
class knn_selector {
 public:
  /// `select` fills any active-set type with `basic_active_set`'s fields (a training step's set is
  /// working memory of the call: detail/selection/scratch_active_set.hpp).
  static constexpr bool fills_scratch_sets = true;
  /// Its sets meet the active-set contract by construction (a step finds the targets in them without
  /// checking them: detail/selection/scratch_active_set.hpp).
  static constexpr bool sets_valid_by_construction = true;
  /// Throws `invalid_argument` naming the value when an option is out of range (see
  /// `knn_graph_builder`; neighbors_used < 0, rebuild_every < 0).
  explicit knn_selector(knn_options options = {}) : options_(options), builder_(options.graph) {
    detail::expects(options.neighbors_used >= 0 && options.neighbors_used <= options.graph.k,
                    "knn_selector: neighbors_used = ", options.neighbors_used, " must be in [0, k = ",
                    options.graph.k, "]");
    detail::expects(options.rebuild_every >= 0 && options.refreshes_between_rebuilds >= 0,
                    "knn_selector: rebuild_every = ", options.rebuild_every, ", refreshes_between_rebuilds = ",
                    options.refreshes_between_rebuilds, " must be >= 0");
  }
  /// Uses a prebuilt graph (rebuilt on the schedule of `options` from the head's weights).
  knn_selector(knn_graph graph, knn_options options) : knn_selector(options) { graph_ = std::move(graph); }

  [[nodiscard]] const knn_options& options() const { return options_; }
  [[nodiscard]] const knn_graph& graph() const { return graph_; }
  [[nodiscard]] const knn_graph_builder& builder() const { return builder_; }
  /// Steps seen by `next_step` since construction.
  [[nodiscard]] index_t steps() const { return steps_; }
  /// Refreshes of the graph since its last full build.
  [[nodiscard]] index_t refreshes_since_build() const { return refreshes_since_build_; }

  /// Rebuilds the graph from `weights` into the same buffers. `ex` is an execution or a Thrust host
  /// policy; the graph is built on its backend (on a device, in device memory), stored on the host
  /// and copied to the device once, on the next `select`.
  /// With `share` (a class-sharded head), this process finds only its share of the rows.
  /// Ring-built (`share->shift` set, exact method), the graph holds this process's rows only and
  /// `select` gathers its targets' rows from their owners through `share->gather_rows` (kept).
  template <class Ex, class T>
  void rebuild(const Ex& ex, matrix_view<const T> weights, const knn_build_share* share = nullptr) {
    builder_.build_on(ex, weights, graph_, share);
    // Only a ring build (so a share) leaves a partial graph; testing `share` also tells GCC so.
    gather_rows_ = share && graph_.held_rows() < graph_.num_classes() ? share->gather_rows : nullptr;
    refreshes_since_build_ = 0;
  }

  /// Refreshes the graph from its last lists for `weights` (`knn_graph_builder::refresh_on`; throws
  /// what it throws, e.g. for an empty graph or one holding a ring-built share of the rows).
  template <class Ex, class T>
  void refresh(const Ex& ex, matrix_view<const T> weights, const knn_build_share* share = nullptr) {
    builder_.refresh_on(ex, weights, graph_, share);
    ++refreshes_since_build_;
  }

  /// Whether the next scheduled update refreshes the graph instead of rebuilding it (see
  /// `knn_options::refreshes_between_rebuilds`).
  [[nodiscard]] bool next_update_refreshes() const {
    return refreshes_since_build_ < options_.refreshes_between_rebuilds && !graph_.empty() &&
           graph_.held_rows() == graph_.num_classes();
  }

  /// Whether the next `next_step` rebuilds the graph (reads its weights; a class-sharded head
  /// runs its ring, or gathers the whole weight matrix, for those steps only).
  [[nodiscard]] bool next_step_rebuilds() const {
    return options_.rebuild_every > 0 && (steps_ + 1) % options_.rebuild_every == 0;
  }

  /// Step hook: counts the step and updates the graph when `rebuild_every` divides the count
  /// (`weights` is read only then): a refresh or a full build, on the schedule of
  /// `knn_options::refreshes_between_rebuilds`.
  template <class Ex, class T>
  void next_step(const Ex& ex, matrix_view<const T> weights, const knn_build_share* share = nullptr) {
    const bool update_now = next_step_rebuilds();
    ++steps_;
    if (!update_now) return;
    if (next_update_refreshes()) {
      refresh(ex, weights, share);
    } else {
      rebuild(ex, weights, share);
    }
  }

  /// Builds the shared active set of `req` on `ex`'s backend; see the class comment for what it
  /// throws.
  template <class Ex, class T, class Set>
  void select(const Ex& ex_in, const selection_request<T>& req, Set& out) const {
    detail::expects(!graph_.empty(), req.where, ": the KNN graph is empty; build it first (knn_selector::rebuild)");
    detail::check_built_for(req.where, "KNN graph", graph_.num_classes(), graph_.dim(), graph_.element(),
                            req.num_classes, req.dim, element_name<std::remove_cv_t<T>>());
    const auto& ex = detail::as_execution(ex_in);
    const index_t k = graph_.k();
    const index_t used = options_.neighbors_used > 0 ? std::min(options_.neighbors_used, k) : k;
    out.reset(active_layout::shared);
    out.classes.resize(static_cast<std::size_t>(req.rows() * (used + 1)));
    if (graph_.held_rows() == graph_.num_classes()) {
      detail::parallel_for(ex, req.rows(),
                           detail::target_and_neighbours{req.targets.data, graph_.ids_on(ex), k, used,
                                                         detail::raw(out.classes)});
    } else {  // a share of the graph: every target's first `used` neighbours from its owner (collective)
      detail::expects(static_cast<bool>(gather_rows_), req.where, ": the KNN graph holds ", graph_.held_rows(),
                      " of ", graph_.num_classes(), " rows and no way to gather the others");
      using execution_type = std::decay_t<decltype(ex)>;
      const index_t rows = req.rows();
      std::vector<index_t> targets(static_cast<std::size_t>(rows)), found(static_cast<std::size_t>(rows * used));
      execution_type::ops::copy(ex.res, targets.data(), req.targets.data, rows);
      execution_type::ops::synchronize(ex.res);
      gather_rows_(targets.data(), rows, graph_.ids().data(), k, used, found.data());
      std::vector<index_t> slots(out.classes.size());
      for (index_t r = 0; r < rows; ++r) {
        slots[static_cast<std::size_t>(r * (used + 1))] = targets[static_cast<std::size_t>(r)];
        for (index_t j = 0; j < used; ++j) {  // an empty neighbour slot (-1): the target again
          const index_t c = found[static_cast<std::size_t>(r * used + j)];
          slots[static_cast<std::size_t>(r * (used + 1) + 1 + j)] = c >= 0 ? c : targets[static_cast<std::size_t>(r)];
        }
      }
      execution_type::ops::copy(ex.res, detail::raw(out.classes), slots.data(), static_cast<index_t>(slots.size()));
    }
    detail::sort_unique(ex, out.classes);
  }

 private:
  knn_options options_;
  knn_graph_builder builder_;
  knn_graph graph_;
  /// A ring-built share's way to its targets' rows (see `knn_build_share::gather_rows`); null otherwise.
  std::function<void(const index_t*, index_t, const index_t*, index_t, index_t, index_t*)> gather_rows_;
  index_t steps_ = 0;
  index_t refreshes_since_build_ = 0;  ///< refreshes since the last full build
};

}  // namespace xsoftmax
