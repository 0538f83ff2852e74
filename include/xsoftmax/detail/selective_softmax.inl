// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `selective_softmax`, one implementation for every backend.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/selection/active_set_checks.hpp>
#include <xsoftmax/detail/selection/per_sample_pass.hpp>
#include <xsoftmax/detail/selection/scratch_active_set.hpp>
#include <xsoftmax/detail/selection/shared_pass.hpp>
#include <xsoftmax/detail/sharding/sharded_selection.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/full_softmax.hpp>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>

namespace xsoftmax {

namespace detail {

/// Whether a selector has `next_step(execution, weights)` / `next_step()`.
template <class S, class Ex, class T, class = void>
struct has_weighted_step : std::false_type {};
template <class S, class Ex, class T>
struct has_weighted_step<S, Ex, T,
                         std::void_t<decltype(std::declval<S&>().next_step(std::declval<const Ex&>(),
                                                                           std::declval<matrix_view<const T>>()))>>
    : std::true_type {};
template <class S, class = void>
struct has_plain_step : std::false_type {};
template <class S>
struct has_plain_step<S, std::void_t<decltype(std::declval<S&>().next_step())>> : std::true_type {};
/// Whether a selector's weighted step takes a share of its build (`next_step(ex, weights, share)`).
template <class S, class Ex, class T, class = void>
struct has_shared_build : std::false_type {};
template <class S, class Ex, class T>
struct has_shared_build<S, Ex, T,
                        std::void_t<decltype(std::declval<S&>().next_step(std::declval<const Ex&>(),
                                                                          std::declval<matrix_view<const T>>(),
                                                                          std::declval<const knn_build_share*>()))>>
    : std::true_type {};
/// Whether a selector says ahead of its step whether the step rebuilds from the weights
/// (`next_step_rebuilds()`): a sharded head then gathers the weights only for those steps.
template <class S, class = void>
struct has_rebuild_schedule : std::false_type {};
template <class S>
struct has_rebuild_schedule<S, std::void_t<decltype(std::declval<const S&>().next_step_rebuilds())>>
    : std::true_type {};

}  // namespace detail

template <class S, class P, class B, class Sh>
selective_softmax<S, P, B, Sh>::selective_softmax(S selector, index_t num_classes, index_t dim, bool with_bias,
                                              init_options init, backend_resources<B> resources)
    : weights_base("selective_softmax", num_classes, dim, with_bias, init, resources),
      selector_(std::move(selector)) {
  static_assert(!sharded, "selective_softmax: a sharded head is constructed from its class_sharding");
}

template <class S, class P, class B, class Sh>
selective_softmax<S, P, B, Sh>::selective_softmax(S selector, matrix_view<storage_type> weights, storage_type* bias,
                                              backend_resources<B> resources)
    : weights_base("selective_softmax", weights, bias, resources), selector_(std::move(selector)) {
  static_assert(!sharded, "selective_softmax: a sharded head is constructed from its class_sharding");
}

template <class S, class P, class B, class Sh>
void selective_softmax<S, P, B, Sh>::set_chunk_size(index_t classes) {
  detail::expects(classes >= 0, "selective_softmax::set_chunk_size: classes = ", classes, " must be >= 0");
  chunk_size_ = classes;
}

template <class S, class P, class B, class Sh>
index_t selective_softmax<S, P, B, Sh>::chunk_size_for(index_t batch_rows, index_t active) const {
  index_t c = chunk_size_;
  if (c == 0)  // the full softmax's rule: the same chunks
    c = is_host_backend<B> ? detail::default_chunk_columns(batch_rows) : detail::device_chunk_columns(batch_rows);
  return std::max<index_t>(1, std::min(c, active));
}

template <class S, class P, class B, class Sh>
void selective_softmax<S, P, B, Sh>::next_step() {
  const detail::execution<B> ex{resources_};
  if constexpr (detail::has_weighted_step<S, detail::execution<B>, storage_type>::value) {
    // Sharded: the whole matrix is gathered only for a step that reads it (every rank agrees: the
    // selectors' schedules are the same everywhere).
    if constexpr (sharded && detail::has_rebuild_schedule<S>::value) {
      if (!selector_.next_step_rebuilds()) {
        selector_.next_step(ex, matrix_view<const storage_type>(nullptr, 0, dim()));
        return;
      }
    }
    with_all_weights_([&](matrix_view<const storage_type> w, const knn_build_share* share) {
      if constexpr (detail::has_shared_build<S, detail::execution<B>, storage_type>::value)
        selector_.next_step(ex, w, share);
      else
        selector_.next_step(ex, w);
    });
  } else if constexpr (detail::has_plain_step<S>::value) {
    selector_.next_step();
  }
}

template <class S, class P, class B, class Sh>
template <class F>
void selective_softmax<S, P, B, Sh>::with_all_weights_(F f) const {
  if constexpr (sharded && detail::has_ring<Sh> &&
                detail::has_shared_build<S, detail::execution<B>, storage_type>::value) {
    // A selector that builds in shares goes round the ring from the local rows (no gathered matrix).
    const detail::execution<B> ex{resources_};
    const knn_build_share share = detail::graph_ring_share(ex, sharding_);
    f(matrix_view<const storage_type>(weights()), &share);
  } else if constexpr (sharded) {
    const detail::execution<B> ex{resources_};
    const backend_vector<B, storage_type> all =
        detail::gather_weights(ex, sharding_, matrix_view<const storage_type>(weights()));
    const knn_build_share share = detail::graph_build_share(ex, sharding_);
    f(matrix_view<const storage_type>(thrust::raw_pointer_cast(all.data()), num_classes(), dim()), &share);
  } else {
    f(matrix_view<const storage_type>(weights()), static_cast<const knn_build_share*>(nullptr));
  }
}

template <class S, class P, class B, class Sh>
selection_request<typename P::storage_type> selective_softmax<S, P, B, Sh>::request_(const char* where,
                                                                                 const detail::batch_rows<B>& batch,
                                                                                 index_t batch_rows) const {
  selection_request<storage_type> req;
  req.where = where;
  req.num_classes = num_classes();
  req.dim = dim();
  if constexpr (sharded) {  // a selector sees no weights: each rank holds a slice only
    req.weights = matrix_view<const storage_type>(nullptr, 0, dim());
    req.bias = nullptr;
  } else {
    req.weights = weights();
    req.bias = bias();
  }
  req.hidden = batch.hidden_view();
  req.targets = {batch.target_data(), batch.rows};
  req.samples = {batch.sample_data(), batch.rows};
  req.batch_rows = batch_rows;
  return req;
}

template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::select(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                        active_set_for<B>& out, index_t ignore_index) const {
  const char* where = "selective_softmax::select";
  const detail::execution<B> ex{resources_};
  detail::check_hidden(ex, where, hidden, dim());
  detail::check_targets(ex, where, targets, hidden.rows, num_classes(), ignore_index);
  detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, targets, ignore_index);
  if constexpr (sharded) {
    const detail::scratch_vector<B, index_t> own_sample = batch.sample;
    detail::sharded_rows<B> rows = detail::gather_rows(ex, sharding_, std::move(batch), nullptr);
    const index_t batch_rows = detail::gather_samples(ex, sharding_, own_sample, hidden.rows, rows);
    selector_.select(ex, request_(where, rows.all, batch_rows), out);
    (void)detail::locate_targets(ex, where, out, rows.all, num_classes());
  } else {
    selector_.select(ex, request_(where, batch, hidden.rows), out);
    (void)detail::locate_targets(ex, where, out, batch, num_classes());
  }
  detail::backend_ops<B>::synchronize(resources_);
}

template <class S, class P, class B, class Sh>
template <class H>
float selective_softmax<S, P, B, Sh>::run_(const char* where, matrix_view<const H> hidden,
                                      vector_view<const index_t> targets, loss_options options,
                                      vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                      gradient_type* grad_weights, vector_view<const float> grad_output) const {
  detail::scratch_vector<B, float> loss(1, detail::execution<B>{resources_});
  run_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss.data());
  return detail::backend_ops<B>::read(resources_, loss.data());  // waits for the work queued
}

template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::run_async_(const char* where, matrix_view<const H> hidden,
                                           vector_view<const index_t> targets, loss_options options,
                                           vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                           gradient_type* grad_weights, vector_view<const float> grad_output,
                                           float* loss) const {
  run_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss);
}

// The algorithm, on every backend: pack the rows that count, ask the selector for the active set,
// check it and find each row's target in it, one shared or per-sample pass, scatter back, reduce.
template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::run_into_(const char* where, matrix_view<const H> hidden,
                                           vector_view<const index_t> targets, loss_options options,
                                           vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                           gradient_type* grad_weights, vector_view<const float> grad_output,
                                           float* loss) const {
  if constexpr (sharded) {
    run_sharded_into_(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output, loss);
    return;
  }
  const detail::execution<B> ex{resources_};  // inputs were checked by head_verbs
  const index_t d = dim();
  detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, targets, options.ignore_index);
  detail::weigh_rows(ex, batch, options);
  detail::scratch_vector<B, float> upstream;
  if (grad_weights) upstream = detail::upstream_gradients(ex, where, batch, hidden.rows, options.reduce, grad_output);
  const index_t rows = batch.rows;
  detail::scratch_vector<B, float> losses(static_cast<std::size_t>(rows), ex, 0.f);
  detail::scratch_vector<B, float> grad_packed(grad_weights ? static_cast<std::size_t>(rows * d) : 0, ex, 0.f);

  if (rows > 0) {
    auto set = detail::make_selection_set<S>(ex);  // working memory of the call when the selector takes it
    selector_.select(ex, request_(where, batch, hidden.rows), set);
    const detail::scratch_vector<B, index_t> pos =
        detail::locate_targets(ex, where, set, batch, num_classes(), !detail::selector_sets_valid<S>);
    const auto w = matrix_view<const storage_type>(weights());
    const float* up = grad_weights ? detail::raw(upstream) : nullptr;
    if (set.layout == active_layout::shared) {
      const index_t chunk = chunk_size_for(rows, static_cast<index_t>(set.classes.size()));
      detail::shared_pass(ex, batch, set, thrust::raw_pointer_cast(pos.data()), w, store_.bias(), chunk, options, up,
                          detail::raw(losses), detail::raw(grad_packed), grad_weights);
    } else {
      detail::per_sample_pass(ex, batch, set, thrust::raw_pointer_cast(pos.data()), w, store_.bias(), options, up,
                              detail::raw(losses), detail::raw(grad_packed), grad_weights);
    }
  } else if (grad_weights) {  // every sample ignored: no row is touched
    grad_weights->dim = d;
    grad_weights->rows.clear();
    grad_weights->values.clear();
    grad_weights->bias_values.clear();
  }
  if (grad_hidden) detail::scatter_rows(ex, batch, detail::raw(grad_packed), *grad_hidden);
  detail::weigh_losses(ex, batch, options, detail::raw(losses));
  if (per_sample.size != 0) detail::scatter_losses(ex, batch, detail::raw(losses), per_sample);
  if (loss) detail::reduce_losses_into(ex, detail::raw(losses), rows, options.reduce, loss, batch.mean_divisor());
}

template <class S, class P, class B, class Sh>
full_softmax<P, B, Sh> selective_softmax<S, P, B, Sh>::full_() const {
  // Non-owning, over the same weights; head_verbs checked the inputs under this head's name.
  auto full = [&] {
    if constexpr (sharded) return full_softmax<P, B, Sh>(sharding_, weights(), bias(), resources_);
    else return full_softmax<P, B, Sh>(weights(), bias(), resources_);
  }();
  full.set_chunk_size(chunk_size_);
  return full;
}

// Prediction scores every class: the full softmax over the same weights (sharded: its sharded path).
template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::topk_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                           matrix_view<float> log_probs, exact_search) const {
  full_().topk(hidden, k, classes, log_probs);
}

template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::log_distribution_(matrix_view<const H> hidden, index_t class_begin,
                                                       index_t class_end, matrix_view<float> out) const {
  full_().log_distribution(hidden, class_begin, class_end, out);
}

template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::topk_async_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                                 matrix_view<float> log_probs, exact_search) const {
  full_().topk_async(hidden, k, classes, log_probs);
}

template <class S, class P, class B, class Sh>
template <class H>
void selective_softmax<S, P, B, Sh>::log_distribution_async_(matrix_view<const H> hidden, index_t class_begin,
                                                             index_t class_end, matrix_view<float> out) const {
  full_().log_distribution_async(hidden, class_begin, class_end, out);
}

}  // namespace xsoftmax
