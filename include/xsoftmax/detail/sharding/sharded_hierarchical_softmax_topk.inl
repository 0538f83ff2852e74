// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sharded_hierarchical_softmax::topk`: an exact search in two rounds (see the header). Since
/// log p(c) = log p_top(s(c)) + log p_sub(c) <= log p_top(s(c)), a top leaf whose log-probability is
/// below a row's k-th best candidate cannot hold a better class; round 1 explores the top tree's
/// best leaves, round 2 every other leaf that reaches the k-th best of round 1. The candidates are
/// merged on the host (k per explored subtree); rows and searches stay in the backend's memory.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/sharding/routing.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace xsoftmax {

namespace detail {
/// Best first: higher log-probability, then the smaller class (the unsharded head's order).
inline bool hs_topk_before(const std::pair<float, index_t>& a, const std::pair<float, index_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}
}  // namespace detail

template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::topk(matrix_view<const float> hidden, index_t k,
                                                       matrix_view<index_t> classes, matrix_view<float> log_probs) const {
  using std::size_t;
  const detail::execution<B> ex{top_.resources()};
  const std::string where = detail::verb_where(head_name, "topk");
  const index_t rows = hidden.rows, n = num_classes(), m = plan_.top_tree().num_classes();
  detail::expects(k >= 1 && k <= n, where, ": k = ", k, " must be in [1, num_classes = ", n, "]");
  detail::expects<shape_error>(classes.rows == rows && classes.cols == k && log_probs.rows == rows &&
                                   log_probs.cols == k,
                               where, ": classes is ", classes.rows, " x ", classes.cols, " and log_probs ",
                               log_probs.rows, " x ", log_probs.cols, " but hidden has ", rows, " rows and k = ", k);
  // The search packs a weight row into 32 bits (tree_search.hpp), as hierarchical_softmax::topk.
  detail::expects(local_.tree().num_rows() <= index_t(0xFFFFFFFF), where, ": this rank's subtrees have ",
                  local_.tree().num_rows(), " weight rows; the search supports at most 2^32 - 1");
  detail::hs_topk_candidates candidates(static_cast<size_t>(rows));
  std::vector<detail::hs_topk_request> requests;
  const auto add_leaf = [&](index_t i, index_t j, float lp) {
    const index_t c = plan_.top_leaf_class(j);
    if (c >= 0) candidates[static_cast<size_t>(i)].push_back({lp, c});
    else requests.push_back({i, plan_.top_leaf_subtree(j), lp});
  };
  // Round 1: the top tree's best leaves (the top head checks hidden).
  const index_t k1 = std::min(k, m);
  detail::scratch_buffer<B, index_t> first_d(static_cast<size_t>(rows * k1), ex);  // (the call's buffers: written, then read)
  detail::scratch_buffer<B, float> first_lp_d(first_d.size(), ex);
  top_.topk(hidden, k1, matrix_view<index_t>(detail::raw(first_d), rows, k1), matrix_view<float>(detail::raw(first_lp_d), rows, k1));
  std::vector<index_t> first = detail::to_host(ex, detail::raw(first_d), rows * k1);
  const std::vector<float> first_lp = detail::to_host(ex, detail::raw(first_lp_d), rows * k1);
  for (index_t i = 0; i < rows; ++i)
    for (index_t e = 0; e < k1; ++e) add_leaf(i, first[static_cast<size_t>(i * k1 + e)], first_lp[static_cast<size_t>(i * k1 + e)]);
  explore_(hidden, k, requests, candidates);
  // Round 2: every other top leaf that reaches the row's k-th best so far (all of them while a
  // row has fewer than k candidates), scanned a chunk of top classes at a time.
  std::vector<float> bound(static_cast<size_t>(rows), -INFINITY);
  for (index_t i = 0; i < rows; ++i) {
    auto& c = candidates[static_cast<size_t>(i)];
    std::sort(c.begin(), c.end(), detail::hs_topk_before);
    if (static_cast<index_t>(c.size()) >= k) bound[static_cast<size_t>(i)] = c[static_cast<size_t>(k - 1)].first;
    std::sort(first.begin() + i * k1, first.begin() + (i + 1) * k1);
  }
  requests.clear();
  constexpr index_t chunk = 1024;
  detail::scratch_buffer<B, float> lp_d(static_cast<size_t>(rows * std::min(chunk, m)), ex);
  for (index_t j0 = 0; j0 < m; j0 += chunk) {
    const index_t jn = std::min(chunk, m - j0);
    top_.log_distribution(hidden, j0, j0 + jn, matrix_view<float>(detail::raw(lp_d), rows, jn));
    const std::vector<float> lp = detail::to_host(ex, detail::raw(lp_d), rows * jn);
    for (index_t i = 0; i < rows; ++i)
      for (index_t e = 0; e < jn; ++e) {
        const float v = lp[static_cast<size_t>(i * jn + e)];
        if (v < bound[static_cast<size_t>(i)]) continue;
        if (std::binary_search(first.begin() + i * k1, first.begin() + (i + 1) * k1, j0 + e)) continue;
        add_leaf(i, j0 + e, v);
      }
  }
  explore_(hidden, k, requests, candidates);
  std::vector<index_t> best(static_cast<size_t>(rows * k));
  std::vector<float> best_lp(best.size());
  for (index_t i = 0; i < rows; ++i) {
    auto& c = candidates[static_cast<size_t>(i)];
    std::partial_sort(c.begin(), c.begin() + k, c.end(), detail::hs_topk_before);  // >= k: see the header
    for (index_t e = 0; e < k; ++e) {
      best[static_cast<size_t>(i * k + e)] = c[static_cast<size_t>(e)].second;
      best_lp[static_cast<size_t>(i * k + e)] = c[static_cast<size_t>(e)].first;
    }
  }
  // Into the caller's outputs (the backend's memory, any row stride).
  const auto best_d = detail::to_scratch(ex, best);
  const auto best_lp_d = detail::to_scratch(ex, best_lp);
  const index_t* bc = detail::raw(best_d);
  const float* bl = detail::raw(best_lp_d);
  XSOFTMAX_PARALLEL_FOR(ex, rows, i, {
    for (index_t e = 0; e < k; ++e) classes(i, e) = bc[i * k + e], log_probs(i, e) = bl[i * k + e];
  });
  detail::backend_ops<B>::synchronize(ex.res);
}

template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::explore_(matrix_view<const float> hidden, index_t k,
                                                           const std::vector<detail::hs_topk_request>& requests,
                                                           detail::hs_topk_candidates& candidates) const {
  using std::size_t;
  const detail::execution<B> ex{top_.resources()};
  const int ranks = size();
  const index_t d = dim();
  std::vector<std::vector<size_t>> to(static_cast<size_t>(ranks));
  for (size_t r = 0; r < requests.size(); ++r)
    to[static_cast<size_t>(plan_.owner(requests[r].subtree))].push_back(r);
  std::vector<size_t> order;
  std::vector<index_t> send_rows(static_cast<size_t>(ranks));
  for (int q = 0; q < ranks; ++q) {
    send_rows[static_cast<size_t>(q)] = static_cast<index_t>(to[static_cast<size_t>(q)].size());
    order.insert(order.end(), to[static_cast<size_t>(q)].begin(), to[static_cast<size_t>(q)].end());
  }
  std::vector<index_t> send_row(order.size()), send_i(order.size());
  for (size_t p = 0; p < order.size(); ++p) {
    send_row[p] = requests[order[p]].row;
    send_i[p] = requests[order[p]].subtree;
  }
  const std::vector<index_t> recv_rows = detail::exchange_counts(ex, comm_, send_rows);
  const index_t sent = static_cast<index_t>(order.size()), received = detail::total_of(recv_rows);
  detail::scratch_buffer<B, float> send_f(static_cast<size_t>(sent * d), ex), recv_f(static_cast<size_t>(received * d), ex);
  const auto send_row_d = detail::to_scratch(ex, send_row);
  detail::gather_rows_by(ex, hidden, detail::raw(send_row_d), sent, detail::raw(send_f));
  std::vector<index_t> recv_i(static_cast<size_t>(received));
  detail::all_to_all_into(ex, comm_, detail::raw(send_f), detail::element_counts(send_rows, d), detail::raw(recv_f),
                          detail::element_counts(recv_rows, d));
  detail::host_all_to_all(ex, comm_, send_i.data(), send_rows, recv_i.data(), recv_rows);
  // Each request's subtree's best min(k, its classes), in one search over this rank's forest, each
  // row in its subtree's tree (a subtree of fewer than k classes leaves slots of class -1).
  std::vector<float> reply_f(static_cast<size_t>(received * k), -INFINITY);
  std::vector<index_t> reply_i(reply_f.size(), -1);
  if (received > 0) {
    std::vector<index_t> tree(static_cast<size_t>(received));
    for (index_t r = 0; r < received; ++r)
      tree[static_cast<size_t>(r)] = slot_[static_cast<size_t>(recv_i[static_cast<size_t>(r)])];
    const auto tree_d = detail::to_scratch(ex, tree);
    detail::scratch_buffer<B, index_t> found(reply_i.size(), ex);
    detail::scratch_buffer<B, float> found_lp(reply_f.size(), ex);
    local_.topk_in_trees(matrix_view<const float>(detail::raw(recv_f), received, d),
                         vector_view<const index_t>(detail::raw(tree_d), received), k,
                         matrix_view<index_t>(detail::raw(found), received, k), matrix_view<float>(detail::raw(found_lp), received, k));
    reply_i = detail::to_host(ex, detail::raw(found), received * k);
    reply_f = detail::to_host(ex, detail::raw(found_lp), received * k);
    for (index_t& c : reply_i)
      if (c >= 0) c = local_classes_[static_cast<size_t>(c)];
  }
  std::vector<float> back_f(order.size() * static_cast<size_t>(k));
  std::vector<index_t> back_i(back_f.size());
  detail::host_all_to_all(ex, comm_, reply_f.data(), detail::element_counts(recv_rows, k), back_f.data(),
                          detail::element_counts(send_rows, k));
  detail::host_all_to_all(ex, comm_, reply_i.data(), detail::element_counts(recv_rows, k), back_i.data(),
                          detail::element_counts(send_rows, k));
  for (size_t p = 0; p < order.size(); ++p) {
    const detail::hs_topk_request& r = requests[order[p]];
    for (index_t e = 0; e < k; ++e) {
      const index_t c = back_i[p * static_cast<size_t>(k) + static_cast<size_t>(e)];
      if (c >= 0) candidates[static_cast<size_t>(r.row)].push_back({r.base + back_f[p * static_cast<size_t>(k) + static_cast<size_t>(e)], c});
    }
  }
}

}  // namespace xsoftmax
