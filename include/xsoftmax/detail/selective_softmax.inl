// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Host implementation of `selective_softmax` (serial and omp backends).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/selection/active_set_checks.hpp>
#include <xsoftmax/detail/selection/per_sample_pass.hpp>
#include <xsoftmax/detail/selection/shared_pass.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/full_softmax.hpp>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {

namespace detail {

/// Whether a selector has `next_step(policy, weights)` / `next_step()`.
template <class S, class Policy, class T, class = void>
struct has_weighted_step : std::false_type {};
template <class S, class Policy, class T>
struct has_weighted_step<S, Policy, T,
                         std::void_t<decltype(std::declval<S&>().next_step(std::declval<const Policy&>(),
                                                                           std::declval<matrix_view<const T>>()))>>
    : std::true_type {};
template <class S, class = void>
struct has_plain_step : std::false_type {};
template <class S>
struct has_plain_step<S, std::void_t<decltype(std::declval<S&>().next_step())>> : std::true_type {};

}  // namespace detail

template <class S, class P, class B>
selective_softmax<S, P, B>::selective_softmax(S selector, index_t num_classes, index_t dim, bool with_bias,
                                              init_options init, backend_resources<B> resources)
    : selector_(std::move(selector)),
      store_("selective_softmax", num_classes, dim, with_bias, init),
      resources_(resources) {}

template <class S, class P, class B>
selective_softmax<S, P, B>::selective_softmax(S selector, matrix_view<storage_type> weights, storage_type* bias,
                                              backend_resources<B> resources)
    : selector_(std::move(selector)), store_("selective_softmax", weights, bias), resources_(resources) {}

template <class S, class P, class B>
void selective_softmax<S, P, B>::set_chunk_size(index_t classes) {
  detail::expects(classes >= 0, "selective_softmax::set_chunk_size: classes = ", classes, " must be >= 0");
  chunk_size_ = classes;
}

template <class S, class P, class B>
index_t selective_softmax<S, P, B>::chunk_size_for(index_t batch_rows, index_t active) const {
  index_t c = chunk_size_;
  if (c == 0) c = detail::default_chunk_columns(batch_rows);  // the full softmax's rule: the same chunks
  return std::max<index_t>(1, std::min(c, active));
}

template <class S, class P, class B>
void selective_softmax<S, P, B>::next_step() {
  const auto policy = backend_traits<B>::policy(resources_);
  if constexpr (detail::has_weighted_step<S, decltype(policy), storage_type>::value)
    selector_.next_step(policy, matrix_view<const storage_type>(weights()));
  else if constexpr (detail::has_plain_step<S>::value)
    selector_.next_step();
}

template <class S, class P, class B>
template <class H>
void selective_softmax<S, P, B>::select(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                        active_set& out, index_t ignore_index) const {
  const char* where = "selective_softmax::select";
  const auto policy = backend_traits<B>::policy(resources_);
  const detail::execution<B> ex{resources_};
  detail::check_hidden(ex, where, hidden, dim());
  detail::check_targets(ex, where, targets, hidden.rows, num_classes(), ignore_index);
  const detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, targets, ignore_index);
  selection_request<storage_type> req;
  req.where = where;
  req.num_classes = num_classes();
  req.dim = dim();
  req.weights = weights();
  req.bias = bias();
  req.hidden = batch.hidden_view();
  req.targets = {batch.target_data(), batch.rows};
  req.samples = {batch.sample_data(), batch.rows};
  req.batch_rows = hidden.rows;
  selector_.select(policy, req, out);
  (void)detail::locate_targets(where, out, batch, num_classes());
}

template <class S, class P, class B>
template <class H>
float selective_softmax<S, P, B>::run_(const char* where, matrix_view<const H> hidden,
                                      vector_view<const index_t> targets, loss_options options,
                                      vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                      gradient_type* grad_weights, vector_view<const float> grad_output) const {
  if constexpr (is_host_backend<B>) {
    return run_host(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output);
  } else {  // a device backend provides this verb in its header (the slot of backend.hpp)
    return detail::device_heads<B>::selective_run(*this, where, hidden, targets, options, per_sample, grad_hidden,
                                                  grad_weights, grad_output);
  }
}

template <class S, class P, class B>
template <class H>
float selective_softmax<S, P, B>::run_host(const char* where, matrix_view<const H> hidden,
                                           vector_view<const index_t> targets, loss_options options,
                                           vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                           gradient_type* grad_weights, vector_view<const float> grad_output) const {
  const auto policy = backend_traits<B>::policy(resources_);
  const detail::execution<B> ex{resources_};
  const index_t n_cls = num_classes(), d = dim();
  // Inputs were checked by head_verbs; packing, upstream gradients, scatter and the reduction are
  // the generic primitives every head uses.

  const detail::batch_rows<B> batch = detail::pack_rows(ex, hidden, targets, options.ignore_index);
  backend_vector<B, float> upstream;
  if (grad_weights) upstream = detail::upstream_gradients(ex, where, batch, hidden.rows, options.reduce, grad_output);
  const index_t rows = batch.rows;
  std::vector<float> losses(static_cast<std::size_t>(rows));
  std::vector<float> grad_packed(grad_weights ? static_cast<std::size_t>(rows * d) : 0, 0.f);

  if (rows > 0) {
    selection_request<storage_type> req;
    req.where = where;
    req.num_classes = n_cls;
    req.dim = d;
    req.weights = weights();
    req.bias = bias();
    req.hidden = batch.hidden_view();
    req.targets = {batch.target_data(), rows};
    req.samples = {batch.sample_data(), rows};
    req.batch_rows = hidden.rows;
    active_set set;
    selector_.select(policy, req, set);
    const std::vector<index_t> pos = detail::locate_targets(where, set, batch, n_cls);
    const auto w = matrix_view<const storage_type>(weights());
    const float* up = grad_weights ? upstream.data() : nullptr;
    if (set.layout == active_layout::shared) {
      const index_t chunk = chunk_size_for(rows, static_cast<index_t>(set.classes.size()));
      detail::shared_pass(policy, batch, set, pos, w, store_.bias(), chunk, up, losses, grad_packed, grad_weights);
    } else {
      detail::per_sample_pass(policy, batch, set, pos, w, store_.bias(), up, losses, grad_packed, grad_weights);
    }
  } else if (grad_weights) {  // every sample ignored: no row is touched
    grad_weights->dim = d;
    grad_weights->rows.clear();
    grad_weights->values.clear();
    grad_weights->bias_values.clear();
  }
  if (grad_hidden) detail::scatter_rows(ex, batch, grad_packed.data(), *grad_hidden);
  if (per_sample.size != 0) detail::scatter_losses(ex, batch, losses.data(), per_sample);
  return detail::reduce_losses(ex, losses.data(), rows, options.reduce);
}

template <class S, class P, class B>
template <class H>
void selective_softmax<S, P, B>::topk_(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                       matrix_view<float> log_probs, exact_search) const {
  // Prediction scores every class: a non-owning full softmax over the same weights (head_verbs
  // checked the inputs under this head's name).
  full_softmax<P, B> full(weights(), bias(), resources_);
  full.set_chunk_size(chunk_size_);
  full.topk(hidden, k, classes, log_probs);
}

template <class S, class P, class B>
template <class H>
void selective_softmax<S, P, B>::log_distribution_(matrix_view<const H> hidden, index_t class_begin,
                                                   index_t class_end, matrix_view<float> out) const {
  full_softmax<P, B> full(weights(), bias(), resources_);
  full.set_chunk_size(chunk_size_);
  full.log_distribution(hidden, class_begin, class_end, out);
}

}  // namespace xsoftmax
