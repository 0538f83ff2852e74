// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The class structure shared by the synthetic studies (`knn_study_data.hpp`, the KNN accuracy study;
/// `convergence_problem.hpp`, the convergence study): class centres in clusters, and Zipf class
/// frequencies over a random ranking. One generator, so that "the generator of the KNN study" in
/// bench/RESULTS.md stays true of both. Every function draws from the caller's engine and Gaussian
/// in a fixed order, so a study's data are a function of its seed alone; the caller's own draws
/// before and after (and its Gaussian's cached second value) are part of that order.

#include <xsoftmax/xsoftmax.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace synthetic_classes {

using xsoftmax::index_t;
using engine = std::mt19937_64;
using gaussian = std::normal_distribution<float>;

/// Overwrites v[0, dim) with a uniformly distributed unit vector (a normalised Gaussian draw).
inline void random_unit(float* v, index_t dim, engine& rng, gaussian& gauss) {
  double s = 0;
  for (index_t p = 0; p < dim; ++p) v[p] = gauss(rng), s += double(v[p]) * v[p];
  for (index_t p = 0; p < dim; ++p) v[p] = static_cast<float>(v[p] / std::sqrt(s));
}

/// n unit class centres (n x dim, row-major) in clusters of `cluster_size` consecutive draws:
/// centre = normalize(cluster centre + spread * random unit vector). Class ids are a random
/// permutation of the draw order, so that neighbouring ids carry no cluster information.
inline std::vector<float> clustered_centres(index_t n, index_t dim, index_t cluster_size, double spread, engine& rng,
                                            gaussian& gauss) {
  const index_t clusters = (n + cluster_size - 1) / cluster_size;
  std::vector<float> mu(static_cast<size_t>(clusters * dim)), centre(static_cast<size_t>(n * dim)), u(dim);
  for (index_t g = 0; g < clusters; ++g) random_unit(mu.data() + g * dim, dim, rng, gauss);
  std::vector<index_t> id(static_cast<size_t>(n));
  std::iota(id.begin(), id.end(), index_t(0));
  std::shuffle(id.begin(), id.end(), rng);
  for (index_t j = 0; j < n; ++j) {
    float* m = centre.data() + id[j] * dim;
    random_unit(u.data(), dim, rng, gauss);
    double s = 0;
    for (index_t p = 0; p < dim; ++p)
      m[p] = mu[(j / cluster_size) * dim + p] + float(spread) * u[p], s += double(m[p]) * m[p];
    for (index_t p = 0; p < dim; ++p) m[p] = static_cast<float>(m[p] / std::sqrt(s));
  }
  return centre;
}

/// Draws class ids with Zipf(`exponent`) frequencies over a random ranking of the n classes (so
/// that frequency is unrelated to id and to cluster), as in product and vocabulary data.
class zipf_classes {
 public:
  /// Shuffles the ranking with `rng` (one draw sequence, at construction).
  zipf_classes(index_t n, double exponent, engine& rng) : rank_(static_cast<size_t>(n)), cdf_(static_cast<size_t>(n)) {
    std::iota(rank_.begin(), rank_.end(), index_t(0));
    std::shuffle(rank_.begin(), rank_.end(), rng);
    double total = 0;
    for (index_t k = 0; k < n; ++k) total += std::pow(double(k + 1), -exponent), cdf_[k] = total;
    u01_ = std::uniform_real_distribution<double>(0.0, total);
  }

  /// One class id (one uniform draw from `rng`).
  index_t operator()(engine& rng) {
    const auto n = static_cast<index_t>(cdf_.size());
    const index_t k = std::min<index_t>(n - 1, std::upper_bound(cdf_.begin(), cdf_.end(), u01_(rng)) - cdf_.begin());
    return rank_[k];
  }

 private:
  std::vector<index_t> rank_;  ///< rank_[k]: the class of frequency rank k
  std::vector<double> cdf_;    ///< unnormalised cumulative Zipf weights by rank
  std::uniform_real_distribution<double> u01_;
};

/// `rows` samples into x (rows x dim) and y: each a class from `draw_class`, then that class's centre
/// plus Gaussian noise of norm about `noise` (sd noise / sqrt(dim) a coordinate), drawn in that order.
inline void draw_samples(const std::vector<float>& centre, index_t dim, double noise, zipf_classes& draw_class,
                         engine& rng, gaussian& gauss, index_t rows, std::vector<float>& x, std::vector<index_t>& y) {
  x.resize(static_cast<size_t>(rows * dim));
  y.resize(static_cast<size_t>(rows));
  const float sd = static_cast<float>(noise / std::sqrt(double(dim)));
  for (index_t i = 0; i < rows; ++i) {
    const index_t c = draw_class(rng);
    y[static_cast<size_t>(i)] = c;
    for (index_t p = 0; p < dim; ++p)
      x[static_cast<size_t>(i * dim + p)] = centre[static_cast<size_t>(c * dim + p)] + sd * gauss(rng);
  }
}

}  // namespace synthetic_classes
