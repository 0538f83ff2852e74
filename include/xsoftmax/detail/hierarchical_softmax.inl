// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hierarchical_softmax`: construction and the training run, written once for every backend over
/// the generic primitives (detail/hierarchical/: planning, the GEMM path, the gather-dot path).
/// Evaluation (top-k, class-range log-probabilities) is in hierarchical_softmax_search.inl.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/dense_runs.hpp>
#include <xsoftmax/detail/hierarchical/gather_runs.hpp>
#include <xsoftmax/detail/hierarchical/run_plan.hpp>
#include <xsoftmax/detail/hierarchical/sigmoid_levels.hpp>
#include <xsoftmax/detail/hierarchical/tree_access.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/detail/validation.hpp>

#include <vector>

namespace xsoftmax {

template <class Tree, class P, class B, class F>
index_t hierarchical_softmax<Tree, P, B, F>::weight_rows(const Tree& tree) {
  return sigmoid_form ? tree.num_rows() / 2 : tree.num_rows();
}

namespace detail {
template <bool Sigmoid, class Tree>
void check_node_form(const Tree& tree) {
  if constexpr (Sigmoid) {
    const auto tv = tree.view();
    for (index_t c = 0; c < tv.num_classes(); ++c)
      for (int l = 0; l < tv.depth(c); ++l) {
        const path_step s = tv.step(c, l);
        expects<tree_error>(s.block_size == 2, "hierarchical_softmax<sigmoid_nodes>: the node at level ", l,
                            " on class ", c, "'s path has ", s.block_size,
                            " children; the sigmoid form needs a binary tree (every node exactly 2)");
      }
  }
}
}  // namespace detail

template <class Tree, class P, class B, class F>
hierarchical_softmax<Tree, P, B, F>::hierarchical_softmax(Tree tree, index_t dim, bool with_bias,
                                                          init_options init, backend_resources<B> resources)
    : tree_(std::move(tree)), resources_(resources) {
  detail::check_node_form<sigmoid_form>(tree_);
  store_ = detail::weight_store<storage_type, B>("hierarchical_softmax", weight_rows(tree_), dim, with_bias, init);
}

template <class Tree, class P, class B, class F>
hierarchical_softmax<Tree, P, B, F>::hierarchical_softmax(Tree tree, matrix_view<storage_type> weights,
                                                          storage_type* bias, backend_resources<B> resources)
    : tree_(std::move(tree)), resources_(resources) {
  detail::check_node_form<sigmoid_form>(tree_);
  detail::expects<shape_error>(weights.rows == weight_rows(tree_), "hierarchical_softmax: weights.rows = ",
                               weights.rows, " but the tree needs ", weight_rows(tree_), " rows");
  store_ = detail::weight_store<storage_type, B>("hierarchical_softmax", weights, bias);
}

template <class Tree, class P, class B, class F>
template <class H>
float hierarchical_softmax<Tree, P, B, F>::run_(const char* where, matrix_view<const H> hidden,
                                               vector_view<const index_t> targets, loss_options options,
                                               vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                               gradient_type* grad_weights,
                                               vector_view<const float> grad_output) const {
  detail::scratch_vector<B, float> loss(1, detail::execution<B>{resources_});
  run_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss.data());
  return detail::backend_ops<B>::read(resources_, loss.data());  // waits for the work queued
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::run_async_(const char* where, matrix_view<const H> hidden,
                                                     vector_view<const index_t> targets, loss_options options,
                                                     vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                     gradient_type* grad_weights,
                                                     vector_view<const float> grad_output, float* loss) const {
  run_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss);
}

// The algorithm, on every backend (inputs were checked by head_verbs):
//  1. pack the rows that count, their upstream gradients, and sort them once by leaf rank;
//  2. plan the runs of rows sharing a node, level by level, keeping each level's child per row
//     (the only read-backs: the batch's deepest path length and the run list);
//  3. lay out the sparse gradient: each run's block, run by run, level by level;
//  4. sigmoid nodes without a tuned gather path: every level at once, in two parallel passes
//     (sigmoid_levels.hpp); otherwise level by level (a level's runs touch disjoint rows and
//     gradient rows): GEMM runs through the dense softmax, the others through gather-dot;
//  5. scatter the hidden gradients and losses back to batch order, reduce the loss into `loss`.
template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::run_into_(const char* where, matrix_view<const H> hidden,
                                                    vector_view<const index_t> targets, loss_options options,
                                                    vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                    gradient_type* grad_weights, vector_view<const float> grad_output,
                                                    float* loss) const {
  const detail::execution<B> ex{resources_};
  const auto tv = detail::tree_access<B, Tree>::view(tree_, backend_cache_, resources_);
  const index_t d = dim();
  const bool want_grad = grad_weights != nullptr;

  // Each level's child per row (and for the all-level sigmoid path its node), from the planning
  // pass (written before read: no zero-fill). On a host the all-level sigmoid path takes one value
  // per entry, the row the path takes, which holds both (`path_row_keys`), and its row ranges copy
  // their own hidden rows in and hidden-gradient rows out (`range_row_copies`).
  constexpr bool all_levels = sigmoid_form && !detail::gather_runs_tuning<B, storage_type, true>::available;
  constexpr bool path_row_keys = all_levels && is_host_backend<B>;
  constexpr bool range_copies = path_row_keys;

  // 1. Pack (samples and targets: the sort takes the hidden rows from `hidden` directly, widened,
  //    into an uninitialised buffer: one copy of the rows, no zero-fill; or the row ranges do) and sort.
  detail::scratch_vector<B, float> upstream;
  detail::batch_rows<B> packed = detail::pack_rows(ex, hidden, targets, options.ignore_index, false);
  detail::weigh_rows(ex, packed, options);
  if (want_grad) upstream = detail::upstream_gradients(ex, where, packed, hidden.rows, options.reduce, grad_output);
  const index_t rows = packed.rows;
  detail::scratch_buffer<B, float> sorted_hidden(static_cast<std::size_t>(rows * d), ex);
  const detail::batch_rows<B> batch = detail::sort_by_leaf_rank(ex, tv, packed, upstream, hidden, packed.sample_data(),
                                                                range_copies ? nullptr : sorted_hidden.data());

  // 2. Plan: which runs take a GEMM, and the scratch values per row the others need.
  const index_t gemm_min_run = gemm_min_run_;
  const auto takes_gemm = [=](const detail::node_run& run) {
    return !sigmoid_form && run.end - run.begin >= gemm_min_run;
  };
  const int levels = detail::planned_levels(ex, tv, batch.target_data(), rows, Tree::max_depth);
  const std::size_t entries = static_cast<std::size_t>(rows) * static_cast<std::size_t>(levels);
  detail::scratch_buffer<B, index_t> children(path_row_keys ? 0 : entries, ex),
      node_keys(all_levels ? entries : 0, ex), path_levels(path_row_keys ? static_cast<std::size_t>(rows) : 0, ex);
  const detail::run_plan plan =
      detail::plan_runs(ex, tv, batch.target_data(), rows, levels, sigmoid_form,
                        [=](const detail::node_run& run) -> index_t {
                          return takes_gemm(run) ? 0 : sigmoid_form ? 1 : run.block_size;
                        },
                        children.data(), all_levels ? node_keys.data() : nullptr, false, path_row_keys,
                        path_row_keys ? path_levels.data() : nullptr);
  const detail::level_entries at{rows, 0, levels, node_keys.data(), true, path_row_keys,
                                 path_row_keys ? path_levels.data() : nullptr};

  // 3. The sparse gradient's rows.
  if (want_grad) {
    gradient_type& g = *grad_weights;
    g.dim = d;
    g.rows.resize(static_cast<std::size_t>(plan.grad_rows));
    detail::write_gradient_row_ids(ex, plan, sigmoid_form, detail::raw(g.rows));
    g.values.resize(static_cast<std::size_t>(plan.grad_rows * d));
    g.bias_values.resize(has_bias() ? static_cast<std::size_t>(plan.grad_rows) : 0);
  }

  // 4. Every level at once, or level by level.
  const std::size_t n = static_cast<std::size_t>(rows);
  // The all-level step writes each row's first hidden-gradient term (no zero-fill of B x d floats).
  detail::scratch_vector<B, float> losses(n, ex, 0.f), grad_packed(want_grad ? n * static_cast<std::size_t>(d) : 0, ex),
      scratch(static_cast<std::size_t>(all_levels ? detail::sigmoid_levels_scratch(at, want_grad) : plan.gather_values), ex);
  detail::node_run_data<storage_type> a;
  a.h = sorted_hidden.data();
  a.dim = d;
  a.w = matrix_view<const storage_type>(weights());
  a.bias = store_.bias();
  a.loss = detail::raw(losses);
  a.scratch = detail::raw(scratch);
  if (want_grad) {
    a.upstream = detail::raw(upstream);
    a.grad_h = detail::raw(grad_packed);
    a.grad_w = detail::raw(grad_weights->values);
    a.grad_b = has_bias() ? detail::raw(grad_weights->bias_values) : nullptr;
  }
  // (Not into gradient rows that overlap the hidden rows: a range's writes could reach rows that
  // another range has yet to copy in.)
  const bool grad_by_ranges =
      range_copies && want_grad && grad_hidden && !detail::rows_overlap(*grad_hidden, hidden);
  if constexpr (range_copies) {
    // Ignored rows (not packed) get zero gradients here; the ranges write every packed row's.
    if (grad_by_ranges && rows != grad_hidden->rows) detail::fill_rows(ex, *grad_hidden, 0.f);
    const detail::range_row_copies<H> copies{hidden, batch.sample_data(), sorted_hidden.data(),
                                             grad_by_ranges ? *grad_hidden : matrix_view<float>(),
                                             detail::raw(grad_packed)};
    detail::sigmoid_levels_generic(ex, a, plan.runs, at, 0, copies);
  } else if constexpr (all_levels) {
    a.child = children.data();
    detail::sigmoid_levels_generic(ex, a, plan.runs, at);
  } else {
    grad_packed.fill(0.f);  // the level-by-level step adds every term
    for (std::size_t lv = 0; lv < plan.levels(); ++lv) {
      std::vector<detail::node_run> gemm_runs, gather_runs;
      gather_runs.reserve(plan.level_first[lv + 1] - plan.level_first[lv]);
      for (std::size_t i = plan.level_first[lv]; i < plan.level_first[lv + 1]; ++i)
        (takes_gemm(plan.runs[i]) ? gemm_runs : gather_runs).push_back(plan.runs[i]);
      a.child = children.data() + static_cast<index_t>(lv) * rows;
      detail::dense_runs(ex, a, gemm_runs, dense_grouping_);
      detail::gather_runs<sigmoid_form>(ex, a, gather_runs);
    }
  }

  // 5. Back to batch order.
  if (grad_hidden && !grad_by_ranges) detail::scatter_rows(ex, batch, detail::raw(grad_packed), *grad_hidden);
  detail::weigh_losses(ex, batch, options, detail::raw(losses));  // batch: sorted, as the losses
  if (per_sample.size != 0) detail::scatter_losses(ex, batch, detail::raw(losses), per_sample);
  if (loss)  // null: backward, log_prob
    detail::reduce_losses_into(ex, detail::raw(losses), rows, options.reduce, loss, packed.mean_divisor());
}

}  // namespace xsoftmax

#include <xsoftmax/detail/hierarchical_softmax_search.inl>
