// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `ivf_index` on any backend: k-means, list building and search are generic algorithms over the
/// primitives (dense scores, row top-k, group_by_key), run on the execution's policy and memory.
/// The host keeps only the seeded random choices (the k-means training sample, its initial rows
/// and re-seeds) and the sizes.

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/group_by_key.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/primitives/score_row_pass.hpp>
#include <xsoftmax/detail/selection/kmeans.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>

#include <thrust/copy.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_set>

namespace xsoftmax {

namespace detail {

/// `train` distinct rows of [0, n), ascending, drawn by Floyd's algorithm from a seeded generator.
inline std::vector<index_t> kmeans_sample_rows(index_t n, index_t train, unsigned long long seed) {
  std::mt19937_64 rng(mix_seed(seed ^ 0x5A5A5A5Aull));
  std::unordered_set<index_t> chosen;
  for (index_t j = n - train; j < n; ++j) {
    const index_t t = std::uniform_int_distribution<index_t>(0, j)(rng);
    chosen.insert(chosen.count(t) ? j : t);
  }
  std::vector<index_t> rows(chosen.begin(), chosen.end());
  std::sort(rows.begin(), rows.end());
  return rows;
}

/// For each query r, its k best among the members of its `nprobe` probed lists (one gather-dot
/// per candidate, folded into a heap in `heap_s` / `heap_i`, rows x k scratch): ids and scores
/// best first, -1 / -inf past the candidates found. The score is the dot product with the stored
/// vector plus bias[id] when `bias` is given.
template <class Ex, class T>
void ivf_scan_lists(const Ex& ex, matrix_view<const float> queries, const index_t* probes, index_t nprobe,
                    const index_t* offsets, const index_t* list_ids, matrix_view<const float> lv, const T* bias,
                    index_t k, float* heap_s, index_t* heap_i, matrix_view<index_t> ids, matrix_view<float> scores) {
  const index_t d = lv.cols;
  XSOFTMAX_PARALLEL_FOR(ex, queries.rows, r, {
    topk_heap heap{heap_s + r * k, heap_i + r * k, 0};
    const float* q = queries.row(r);
    for (index_t j = 0; j < nprobe; ++j) {
      const index_t l = probes[r * nprobe + j];
      for (index_t m = offsets[l]; m < offsets[l + 1]; ++m) {
        float v = dot_row(q, lv.row(m), d);
        if (bias) v += to_float(bias[list_ids[m]]);
        heap.offer(v, list_ids[m], k);
      }
    }
    heap.sort_best_first();
    for (index_t j = 0; j < k; ++j) {
      const bool have = j < heap.n;
      ids(r, j) = have ? heap.hi[j] : -1;
      scores(r, j) = have ? heap.hs[j] : -INFINITY;
    }
  });
}

}  // namespace detail

template <class Ex, class T>
void ivf_index::build_on(const Ex& ex, matrix_view<const T> vectors, const ivf_options& o) {
  build_probing_on(ex, vectors, o, 0, nullptr);
}

template <class Ex, class T>
void ivf_index::build_probing_on(const Ex& ex_in, matrix_view<const T> vectors, const ivf_options& o, index_t nprobe,
                                 index_t* probes) {
  const char* where = "ivf_index::build";
  const index_t n = vectors.rows, d = vectors.cols;
  detail::expects(n >= 1 && d >= 1 && vectors.data != nullptr, where, ": vectors are ", n, " x ", d,
                  (vectors.data ? "" : " (null data)"), "; need at least one row and one column");
  const index_t lists = o.num_lists > 0 ? o.num_lists
                                        : std::max<index_t>(1, static_cast<index_t>(std::lround(std::sqrt(double(n)))));
  detail::expects(lists >= 1 && lists <= n, where, ": num_lists = ", lists, " must be in [1, N = ", n, "]");
  detail::expects(o.iterations >= 0, where, ": iterations = ", o.iterations, " must be >= 0");
  detail::expects(nprobe >= 0 && nprobe <= lists, where, ": nprobe = ", nprobe, " must be in [1, num_lists = ", lists,
                  "]");  // 0: no probes wanted (build_on)
  detail::expects(o.metric == similarity::cosine || o.metric == similarity::inner_product, where, ": metric = ",
                  static_cast<int>(o.metric), " is not a similarity");
  detail::expects(o.train_points >= 0 && o.train_points <= n, where, ": train_points = ", o.train_points,
                  " must be in [0, N = ", n, "]");
  const bool spherical = o.metric == similarity::cosine;
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using float_vector = typename execution_type::template vector<float>;
  using index_vector = typename execution_type::template vector<index_t>;

  // fp32 copy in id order (unit rows for cosine).
  float_vector xv(static_cast<std::size_t>(n * d));
  float* x = detail::raw(xv);
  detail::widen_rows(ex, vectors, 0, n, nullptr, x);
  if (spherical) detail::unit_rows(ex, x, n, d);
  const matrix_view<const float> all(x, n, d);

  // k-means on a seeded sample of the rows (the sample's row indices are drawn on the host).
  index_t train = o.train_points > 0 ? o.train_points : std::min<index_t>(n, 64 * lists);
  train = std::max(train, lists);
  float_vector sample;
  matrix_view<const float> tx = all;
  if (train < n) {
    const std::vector<index_t> rows = detail::kmeans_sample_rows(n, train, o.seed);
    const index_vector rows_here(rows.begin(), rows.end());
    sample.resize(static_cast<std::size_t>(train * d));
    detail::copy_listed_rows(ex, x, d, thrust::raw_pointer_cast(rows_here.data()), train, detail::raw(sample));
    tx = matrix_view<const float>(detail::raw(sample), train, d);
  }
  const bool warm = o.warm_start && !empty() && num_lists() == lists && d_ == d && metric_ == o.metric;
  float_vector previous;
  if (warm) {  // the last build's centroids, kept through the reset below (which may reallocate)
    const float* c = centroids_.data(ex);
    previous.resize(static_cast<std::size_t>(lists * d));
    thrust::copy(ex.policy(), c, c + lists * d, previous.begin());
  }
  float* centroids = centroids_.reset(ex, lists * d);
  if (warm) thrust::copy(ex.policy(), previous.begin(), previous.end(), centroids);
  detail::kmeans(ex, tx, lists, o.iterations, spherical, o.seed, centroids, warm);

  // Every vector into its list; lists in id order (a stable sort by list). Under cosine on a host
  // a caller's probes come from the same scores (the assignment is their top-1); a device takes
  // them from `probe_on`, whose top-k is the backend's row top-k.
  index_vector assign(static_cast<std::size_t>(n)), sorted, ids, offsets;
  const matrix_view<const float> cv(centroids, lists, d);
  const bool probes_now = nprobe > 0 && spherical && is_host_backend<typename execution_type::backend>;
  if (probes_now) {
    float_vector heap_s(static_cast<std::size_t>(n * nprobe));
    detail::for_each_score_row(ex, all, cv, detail::best_columns{lists, nprobe, detail::raw(heap_s), probes,
                                                                 detail::raw(assign)});
  } else {
    detail::assign_to_centroids(ex, all, cv, spherical, detail::raw(assign));
  }
  detail::group_by_key(ex, detail::raw(assign), n, lists, sorted, ids, offsets);
  const auto policy = ex.policy();
  thrust::copy(policy, ids.begin(), ids.end(), list_ids_.reset(ex, n));
  thrust::copy(policy, offsets.begin(), offsets.end(), list_offsets_.reset(ex, lists + 1));
  detail::copy_listed_rows(ex, x, d, detail::raw(ids), n, vectors_.reset(ex, n * d));
  n_ = n;
  d_ = d;
  metric_ = o.metric;
  element_ = element_name<std::remove_cv_t<T>>();
  if (nprobe > 0 && !probes_now) probe_on(ex, all, nprobe, probes);
  execution_type::ops::synchronize(ex.res);  // a verb: complete on return (host() may read it next)
}

template <class Ex>
void ivf_index::probe_on(const Ex& ex_in, matrix_view<const float> queries, index_t nprobe, index_t* lists) const {
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t nl = num_lists();
  const matrix_view<const float> c(centroids_.data(ex), nl, d_);
  if constexpr (is_host_backend<typename execution_type::backend>) {
    // Each query's scores read while cached (score_row_pass.hpp), a heap of nprobe per query.
    typename execution_type::template vector<float> heap_s(static_cast<std::size_t>(queries.rows * nprobe));
    detail::for_each_score_row(ex, queries, c, detail::best_columns{nl, nprobe, detail::raw(heap_s), lists, nullptr});
  } else {
    // A device: the backend's row top-k (a block per row, not a thread walking a row) over chunks
    // of queries whose centroid scores stay bounded however many queries there are.
    const index_t chunk = std::max<index_t>(1, std::min<index_t>(queries.rows, (index_t(16) << 20) / nl));
    typename execution_type::template vector<float> s(static_cast<std::size_t>(chunk * nl)), scratch;
    for (index_t r0 = 0; r0 < queries.rows; r0 += chunk) {
      const index_t rows = std::min(chunk, queries.rows - r0);
      detail::dense_scores(ex, matrix_view<const float>(queries.row(r0), rows, queries.cols, queries.stride), c,
                           static_cast<const float*>(nullptr), 0, nl, detail::raw(s), nl, scratch);
      detail::basic_row_topk_state<typename execution_type::backend> best(rows, nprobe, ex);
      detail::row_topk_update(ex, detail::raw(s), rows, nl, nl, 0, best);
      detail::row_topk_finish(ex, rows, best);
      thrust::copy(ex.policy(), best.index.begin(), best.index.end(), lists + r0 * nprobe);
    }
  }
}

template <class Ex, class T>
void ivf_index::search_on(const Ex& ex_in, matrix_view<const float> queries, index_t k, index_t nprobe,
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
  if (queries.rows == 0) return;
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t rows = queries.rows;
  typename execution_type::template vector<index_t> probes(static_cast<std::size_t>(rows * nprobe));
  probe_on(ex, queries, nprobe, detail::raw(probes));
  detail::basic_row_topk_state<typename execution_type::backend> heaps(rows, k, ex);
  detail::ivf_scan_lists(ex, queries, detail::raw(probes), nprobe, list_offsets_.data(ex), list_ids_.data(ex),
                         matrix_view<const float>(vectors_.data(ex), n_, d_), bias, k, detail::raw(heaps.score),
                         detail::raw(heaps.index), ids, scores);
  execution_type::ops::synchronize(ex.res);  // a verb: the outputs are complete on return
}

}  // namespace xsoftmax
