// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax`'s algorithm, written once for every backend over the generic primitives.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/primitives/score_chunks.hpp>
#include <xsoftmax/detail/validation.hpp>

#include <thrust/sequence.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace xsoftmax {

namespace detail {
/// Row r's j-th best (score, class) of a finished top-k state, as a class and a log-probability,
/// into output row `sample[r]` (r when `sample` is null).
struct write_topk {
  const float* score;
  const index_t* index;
  const float* lse;
  index_t k;
  matrix_view<index_t> classes;
  matrix_view<float> log_probs;
  const index_t* sample = nullptr;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t r = i / k, j = i % k, out = sample ? sample[r] : r;
    classes(out, j) = index[i];
    log_probs(out, j) = score[i] - lse[r];
  }
};

/// Every entry of a top-k output: class -1, log-probability -inf (the rows no top-k is written to).
struct clear_topk {
  index_t k;
  matrix_view<index_t> classes;
  matrix_view<float> log_probs;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t r = i / k, j = i % k;
    classes(r, j) = -1;
    log_probs(r, j) = -INFINITY;
  }
};

/// A chunk of scores (rows x cn, classes from c0 on) as log-probabilities into `out`.
struct write_log_probs {
  const float* s;
  const float* lse;
  index_t c0, cn;
  matrix_view<float> out;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t r = i / cn, j = i % cn;
    out(r, c0 + j) = s[i] - lse[r];
  }
};
}  // namespace detail

template <class P, class B, class S>
full_softmax<P, B, S>::full_softmax(index_t num_classes, index_t dim, bool with_bias, init_options init,
                                 backend_resources<B> resources)
    : weights_base("full_softmax", num_classes, dim, with_bias, init, resources) {
  static_assert(!sharded, "full_softmax: a sharded head is constructed from its class_sharding");
}

template <class P, class B, class S>
full_softmax<P, B, S>::full_softmax(matrix_view<storage_type> weights, storage_type* bias,
                                 backend_resources<B> resources)
    : weights_base("full_softmax", weights, bias, resources) {
  static_assert(!sharded, "full_softmax: a sharded head is constructed from its class_sharding");
}

template <class P, class B, class S>
void full_softmax<P, B, S>::set_chunk_size(index_t classes) {
  detail::expects(classes >= 0, "full_softmax::set_chunk_size: classes = ", classes, " must be >= 0");
  chunk_size_ = classes;
}

template <class P, class B, class S>
void full_softmax<P, B, S>::set_score_cache_bytes(index_t bytes) {
  detail::expects(bytes >= 0, "full_softmax::set_score_cache_bytes: bytes = ", bytes, " must be >= 0");
  score_cache_bytes_ = bytes;
  automatic_plan_ = false;
}

template <class P, class B, class S>
void full_softmax<P, B, S>::set_row_block(index_t rows) {
  detail::expects(rows >= 0, "full_softmax::set_row_block: rows = ", rows, " must be >= 0");
  row_block_ = rows;
  automatic_plan_ = false;
}

template <class P, class B, class S>
void full_softmax<P, B, S>::use_automatic_plan() {
  row_block_ = 0;
  score_cache_bytes_ = default_score_cache_bytes;
  automatic_plan_ = true;
}

template <class P, class B, class S>
dense_step_plan full_softmax<P, B, S>::training_plan(index_t batch_rows) const {
  dense_step_plan p{row_block_, score_cache_bytes_, 0};
  if constexpr (!sharded) {
    if (automatic_plan_) {
      if constexpr (!is_host_backend<B>)
        return detail::automatic_device_plan(batch_rows, local_classes(), chunk_size_, default_score_cache_bytes);
      p = detail::automatic_host_plan(batch_rows, local_classes(), weights().cols, default_score_cache_bytes);
    }
  }
  const bool blocked = p.row_block > 0 && p.row_block < batch_rows;
  if (!blocked) p.row_block = 0;
  p.chunk = chunk_size_for(blocked ? p.row_block : batch_rows);  // a block's chunks are sized for its rows
  return p;
}

template <class P, class B, class S>
void full_softmax<P, B, S>::keep_scores_in_row_blocks(index_t rows) {
  set_row_block(rows);  // checks rows first: nothing changes on an error
  set_score_cache_bytes(rows * local_classes() * static_cast<index_t>(sizeof(float)));
}

template <class P, class B, class S>
index_t full_softmax<P, B, S>::chunk_size_for(index_t batch_rows) const {
  index_t c = chunk_size_;
  if (c == 0) {
    // Host: ~32 MiB of fp32 scores, large enough that the GEMM runs near peak, small enough for
    // L3-ish reuse of the chunk between the score and gradient GEMMs. Device: ~256 MiB, wide GEMMs.
    c = is_host_backend<B> ? detail::default_chunk_columns(batch_rows) : detail::device_chunk_columns(batch_rows);
  }
  return std::min(c, local_classes());
}

template <class P, class B, class S>
template <class H>
float full_softmax<P, B, S>::run_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                               loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                               gradient_type* grad_weights, vector_view<const float> grad_output) const {
  const detail::execution<B> ex{resources_};
  detail::scratch_vector<B, float> loss(1, ex);
  run_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss.data());
  return detail::backend_ops<B>::read(resources_, loss.data());  // waits for the work queued
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::check_forward_topk_(const char* where, matrix_view<const H> hidden,
                                             vector_view<const index_t> targets, index_t k,
                                             matrix_view<index_t> classes, matrix_view<float> log_probs,
                                             const loss_options& options, vector_view<float> per_sample) const {
  check_topk_without_margin_(where, hidden.rows, k, classes, log_probs, options);  // no data read: first
  verbs::check_loss_inputs(where, hidden, targets, options, per_sample, nullptr, false, {});
}

template <class P, class B, class S>
void full_softmax<P, B, S>::check_topk_without_margin_(const char* where, index_t rows, index_t k,
                                                    matrix_view<index_t> classes, matrix_view<float> log_probs,
                                                    const loss_options& options) const {
  verbs::check_topk_outputs(where, rows, k, classes, log_probs);
  detail::expects(!options.margin.enabled(), where,
                  ": an angular margin changes the target's logit in the loss, so its scores are not the ",
                  "model's prediction; call forward and topk separately");
}

template <class P, class B, class S>
template <class H>
float full_softmax<P, B, S>::forward_topk(matrix_view<H> hidden, vector_view<const index_t> targets, index_t k,
                                       matrix_view<index_t> classes, matrix_view<float> log_probs,
                                       loss_options options, vector_view<float> per_sample) const {
  const auto h = verbs::as_const(hidden);
  check_forward_topk_("full_softmax::forward_topk", h, targets, k, classes, log_probs, options, per_sample);
  const detail::execution<B> ex{resources_};
  detail::scratch_vector<B, float> loss(1, ex);
  const topk_outputs out{k, classes, log_probs};
  run_into_("full_softmax::forward_topk", h, targets, options, per_sample, nullptr, nullptr, {}, loss.data(), &out);
  return detail::backend_ops<B>::read(resources_, loss.data());  // waits for the work queued
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::forward_topk_async(matrix_view<H> hidden, vector_view<const index_t> targets, index_t k,
                                            matrix_view<index_t> classes, matrix_view<float> log_probs,
                                            vector_view<float> loss, loss_options options,
                                            vector_view<float> per_sample) const {
  detail::check_async_loss("full_softmax::forward_topk_async", loss);
  const auto h = verbs::as_const(hidden);
  check_forward_topk_("full_softmax::forward_topk", h, targets, k, classes, log_probs, options, per_sample);
  const topk_outputs out{k, classes, log_probs};
  run_into_("full_softmax::forward_topk", h, targets, options, per_sample, nullptr, nullptr, {}, loss.data, &out);
}

template <class P, class B, class S>
template <class G>
auto full_softmax<P, B, S>::check_dense_gradient_(const char* where, dense_gradient<G> g) const -> dense_outputs {
  static_assert(!sharded, "full_softmax: a dense weight gradient is offered by unsharded heads only (a class-sharded "
                "head's gradient covers its own classes: use its sparse_gradient)");
  static_assert(std::is_same_v<G, float> || std::is_same_v<G, storage_type>,
                "full_softmax: a dense_gradient holds float or the head's storage type");
  const index_t n = num_classes(), d = dim();
  detail::check_output(where, "grad_weights.weights", g.weights, n, d);
  detail::expects<shape_error>(g.weights.stride == d, where, ": grad_weights.weights.stride = ", g.weights.stride,
                               " must be dim = ", d, " (a contiguous num_classes x dim matrix)");
  detail::check_output(where, "grad_weights.bias", g.bias, has_bias() ? n : 0);
  dense_outputs out;
  if constexpr (std::is_same_v<G, float>) {
    out.weights = g.weights.data;
  } else {
    out.storage_weights = g.weights.data;
  }
  out.bias = has_bias() ? g.bias.data : nullptr;
  return out;
}

template <class P, class B, class S>
template <class H, class G>
void full_softmax<P, B, S>::run_dense_(const char* where, matrix_view<const H> hidden,
                                       vector_view<const index_t> targets, const loss_options& options,
                                       vector_view<float> per_sample, matrix_view<float> grad_hidden,
                                       dense_gradient<G> grad_weights, vector_view<const float> grad_output,
                                       float* loss) const {
  const dense_outputs dense = check_dense_gradient_(where, grad_weights);  // no data read: first
  verbs::check_loss_inputs(where, hidden, targets, options, per_sample, &grad_hidden, true, grad_output);
  run_into_(where, hidden, targets, options, per_sample, &grad_hidden, nullptr, grad_output, loss, nullptr, &dense);
}

template <class P, class B, class S>
template <class H, class G>
float full_softmax<P, B, S>::forward_backward(matrix_view<H> hidden, vector_view<const index_t> targets,
                                              matrix_view<float> grad_hidden, dense_gradient<G> grad_weights,
                                              loss_options options, vector_view<float> per_sample,
                                              vector_view<const float> grad_output) const {
  const detail::execution<B> ex{resources_};
  detail::scratch_vector<B, float> loss(1, ex);
  run_dense_("full_softmax::forward_backward", verbs::as_const(hidden), targets, options, per_sample, grad_hidden,
             grad_weights, grad_output, loss.data());
  return detail::backend_ops<B>::read(resources_, loss.data());  // waits for the work queued
}

template <class P, class B, class S>
template <class H, class G>
void full_softmax<P, B, S>::backward(matrix_view<H> hidden, vector_view<const index_t> targets,
                                     matrix_view<float> grad_hidden, dense_gradient<G> grad_weights,
                                     loss_options options, vector_view<const float> grad_output) const {
  run_dense_("full_softmax::backward", verbs::as_const(hidden), targets, options, {}, grad_hidden, grad_weights,
             grad_output, nullptr);
  detail::backend_ops<B>::synchronize(resources_);
}

template <class P, class B, class S>
template <class H, class G>
void full_softmax<P, B, S>::forward_backward_async(matrix_view<H> hidden, vector_view<const index_t> targets,
                                                   matrix_view<float> grad_hidden, dense_gradient<G> grad_weights,
                                                   vector_view<float> loss, loss_options options,
                                                   vector_view<float> per_sample,
                                                   vector_view<const float> grad_output) const {
  detail::check_async_loss("full_softmax::forward_backward_async", loss);
  run_dense_("full_softmax::forward_backward", verbs::as_const(hidden), targets, options, per_sample, grad_hidden,
             grad_weights, grad_output, loss.data);
}

template <class P, class B, class S>
template <class H, class G>
void full_softmax<P, B, S>::backward_async(matrix_view<H> hidden, vector_view<const index_t> targets,
                                           matrix_view<float> grad_hidden, dense_gradient<G> grad_weights,
                                           loss_options options, vector_view<const float> grad_output) const {
  run_dense_("full_softmax::backward", verbs::as_const(hidden), targets, options, {}, grad_hidden, grad_weights,
             grad_output, nullptr);
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::run_async_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                                    loss_options options, vector_view<float> per_sample,
                                    matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                                    vector_view<const float> grad_output, float* loss) const {
  run_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss);
}

// The algorithm, on every backend: check, pack the rows that count, one dense softmax over every
// class (chunked, online log-sum-exp, kept within the score-cache budget or recomputed in the
// backward), scatter back, reduce.
template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::run_into_(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                                   loss_options options, vector_view<float> per_sample,
                                   matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                                   vector_view<const float> grad_output, float* loss,
                                   const topk_outputs* topk, const dense_outputs* dense) const {
  if constexpr (sharded) {
    run_sharded_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss, topk);
    return;
  }
  const bool backward = grad_weights || dense;
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  const index_t n_cls = local_classes(), d = dim();

  detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, targets, options.ignore_index);
  detail::weigh_rows(ex, batch, options);
  detail::scratch_vector<B, float> upstream;
  if (backward) upstream = detail::upstream_gradients(ex, where, batch, hidden.rows, options.reduce, grad_output);
  const index_t rows = batch.rows;
  const storage_type* bias = store_.bias();
  detail::scratch_vector<B, float> losses(static_cast<std::size_t>(rows), ex, 0.f);  // accumulated into
  detail::scratch_vector<B, float> grad_packed(backward ? static_cast<std::size_t>(rows * d) : 0, ex, 0.f);

  // The exact softmax is one dense block: every packed row against every class.
  detail::dense_softmax_args a;
  a.h = batch.hidden_view();
  a.target = batch.target_data();
  a.n = n_cls;
  // Row blocks and the score cache only in the backward (see training_plan).
  if (backward) {
    const dense_step_plan plan = training_plan(rows);
    a.chunk = plan.chunk;
    a.row_block = plan.row_block;
    a.score_cache_bytes = plan.score_cache_bytes;
  } else {
    a.chunk = chunk_size_for(rows);
  }
  a.loss = detail::raw(losses);
  a.label_smoothing = options.label_smoothing;
  a.z_loss = options.z_loss;
  a.margin = options.margin;  // head_verbs checked: no bias with a margin
  a.softcap = options.softcap;
  a.gradient_filter = options.gradient_filter;
  if (batch.weights_in_pass) {  // class weights with label smoothing: the pass weighs the losses
    a.class_weight = options.class_weight.data;
    a.row_weight = batch.weight.data();
  }
  if (grad_weights) {
    gradient_type& g = *grad_weights;
    g.dim = d;
    const index_t touched = rows > 0 ? n_cls : 0;  // every class, unless no row counts
    g.rows.resize(static_cast<std::size_t>(touched));
    thrust::sequence(ex.policy(), g.rows.begin(), g.rows.end());
    g.values.resize(static_cast<std::size_t>(touched * d));
    g.bias_values.resize(bias && touched ? static_cast<std::size_t>(touched) : 0);
    a.upstream = detail::raw(upstream);
    a.grad_h = detail::raw(grad_packed);
    a.grad_w = detail::raw(g.values);
    a.grad_b = g.bias_values.empty() ? nullptr : detail::raw(g.bias_values);
  } else if (dense) {  // the caller's dense gradient; zero when no row counts (no block writes it)
    a.upstream = detail::raw(upstream);
    a.grad_h = detail::raw(grad_packed);
    a.grad_w = dense->weights;
    a.grad_w_storage = dense->storage_weights;
    a.grad_b = dense->bias;
    if (rows == 0) {
      if (dense->storage_weights)
        detail::parallel_for(ex, n_cls * d, detail::store_zero<storage_type>{dense->storage_weights});
      if (dense->weights) detail::parallel_for(ex, n_cls * d, detail::store_zero<float>{dense->weights});
      if (dense->bias) detail::parallel_for(ex, n_cls, detail::store_zero<float>{dense->bias});
    }
  }
  // forward_topk: the top-k kept from the same score chunks, its log-probabilities against the
  // rows' log-sum-exp (no second GEMM). Rows that are not packed (ignored) get -1 / -inf.
  std::optional<detail::basic_row_topk_state<B>> best;
  detail::scratch_vector<B, float> row_lse(topk ? static_cast<std::size_t>(rows) : 0, ex);
  if (topk) {
    best.emplace(rows, topk->k, ex);
    a.row_lse = detail::raw(row_lse);
    a.observe_scores = [&](index_t c0, index_t cn, const float* s) {
      detail::row_topk_update(ex, s, rows, cn, cn, c0, *best);
    };
  }
  detail::dense_softmax(ex, matrix_view<const storage_type>(weights()), bias, a);
  if (topk) {
    detail::row_topk_finish(ex, rows, *best);
    const index_t k = topk->k;
    if (rows < hidden.rows) detail::parallel_for(ex, hidden.rows * k, detail::clear_topk{k, topk->classes, topk->log_probs});
    detail::parallel_for(ex, rows * k,
                         detail::write_topk{detail::raw(best->score), detail::raw(best->index), detail::raw(row_lse), k,
                                            topk->classes, topk->log_probs, batch.sample_data()});
  }
  if (grad_hidden) detail::scatter_rows(ex, batch, detail::raw(grad_packed), *grad_hidden);
  detail::weigh_losses(ex, batch, options, detail::raw(losses));
  if (per_sample.size != 0) detail::scatter_losses(ex, batch, detail::raw(losses), per_sample);
  if (loss) detail::reduce_losses_into(ex, detail::raw(losses), rows, options.reduce, loss, batch.mean_divisor());
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::topk_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                               matrix_view<float> log_probs, exact_search) const {
  topk_into_(hidden, k, classes, log_probs);
  detail::backend_ops<B>::synchronize(resources_);
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::topk_async_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                     matrix_view<float> log_probs, exact_search) const {
  topk_into_(hidden, k, classes, log_probs);
}

// Every row's scores stream past a running top-k and an online log-sum-exp, chunk by chunk.
template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::topk_into_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                    matrix_view<float> log_probs) const {
  if constexpr (sharded) {
    topk_sharded_into_(hidden, k, classes, log_probs);
    return;
  }
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  const index_t n_cls = local_classes();
  const detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, {}, 0);
  const index_t rows = batch.rows;
  detail::basic_online_lse_state<B> lse(rows, ex);
  detail::basic_row_topk_state<B> best(rows, k, ex);
  detail::for_each_score_chunk(ex, batch.hidden_view(), matrix_view<const storage_type>(weights()), store_.bias(), 0,
                               n_cls, chunk_size_for(rows), [&](index_t c0, index_t cn, const float* s) {
                                 detail::online_lse_update(ex, s, rows, cn, cn, c0, nullptr, lse);
                                 detail::row_topk_update(ex, s, rows, cn, cn, c0, best);
                               });
  detail::row_topk_finish(ex, rows, best);
  detail::scratch_vector<B, float> row_lse(static_cast<std::size_t>(rows), ex);
  const float* l = detail::raw(row_lse);
  detail::online_lse_finish(ex, lse, rows, detail::raw(row_lse));
  detail::parallel_for(ex, rows * k,
                       detail::write_topk{detail::raw(best.score), detail::raw(best.index), l, k, classes, log_probs});
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::log_distribution_(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                                           matrix_view<float> out) const {
  log_distribution_into_(hidden, class_begin, class_end, out);
  detail::backend_ops<B>::synchronize(resources_);
}

template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::log_distribution_async_(matrix_view<const H> hidden, index_t class_begin,
                                                 index_t class_end, matrix_view<float> out) const {
  log_distribution_into_(hidden, class_begin, class_end, out);
}

// The log-sum-exp needs every class; then only the asked range is scored again.
template <class P, class B, class S>
template <class H>
void full_softmax<P, B, S>::log_distribution_into_(matrix_view<const H> hidden, index_t class_begin,
                                                index_t class_end, matrix_view<float> out) const {
  detail::expects(!sharded, "full_softmax::log_distribution: not offered by a class-sharded head (each rank holds ",
                  "only its own classes); use topk or log_prob, or an unsharded head");
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  const index_t n_cls = local_classes();
  const detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, {}, 0);
  const index_t rows = batch.rows, chunk = chunk_size_for(rows);
  const auto w = matrix_view<const storage_type>(weights());
  detail::basic_online_lse_state<B> lse(rows, ex);
  detail::for_each_score_chunk(ex, batch.hidden_view(), w, store_.bias(), 0, n_cls, chunk,
                               [&](index_t c0, index_t cn, const float* s) {
                                 detail::online_lse_update(ex, s, rows, cn, cn, c0, nullptr, lse);
                               });
  detail::scratch_vector<B, float> row_lse(static_cast<std::size_t>(rows), ex);
  const float* l = detail::raw(row_lse);
  detail::online_lse_finish(ex, lse, rows, detail::raw(row_lse));
  detail::for_each_score_chunk(ex, batch.hidden_view(), w, store_.bias(), class_begin, class_end - class_begin,
                               chunk, [&](index_t c0, index_t cn, const float* s) {
                                 detail::parallel_for(ex, rows * cn, detail::write_log_probs{s, l, c0, cn, out});
                               });
}

}  // namespace xsoftmax
