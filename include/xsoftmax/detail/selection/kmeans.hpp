// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// k-means over class vectors for the IVF index, on an execution: Lloyd iterations whose
/// assignment step is the dense-scores primitive (points x centroids, one GEMM per tile) followed
/// by a top-1, and whose update step groups the points by cluster (a stable sort) and
/// averages each cluster's members in ascending point order, so the centroids are the same on
/// every backend and thread count. Spherical k-means (cosine) keeps centroids on the unit sphere
/// and assigns by inner product; Euclidean k-means assigns by x . c - |c|^2 / 2 (the bias of the
/// dense-scores call). Random draws (initial rows, re-seeds of empty clusters) stay on the host,
/// seeded; only their row indices travel.

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/group_by_key.hpp>
#include <xsoftmax/detail/selection/sampling.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>

#include <algorithm>
#include <math.h>
#include <random>
#include <vector>

namespace xsoftmax::detail {

/// assign[r] = the column of row r's highest score (s: rows x k), ties towards the smaller column:
/// the top-1 of `row_topk` (same order, same handling of NaN), without its heap buffers.
struct best_column {
  const float* s;
  index_t k;
  index_t* assign;
  XSOFTMAX_HD void operator()(index_t r) const {
    const float* row = s + r * k;
    index_t best = 0;
    for (index_t j = 1; j < k; ++j)
      if (row[j] > row[best]) best = j;
    assign[r] = best;
  }
};

/// For every row of `x`, the centroid (rows of `c`, k x d) with the highest score, into `assign`
/// (x.rows values): x . c for spherical k-means, x . c - |c|^2 / 2 (nearest in L2) otherwise. Ties:
/// the smaller centroid. `x`, `c` and `assign` are in the execution's memory.
template <class Ex>
void assign_to_centroids(const Ex& ex_in, matrix_view<const float> x, matrix_view<const float> c, bool spherical,
                         index_t* assign) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t n = x.rows, k = c.rows, d = c.cols;
  typename execution_type::template vector<float> half_norm(static_cast<std::size_t>(spherical ? 0 : k));
  float* hn = raw(half_norm);
  if (!spherical)
    parallel_for(ex, k, [=] XSOFTMAX_HD_LAMBDA(index_t j) {
      const float* r = c.row(j);
      float s = 0;
      for (index_t p = 0; p < d; ++p) s += r[p] * r[p];
      hn[j] = -0.5f * s;
    });
  const index_t tile = std::max<index_t>(1, std::min<index_t>(n, (index_t(4) << 20) / std::max<index_t>(k, 1)));
  typename execution_type::template vector<float> s(static_cast<std::size_t>(tile * k)), scratch;
  for (index_t r0 = 0; r0 < n; r0 += tile) {
    const index_t rn = std::min(tile, n - r0);
    dense_scores(ex, matrix_view<const float>(x.row(r0), rn, d, x.stride), c, spherical ? nullptr : hn, 0, k, raw(s),
                 k, scratch);
    parallel_for(ex, rn, best_column{raw(s), k, assign + r0});
  }
}

/// Centroid j = the mean of its members (items[offsets[j] .. offsets[j + 1]) of `x`, summed in
/// double in that order), or row reseed[j] of `x` when it has none; then scaled to unit length
/// when `unit` (as `unit_rows` does). `sum`: k x d doubles of scratch.
template <class Ex>
void update_centroids(const Ex& ex, matrix_view<const float> x, index_t k, const index_t* items,
                      const index_t* offsets, const index_t* reseed, bool unit, double* sum, float* centroids) {
  const index_t d = x.cols;
  parallel_for(ex, k, [=] XSOFTMAX_HD_LAMBDA(index_t j) {
    float* cj = centroids + j * d;
    const index_t first = offsets[j], last = offsets[j + 1];
    if (first == last) {
      const float* r = x.row(reseed[j]);
      for (index_t p = 0; p < d; ++p) cj[p] = r[p];
    } else {
      double* sj = sum + j * d;
      for (index_t p = 0; p < d; ++p) sj[p] = 0.0;
      for (index_t m = first; m < last; ++m) {
        const float* r = x.row(items[m]);
        for (index_t p = 0; p < d; ++p) sj[p] += r[p];
      }
      const double count = static_cast<double>(last - first);
      for (index_t p = 0; p < d; ++p) cj[p] = static_cast<float>(sj[p] / count);
    }
    if (unit) {
      double s = 0;
      for (index_t p = 0; p < d; ++p) s += static_cast<double>(cj[p]) * cj[p];
      const float inv = s > 0 ? static_cast<float>(1.0 / ::sqrt(s)) : 0.f;
      for (index_t p = 0; p < d; ++p) cj[p] *= inv;
    }
  });
}

/// Lloyd's k-means of the rows of `x` (n x d, unit rows when `spherical`; execution memory) into
/// `k` centroids (k x d, written to `centroids` in the execution's memory), `iterations` rounds,
/// seeded initialisation from distinct rows; an empty cluster is re-seeded from a random row (a
/// host decision on the cluster sizes). Deterministic for a given seed, on every backend.
template <class Ex>
void kmeans(const Ex& ex_in, matrix_view<const float> x, index_t k, index_t iterations, bool spherical,
            unsigned long long seed, float* centroids) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using index_vector = typename execution_type::template vector<index_t>;
  const index_t n = x.rows, d = x.cols;
  std::mt19937_64 rng(mix_seed(seed));
  std::vector<index_t> pick(static_cast<std::size_t>(k));
  {  // k distinct rows (partial Fisher-Yates over indices)
    std::vector<index_t> idx(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) idx[i] = i;
    for (index_t j = 0; j < k; ++j) {
      std::swap(idx[j], idx[std::uniform_int_distribution<index_t>(j, n - 1)(rng)]);
      pick[j] = idx[j];
    }
  }
  {
    const index_vector rows(pick.begin(), pick.end());
    copy_listed_rows(ex, x.data, d, thrust::raw_pointer_cast(rows.data()), k, centroids);
  }
  index_vector assign(static_cast<std::size_t>(n)), keys, items, offsets, reseed(static_cast<std::size_t>(k));
  typename execution_type::template vector<double> sum(static_cast<std::size_t>(k * d));
  std::vector<index_t> start(static_cast<std::size_t>(k + 1));
  for (index_t it = 0; it < iterations; ++it) {
    assign_to_centroids(ex, x, matrix_view<const float>(centroids, k, d), spherical, raw(assign));
    group_by_key(ex, raw(assign), n, k, keys, items, offsets);
    // The cluster sizes decide the re-seeds on the host, in centroid order (one draw per empty one).
    execution_type::ops::copy(ex.res, start.data(), raw(offsets), k + 1);
    for (index_t j = 0; j < k; ++j) pick[j] = start[j + 1] == start[j] ? std::uniform_int_distribution<index_t>(0, n - 1)(rng) : 0;
    execution_type::ops::copy(ex.res, raw(reseed), pick.data(), k);
    update_centroids(ex, x, k, raw(items), raw(offsets), raw(reseed), spherical, raw(sum), centroids);
  }
}

}  // namespace xsoftmax::detail
