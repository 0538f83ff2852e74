// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `feature_query_selector`: each sample's active set is its own top-K classes by logit against
/// its hidden vector (plus its target): the classes the model currently confuses it with. Exact
/// (dense scores over every class, chunk by chunk, with a running top-K: the cost of a full forward
/// pass) or approximate through an IVF index over the class vectors (`nprobe` lists per sample).

#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/primitives/score_chunks.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/detail/selection/checks.hpp>
#include <xsoftmax/detail/selection/row_lists.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/selection/ivf_index.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace xsoftmax {

namespace detail {

/// Row r's slots: its k top ids, then its target.
struct top_and_target {
  const index_t* top;  ///< rows x k
  const index_t* targets;
  index_t k;
  index_t* out;  ///< rows x (k + 1)
  XSOFTMAX_HD void operator()(index_t r) const {
    for (index_t j = 0; j < k; ++j) out[r * (k + 1) + j] = top[r * k + j];
    out[r * (k + 1) + k] = targets[r];
  }
};

/// The row of each of a row's `width` slots.
struct row_index_of {
  index_t width;
  index_t* out;
  XSOFTMAX_HD void operator()(index_t r) const {
    for (index_t j = 0; j < width; ++j) out[r * width + j] = r;
  }
};

}  // namespace detail

/// Per-sample active set = sorted unique { t_i } U top-K classes of h_i . w_c + b_c. The IVF form
/// scans the `nprobe` lists nearest to h_i; its index must be built with `similarity::inner_product`
/// from the head's weights, and is rebuilt from them every `rebuild_every` steps (0: never).
///
/// Throws: `invalid_argument` naming the value when k < 1 (construction) or k > N (select), for
/// nprobe outside [1, num_lists] or an index built with cosine similarity; `shape_error` when the
/// index was built for another N or dim than the head's; `invalid_argument` naming both element
/// types when it was built from weights of another precision.
class feature_query_selector {
 public:
  /// `select` scores `request.weights` (so a class-sharded head does not take this selector).
  static constexpr bool scores_weights = true;
  /// `select` fills any active-set type with `basic_active_set`'s fields (a training step's set is
  /// working memory of the call: detail/selection/scratch_active_set.hpp).
  static constexpr bool fills_scratch_sets = true;
  /// Its sets meet the active-set contract by construction (a step finds the targets in them without
  /// checking them: detail/selection/scratch_active_set.hpp).
  static constexpr bool sets_valid_by_construction = true;

  /// Exact top-K.
  explicit feature_query_selector(index_t k) : k_(k) {
    detail::expects(k >= 1, "feature_query_selector: k = ", k, " must be >= 1");
  }
  /// Approximate top-K through `index` (built over the head's weights), searching `nprobe` lists.
  /// `rebuild` options are used when the schedule rebuilds the index.
  feature_query_selector(index_t k, ivf_index index, index_t nprobe, index_t rebuild_every = 0,
                         ivf_options rebuild = {})
      : feature_query_selector(k) {
    const char* where = "feature_query_selector";
    detail::expects(!index.empty(), where, ": the IVF index is empty; build it first");
    detail::expects(index.metric() == similarity::inner_product, where,
                    ": the IVF index must use similarity::inner_product (logits), not cosine");
    detail::check_count(where, "nprobe", nprobe, index.num_lists(), "num_lists");
    detail::expects(rebuild_every >= 0, where, ": rebuild_every = ", rebuild_every, " must be >= 0");
    index_ = std::move(index);
    nprobe_ = nprobe;
    rebuild_every_ = rebuild_every;
    rebuild_ = rebuild;
    rebuild_.metric = similarity::inner_product;
    approximate_ = true;
  }

  [[nodiscard]] index_t k() const { return k_; }
  [[nodiscard]] bool approximate() const { return approximate_; }
  [[nodiscard]] index_t nprobe() const { return nprobe_; }
  [[nodiscard]] const ivf_index& index() const { return index_; }
  [[nodiscard]] index_t steps() const { return steps_; }

  /// Step hook: rebuilds the IVF index from `weights` on `ex`'s backend when `rebuild_every`
  /// divides the step count.
  template <class Ex, class T>
  void next_step(const Ex& ex, matrix_view<const T> weights) {
    ++steps_;
    if (approximate_ && rebuild_every_ > 0 && steps_ % rebuild_every_ == 0) {
      rebuild_.num_lists = index_.num_lists();
      index_.build_on(ex, weights, rebuild_);
    }
  }

  /// Builds the per-sample active set of `req` on `ex`'s backend; see the class comment for what it
  /// throws. Both forms run where the batch lives (an index built on another backend is copied to
  /// this one once per build).
  template <class Ex, class T, class Set>
  void select(const Ex& ex_in, const selection_request<T>& req, Set& out) const {
    detail::check_count(req.where, "k", k_, req.num_classes, "num_classes");
    const auto& ex = detail::as_execution(ex_in);
    using execution_type = std::decay_t<decltype(ex)>;
    using index_vector = detail::scratch_buffer<typename execution_type::backend, index_t>;  // each written, then read
    const index_t rows = req.rows(), k = k_;
    // Row r's slots: its top k (-1: none found), then its target.
    index_vector list(static_cast<std::size_t>(rows * (k + 1)), ex);
    if (approximate_) {
      detail::check_built_for(req.where, "IVF index", index_.num_vectors(), index_.dim(), index_.element(),
                              req.num_classes, req.dim, element_name<std::remove_cv_t<T>>());
      index_vector top(static_cast<std::size_t>(rows * k), ex);
      detail::scratch_buffer<typename execution_type::backend, float> scores(static_cast<std::size_t>(rows * k), ex);
      index_.search_on(ex, req.hidden, k, nprobe_, matrix_view<index_t>(detail::raw(top), rows, k),
                       matrix_view<float>(detail::raw(scores), rows, k), req.bias);
      detail::parallel_for(ex, rows, detail::top_and_target{detail::raw(top), req.targets.data, k, detail::raw(list)});
    } else {  // dense scores chunk by chunk, folded into a running top-k (a full forward pass)
      detail::basic_row_topk_state<typename execution_type::backend> best(rows, k, ex);
      detail::for_each_score_chunk(ex, req.hidden, req.weights, req.bias, 0, req.num_classes,
                                   detail::default_chunk_columns(rows), [&](index_t c0, index_t cn, const float* s) {
                                     detail::row_topk_update(ex, s, rows, cn, cn, c0, best);
                                   });
      detail::parallel_for(ex, rows, detail::top_and_target{detail::raw(best.index), req.targets.data, k, detail::raw(list)});
    }
    index_vector row_of(list.size(), ex);
    detail::parallel_for(ex, rows, detail::row_index_of{k + 1, detail::raw(row_of)});
    out.reset(active_layout::per_sample);
    detail::sorted_rows(ex, rows, row_of, list, out);
  }

 private:
  index_t k_ = 1;
  bool approximate_ = false;
  ivf_index index_;
  index_t nprobe_ = 0;
  index_t rebuild_every_ = 0;
  ivf_options rebuild_;
  index_t steps_ = 0;
};

}  // namespace xsoftmax
