// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Host implementation of `full_softmax` (serial and omp backends).

#include <xsoftmax/detail/batch.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/validation.hpp>

#include <thrust/sequence.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace xsoftmax {

template <class P, class B>
full_softmax<P, B>::full_softmax(index_t num_classes, index_t dim, bool with_bias, init_options init,
                                 backend_resources<B> resources)
    : store_("full_softmax", num_classes, dim, with_bias, init), resources_(resources) {}

template <class P, class B>
full_softmax<P, B>::full_softmax(matrix_view<storage_type> weights, storage_type* bias,
                                 backend_resources<B> resources)
    : store_("full_softmax", weights, bias), resources_(resources) {}

template <class P, class B>
void full_softmax<P, B>::set_chunk_size(index_t classes) {
  detail::expects(classes >= 0, "full_softmax::set_chunk_size: classes = ", classes, " must be >= 0");
  chunk_size_ = classes;
}

template <class P, class B>
index_t full_softmax<P, B>::chunk_size_for(index_t batch_rows) const {
  index_t c = chunk_size_;
  if (c == 0) {
    // ~32 MiB of fp32 scores: large enough that the GEMM runs near peak, small enough for L3-ish
    // reuse of the chunk between the score and gradient GEMMs.
    c = detail::default_chunk_columns(batch_rows);
  }
  return std::min(c, num_classes());
}

template <class P, class B>
template <class H>
float full_softmax<P, B>::run(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                              loss_options options, vector_view<float> per_sample,
                              matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                              vector_view<const float> grad_output) const {
  if constexpr (is_host_backend<B>) {
    return run_host(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output);
  } else {
    return detail::device_heads<B>::full_run(*this, where, hidden, targets, options, per_sample, grad_hidden,
                                             grad_weights, grad_output);
  }
}

template <class P, class B>
template <class H>
float full_softmax<P, B>::run_host(const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
                              loss_options options, vector_view<float> per_sample,
                              matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                              vector_view<const float> grad_output) const {
  const auto policy = backend_traits<B>::policy(resources_);
  const index_t n_cls = num_classes(), d = dim();
  detail::check_hidden(where, hidden, d);
  detail::check_targets(where, targets, hidden.rows, n_cls, options.ignore_index);
  if ((options.reduce == reduction::none && !grad_weights) || per_sample.size != 0)  // backward has no per_sample
    detail::check_output(where, "per_sample", per_sample, hidden.rows);
  if (grad_hidden) detail::check_output(where, "grad_hidden", *grad_hidden, hidden.rows, d);

  detail::packed_batch batch = detail::pack_batch(policy, hidden, targets, options.ignore_index);
  std::vector<float> upstream;
  if (grad_weights)
    upstream = detail::upstream_gradients(where, batch, hidden.rows, options.reduce, grad_output);
  const index_t rows = batch.rows();
  const storage_type* bias = store_.bias();
  std::vector<float> losses(static_cast<std::size_t>(rows), 0.f);
  std::vector<float> grad_packed(grad_weights ? static_cast<std::size_t>(rows * d) : 0, 0.f);

  // The exact softmax is one dense block: every packed row against every class.
  detail::dense_softmax_args a;
  a.h = batch.hidden_view();
  a.target = batch.target.data();
  a.n = n_cls;
  a.chunk = chunk_size_for(rows);
  a.loss = losses.data();
  if (grad_weights) {
    gradient_type& g = *grad_weights;
    g.dim = d;
    const index_t touched = rows > 0 ? n_cls : 0;  // every class, unless no row counts
    g.rows.resize(static_cast<std::size_t>(touched));
    thrust::sequence(policy, g.rows.begin(), g.rows.end());
    g.values.resize(static_cast<std::size_t>(touched * d));
    g.bias_values.resize(bias && touched ? static_cast<std::size_t>(touched) : 0);
    a.upstream = upstream.data();
    a.grad_h = grad_packed.data();
    a.grad_w = thrust::raw_pointer_cast(g.values.data());
    a.grad_b = g.bias_values.empty() ? nullptr : thrust::raw_pointer_cast(g.bias_values.data());
  }
  detail::dense_softmax(policy, matrix_view<const storage_type>(weights()), bias, a);
  if (grad_hidden) detail::scatter_rows(policy, batch, grad_packed, *grad_hidden);
  if (per_sample.size != 0) detail::scatter_losses(batch, losses, per_sample);
  return detail::reduce_losses(losses, options.reduce);
}

template <class P, class B>
template <class H>
float full_softmax<P, B>::forward(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                  loss_options options, vector_view<float> per_sample) const {
  return run("full_softmax::forward", hidden, targets, options, per_sample, nullptr, nullptr, {});
}

template <class P, class B>
template <class H>
float full_softmax<P, B>::forward_backward(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                           matrix_view<float> grad_hidden, gradient_type& grad_weights,
                                           loss_options options, vector_view<float> per_sample,
                                           vector_view<const float> grad_output) const {
  return run("full_softmax::forward_backward", hidden, targets, options, per_sample, &grad_hidden,
             &grad_weights, grad_output);
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::backward(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                  matrix_view<float> grad_hidden, gradient_type& grad_weights,
                                  loss_options options, vector_view<const float> grad_output) const {
  run("full_softmax::backward", hidden, targets, options, {}, &grad_hidden, &grad_weights, grad_output);
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::log_prob(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                  vector_view<float> out) const {
  loss_options o;
  o.reduce = reduction::none;
  o.ignore_index = std::numeric_limits<index_t>::min();  // no target may be skipped
  detail::check_output("full_softmax::log_prob", "out", out, hidden.rows);
  run("full_softmax::log_prob", hidden, targets, o, out, nullptr, nullptr, {});
  if constexpr (is_host_backend<B>) {
    for (index_t i = 0; i < out.size; ++i) out[i] = -out[i];
  } else {
    detail::device_heads<B>::negate(resources_, out);  // `out` is device memory
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::topk(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                              matrix_view<float> log_probs) const {
  if constexpr (!is_host_backend<B>) {
    detail::device_heads<B>::full_topk(*this, hidden, k, classes, log_probs);
  } else {
    topk_host(hidden, k, classes, log_probs);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::topk_host(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                   matrix_view<float> log_probs) const {
  const char* where = "full_softmax::topk";
  const auto policy = backend_traits<B>::policy(resources_);
  const index_t n_cls = num_classes();
  detail::check_hidden(where, hidden, dim());
  detail::expects(k >= 1 && k <= n_cls, where, ": k = ", k, " must be in [1, num_classes = ", n_cls, "]");
  detail::check_output(where, "classes", classes, hidden.rows, k);
  detail::check_output(where, "log_probs", log_probs, hidden.rows, k);
  const detail::packed_batch batch = detail::pack_all_rows(policy, hidden);
  const index_t rows = batch.rows();
  detail::online_lse_state lse(rows);
  detail::row_topk_state best(rows, k);
  detail::for_each_score_chunk(policy, batch.hidden_view(), matrix_view<const storage_type>(weights()),
                               store_.bias(), 0, n_cls, chunk_size_for(rows),
                               [&](index_t c0, index_t cn, const float* s) {
                                 detail::online_lse_update(policy, s, rows, cn, cn, c0, nullptr, lse);
                                 detail::row_topk_update(policy, s, rows, cn, cn, c0, best);
                               });
  detail::row_topk_finish(policy, rows, best);
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < k; ++j) {
      classes(r, j) = best.index[r * k + j];
      log_probs(r, j) = best.score[r * k + j] - lse.lse(r);
    }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::log_distribution(matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                                          matrix_view<float> out) const {
  if constexpr (!is_host_backend<B>) {
    detail::device_heads<B>::full_log_distribution(*this, hidden, class_begin, class_end, out);
  } else {
    log_distribution_host(hidden, class_begin, class_end, out);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::log_distribution_host(matrix_view<const H> hidden, index_t class_begin,
                                               index_t class_end, matrix_view<float> out) const {
  const char* where = "full_softmax::log_distribution";
  const auto policy = backend_traits<B>::policy(resources_);
  const index_t n_cls = num_classes();
  detail::check_hidden(where, hidden, dim());
  detail::expects<out_of_range>(class_begin >= 0 && class_begin < class_end && class_end <= n_cls, where,
                                ": class range [", class_begin, ", ", class_end, ") is empty or outside [0, ",
                                n_cls, ")");
  detail::check_output(where, "out", out, hidden.rows, class_end - class_begin);
  const detail::packed_batch batch = detail::pack_all_rows(policy, hidden);
  const index_t rows = batch.rows(), chunk = chunk_size_for(rows);
  const auto w = matrix_view<const storage_type>(weights());
  // The log-sum-exp needs every class; then only the asked range is scored again.
  detail::online_lse_state lse(rows);
  detail::for_each_score_chunk(policy, batch.hidden_view(), w, store_.bias(), 0, n_cls, chunk,
                               [&](index_t c0, index_t cn, const float* s) {
                                 detail::online_lse_update(policy, s, rows, cn, cn, c0, nullptr, lse);
                               });
  detail::for_each_score_chunk(policy, batch.hidden_view(), w, store_.bias(), class_begin, class_end - class_begin,
                               chunk, [&](index_t c0, index_t cn, const float* s) {
                                 for (index_t r = 0; r < rows; ++r)
                                   for (index_t j = 0; j < cn; ++j) out(r, c0 + j) = s[r * cn + j] - lse.lse(r);
                               });
}

// ------------------------------------------------------------------------------------------------
// _async verbs: host backends run the blocking verb; device backends queue (device_heads<B>::*_async).
// detail::check_async_loss comes from detail/async.hpp (through backend.hpp).
// ------------------------------------------------------------------------------------------------

template <class P, class B>
template <class H>
void full_softmax<P, B>::forward_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                       vector_view<float> loss, loss_options options,
                                       vector_view<float> per_sample) const {
  detail::check_async_loss("full_softmax::forward_async", loss);
  if constexpr (is_host_backend<B>) {
    loss[0] = forward(hidden, targets, options, per_sample);
  } else {
    detail::device_heads<B>::full_run_async(*this, "full_softmax::forward", hidden, targets, options, per_sample,
                                            nullptr, nullptr, {}, loss.data);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::forward_backward_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                                matrix_view<float> grad_hidden, gradient_type& grad_weights,
                                                vector_view<float> loss, loss_options options,
                                                vector_view<float> per_sample,
                                                vector_view<const float> grad_output) const {
  detail::check_async_loss("full_softmax::forward_backward_async", loss);
  if constexpr (is_host_backend<B>) {
    loss[0] = forward_backward(hidden, targets, grad_hidden, grad_weights, options, per_sample, grad_output);
  } else {
    detail::device_heads<B>::full_run_async(*this, "full_softmax::forward_backward", hidden, targets, options,
                                            per_sample, &grad_hidden, &grad_weights, grad_output, loss.data);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::backward_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                        matrix_view<float> grad_hidden, gradient_type& grad_weights,
                                        loss_options options, vector_view<const float> grad_output) const {
  if constexpr (is_host_backend<B>) {
    backward(hidden, targets, grad_hidden, grad_weights, options, grad_output);
  } else {
    detail::device_heads<B>::full_run_async(*this, "full_softmax::backward", hidden, targets, options, {},
                                            &grad_hidden, &grad_weights, grad_output, nullptr);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::log_prob_async(matrix_view<const H> hidden, vector_view<const index_t> targets,
                                        vector_view<float> out) const {
  if constexpr (is_host_backend<B>) {
    log_prob(hidden, targets, out);
  } else {
    loss_options o;
    o.reduce = reduction::none;
    o.ignore_index = std::numeric_limits<index_t>::min();  // no target may be skipped
    detail::check_output("full_softmax::log_prob", "out", out, hidden.rows);
    detail::device_heads<B>::full_run_async(*this, "full_softmax::log_prob", hidden, targets, o, out, nullptr,
                                            nullptr, {}, nullptr);
    detail::device_heads<B>::negate_async(resources_, out);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::topk_async(matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                                    matrix_view<float> log_probs) const {
  if constexpr (is_host_backend<B>) {
    topk(hidden, k, classes, log_probs);
  } else {
    detail::device_heads<B>::full_topk_async(*this, hidden, k, classes, log_probs);
  }
}

template <class P, class B>
template <class H>
void full_softmax<P, B>::log_distribution_async(matrix_view<const H> hidden, index_t class_begin,
                                                index_t class_end, matrix_view<float> out) const {
  if constexpr (is_host_backend<B>) {
    log_distribution(hidden, class_begin, class_end, out);
  } else {
    detail::device_heads<B>::full_log_distribution_async(*this, hidden, class_begin, class_end, out);
  }
}

}  // namespace xsoftmax
