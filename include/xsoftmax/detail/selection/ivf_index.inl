// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Host implementation of `ivf_index`.

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/kmeans.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>

#include <thrust/system/cpp/execution_policy.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <unordered_set>

namespace xsoftmax {

template <class Policy, class T>
void ivf_index::build_on(const Policy& policy, matrix_view<const T> vectors, const ivf_options& o) {
  const char* where = "ivf_index::build";
  const index_t n = vectors.rows, d = vectors.cols;
  detail::expects(n >= 1 && d >= 1 && vectors.data != nullptr, where, ": vectors are ", n, " x ", d,
                  (vectors.data ? "" : " (null data)"), "; need at least one row and one column");
  const index_t lists = o.num_lists > 0 ? o.num_lists
                                        : std::max<index_t>(1, static_cast<index_t>(std::lround(std::sqrt(double(n)))));
  detail::expects(lists >= 1 && lists <= n, where, ": num_lists = ", lists, " must be in [1, N = ", n, "]");
  detail::expects(o.iterations >= 0, where, ": iterations = ", o.iterations, " must be >= 0");
  detail::expects(o.metric == similarity::cosine || o.metric == similarity::inner_product, where, ": metric = ",
                  static_cast<int>(o.metric), " is not a similarity");
  detail::expects(o.train_points >= 0 && o.train_points <= n, where, ": train_points = ", o.train_points,
                  " must be in [0, N = ", n, "]");
  const bool spherical = o.metric == similarity::cosine;

  // fp32 copy in id order (unit rows for cosine).
  scratch_.resize(static_cast<std::size_t>(n * d));
  float* x = scratch_.data();
  detail::parallel_for(policy, n, [=](index_t i) {
    const T* r = vectors.row(i);
    for (index_t p = 0; p < d; ++p) x[i * d + p] = to_float(r[p]);
  });
  if (spherical) detail::normalize_rows(policy, x, n, d);
  const matrix_view<const float> all(x, n, d);

  // k-means on a seeded sample of the rows.
  index_t train = o.train_points > 0 ? o.train_points : std::min<index_t>(n, 64 * lists);
  train = std::max(train, lists);
  std::vector<float> sample;
  matrix_view<const float> tx = all;
  if (train < n) {
    std::mt19937_64 rng(detail::mix_seed(o.seed ^ 0x5A5A5A5Aull));
    std::unordered_set<index_t> chosen;  // Floyd: a uniform subset of `train` rows
    for (index_t j = n - train; j < n; ++j) {
      const index_t t = std::uniform_int_distribution<index_t>(0, j)(rng);
      chosen.insert(chosen.count(t) ? j : t);
    }
    std::vector<index_t> rows(chosen.begin(), chosen.end());
    std::sort(rows.begin(), rows.end());
    sample.resize(static_cast<std::size_t>(train * d));
    for (index_t i = 0; i < train; ++i) std::copy(x + rows[i] * d, x + rows[i] * d + d, sample.data() + i * d);
    tx = matrix_view<const float>(sample.data(), train, d);
  }
  detail::kmeans(policy, tx, lists, o.iterations, spherical, o.seed, centroids_);

  // Every vector into its list; lists in id order (a stable counting sort).
  std::vector<index_t> assign;
  detail::assign_to_centroids(policy, all, matrix_view<const float>(centroids_.data(), lists, d), spherical, assign);
  list_offsets_.assign(static_cast<std::size_t>(lists + 1), 0);
  for (index_t i = 0; i < n; ++i) ++list_offsets_[assign[i] + 1];
  for (index_t l = 0; l < lists; ++l) list_offsets_[l + 1] += list_offsets_[l];
  std::vector<index_t> fill(list_offsets_.begin(), list_offsets_.end() - 1);
  list_ids_.resize(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) list_ids_[fill[assign[i]]++] = i;
  vectors_.resize(static_cast<std::size_t>(n * d));
  float* v = vectors_.data();
  const index_t* ids = list_ids_.data();
  detail::parallel_for(policy, n, [=](index_t i) { std::copy(x + ids[i] * d, x + ids[i] * d + d, v + i * d); });

  n_ = n;
  d_ = d;
  metric_ = o.metric;
  element_ = element_name<std::remove_cv_t<T>>();
}

template <class Policy>
void ivf_index::probe_on(const Policy& policy, matrix_view<const float> queries, index_t nprobe,
                         std::vector<index_t>& lists) const {
  const index_t rows = queries.rows, nl = num_lists();
  std::vector<float> s(static_cast<std::size_t>(rows * nl)), scratch;
  detail::dense_scores(policy, queries, centroids(), static_cast<const float*>(nullptr), 0, nl, s.data(), nl, scratch);
  detail::row_topk_state best(rows, nprobe);
  detail::row_topk_update(policy, s.data(), rows, nl, nl, 0, best);
  detail::row_topk_finish(policy, rows, best);
  lists.assign(best.index.begin(), best.index.end());
}

template <class Policy, class T>
void ivf_index::search_on(const Policy& policy, matrix_view<const float> queries, index_t k, index_t nprobe,
                          matrix_view<index_t> ids, matrix_view<float> scores, const T* bias) const {
  const char* where = "ivf_index::search";
  detail::expects(!empty(), where, ": the index is empty (build it first)");
  detail::expects<shape_error>(queries.cols == d_, where, ": queries have ", queries.cols,
                               " columns but the index has dim ", d_);
  detail::expects(k >= 1, where, ": k = ", k, " must be >= 1");
  detail::expects(nprobe >= 1 && nprobe <= num_lists(), where, ": nprobe = ", nprobe, " must be in [1, num_lists = ",
                  num_lists(), "]");
  detail::check_output(where, "ids", ids, queries.rows, k);
  detail::check_output(where, "scores", scores, queries.rows, k);
  std::vector<index_t> probes;
  probe_on(policy, queries, nprobe, probes);
  const index_t* pr = probes.data();
  const index_t* off = list_offsets_.data();
  const index_t* lid = list_ids_.data();
  const matrix_view<const float> lv = list_vectors();
  detail::parallel_for(policy, queries.rows, [=](index_t r) {
    detail::row_topk_state best(1, k);
    std::vector<float> buf;
    for (index_t j = 0; j < nprobe; ++j) {
      const index_t l = pr[r * nprobe + j], first = off[l], len = off[l + 1] - off[l];
      buf.resize(static_cast<std::size_t>(len));
      detail::gather_dot(queries.row(r), lv, static_cast<const float*>(nullptr), first, len, buf.data());
      if (bias)
        for (index_t i = 0; i < len; ++i) buf[i] += to_float(bias[lid[first + i]]);
      detail::row_topk_update_ids(thrust::cpp::par, buf.data(), 1, len, len, lid + first, best);
    }
    detail::row_topk_finish(thrust::cpp::par, 1, best);
    for (index_t j = 0; j < k; ++j) {
      const bool have = j < best.size[0];
      ids(r, j) = have ? best.index[j] : -1;
      scores(r, j) = have ? best.score[j] : -std::numeric_limits<float>::infinity();
    }
  });
}

}  // namespace xsoftmax
