// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Host implementation of `knn_graph` and `knn_graph_builder`.

#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/checks.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>

#include <thrust/system/cpp/execution_policy.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace xsoftmax {

inline knn_graph knn_graph::from_lists(index_t num_classes, index_t dim, index_t k, std::vector<index_t> ids) {
  const char* where = "knn_graph::from_lists";
  detail::expects(num_classes >= 1 && dim >= 1, where, ": num_classes = ", num_classes, ", dim = ", dim,
                  " must both be >= 1");
  detail::check_count(where, "k", k, num_classes, "num_classes");
  detail::expects<shape_error>(static_cast<index_t>(ids.size()) == num_classes * k, where, ": ", ids.size(),
                               " ids given for num_classes x k = ", num_classes, " x ", k);
  for (std::size_t i = 0; i < ids.size(); ++i)
    detail::expects<out_of_range>(ids[i] >= -1 && ids[i] < num_classes, where, ": ids[", i, "] = ", ids[i],
                                  " is out of range [-1, ", num_classes, ")");
  knn_graph g;
  g.n_ = num_classes;
  g.d_ = dim;
  g.k_ = k;
  g.ids_.assign(std::move(ids));
  g.builds_ = 1;
  return g;
}

inline knn_graph_builder::knn_graph_builder(knn_build_options options) : options_(options) {
  const char* where = "knn_graph_builder";
  detail::expects(options.k >= 1, where, ": k = ", options.k, " must be >= 1");
  detail::expects(options.nprobe >= 1, where, ": nprobe = ", options.nprobe, " must be >= 1");
  detail::expects(options.metric == similarity::cosine || options.metric == similarity::inner_product, where,
                  ": metric = ", static_cast<int>(options.metric), " is not a similarity");
  detail::expects(options.method == knn_build_method::exact || options.method == knn_build_method::ivf, where,
                  ": method = ", static_cast<int>(options.method), " is not a knn_build_method");
  detail::expects(options.query_tile >= 1 && options.class_tile >= 1, where, ": query_tile = ", options.query_tile,
                  ", class_tile = ", options.class_tile, " must be >= 1");
}

template <class Policy, class T>
void knn_graph_builder::build_on(const Policy& policy, matrix_view<const T> weights, knn_graph& out) {
  const char* where = "knn_graph_builder::build";
  const index_t n = weights.rows, d = weights.cols;
  detail::expects(n >= 1 && d >= 1 && weights.data != nullptr, where, ": weights are ", n, " x ", d,
                  "; need at least one row and one column");
  detail::check_count(where, "k", options_.k, n, "num_classes");
  out.ids_.edit().resize(static_cast<std::size_t>(n * options_.k));  // drops a device copy
  out.sims_.resize(static_cast<std::size_t>(n * options_.k));
  if (options_.method == knn_build_method::exact) build_exact(policy, weights, out);
  else build_ivf(policy, weights, out);
  out.n_ = n;
  out.d_ = d;
  out.k_ = options_.k;
  out.metric_ = options_.metric;
  out.element_ = element_name<std::remove_cv_t<T>>();
  ++out.builds_;
}

template <class Policy, class T>
void knn_graph_builder::build_exact(const Policy& policy, matrix_view<const T> w, knn_graph& out) {
  const index_t n = w.rows, d = w.cols, k = options_.k;
  const bool cosine = options_.metric == similarity::cosine;
  const index_t tq = std::min(options_.query_tile, n), tc = std::min(options_.class_tile, n);
  if (cosine) {  // 1 / |w_c| (0 for a zero vector: its similarity to everything is 0)
    inv_norm_.resize(static_cast<std::size_t>(n));
    float* inv = inv_norm_.data();
    detail::parallel_for(policy, n, [=](index_t c) {
      const T* r = w.row(c);
      double s = 0;
      for (index_t p = 0; p < d; ++p) s += static_cast<double>(to_float(r[p])) * to_float(r[p]);
      inv[c] = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.f;
    });
  }
  scores_.resize(static_cast<std::size_t>(tq * tc));
  query_.resize(static_cast<std::size_t>(tq * d));
  detail::row_topk_state best(tq, k);
  std::vector<float> class_scratch;
  for (index_t q0 = 0; q0 < n; q0 += tq) {
    const index_t qn = std::min(tq, n - q0);
    // The query tile as dense fp32 rows, scaled to unit length under cosine.
    float* q = query_.data();
    const float* inv = cosine ? inv_norm_.data() : nullptr;
    detail::parallel_for(policy, qn, [=](index_t i) {
      const T* r = w.row(q0 + i);
      const float scale = inv ? inv[q0 + i] : 1.f;
      for (index_t p = 0; p < d; ++p) q[i * d + p] = to_float(r[p]) * scale;
    });
    std::fill(best.size.begin(), best.size.end(), 0);
    for (index_t c0 = 0; c0 < n; c0 += tc) {
      const index_t cn = std::min(tc, n - c0);
      float* s = scores_.data();
      detail::dense_scores(policy, matrix_view<const float>(q, qn, d), w, static_cast<const T*>(nullptr), c0, cn, s,
                           cn, class_scratch);
      if (inv)
        detail::parallel_for(policy, qn, [=](index_t i) {
          for (index_t j = 0; j < cn; ++j) s[i * cn + j] *= inv[c0 + j];
        });
      detail::row_topk_update(policy, s, qn, cn, cn, c0, best);
    }
    detail::row_topk_finish(policy, qn, best);
    std::copy(best.index.begin(), best.index.begin() + qn * k, out.ids_.edit().begin() + q0 * k);
    std::copy(best.score.begin(), best.score.begin() + qn * k, out.sims_.begin() + q0 * k);
  }
}

template <class Policy, class T>
void knn_graph_builder::build_ivf(const Policy& policy, matrix_view<const T> w, knn_graph& out) {
  const char* where = "knn_graph_builder::build";
  const index_t d = w.cols, k = options_.k;
  ivf_options io = options_.ivf;
  io.metric = options_.metric;
  index_.build_on(policy, w, io);
  const index_t nl = index_.num_lists();
  detail::expects(options_.nprobe <= nl, where, ": nprobe = ", options_.nprobe, " must be in [1, num_lists = ", nl,
                  "]");
  // Each list probes its own list and the nprobe - 1 lists whose centroids score highest with its
  // centroid; all members of a list share these probes, so a list's members are scored against a
  // probed list with one GEMM.
  const index_t np = options_.nprobe;
  std::vector<float> cs(static_cast<std::size_t>(nl * nl)), scratch;
  detail::dense_scores(policy, index_.centroids(), index_.centroids(), static_cast<const float*>(nullptr), 0, nl,
                       cs.data(), nl, scratch);
  for (index_t l = 0; l < nl; ++l) cs[l * nl + l] = std::numeric_limits<float>::infinity();
  detail::row_topk_state probes(nl, np);
  detail::row_topk_update(policy, cs.data(), nl, nl, nl, 0, probes);
  detail::row_topk_finish(policy, nl, probes);

  const index_t* pr = probes.index.data();
  const index_t* off = index_.list_offsets().data();
  const index_t* lid = index_.list_ids().data();
  const matrix_view<const float> lv = index_.list_vectors();
  index_t* gids = out.ids_.edit().data();
  float* gsims = out.sims_.data();
  detail::parallel_for(policy, nl, [=](index_t a) {
    const index_t qa = off[a + 1] - off[a];
    if (qa == 0) return;
    const matrix_view<const float> queries(lv.row(off[a]), qa, d);
    detail::row_topk_state best(qa, k);
    std::vector<float> s, scr;
    for (index_t j = 0; j < np; ++j) {
      const index_t b = pr[a * np + j], len = off[b + 1] - off[b];
      if (len == 0) continue;
      s.resize(static_cast<std::size_t>(qa * len));
      detail::dense_scores(thrust::cpp::par, queries, lv, static_cast<const float*>(nullptr), off[b], len, s.data(),
                           len, scr);
      detail::row_topk_update_ids(thrust::cpp::par, s.data(), qa, len, len, lid + off[b], best);
    }
    detail::row_topk_finish(thrust::cpp::par, qa, best);
    for (index_t i = 0; i < qa; ++i) {
      const index_t c = lid[off[a] + i];
      for (index_t j = 0; j < k; ++j) {
        const bool have = j < best.size[i];
        gids[c * k + j] = have ? best.index[i * k + j] : -1;
        gsims[c * k + j] = have ? best.score[i * k + j] : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

inline double knn_graph_recall(const knn_graph& approx, const knn_graph& exact) {
  detail::expects<shape_error>(approx.num_classes() == exact.num_classes() && approx.k() == exact.k(),
                               "knn_graph_recall: the approximate graph has num_classes = ", approx.num_classes(),
                               ", k = ", approx.k(), " but the exact one has num_classes = ", exact.num_classes(),
                               ", k = ", exact.k());
  const index_t n = exact.num_classes(), k = exact.k();
  if (n == 0) return 1.0;
  double total = 0;
  std::vector<index_t> a, e;
  for (index_t c = 0; c < n; ++c) {
    a.assign(approx.neighbors(c), approx.neighbors(c) + k);
    e.assign(exact.neighbors(c), exact.neighbors(c) + k);
    std::sort(a.begin(), a.end());
    std::sort(e.begin(), e.end());
    index_t hit = 0;
    for (std::size_t i = 0, j = 0; i < a.size() && j < e.size();) {
      if (a[i] < 0) { ++i; continue; }
      if (a[i] == e[j]) ++hit, ++i, ++j;
      else if (a[i] < e[j]) ++i;
      else ++j;
    }
    total += static_cast<double>(hit) / k;
  }
  return total / n;
}

}  // namespace xsoftmax
