// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// k-means over class vectors for the IVF index: Lloyd iterations whose assignment step is the
/// dense-scores primitive (points x centroids, one GEMM per tile) followed by a top-1 (row_topk).
/// Spherical k-means (cosine) keeps centroids on the unit sphere and assigns by inner product;
/// Euclidean k-means assigns by x . c - |c|^2 / 2 (the bias of the dense-scores call).

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/sampling.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace xsoftmax::detail {

/// Scales every row of `x` (n x d, dense) to unit length (zero rows stay zero).
template <class Policy>
void normalize_rows(const Policy& policy, float* x, index_t n, index_t d) {
  parallel_for(policy, n, [=](index_t i) {
    float* r = x + i * d;
    double s = 0;
    for (index_t p = 0; p < d; ++p) s += static_cast<double>(r[p]) * r[p];
    const float inv = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.f;
    for (index_t p = 0; p < d; ++p) r[p] *= inv;
  });
}

/// For every row of `x`, the centroid (rows of `c`, k x d) with the highest score: x . c for
/// spherical k-means, x . c - |c|^2 / 2 (nearest in L2) otherwise. Ties: the smaller centroid.
template <class Policy>
void assign_to_centroids(const Policy& policy, matrix_view<const float> x, matrix_view<const float> c,
                         bool spherical, std::vector<index_t>& assign) {
  const index_t n = x.rows, k = c.rows, d = c.cols;
  std::vector<float> half_norm;
  if (!spherical) {
    half_norm.resize(static_cast<std::size_t>(k));
    for (index_t j = 0; j < k; ++j) {
      float s = 0;
      for (index_t p = 0; p < d; ++p) s += c(j, p) * c(j, p);
      half_norm[j] = -0.5f * s;
    }
  }
  assign.resize(static_cast<std::size_t>(n));
  const index_t tile = std::max<index_t>(1, std::min<index_t>(n, (index_t(4) << 20) / std::max<index_t>(k, 1)));
  std::vector<float> s(static_cast<std::size_t>(tile * k)), scratch;
  row_topk_state best(tile, 1);
  for (index_t r0 = 0; r0 < n; r0 += tile) {
    const index_t rn = std::min(tile, n - r0);
    std::fill(best.size.begin(), best.size.end(), 0);
    dense_scores(policy, matrix_view<const float>(x.row(r0), rn, d, x.stride), c,
                 spherical ? nullptr : half_norm.data(), 0, k, s.data(), k, scratch);
    row_topk_update(policy, s.data(), rn, k, k, 0, best);
    for (index_t r = 0; r < rn; ++r) assign[r0 + r] = best.index[r];
  }
}

/// Lloyd's k-means of the rows of `x` (n x d, unit rows when `spherical`) into `k` centroids
/// (k x d, written to `centroids`), `iterations` rounds, seeded initialisation from distinct rows;
/// an empty cluster is re-seeded from a random row. Deterministic for a given seed.
template <class Policy>
void kmeans(const Policy& policy, matrix_view<const float> x, index_t k, index_t iterations, bool spherical,
            unsigned long long seed, std::vector<float>& centroids) {
  const index_t n = x.rows, d = x.cols;
  std::mt19937_64 rng(mix_seed(seed));
  centroids.resize(static_cast<std::size_t>(k * d));
  {  // k distinct rows (partial Fisher-Yates over indices)
    std::vector<index_t> idx(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) idx[i] = i;
    for (index_t j = 0; j < k; ++j) {
      std::swap(idx[j], idx[std::uniform_int_distribution<index_t>(j, n - 1)(rng)]);
      std::copy(x.row(idx[j]), x.row(idx[j]) + d, centroids.begin() + j * d);
    }
  }
  std::vector<index_t> assign;
  std::vector<double> sum(static_cast<std::size_t>(k * d));
  std::vector<index_t> count(static_cast<std::size_t>(k));
  for (index_t it = 0; it < iterations; ++it) {
    assign_to_centroids(policy, x, matrix_view<const float>(centroids.data(), k, d), spherical, assign);
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), 0);
    for (index_t i = 0; i < n; ++i) {
      const index_t a = assign[i];
      ++count[a];
      for (index_t p = 0; p < d; ++p) sum[a * d + p] += x(i, p);
    }
    for (index_t j = 0; j < k; ++j) {
      float* cj = centroids.data() + j * d;
      if (count[j] == 0) {
        const index_t r = std::uniform_int_distribution<index_t>(0, n - 1)(rng);
        std::copy(x.row(r), x.row(r) + d, cj);
        continue;
      }
      for (index_t p = 0; p < d; ++p) cj[p] = static_cast<float>(sum[j * d + p] / count[j]);
    }
    if (spherical) normalize_rows(policy, centroids.data(), k, d);
  }
}

}  // namespace xsoftmax::detail
