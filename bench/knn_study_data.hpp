// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The data of the KNN softmax accuracy study (`knn_accuracy_bench.cpp`): its configuration from
/// the environment, the fixed synthetic training stream and test set, the weight initialisation.
/// Split from the benchmark so that the study's logic and its data stay under 400 lines each.

#include "synthetic_classes.hpp"

#include <xsoftmax/xsoftmax.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace knn_study {

using xsoftmax::index_t;

inline double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

/// The classifier's logits. `linear`: <h, w_j> (the first study). The others are the normalised
/// classifier of face and product recognition (and of the 100M-class system): logits s cos theta_j
/// over L2-normalised features and class weights, through `loss_options::margin`, which normalises
/// inside the loss (the stored weights keep their norms); `cosine` is CosFace with m = 0 (no margin).
enum class logits_kind { linear, cosine, cosface, arcface };

/// XSOFTMAX_STUDY_LOGITS: linear (default) | cosine | cosface | arcface.
inline logits_kind logits_from_env() {
  const char* v = std::getenv("XSOFTMAX_STUDY_LOGITS");
  if (!v || !*v || !std::strcmp(v, "linear")) return logits_kind::linear;
  if (!std::strcmp(v, "cosine")) return logits_kind::cosine;
  if (!std::strcmp(v, "cosface")) return logits_kind::cosface;
  if (!std::strcmp(v, "arcface")) return logits_kind::arcface;
  std::fprintf(stderr, "XSOFTMAX_STUDY_LOGITS = %s: expected linear, cosine, cosface or arcface\n", v);
  std::exit(2);
}

struct study_config {
  logits_kind logits = logits_from_env();
  float scale = static_cast<float>(env_or("XSOFTMAX_STUDY_SCALE", 30));  ///< s of the normalised logits
  /// m: CosFace in cosine units (paper: 0.35), ArcFace in radians (paper: 0.5); 0 for `cosine`.
  float margin = static_cast<float>(env_or("XSOFTMAX_STUDY_MARGIN", logits == logits_kind::arcface ? 0.5 : 0.35));
  index_t n = static_cast<index_t>(env_or("XSOFTMAX_STUDY_N", 100000));
  index_t dim = static_cast<index_t>(env_or("XSOFTMAX_STUDY_DIM", 64));
  index_t batch = static_cast<index_t>(env_or("XSOFTMAX_STUDY_BATCH", 256));
  index_t steps = static_cast<index_t>(env_or("XSOFTMAX_STUDY_STEPS", 150));
  /// Passes over the training stream (same order each time): more than one lets the class geometry,
  /// and so the KNN graph, settle before the end.
  index_t epochs = static_cast<index_t>(env_or("XSOFTMAX_STUDY_EPOCHS", 1));
  // Mean reduction. Linear: 2048 (8 per sample at B = 256), tuned for the full softmax at N = 1e4.
  // Normalised: 0.3, tuned the same way (see RESULTS.md; the gradient of a normalised row is
  // orthogonal to it and scales as 1 / |w|, so the plain lr does not carry over).
  float lr = static_cast<float>(env_or("XSOFTMAX_STUDY_LR", logits == logits_kind::linear ? 2048 : 0.3));
  double zipf = env_or("XSOFTMAX_STUDY_ZIPF", 1.0);
  index_t test = static_cast<index_t>(env_or("XSOFTMAX_STUDY_TEST", 5000));
  index_t rebuild = static_cast<index_t>(env_or("XSOFTMAX_STUDY_REBUILD", 50));
  index_t nprobe = static_cast<index_t>(env_or("XSOFTMAX_STUDY_NPROBE", 8));
  index_t sampled = static_cast<index_t>(env_or("XSOFTMAX_STUDY_SAMPLED", 2048));
  bool knn_inner_product = env_or("XSOFTMAX_STUDY_KNN_IP", 0) != 0;  ///< graph by inner product, not cosine
  bool knn_exact = env_or("XSOFTMAX_STUDY_KNN_EXACT", 0) != 0;        ///< exact tiled graph, not IVF
  /// IVF graph with each class probing its own lists (knn_build_method::ivf_class_probes)
  bool knn_class_probes = env_or("XSOFTMAX_STUDY_KNN_CLASS_PROBES", 0) != 0;
  index_t lists = static_cast<index_t>(env_or("XSOFTMAX_STUDY_LISTS", 0));  ///< IVF lists (0: the method's default)
  /// rebuilds warm-start k-means with this many rounds (knn_build_options::refresh_iterations; -1: off)
  index_t refresh = static_cast<index_t>(env_or("XSOFTMAX_STUDY_KNN_REFRESH", -1));
  /// graph updates that refresh the last graph between full builds (knn_options::refreshes_between_rebuilds)
  index_t refreshes = static_cast<index_t>(env_or("XSOFTMAX_STUDY_KNN_REFRESHES", 0));
  /// neighbours-of-neighbours passes after each IVF build and of each refresh (knn_refine_options)
  index_t refine_build = static_cast<index_t>(env_or("XSOFTMAX_STUDY_KNN_REFINE", 0));
  index_t refine_refresh = static_cast<index_t>(env_or("XSOFTMAX_STUDY_KNN_REFRESH_PASSES", 1));
  /// fraction of classes a refresh searches exactly, those that turned most (knn_refine_options::moved)
  double moved = env_or("XSOFTMAX_STUDY_KNN_MOVED", 0);
  unsigned long long seed = static_cast<unsigned long long>(env_or("XSOFTMAX_STUDY_SEED", 2024));  ///< data
  index_t cluster_size = 50;
  double spread = 0.7;  ///< class centre = normalize(cluster centre + spread * unit noise)
  double noise = 0.6;   ///< sample = class centre + noise (norm ~ `noise`)
  float init_scale = 0.01f;

  [[nodiscard]] bool normalised() const { return logits != logits_kind::linear; }
  /// The loss options of a training step: mean reduction and, when normalised, the margin.
  [[nodiscard]] xsoftmax::loss_options loss() const {
    xsoftmax::loss_options o;
    o.reduce = xsoftmax::reduction::mean;
    if (logits == logits_kind::arcface) o.margin = xsoftmax::margin_options::arcface(scale, margin);
    if (logits == logits_kind::cosface) o.margin = xsoftmax::margin_options::cosface(scale, margin);
    if (logits == logits_kind::cosine) o.margin = xsoftmax::margin_options::cosface(scale, 0.f);
    return o;
  }
  [[nodiscard]] const char* logits_name() const {
    switch (logits) {
      case logits_kind::cosine: return "cosine (s cos theta, no margin)";
      case logits_kind::cosface: return "CosFace (s (cos theta - m) for the target)";
      case logits_kind::arcface: return "ArcFace (s cos(theta + m) for the target)";
      default: return "linear (<h, w>)";
    }
  }
};

/// Fixed features and labels of the training stream and the test set.
struct dataset {
  study_config cfg;
  std::vector<float> train_x, test_x;  ///< rows x dim
  std::vector<index_t> train_y, test_y;
  std::vector<double> train_counts;  ///< per class
};

inline const dataset& data() {
  static const std::unique_ptr<dataset> d = [] {
    auto ds = std::make_unique<dataset>();
    const study_config& c = ds->cfg;
    const index_t n = c.n, dim = c.dim;
    synthetic_classes::engine rng(c.seed);
    synthetic_classes::gaussian gauss;
    // Clusters of `cluster_size` classes, then Zipf frequencies (synthetic_classes.hpp).
    const std::vector<float> centre =
        synthetic_classes::clustered_centres(n, dim, c.cluster_size, c.spread, rng, gauss);
    synthetic_classes::zipf_classes draw_class(n, c.zipf, rng);
    synthetic_classes::draw_samples(centre, dim, c.noise, draw_class, rng, gauss, c.steps * c.batch, ds->train_x,
                                    ds->train_y);
    synthetic_classes::draw_samples(centre, dim, c.noise, draw_class, rng, gauss, c.test, ds->test_x, ds->test_y);
    ds->train_counts.assign(static_cast<size_t>(n), 0.0);
    for (index_t y : ds->train_y) ds->train_counts[y] += 1;
    return ds;
  }();
  return *d;
}

inline xsoftmax::init_options init() {
  xsoftmax::init_options o;
  o.seed = 7;
  o.scale = data().cfg.init_scale;
  return o;
}

}  // namespace knn_study
