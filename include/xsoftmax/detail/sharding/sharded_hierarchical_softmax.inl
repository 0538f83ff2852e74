// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sharded_hierarchical_softmax`: construction and the one routed step behind every verb (see the
/// header's file comment). The routing's bookkeeping (targets, destinations, row counts) is on the
/// host; rows, losses and gradients stay in the backend's memory (routing.hpp).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/sparse_gradient_checks.hpp>
#include <xsoftmax/detail/sharding/routing.hpp>
#include <xsoftmax/head_verbs.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace xsoftmax {

namespace detail {
/// `top_weights` after the checks of the sharded head's constructor (see its documentation).
template <class Plan, class T>
matrix_view<T> checked_hs_shard_weights(const Plan& plan, int size, int rank, matrix_view<T> top_weights,
                                        matrix_view<T> local_weights, const T* top_bias, const T* local_bias) {
  constexpr const char* who = "sharded_hierarchical_softmax: ";
  expects(size == plan.ranks(), who, "the communicator has ", size, " ranks but the plan was made for ", plan.ranks());
  expects((top_bias == nullptr) == (local_bias == nullptr), who,
          "top_bias and local_bias must both be given or both be null");
  const index_t top_rows = static_cast<index_t>(plan.top_rows().size());
  const index_t local_rows = static_cast<index_t>(plan.local_rows(rank).size());
  expects<shape_error>(top_weights.rows == top_rows, who, "top_weights has ", top_weights.rows,
                       " rows but the plan's top tree has ", top_rows);
  expects<shape_error>(local_weights.rows == local_rows, who, "local_weights has ", local_weights.rows,
                       " rows but rank ", rank, "'s subtrees have ", local_rows);
  expects<shape_error>(local_weights.cols == top_weights.cols, who, "local_weights has ", local_weights.cols,
                       " columns but top_weights has ", top_weights.cols);
  return top_weights;
}
}  // namespace detail

template <class C, class F, class P, class B, int D>
sharded_hierarchical_softmax<C, F, P, B, D>::sharded_hierarchical_softmax(
    plan_type plan, C communicator, matrix_view<storage_type> top_weights, matrix_view<storage_type> local_weights,
    storage_type* top_bias, storage_type* local_bias, backend_resources<B> resources)
    : plan_(std::move(plan)),
      comm_(std::move(communicator)),
      rank_(comm_.rank()),
      top_(plan_.top_tree(),
           detail::checked_hs_shard_weights(plan_, comm_.size(), comm_.rank(), top_weights, local_weights, top_bias,
                                            local_bias),
           top_bias, resources),
      local_(plan_.local_forest(rank_), local_weights, local_bias, resources) {
  slot_.assign(static_cast<std::size_t>(plan_.num_subtrees()), -1);
  const auto& mine = plan_.subtrees_of(rank_);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    slot_[static_cast<std::size_t>(mine[i])] = static_cast<index_t>(i);
    class_begin_.push_back(plan_.local_class_offset(mine[i]));
    const auto& classes = plan_.subtree_classes(mine[i]);
    local_classes_.insert(local_classes_.end(), classes.begin(), classes.end());
  }
  if constexpr (is_host_backend<B>) rows_per_call_ = std::max<index_t>(1, 8192 / std::max<index_t>(1, dim()));  // 32 KiB
  else rows_per_call_ = std::numeric_limits<index_t>::max();  // a GPU wants one wide call
}

template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::log_prob(matrix_view<const float> hidden,
                                                           vector_view<const index_t> targets,
                                                           vector_view<float> out) const {
  detail::expects<shape_error>(out.size == hidden.rows && (out.data != nullptr || hidden.rows == 0),
                               detail::verb_where(head_name, "log_prob"), ": out has ", out.size, " entries but hidden has ",
                               hidden.rows, " rows");
  run_(detail::hs_route_mode::log_prob, hidden, targets, detail::log_prob_options(), out, nullptr, nullptr, nullptr, {},
       nullptr);
}

template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::apply_sgd(const gradient_type& grad_top,
                                                            const gradient_type& grad_local, float lr) {
  const std::string where = detail::verb_where(head_name, "apply_sgd");
  const index_t d = dim(), n_local = static_cast<index_t>(plan_.local_rows(rank_).size()), rows = grad_local.num_rows();
  detail::expects(std::isfinite(lr), where, ": lr = ", lr, " is not finite");
  // grad_local whole first, by the check the forest head's own apply_sgd makes (the forest's rows
  // are the local rows); then the top head checks grad_top before changing anything; only then is
  // anything written.
  if (rows > 0)
    detail::check_sparse_gradient(where.c_str(), detail::execution<B>{local_.resources()}, grad_local, n_local, d,
                                  local_.has_bias(), lr);
  top_.apply_sgd(grad_top, lr);
  if (rows > 0) local_.apply_sgd(grad_local, lr);  // the forest's rows are the local rows
}

// Step 4 of the routed step: the received rows (classes of this rank's forest, -1: a row the verb
// ignores, left at 0 in `reply`) through the forest head, in calls of whole subtrees of at least
// `rows_per_call()` rows each (host default: 32 KiB of hidden rows; device: one call). One call for
// the whole batch would pay the call's fixed cost once, but on a CPU it walks the tree level by
// level over all its rows (at d = 256 and 2.6k rows slower than a call per subtree; presumably the
// rows leave the core's caches between levels); the default's calls (64 rows at d = 128, 32 at
// d = 256) were faster than both in every run measured (bench/RESULTS.md, "one head call per
// rank"). Each row is scored alone in its subtree, so the results do not depend on the grouping.
// reply (received x rw, the backend's memory): per row, the loss (log-probability), then the hidden
// gradient when training.
template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::score_subtrees_(detail::hs_route_mode mode,
                                                                  const backend_vector<B, float>& recv_h,
                                                                  const std::vector<index_t>& recv_i,
                                                                  const std::vector<float>& recv_up,
                                                                  detail::scratch_vector<B, float>& reply,
                                                                  gradient_type* grad_local) const {
  using std::size_t;
  const detail::execution<B> ex{local_.resources()};
  const bool train = mode == detail::hs_route_mode::train;
  const index_t d = dim(), received = static_cast<index_t>(recv_i.size());
  if (train) {
    grad_local->dim = d;
    grad_local->rows.clear(), grad_local->values.clear(), grad_local->bias_values.clear();
  }
  // The scored rows grouped by subtree (a stable counting sort: each subtree's rows in arrival order).
  const size_t trees = class_begin_.size();
  std::vector<index_t> tree_of(static_cast<size_t>(received), -1), first(trees + 1, 0);
  for (index_t r = 0; r < received; ++r) {
    const index_t c = recv_i[static_cast<size_t>(r)];
    if (c < 0) continue;
    const auto k = std::upper_bound(class_begin_.begin(), class_begin_.end(), c) - class_begin_.begin() - 1;
    tree_of[static_cast<size_t>(r)] = static_cast<index_t>(k);
    ++first[static_cast<size_t>(k) + 1];
  }
  for (size_t k = 0; k < trees; ++k) first[k + 1] += first[k];
  std::vector<index_t> rows(static_cast<size_t>(first[trees])), next(first.begin(), first.end() - 1);
  for (index_t r = 0; r < received; ++r) {
    const index_t k = tree_of[static_cast<size_t>(r)];
    if (k >= 0) rows[static_cast<size_t>(next[static_cast<size_t>(k)]++)] = r;
  }
  if (rows.empty()) return;
  // The grouped rows' classes and upstream gradients, moved to the backend's memory once.
  std::vector<index_t> t_host(rows.size());
  std::vector<float> up_host(train ? rows.size() : 0);
  for (size_t j = 0; j < rows.size(); ++j) {
    t_host[j] = recv_i[static_cast<size_t>(rows[j])];
    if (train) up_host[j] = recv_up[static_cast<size_t>(rows[j])];
  }
  const auto rows_d = detail::to_scratch(ex, rows);
  const auto t_all = detail::to_scratch(ex, t_host);
  const auto up_all = detail::to_scratch(ex, up_host);

  loss_options none;
  none.reduce = reduction::none;
  none.ignore_index = -1;
  const index_t per_call = rows_per_call_;
  const matrix_view<const float> received_rows(detail::raw(recv_h), received, d);
  float* rp = detail::raw(reply);
  detail::scratch_vector<B, float> h, out, gh;  // sized per call below
  gradient_type& g = subtree_gradient_;  // overwritten by each call below
  for (size_t b = 0; b < rows.size();) {
    size_t e = b;  // whole subtrees, until the call has per_call rows
    while (e < rows.size() && (static_cast<index_t>(e - b) < per_call ||
                               tree_of[static_cast<size_t>(rows[e])] == tree_of[static_cast<size_t>(rows[e - 1])]))
      ++e;
    const index_t m = static_cast<index_t>(e - b);
    const index_t* call_rows = detail::raw(rows_d) + b;
    h.resize(static_cast<size_t>(m * d), ex), out.resize(static_cast<size_t>(m), ex);
    gh.resize(train ? static_cast<size_t>(m * d) : 0, ex);
    detail::gather_rows_by(ex, received_rows, call_rows, m, detail::raw(h));
    const matrix_view<const float> hv(detail::raw(h), m, d);
    const vector_view<const index_t> tv(detail::raw(t_all) + b, m);
    const vector_view<float> ov(detail::raw(out), m);
    if (train) {
      local_.forward_backward(hv, tv, matrix_view<float>(detail::raw(gh), m, d), g, none, ov,
                              vector_view<const float>(detail::raw(up_all) + b, m));
      grad_local->rows.insert(grad_local->rows.end(), g.rows.begin(), g.rows.end());  // forest rows = local rows
      grad_local->values.insert(grad_local->values.end(), g.values.begin(), g.values.end());
      grad_local->bias_values.insert(grad_local->bias_values.end(), g.bias_values.begin(), g.bias_values.end());
    } else if (mode == detail::hs_route_mode::forward) {
      local_.forward(hv, tv, none, ov);
    } else {
      local_.log_prob(hv, tv, ov);
    }
    detail::place_replies(ex, detail::raw(out), train ? detail::raw(gh) : nullptr, d, call_rows, m, rp);
    detail::backend_ops<B>::synchronize(ex.res);  // before the next call resizes h, out, gh
    b = e;
  }
}

// Routes this rank's rows whose target is a class below the frontier (less the ignored ones when
// `can_ignore`) to their subtree's owner: the row counts (blocking), then the hidden rows, started
// (`start_all_to_all`) when `start` and the communicator has it, else at once. `targets`: a host
// copy. Collective.
template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::route_(detail::hs_routed_state<B, C>& st,
                                                         matrix_view<const float> hidden,
                                                         const std::vector<index_t>& targets, bool can_ignore,
                                                         index_t ignore_index, bool start) const {
  using std::size_t;
  const detail::execution<B> ex{top_.resources()};
  const index_t d = dim(), n = num_classes();
  const int ranks = size();
  std::vector<std::vector<index_t>> to(static_cast<size_t>(ranks));
  for (index_t i = 0; i < hidden.rows; ++i) {
    const index_t t = targets[static_cast<size_t>(i)];
    if ((can_ignore && t == ignore_index) || t < 0 || t >= n || plan_.subtree_of(t) < 0) continue;
    to[static_cast<size_t>(plan_.owner(plan_.subtree_of(t)))].push_back(i);
  }
  st.order.clear();
  st.send_rows.assign(static_cast<size_t>(ranks), 0);
  for (int q = 0; q < ranks; ++q) {
    st.send_rows[static_cast<size_t>(q)] = static_cast<index_t>(to[static_cast<size_t>(q)].size());
    st.order.insert(st.order.end(), to[static_cast<size_t>(q)].begin(), to[static_cast<size_t>(q)].end());
  }
  const index_t routed = static_cast<index_t>(st.order.size());
  st.send_hidden = pool_.take(static_cast<size_t>(routed * d));
  const auto order_d = detail::to_scratch(ex, st.order);
  detail::gather_rows_by(ex, hidden, detail::raw(order_d), routed, detail::raw(st.send_hidden));
  st.recv_rows = detail::exchange_counts(ex, comm_, st.send_rows);
  const index_t received = detail::total_of(st.recv_rows);
  st.recv_hidden = pool_.take(static_cast<size_t>(received * d));
  const std::vector<index_t> out = detail::element_counts(st.send_rows, d), in = detail::element_counts(st.recv_rows, d);
  if constexpr (detail::has_start_all_to_all<C, float>) {
    if (start) {
      if constexpr (detail::takes_device_memory<C> || is_host_backend<B>) {
        detail::backend_ops<B>::synchronize(ex.res);
        st.pending.emplace(comm_.start_all_to_all(detail::raw(st.send_hidden), out.data(), detail::raw(st.recv_hidden), in.data()));
      } else {  // a device backend's rows through host buffers that live as long as the exchange
        st.host_send = detail::to_host(ex, detail::raw(st.send_hidden), routed * d);
        st.host_recv.resize(static_cast<size_t>(received * d));
        st.pending.emplace(comm_.start_all_to_all(st.host_send.data(), out.data(), st.host_recv.data(), in.data()));
      }
      return;
    }
  }
  detail::all_to_all_into(ex, comm_, detail::raw(st.send_hidden), out, detail::raw(st.recv_hidden), in);
}

// The routed step (see the header). Every check that can differ between ranks (shapes, targets,
// hidden values: the top head's own checks) runs before the first collective.
template <class C, class F, class P, class B, int D>
float sharded_hierarchical_softmax<C, F, P, B, D>::run_(detail::hs_route_mode mode, matrix_view<const float> hidden,
                                                        vector_view<const index_t> targets, loss_options options,
                                                        vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                        gradient_type* grad_top, gradient_type* grad_local,
                                                        vector_view<const float> grad_output,
                                                        detail::hs_routed_state<B, C>* pre) const {
  using std::size_t;
  using mode_t = detail::hs_route_mode;
  const detail::execution<B> ex{top_.resources()};
  const std::string where = detail::verb_where(
      head_name, mode == mode_t::train ? "forward_backward" : mode == mode_t::forward ? "forward" : "log_prob");
  const index_t rows = hidden.rows, d = dim(), n = num_classes();
  const int ranks = size();
  const bool train = mode == mode_t::train;

  detail::expects(options.class_weight.size == 0, where,
                  ": options.class_weight is not supported by the class-sharded ", head_name);
  // 1. Checks of what the top head cannot see (global targets, the caller's per-sample buffer), on
  //    a host copy of the targets (the routing's bookkeeping reads them there too).
  detail::expects<shape_error>(targets.size == rows && (targets.data != nullptr || rows == 0), where, ": targets has ",
                               targets.size, " entries but hidden has ", rows, " rows");
  const std::vector<index_t> target = detail::to_host(ex, targets.data, rows);
  const bool can_ignore = mode != mode_t::log_prob;
  for (index_t i = 0; i < rows; ++i) {
    const index_t t = target[static_cast<size_t>(i)];
    detail::expects<out_of_range>((can_ignore && t == options.ignore_index) || (t >= 0 && t < n), where, ": targets[", i,
                                  "] = ", t, " is out of range [0, ", n, ")",
                                  can_ignore ? " and is not ignore_index" : "");
  }
  if (per_sample.size != 0 || (mode == mode_t::forward && options.reduce == reduction::none))
    detail::expects<shape_error>(per_sample.size == rows && per_sample.data != nullptr, where, ": per_sample has ",
                                 per_sample.size, " entries but hidden has ", rows, " rows");
  const auto ignored = [&](index_t i) { return can_ignore && target[static_cast<size_t>(i)] == options.ignore_index; };

  // 2. The top tree on this rank's rows (its checks: hidden, options, grad shapes).
  std::vector<index_t> top_targets(static_cast<size_t>(rows));
  index_t valid = 0;
  for (index_t i = 0; i < rows; ++i) {
    top_targets[static_cast<size_t>(i)] = ignored(i) ? -1 : plan_.top_class(target[static_cast<size_t>(i)]);
    valid += ignored(i) ? 0 : 1;
  }
  detail::scratch_vector<B, float> part(static_cast<size_t>(rows), ex, 0.f);  // per row: loss (or log-probability)
  const vector_view<float> part_view(detail::raw(part), rows);
  const auto top_targets_d = detail::to_scratch(ex, top_targets);
  const vector_view<const index_t> top_view(detail::raw(top_targets_d), rows);
  loss_options top_options = options;
  top_options.ignore_index = -1;
  gradient_type& own_top = top_gradient_;  // overwritten by the top head's step
  if (train) top_.forward_backward(hidden, top_view, *grad_hidden, own_top, top_options, part_view, grad_output);
  else if (mode == mode_t::forward) top_.forward(hidden, top_view, top_options, part_view);
  else top_.log_prob(hidden, top_view, part_view);

  // 3. Rows below the frontier to their subtree's owner (routed already when prefetched): the
  //    hidden rows; then, per routed row, its class in the owner's forest (-1 for a row this verb
  //    ignores) and, when training, the unsharded head's upstream gradient (grad_output was
  //    checked by the top head).
  const std::vector<float> upstream = train ? detail::to_host(ex, grad_output.data, grad_output.size) : std::vector<float>{};
  float scale = 1.f;
  if (train) {
    if (options.reduce != reduction::none && upstream.size() == 1) scale = upstream[0];
    if (options.reduce == reduction::mean && valid > 0) scale /= static_cast<float>(valid);
  }
  const bool per_row_upstream = train && options.reduce == reduction::none && !upstream.empty();
  detail::hs_routed_state<B, C> blocking;
  detail::hs_routed_state<B, C>& st = pre ? *pre : blocking;
  if (!pre) route_(st, hidden, target, can_ignore, options.ignore_index, false);
  const std::vector<index_t>& order = st.order;
  std::vector<index_t> send_i(order.size());
  std::vector<float> send_up(train ? order.size() : 0);
  for (size_t p = 0; p < order.size(); ++p) {
    const index_t i = order[p], t = target[static_cast<size_t>(i)];
    send_i[p] = ignored(i) ? -1 : plan_.local_class_offset(plan_.subtree_of(t)) + plan_.local_class(t);
    if (train) send_up[p] = per_row_upstream ? upstream[static_cast<size_t>(i)] : scale;
  }
  const std::vector<index_t>&send_rows = st.send_rows, &recv_rows = st.recv_rows;
  const index_t received = detail::total_of(recv_rows);
  std::vector<index_t> recv_i(static_cast<size_t>(received));
  std::vector<float> recv_up(train ? static_cast<size_t>(received) : 0);
  detail::host_all_to_all(ex, comm_, send_i.data(), send_rows, recv_i.data(), recv_rows);
  if (train) detail::host_all_to_all(ex, comm_, send_up.data(), send_rows, recv_up.data(), recv_rows);
  st.complete();

  // 4. This rank's subtrees, through the forest head, on the received rows (reduction none,
  //    upstream per row).
  const index_t rw = 1 + (train ? d : 0);
  detail::scratch_vector<B, float> reply(static_cast<size_t>(received * rw), ex, 0.f);
  score_subtrees_(mode, st.recv_hidden, recv_i, recv_up, reply, grad_local);

  // 5. Back to the rows' ranks, added to the top part (a row appears once in `order`; a row a
  //    prefetch routed but this verb ignores is skipped).
  detail::scratch_buffer<B, float> back(order.size() * static_cast<size_t>(rw), ex);
  detail::all_to_all_into(ex, comm_, detail::raw(reply), detail::element_counts(recv_rows, rw), detail::raw(back),
                          detail::element_counts(send_rows, rw));
  std::vector<index_t> dest(order.size());
  for (size_t p = 0; p < order.size(); ++p) dest[p] = ignored(order[p]) ? -1 : order[p];
  const auto dest_d = detail::to_scratch(ex, dest);
  detail::add_routed_results(ex, detail::raw(back), detail::raw(dest_d), static_cast<index_t>(order.size()),
                             detail::raw(part), train ? *grad_hidden : matrix_view<float>{});

  // 6. The top tree's gradient: the union of every rank's touched rows, summed in rank order.
  if (train) {
    const index_t own_n = own_top.num_rows();
    std::vector<index_t> counts(static_cast<size_t>(ranks));
    detail::host_all_gather(ex, comm_, &own_n, 1, counts.data(), std::vector<index_t>(static_cast<size_t>(ranks), 1));
    const std::vector<index_t> own_rows = detail::to_host(ex, detail::raw(own_top.rows), own_n);
    std::vector<index_t> union_rows(static_cast<size_t>(detail::total_of(counts)));
    detail::host_all_gather(ex, comm_, own_rows.data(), own_n, union_rows.data(), counts);
    std::sort(union_rows.begin(), union_rows.end());
    union_rows.erase(std::unique(union_rows.begin(), union_rows.end()), union_rows.end());
    const index_t u = static_cast<index_t>(union_rows.size());
    const bool bias = top_.has_bias();
    std::vector<index_t> at(static_cast<size_t>(own_n));  // each own row's place in the union
    for (index_t e = 0; e < own_n; ++e)
      at[static_cast<size_t>(e)] = static_cast<index_t>(
          std::lower_bound(union_rows.begin(), union_rows.end(), own_rows[static_cast<size_t>(e)]) - union_rows.begin());
    const auto at_d = detail::to_scratch(ex, at);
    // Summed in the caller's gradient (its memory reused from the last step when it is large enough).
    grad_top->dim = d;
    grad_top->rows.assign(union_rows.begin(), union_rows.end());
    grad_top->values.assign(static_cast<size_t>(u * d), 0.f);
    grad_top->bias_values.assign(bias ? static_cast<size_t>(u) : 0, 0.f);
    auto &values = grad_top->values, &bias_values = grad_top->bias_values;
    detail::scatter_rows_to(ex, detail::raw(own_top.values), d, detail::raw(at_d), own_n, detail::raw(values));
    if (bias) detail::scatter_rows_to(ex, detail::raw(own_top.bias_values), 1, detail::raw(at_d), own_n, detail::raw(bias_values));
    detail::in_comm_memory<C>(ex, detail::raw(values), u * d, true, [&](float* p) { comm_.all_reduce(p, u * d, reduce_op::sum); });
    if (bias)
      detail::in_comm_memory<C>(ex, detail::raw(bias_values), u, true, [&](float* p) { comm_.all_reduce(p, u, reduce_op::sum); });
  }

  // 7. The routing's buffers back to the pool (`hidden` is the prefetched batch's `own`: no longer
  //    read); per-sample values and the reduced loss (in row order, in double).
  pool_.give(std::move(st.send_hidden));
  pool_.give(std::move(st.recv_hidden));
  if (pre) pool_.give(std::move(st.own));
  if (per_sample.size != 0) detail::backend_ops<B>::copy(ex.res, per_sample.data, detail::raw(part), rows);
  const std::vector<float> part_host = detail::to_host(ex, detail::raw(part), rows);
  double total = 0;
  for (float x : part_host) total += x;
  if (options.reduce == reduction::mean) total = valid > 0 ? total / static_cast<double>(valid) : 0.0;
  return static_cast<float>(total);
}

}  // namespace xsoftmax
