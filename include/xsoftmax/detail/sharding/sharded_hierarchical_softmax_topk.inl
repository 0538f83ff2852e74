// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sharded_hierarchical_softmax::topk`: an exact search in two rounds (see the header). Since
/// log p(c) = log p_top(s(c)) + log p_sub(c) <= log p_top(s(c)), a top leaf whose log-probability is
/// below a row's k-th best candidate cannot hold a better class; round 1 explores the top tree's
/// best leaves, round 2 every other leaf that reaches the k-th best of round 1.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>

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
  std::vector<index_t> first(static_cast<size_t>(rows * k1));
  std::vector<float> first_lp(first.size());
  top_.topk(hidden, k1, matrix_view<index_t>(first.data(), rows, k1), matrix_view<float>(first_lp.data(), rows, k1));
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
  std::vector<float> lp(static_cast<size_t>(rows * std::min(chunk, m)));
  for (index_t j0 = 0; j0 < m; j0 += chunk) {
    const index_t jn = std::min(chunk, m - j0);
    top_.log_distribution(hidden, j0, j0 + jn, matrix_view<float>(lp.data(), rows, jn));
    for (index_t i = 0; i < rows; ++i)
      for (index_t e = 0; e < jn; ++e) {
        const float v = lp[static_cast<size_t>(i * jn + e)];
        if (v < bound[static_cast<size_t>(i)]) continue;
        if (std::binary_search(first.begin() + i * k1, first.begin() + (i + 1) * k1, j0 + e)) continue;
        add_leaf(i, j0 + e, v);
      }
  }
  explore_(hidden, k, requests, candidates);

  for (index_t i = 0; i < rows; ++i) {
    auto& c = candidates[static_cast<size_t>(i)];
    std::partial_sort(c.begin(), c.begin() + k, c.end(), detail::hs_topk_before);  // >= k: see the header
    for (index_t e = 0; e < k; ++e) {
      classes(i, e) = c[static_cast<size_t>(e)].second;
      log_probs(i, e) = c[static_cast<size_t>(e)].first;
    }
  }
}

template <class C, class F, class P, class B, int D>
void sharded_hierarchical_softmax<C, F, P, B, D>::explore_(matrix_view<const float> hidden, index_t k,
                                                           const std::vector<detail::hs_topk_request>& requests,
                                                           detail::hs_topk_candidates& candidates) const {
  using std::size_t;
  const int ranks = size();
  const index_t d = dim();
  std::vector<std::vector<size_t>> to(static_cast<size_t>(ranks));
  for (size_t r = 0; r < requests.size(); ++r)
    to[static_cast<size_t>(plan_.owner(requests[r].subtree))].push_back(r);
  std::vector<size_t> order;
  std::vector<index_t> send_rows(static_cast<size_t>(ranks)), recv_rows(send_rows.size()), ones(send_rows.size(), 1);
  for (int q = 0; q < ranks; ++q) {
    send_rows[static_cast<size_t>(q)] = static_cast<index_t>(to[static_cast<size_t>(q)].size());
    order.insert(order.end(), to[static_cast<size_t>(q)].begin(), to[static_cast<size_t>(q)].end());
  }
  std::vector<float> send_f(order.size() * static_cast<size_t>(d));
  std::vector<index_t> send_i(order.size());
  for (size_t p = 0; p < order.size(); ++p) {
    const detail::hs_topk_request& r = requests[order[p]];
    std::copy(hidden.row(r.row), hidden.row(r.row) + d, send_f.begin() + static_cast<std::ptrdiff_t>(p * static_cast<size_t>(d)));
    send_i[p] = r.subtree;
  }
  comm_.all_to_all(send_rows.data(), ones.data(), recv_rows.data(), ones.data());
  index_t received = 0;
  for (index_t r : recv_rows) received += r;
  std::vector<float> recv_f(static_cast<size_t>(received * d));
  std::vector<index_t> recv_i(static_cast<size_t>(received));
  comm_.all_to_all(send_f.data(), detail::element_counts(send_rows, d).data(), recv_f.data(),
                   detail::element_counts(recv_rows, d).data());
  comm_.all_to_all(send_i.data(), send_rows.data(), recv_i.data(), recv_rows.data());

  // Each request's subtree's best min(k, its classes), in one search over this rank's forest, each
  // row started at its subtree's root block (a subtree of fewer than k classes leaves slots of
  // class -1, as the reply's unfilled ones).
  std::vector<float> reply_f(static_cast<size_t>(received * k), -INFINITY);
  std::vector<index_t> reply_i(reply_f.size(), -1), start_begin(static_cast<size_t>(received)),
      start_size(start_begin.size());
  const auto& tree = local_.tree();
  const auto& bo = tree.block_offsets();
  for (index_t r = 0; r < received; ++r) {
    const index_t root = tree.root_nodes()[static_cast<size_t>(slot_[static_cast<size_t>(recv_i[static_cast<size_t>(r)])])];
    start_begin[static_cast<size_t>(r)] = bo[static_cast<size_t>(root)];
    start_size[static_cast<size_t>(r)] = bo[static_cast<size_t>(root) + 1] - bo[static_cast<size_t>(root)];
  }
  if (received > 0) {
    const detail::execution<B> ex{local_.resources()};
    detail::tree_topk<head_type::sigmoid_form>(ex, tree.view(), matrix_view<const float>(recv_f.data(), received, d),
                                               matrix_view<const storage_type>(local_.weights()), local_.bias(),
                                               widest_local_, k, 0, matrix_view<index_t>(reply_i.data(), received, k),
                                               matrix_view<float>(reply_f.data(), received, k), start_begin.data(),
                                               start_size.data());
    for (index_t& c : reply_i)
      if (c >= 0) c = local_classes_[static_cast<size_t>(c)];
  }

  std::vector<float> back_f(order.size() * static_cast<size_t>(k));
  std::vector<index_t> back_i(back_f.size());
  comm_.all_to_all(reply_f.data(), detail::element_counts(recv_rows, k).data(), back_f.data(),
                   detail::element_counts(send_rows, k).data());
  comm_.all_to_all(reply_i.data(), detail::element_counts(recv_rows, k).data(), back_i.data(),
                   detail::element_counts(send_rows, k).data());
  for (size_t p = 0; p < order.size(); ++p) {
    const detail::hs_topk_request& r = requests[order[p]];
    for (index_t e = 0; e < k; ++e) {
      const index_t c = back_i[p * static_cast<size_t>(k) + static_cast<size_t>(e)];
      if (c >= 0) candidates[static_cast<size_t>(r.row)].push_back({r.base + back_f[p * static_cast<size_t>(k) + static_cast<size_t>(e)], c});
    }
  }
}

}  // namespace xsoftmax
