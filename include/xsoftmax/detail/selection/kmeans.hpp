// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// k-means over class vectors for the IVF index, on an execution: Lloyd iterations whose
/// assignment step is a top-1 over each point's scores against the centroids
/// (`for_each_score_row`: one GEMM per tile of points, each point's scores read while cached),
/// and whose update step gives each centroid one thread that sums its members in ascending point
/// order (a scan of the assignment), so the centroids are the same on every
/// backend and thread count. Spherical k-means (cosine) keeps centroids on the unit sphere and
/// assigns by inner product; Euclidean k-means assigns by x . c - |c|^2 / 2. Random draws (initial
/// rows, re-seeds of empty clusters) stay on the host, seeded; only row indices and cluster sizes
/// travel.
///
/// Why a scan rather than a sort by cluster: an iteration is then three passes (GEMM, top-1,
/// update) where a stable sort adds five parallel regions on a host backend (measured on the omp
/// backend: 95 regions for 10 iterations with the sort, against 35 before this code was generic;
/// on a loaded machine each costs milliseconds). The scan reads the N assignments once per
/// centroid, N * num_lists index reads against the assignment GEMM's N * num_lists * d
/// multiply-adds.

#include <xsoftmax/detail/primitives/group_by_key.hpp>
#include <xsoftmax/detail/primitives/mix_seed.hpp>
#include <xsoftmax/detail/primitives/row_argmax.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/primitives/score_row_pass.hpp>
#include <xsoftmax/detail/selection/sampling.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>

#include <algorithm>
#include <math.h>
#include <random>
#include <vector>

namespace xsoftmax::detail {

/// Row r's cluster from its scores against every centroid: the column of the highest s[j] +
/// bias[j] (bias may be null), ties towards the smaller column (the top-1 of `row_topk`, NaN
/// handled alike).
struct best_column {
  const float* bias;
  index_t k;
  index_t* assign;
  XSOFTMAX_HD void operator()(index_t r, const float* s) const { assign[r] = row_argmax(s, bias, k); }
};

/// Row r's `m` best columns by s[j] (no bias: the IVF probes' inner products), best first in
/// `row_topk`'s order (ties: the smaller column), into lists[r * m ..] (their scores in heap_s, rows
/// x m); with `assign`, also `best_column`'s choice into assign[r] (the same scores' top-1).
struct best_columns {
  index_t k, m;
  float* heap_s;
  index_t* lists;
  index_t* assign;
  XSOFTMAX_HD void operator()(index_t r, const float* s) const {
    topk_heap heap{heap_s + r * m, lists + r * m, 0};
    for (index_t j = 0; j < k; ++j) heap.offer(s[j], j, m);
    heap.sort_best_first();
    if (assign) assign[r] = row_argmax(s, nullptr, k);
  }
};

/// half_norm[j] = -|c_j|^2 / 2, summed in fp32 in index order.
XSOFTMAX_HD inline float minus_half_norm(const float* c, index_t d) {
  float s = 0;
  for (index_t p = 0; p < d; ++p) s += c[p] * c[p];
  return -0.5f * s;
}

/// Scales c (d values) to unit length, the norm summed in double (zero stays zero).
XSOFTMAX_HD inline void unit_length(float* c, index_t d) {
  double s = 0;
  for (index_t p = 0; p < d; ++p) s += static_cast<double>(c[p]) * c[p];
  const float inv = s > 0 ? static_cast<float>(1.0 / ::sqrt(s)) : 0.f;
  for (index_t p = 0; p < d; ++p) c[p] *= inv;
}

/// The cluster of every row of `x` (centroids `c`, k x d), into `assign` (x.rows). `half_norm` (k
/// values, -|c_j|^2 / 2) is added to the scores unless spherical (then null). All in the
/// execution's memory.
template <class Ex>
void nearest_centroids(const Ex& ex, matrix_view<const float> x, matrix_view<const float> c,
                       const float* half_norm, index_t* assign) {
  for_each_score_row(ex, x, c, best_column{half_norm, c.rows, assign});
}

/// For every row of `x`, the centroid (rows of `c`, k x d) with the highest score, into `assign`
/// (x.rows values): x . c for spherical k-means, x . c - |c|^2 / 2 (nearest in L2) otherwise. Ties:
/// the smaller centroid. `x`, `c` and `assign` are in the execution's memory.
template <class Ex>
void assign_to_centroids(const Ex& ex_in, matrix_view<const float> x, matrix_view<const float> c, bool spherical,
                         index_t* assign) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t k = c.rows, d = c.cols;
  typename execution_type::template vector<float> half_norm(static_cast<std::size_t>(spherical ? 0 : k));
  float* hn = raw(half_norm);
  if (!spherical) XSOFTMAX_PARALLEL_FOR(ex, k, j, { hn[j] = minus_half_norm(c.row(j), d); });
  nearest_centroids(ex, x, c, spherical ? nullptr : hn, assign);
}

/// Centroid j (k threads): a non-empty cluster's centroid becomes the mean of its members
/// (members[offsets[j] .. offsets[j + 1]), the points assigned to j in ascending order, as
/// `group_by_key` lists them), summed in double in that order (then unit length when spherical,
/// and its half norm for the next assignment); an empty one is left for the host's re-seed.
/// Writes the cluster sizes to `size` (k). Work O(n d) in all, not O(n k).
struct update_centroid {
  matrix_view<const float> x;
  const index_t* members;
  const index_t* offsets;
  bool spherical;
  double* sum;  ///< k x d
  float* centroids;
  float* half_norm;
  index_t* size;
  XSOFTMAX_HD void operator()(index_t j) const {
    const index_t d = x.cols;
    double* sj = sum + j * d;
    for (index_t p = 0; p < d; ++p) sj[p] = 0.0;
    const index_t count = offsets[j + 1] - offsets[j];
    for (index_t m = offsets[j]; m < offsets[j + 1]; ++m) {
      const float* r = x.row(members[m]);
      for (index_t p = 0; p < d; ++p) sj[p] += r[p];
    }
    size[j] = count;
    if (count == 0) return;
    float* cj = centroids + j * d;
    for (index_t p = 0; p < d; ++p) cj[p] = static_cast<float>(sj[p] / static_cast<double>(count));
    if (spherical) unit_length(cj, d);
    if (half_norm) half_norm[j] = minus_half_norm(cj, d);
  }
};

/// Centroid j = row from[j] of `x` where from[j] >= 0 (the initial rows, or re-seeds of empty
/// clusters), unit length when spherical (as after an update), with its half norm.
struct seed_centroid {
  matrix_view<const float> x;
  const index_t* from;
  bool spherical;
  float* centroids;
  float* half_norm;
  XSOFTMAX_HD void operator()(index_t j) const {
    if (from[j] < 0) return;
    const index_t d = x.cols;
    float* cj = centroids + j * d;
    const float* r = x.row(from[j]);
    for (index_t p = 0; p < d; ++p) cj[p] = r[p];
    if (spherical) unit_length(cj, d);
    if (half_norm) half_norm[j] = minus_half_norm(cj, d);
  }
};

/// Centroid j's half norm (the L2 assignment's offset) from its current value.
struct centroid_half_norm {
  const float* centroids;
  index_t d;
  float* half_norm;
  XSOFTMAX_HD void operator()(index_t j) const { half_norm[j] = minus_half_norm(centroids + j * d, d); }
};

/// Lloyd's k-means of the rows of `x` (n x d, unit rows when `spherical`; execution memory) into
/// `k` centroids (k x d, written to `centroids` in the execution's memory), `iterations` rounds,
/// seeded initialisation from distinct rows -- or, when `warm`, from the centroids `centroids`
/// already holds (a refresh after the data moved a little); an empty cluster is re-seeded from a
/// random row (a host decision on the cluster sizes). Deterministic for a given seed, on every
/// backend.
template <class Ex>
void kmeans(const Ex& ex_in, matrix_view<const float> x, index_t k, index_t iterations, bool spherical,
            unsigned long long seed, float* centroids, bool warm = false) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using index_vector = typename execution_type::template vector<index_t>;
  const index_t n = x.rows, d = x.cols;
  std::mt19937_64 rng(mix_seed(seed));
  std::vector<index_t> pick(static_cast<std::size_t>(k));
  if (!warm) {  // k distinct rows (partial Fisher-Yates over indices)
    std::vector<index_t> idx(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) idx[i] = i;
    for (index_t j = 0; j < k; ++j) {
      std::swap(idx[j], idx[std::uniform_int_distribution<index_t>(j, n - 1)(rng)]);
      pick[j] = idx[j];
    }
  }
  typename execution_type::template vector<float> half_norm(static_cast<std::size_t>(spherical ? 0 : k));
  float* hn = spherical ? nullptr : raw(half_norm);
  index_vector from(pick.begin(), pick.end());
  // The initial rows are copied as they are (x's rows are already unit under spherical).
  if (!warm) parallel_for(ex, k, seed_centroid{x, raw(from), false, centroids, hn});
  else if (hn) parallel_for(ex, k, centroid_half_norm{centroids, d, hn});
  index_vector assign(static_cast<std::size_t>(n)), size(static_cast<std::size_t>(k)), sorted_assign, members,
      member_offsets;
  typename execution_type::template vector<double> sum(static_cast<std::size_t>(k * d));
  std::vector<index_t> size_host(static_cast<std::size_t>(k));
  for (index_t it = 0; it < iterations; ++it) {
    nearest_centroids(ex, x, matrix_view<const float>(centroids, k, d), hn, raw(assign));
    group_by_key(ex, raw(assign), n, k, sorted_assign, members, member_offsets);
    parallel_for(ex, k, update_centroid{x, raw(members), raw(member_offsets), spherical, raw(sum), centroids, hn,
                                        raw(size)});
    // The cluster sizes decide the re-seeds on the host, in centroid order (one draw per empty one).
    execution_type::ops::copy(ex.res, size_host.data(), raw(size), k);
    bool any = false;
    for (index_t j = 0; j < k; ++j) {
      pick[j] = size_host[j] == 0 ? std::uniform_int_distribution<index_t>(0, n - 1)(rng) : -1;
      any = any || pick[j] >= 0;
    }
    if (any) {
      execution_type::ops::copy(ex.res, raw(from), pick.data(), k);
      parallel_for(ex, k, seed_centroid{x, raw(from), spherical, centroids, hn});
    }
  }
}

}  // namespace xsoftmax::detail
