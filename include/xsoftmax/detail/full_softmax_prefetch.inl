// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax`'s prefetch (class-sharded heads): `gather_rows_async` starts the gather of a
/// micro-batch's rows, and the verbs taking the `gathered_batch` score them with the same code as
/// the verbs taking `hidden` (`run_gathered_`, `topk_gathered_`), once the gather is complete and
/// the ignored rows dropped (`detail::finish_gather`): the results are bitwise the same.

#include <xsoftmax/detail/sharding/prefetch.hpp>

#include <string>
#include <type_traits>

namespace xsoftmax {

template <class P, class B, class S>
template <class H>
auto full_softmax<P, B, S>::gather_rows_async(matrix_view<H> hidden) const -> gathered_batch {
  static_assert(sharded, "full_softmax: gather_rows_async is offered by class-sharded heads only");
  using E = std::remove_const_t<H>;
  static_assert(is_supported_element<E>, "xsoftmax: hidden must be a matrix_view of float, double, bf16 or fp16");
  const std::string w = detail::verb_where(head_name, "gather_rows_async");
  const detail::execution<B> ex{resources_};
  detail::check_hidden(ex, w.c_str(), matrix_view<const E>(hidden), dim());
  return detail::start_gather(ex, sharding_, matrix_view<const E>(hidden), this);
}

template <class P, class B, class S>
auto full_softmax<P, B, S>::usable_(const char* where, const gathered_batch& g) const
    -> detail::gathered_state<B, typename detail::communicator_of<S>::type>& {
  static_assert(sharded, "full_softmax: a gathered_batch is taken by class-sharded heads only");
  auto* st = detail::gathered_access::state(g);
  detail::expects(st != nullptr, where, ": rows is an empty gathered_batch (default-constructed or moved from)");
  detail::expects(st->owner == static_cast<const void*>(this), where,
                  ": rows were gathered by another head (use the gather_rows_async of the head that scores them)");
  detail::expects(!st->used, where, ": rows were already used by a verb (a gathered_batch is used once)");
  return *st;
}

// head_verbs' checks of the loss verbs, less the hidden rows' (checked when the gather started).
template <class P, class B, class S>
void full_softmax<P, B, S>::check_prefetched_loss_(const char* w, const gathered_batch& g,
                                                   vector_view<const index_t> targets, const loss_options& options,
                                                   vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                   bool backward, vector_view<const float> grad_output) const {
  const index_t rows = usable_(w, g).rows;
  verbs::check_loss_rows(
      w, rows,
      [&](const detail::execution<B>& ex) {  // the rows were checked at the prefetch
        detail::check_targets(ex, w, targets, rows, num_classes(), options.ignore_index);
      },
      options, per_sample, grad_hidden, backward, grad_output);
}

// As run_sharded_into_, with the rows from the prefetch: this rank's sample map and upstream
// gradients from the targets, every rank's kept rows from the gathered batch.
template <class P, class B, class S>
float full_softmax<P, B, S>::run_prefetched_(const char* where, gathered_batch& g, vector_view<const index_t> targets,
                                             loss_options options, vector_view<float> per_sample,
                                             matrix_view<float>* grad_hidden, gradient_type* grad_weights,
                                             vector_view<const float> grad_output, const topk_outputs* topk) const {
  auto& st = usable_(where, g);
  st.used = true;
  const detail::execution<B> ex{resources_};
  // pack_rows of zero columns: the sample map and targets of the kept rows, no row copied.
  detail::batch_rows<B> own =
      detail::pack_rows(ex, matrix_view<const float>(detail::raw(st.own), st.rows, 0), targets, options.ignore_index);
  own.dim = dim();
  detail::scratch_vector<B, float> own_upstream;
  if (grad_weights) own_upstream = detail::upstream_gradients(ex, where, own, st.rows, options.reduce, grad_output);
  detail::sharded_rows<B> rows =
      detail::finish_gather(ex, sharding_, st, targets, options.ignore_index, grad_weights ? &own_upstream : nullptr);
  detail::scratch_vector<B, float> loss(1, ex);
  run_gathered_(rows, own, options, per_sample, grad_hidden, grad_weights, loss.data(), topk);
  return detail::backend_ops<B>::read(resources_, loss.data());
}

template <class P, class B, class S>
float full_softmax<P, B, S>::forward(gathered_batch& rows, vector_view<const index_t> targets, loss_options options,
                                     vector_view<float> per_sample) const {
  const std::string w = detail::verb_where(head_name, "forward");
  check_prefetched_loss_(w.c_str(), rows, targets, options, per_sample, nullptr, false, {});
  return run_prefetched_(w.c_str(), rows, targets, options, per_sample, nullptr, nullptr, {});
}

template <class P, class B, class S>
float full_softmax<P, B, S>::forward_backward(gathered_batch& rows, vector_view<const index_t> targets,
                                              matrix_view<float> grad_hidden, gradient_type& grad_weights,
                                              loss_options options, vector_view<float> per_sample,
                                              vector_view<const float> grad_output) const {
  const std::string w = detail::verb_where(head_name, "forward_backward");
  check_prefetched_loss_(w.c_str(), rows, targets, options, per_sample, &grad_hidden, true, grad_output);
  return run_prefetched_(w.c_str(), rows, targets, options, per_sample, &grad_hidden, &grad_weights, grad_output);
}

template <class P, class B, class S>
void full_softmax<P, B, S>::backward(gathered_batch& rows, vector_view<const index_t> targets,
                                     matrix_view<float> grad_hidden, gradient_type& grad_weights, loss_options options,
                                     vector_view<const float> grad_output) const {
  const std::string w = detail::verb_where(head_name, "backward");
  check_prefetched_loss_(w.c_str(), rows, targets, options, {}, &grad_hidden, true, grad_output);
  run_prefetched_(w.c_str(), rows, targets, options, {}, &grad_hidden, &grad_weights, grad_output);
}

template <class P, class B, class S>
void full_softmax<P, B, S>::log_prob(gathered_batch& rows, vector_view<const index_t> targets,
                                     vector_view<float> out) const {
  const std::string w = detail::verb_where(head_name, "log_prob");
  const index_t n = usable_(w.c_str(), rows).rows;
  const detail::execution<B> ex{resources_};
  detail::check_targets(ex, w.c_str(), targets, n, num_classes());
  detail::check_output(w.c_str(), "out", out, n);
  run_prefetched_(w.c_str(), rows, targets, detail::log_prob_options(), out, nullptr, nullptr, {});
  detail::parallel_for(ex, out.size, detail::negate_in_place{out.data});
  detail::backend_ops<B>::synchronize(resources_);
}

template <class P, class B, class S>
void full_softmax<P, B, S>::topk(gathered_batch& rows, index_t k, matrix_view<index_t> classes,
                                 matrix_view<float> log_probs) const {
  const std::string w = detail::verb_where(head_name, "topk");
  auto& st = usable_(w.c_str(), rows);
  const index_t n = num_classes();
  detail::expects(k >= 1 && k <= n, w, ": k = ", k, " must be in [1, num_classes = ", n, "]");
  detail::check_output(w.c_str(), "classes", classes, st.rows, k);
  detail::check_output(w.c_str(), "log_probs", log_probs, st.rows, k);
  st.used = true;
  const detail::execution<B> ex{resources_};
  detail::sharded_rows<B> gathered = detail::finish_gather(ex, sharding_, st, {}, 0, nullptr);
  topk_gathered_(gathered, st.rows, k, classes, log_probs);
}

template <class P, class B, class S>
float full_softmax<P, B, S>::forward_topk(gathered_batch& rows, vector_view<const index_t> targets, index_t k,
                                          matrix_view<index_t> classes, matrix_view<float> log_probs,
                                          loss_options options, vector_view<float> per_sample) const {
  const std::string w = detail::verb_where(head_name, "forward_topk");
  check_topk_without_margin_(w.c_str(), usable_(w.c_str(), rows).rows, k, classes, log_probs, options);
  check_prefetched_loss_(w.c_str(), rows, targets, options, per_sample, nullptr, false, {});
  const topk_outputs out{k, classes, log_probs};
  return run_prefetched_(w.c_str(), rows, targets, options, per_sample, nullptr, nullptr, {}, &out);
}

}  // namespace xsoftmax
