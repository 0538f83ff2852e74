// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sharded_hierarchical_softmax`'s prefetch: `route_rows_async` routes a micro-batch's rows to
/// their subtrees' owners ahead of the verb, and the verbs taking the `routed_batch` run the same
/// step as the verbs taking `hidden` (`run_`, handed the routed state), so the results are bitwise
/// the same: the owners score the same rows in the same order (the rows a verb ignores travel but
/// are dropped before scoring).

#include <xsoftmax/detail/primitives/batch_rows.hpp>

#include <memory>
#include <string>

namespace xsoftmax {

template <class C, class F, class P, class B, int D>
auto sharded_hierarchical_softmax<C, F, P, B, D>::route_rows_async(matrix_view<const float> hidden,
                                                                   vector_view<const index_t> targets) const
    -> routed_batch {
  const std::string w = detail::verb_where(head_name, "route_rows_async");
  detail::check_hidden(detail::execution<B>{top_.resources()}, w.c_str(), hidden, dim());
  detail::expects<shape_error>(targets.size == hidden.rows && (targets.data != nullptr || hidden.rows == 0), w,
                               ": targets has ", targets.size, " entries but hidden has ", hidden.rows, " rows");
  const detail::execution<B> ex{top_.resources()};
  auto st = std::make_unique<detail::hs_routed_state<B, C>>();
  st->owner = this, st->rows = hidden.rows, st->dim = hidden.cols;
  st->own = pool_.take(static_cast<std::size_t>(hidden.rows * hidden.cols));
  {
    float* own = detail::raw(st->own);
    const index_t d = hidden.cols;
    XSOFTMAX_PARALLEL_FOR(ex, hidden.rows, i, {
      const float* h = hidden.row(i);
      for (index_t c = 0; c < d; ++c) own[i * d + c] = h[c];
    });
  }
  st->targets.resize(static_cast<std::size_t>(targets.size));
  if (targets.size > 0) detail::backend_ops<B>::copy(ex.res, detail::raw(st->targets), targets.data, targets.size);
  // Every class target: the verb's ignore_index is not known yet (its rows are dropped there).
  route_(*st, matrix_view<const float>(detail::raw(st->own), st->rows, st->dim), detail::to_host(ex, targets.data, targets.size),
         false, 0, true);
  return detail::routed_access::make(std::move(st));
}

template <class C, class F, class P, class B, int D>
detail::hs_routed_state<B, C>& sharded_hierarchical_softmax<C, F, P, B, D>::take_(const char* where,
                                                                               routed_batch& rows) const {
  auto* st = detail::routed_access::state(rows);
  detail::expects(st != nullptr, where, ": rows is an empty routed_batch (default-constructed or moved from)");
  detail::expects(st->owner == static_cast<const void*>(this), where,
                  ": rows were routed by another head (use the route_rows_async of the head that scores them)");
  detail::expects(!st->used, where, ": rows were already used by a verb (a routed_batch is used once)");
  return *st;
}

template <class C, class F, class P, class B, int D>
float sharded_hierarchical_softmax<C, F, P, B, D>::forward(routed_batch& rows, loss_options options,
                                                           vector_view<float> per_sample) const {
  auto& st = take_(detail::verb_where(head_name, "forward").c_str(), rows);
  const matrix_view<const float> hidden(detail::raw(st.own), st.rows, st.dim);
  const vector_view<const index_t> targets(detail::raw(st.targets), st.rows);
  const float loss = run_(detail::hs_route_mode::forward, hidden, targets, options, per_sample, nullptr, nullptr,
                          nullptr, {}, &st);
  st.used = true;
  return loss;
}

template <class C, class F, class P, class B, int D>
float sharded_hierarchical_softmax<C, F, P, B, D>::forward_backward(routed_batch& rows, matrix_view<float> grad_hidden,
                                                                    gradient_type& grad_top, gradient_type& grad_local,
                                                                    loss_options options,
                                                                    vector_view<float> per_sample,
                                                                    vector_view<const float> grad_output) const {
  auto& st = take_(detail::verb_where(head_name, "forward_backward").c_str(), rows);
  const matrix_view<const float> hidden(detail::raw(st.own), st.rows, st.dim);
  const vector_view<const index_t> targets(detail::raw(st.targets), st.rows);
  const float loss = run_(detail::hs_route_mode::train, hidden, targets, options, per_sample, &grad_hidden, &grad_top,
                          &grad_local, grad_output, &st);
  st.used = true;
  return loss;
}

template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::log_prob(routed_batch& rows, vector_view<float> out) const {
  const std::string w = detail::verb_where(head_name, "log_prob");
  auto& st = take_(w.c_str(), rows);
  detail::expects<shape_error>(out.size == st.rows && (out.data != nullptr || st.rows == 0), w, ": out has ",
                               out.size, " entries but rows has ", st.rows, " rows");
  const matrix_view<const float> hidden(detail::raw(st.own), st.rows, st.dim);
  const vector_view<const index_t> targets(detail::raw(st.targets), st.rows);
  run_(detail::hs_route_mode::log_prob, hidden, targets, detail::log_prob_options(), out, nullptr, nullptr, nullptr,
       {}, &st);
  st.used = true;
}

}  // namespace xsoftmax
