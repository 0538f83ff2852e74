// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The problem of the convergence study (`convergence_bench.cpp`): its configuration from the
/// environment, the fixed synthetic training and test sets, and the host GEMM the two-layer model
/// runs on. Split from the benchmark so that the problem and the training loop stay under 400
/// lines each; the class structure is the KNN study's (`synthetic_classes.hpp`).

#include "synthetic_classes.hpp"

#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/xsoftmax.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace convergence {

using xsoftmax::index_t;

inline double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

/// Everything a run depends on; read once from the XSOFTMAX_CONV_* environment (see the header
/// comment of convergence_bench.cpp for the list and the defaults).
struct conv_config {
  index_t n = static_cast<index_t>(env_or("XSOFTMAX_CONV_N", 100000));
  index_t dim = static_cast<index_t>(env_or("XSOFTMAX_CONV_DIM", 32));
  index_t train = static_cast<index_t>(env_or("XSOFTMAX_CONV_TRAIN", 32768));
  index_t test = static_cast<index_t>(env_or("XSOFTMAX_CONV_TEST", 5000));
  index_t epochs = static_cast<index_t>(env_or("XSOFTMAX_CONV_EPOCHS", 8));
  double warmup = env_or("XSOFTMAX_CONV_WARMUP", 1.0);  ///< passes of linear warm-up
  double zipf = env_or("XSOFTMAX_CONV_ZIPF", 1.0);
  unsigned long long seed = static_cast<unsigned long long>(env_or("XSOFTMAX_CONV_SEED", 2024));  ///< the data
  float lr_sgd1k = static_cast<float>(env_or("XSOFTMAX_CONV_LR_SGD1K", 2));
  float lr_lamb = static_cast<float>(env_or("XSOFTMAX_CONV_LR_LAMB", 0.1));
  float lr_lars = static_cast<float>(env_or("XSOFTMAX_CONV_LR_LARS", 16));
  float lr_sgd8k = static_cast<float>(env_or("XSOFTMAX_CONV_LR_SGD8K", 8 * lr_sgd1k));
  float lars_eta = static_cast<float>(env_or("XSOFTMAX_CONV_LARS_ETA", 0.001));
  /// Weight decay of every optimizer run (both layers), in each rule's own form (added to the Adam
  /// direction for LAMB, to the gradient for LARS and SGD-momentum).
  float weight_decay = static_cast<float>(env_or("XSOFTMAX_CONV_WD", 0));
  std::string out = std::getenv("XSOFTMAX_CONV_OUT") ? std::getenv("XSOFTMAX_CONV_OUT") : "convergence.json";
  index_t cluster_size = 50;
  double spread = 0.7;    ///< class centre = normalize(cluster centre + spread * unit noise)
  double noise = 0.6;     ///< sample = class centre + noise (norm ~ `noise`), before the map A
  double condition = 10;  ///< A's largest / smallest singular value
};

inline const conv_config& cfg() {
  static const conv_config c;
  return c;
}

/// Fixed inputs (already through A) and labels of the training set and the test set.
struct dataset {
  std::vector<float> train_x, test_x;  ///< rows x dim
  std::vector<index_t> train_y, test_y;
  index_t train_classes = 0;  ///< distinct classes in the training set
  double test_seen = 0;       ///< fraction of test samples whose class occurs in the training set
};

/// An orthonormal dim x dim matrix (Gram-Schmidt on Gaussian columns, in double).
inline std::vector<double> random_orthonormal(index_t d, std::mt19937_64& rng) {
  std::normal_distribution<double> g;
  std::vector<double> q(static_cast<size_t>(d * d));
  for (index_t j = 0; j < d; ++j) {
    for (index_t i = 0; i < d; ++i) q[i * d + j] = g(rng);
    for (index_t k = 0; k < j; ++k) {
      double dot = 0;
      for (index_t i = 0; i < d; ++i) dot += q[i * d + j] * q[i * d + k];
      for (index_t i = 0; i < d; ++i) q[i * d + j] -= dot * q[i * d + k];
    }
    double s = 0;
    for (index_t i = 0; i < d; ++i) s += q[i * d + j] * q[i * d + j];
    for (index_t i = 0; i < d; ++i) q[i * d + j] /= std::sqrt(s);
  }
  return q;
}

/// A = U diag(s) V^T (dim x dim, row-major), s log-spaced from 1 down to 1 / condition and scaled
/// so that E||A z||^2 = ||z||^2: a fixed ill-conditioned map for W1 to undo.
inline std::vector<double> ill_conditioned_map(index_t dim, double condition, std::mt19937_64& rng) {
  const std::vector<double> uq = random_orthonormal(dim, rng), vq = random_orthonormal(dim, rng);
  std::vector<double> sv(static_cast<size_t>(dim));
  double ms = 0;
  for (index_t k = 0; k < dim; ++k)
    sv[k] = std::pow(condition, -double(k) / double(std::max<index_t>(1, dim - 1))), ms += sv[k] * sv[k];
  for (auto& s : sv) s /= std::sqrt(ms / dim);
  std::vector<double> a(static_cast<size_t>(dim * dim), 0.0);
  for (index_t i = 0; i < dim; ++i)
    for (index_t j = 0; j < dim; ++j)
      for (index_t k = 0; k < dim; ++k) a[i * dim + j] += uq[i * dim + k] * sv[k] * vq[j * dim + k];
  return a;
}

/// The study's data, generated once from cfg().seed: class centres and Zipf frequencies as in the
/// KNN study, samples = A (class centre + Gaussian noise).
inline const dataset& data() {
  static const std::unique_ptr<dataset> d = [] {
    auto ds = std::make_unique<dataset>();
    const conv_config& c = cfg();
    const index_t n = c.n, dim = c.dim;
    synthetic_classes::engine rng(c.seed);
    synthetic_classes::gaussian gauss;
    const std::vector<float> centre =
        synthetic_classes::clustered_centres(n, dim, c.cluster_size, c.spread, rng, gauss);
    const std::vector<double> a = ill_conditioned_map(dim, c.condition, rng);
    synthetic_classes::zipf_classes draw_class(n, c.zipf, rng);
    auto draw = [&](std::vector<float>& xs, std::vector<index_t>& ys, index_t rows) {
      xs.resize(static_cast<size_t>(rows * dim));
      ys.resize(static_cast<size_t>(rows));
      const float sd = static_cast<float>(c.noise / std::sqrt(double(dim)));
      std::vector<double> z(static_cast<size_t>(dim));
      for (index_t i = 0; i < rows; ++i) {
        const index_t y = draw_class(rng);
        ys[i] = y;
        for (index_t p = 0; p < dim; ++p) z[p] = centre[y * dim + p] + sd * gauss(rng);
        for (index_t p = 0; p < dim; ++p) {
          double s = 0;
          for (index_t q = 0; q < dim; ++q) s += a[p * dim + q] * z[q];
          xs[i * dim + p] = static_cast<float>(s);
        }
      }
    };
    draw(ds->train_x, ds->train_y, c.train);
    draw(ds->test_x, ds->test_y, c.test);
    std::vector<char> seen(static_cast<size_t>(n), 0);
    for (index_t y : ds->train_y) ds->train_classes += seen[y] ? 0 : 1, seen[y] = 1;
    for (index_t y : ds->test_y) ds->test_seen += seen[y];
    ds->test_seen /= c.test;
    return ds;
  }();
  return *d;
}

/// Row-major C(m x n) = op(A) op(B) through the library's host GEMM (CBLAS when the build has one).
inline void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const float* a, index_t lda, const float* b,
                 index_t ldb, float* c) {
  namespace h = xsoftmax::detail::host;
  h::gemm_args g;
  g.op_a = ta ? h::op::transpose : h::op::none;
  g.op_b = tb ? h::op::transpose : h::op::none;
  g.m = m, g.n = n, g.k = k, g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = n;
  h::gemm(g);
}

}  // namespace convergence
