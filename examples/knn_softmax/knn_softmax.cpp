// SPDX-License-Identifier: Apache-2.0
//
// knn_softmax: the three "active set" heads side by side on one problem, on the CPU.
//
//  * full_softmax        - the exact softmax over all 10,000 classes (the baseline);
//  * knn_softmax         - Alibaba's method: the softmax over the union of each target's K nearest
//                          classes in a graph over the class weight vectors (IVF-built, rebuilt
//                          every 20 steps; and a second head whose graph is rebuilt only every
//                          third update and refreshed from its last lists in between:
//                          neighbours-of-neighbours passes, plus an exact search for the 2 % of
//                          classes whose weights turned most);
//  * selective_softmax<sampled_negatives>
//                        - TensorFlow's sampled softmax: 256 shared negatives drawn from the class
//                          counts, log-Q corrected.
//
// Classes come in clusters of similar vectors, labels are Zipf-distributed; each head trains the
// same linear classifier from the same start for the same steps, then reports top-1 accuracy over
// all classes and the weight rows one step touches. (Each loss is over that head's own active set,
// so losses are not comparable across heads; accuracy is.) See bench/RESULTS.md for the full study.
//
// Build and run: cmake --build build --target knn_softmax && ./build/examples/knn_softmax

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t num_classes = 10'000, dim = 32, batch = 256, cluster = 20;
constexpr int steps = 60;
constexpr float lr = 512.f;

/// Class vectors in clusters: classes of one cluster are close, which is what a KNN graph exploits.
std::vector<float> make_class_vectors(std::mt19937_64& rng) {
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::vector<float> centre(dim), v(static_cast<std::size_t>(num_classes * dim));
  for (index_t c = 0; c < num_classes; ++c) {
    if (c % cluster == 0)
      for (float& x : centre) x = gauss(rng);
    float norm = 0;
    for (index_t j = 0; j < dim; ++j) norm += (v[c * dim + j] = centre[j] + 0.7f * gauss(rng)) * v[c * dim + j];
    for (index_t j = 0; j < dim; ++j) v[c * dim + j] /= std::sqrt(norm);
  }
  return v;
}

struct batch_source {
  std::vector<float> vectors;
  std::discrete_distribution<index_t> zipf;
  void draw(std::mt19937_64& rng, std::vector<float>& h, std::vector<index_t>& t) {
    std::normal_distribution<float> noise(0.f, 0.1f);
    for (index_t i = 0; i < batch; ++i) {
      t[i] = zipf(rng);
      for (index_t j = 0; j < dim; ++j) h[i * dim + j] = vectors[t[i] * dim + j] + noise(rng);
    }
  }
};

/// Trains `head` for `steps` SGD steps on batches from `source` (same seed for every head), then
/// returns top-1 accuracy over all classes on a held-out batch.
template <class Head>
void train_and_report(const char* name, Head& head, batch_source source) {
  std::mt19937_64 rng(7);
  std::vector<float> h(batch * dim), grad_h(batch * dim);
  std::vector<index_t> t(batch);
  typename Head::gradient_type grad;
  double rows = 0;
  float loss = 0;
  for (int s = 0; s < steps; ++s) {
    source.draw(rng, h, t);
    loss = head.forward_backward(xs::matrix_view<const float>(h.data(), batch, dim),
                                 xs::vector_view<const index_t>(t.data(), batch),
                                 xs::matrix_view<float>(grad_h.data(), batch, dim), grad);
    head.apply_sgd(grad, lr);
    rows += grad.num_rows();
    if constexpr (!std::is_same_v<Head, xs::full_softmax<>>) head.next_step();  // sampler / graph schedule
  }
  source.draw(rng, h, t);
  std::vector<index_t> best(batch);
  std::vector<float> log_p(batch);
  head.topk(xs::matrix_view<const float>(h.data(), batch, dim), 1, xs::matrix_view<index_t>(best.data(), batch, 1),
            xs::matrix_view<float>(log_p.data(), batch, 1));
  index_t correct = 0;
  for (index_t i = 0; i < batch; ++i) correct += best[i] == t[i];
  std::printf("%-34s last loss %6.3f   top-1 %5.1f %%   rows touched / step %7.0f (%4.1f %%)\n", name, loss,
              100.0 * correct / batch, rows / steps, 100.0 * rows / steps / num_classes);
}

}  // namespace

int main() {
  std::mt19937_64 rng(2024);
  std::vector<double> freq(num_classes);
  for (index_t c = 0; c < num_classes; ++c) freq[c] = 1.0 / (c + 1);
  std::shuffle(freq.begin(), freq.end(), rng);  // frequent classes spread over the clusters
  batch_source source{make_class_vectors(rng), std::discrete_distribution<index_t>(freq.begin(), freq.end())};

  xs::init_options init;
  init.seed = 1;
  init.scale = 0.01f;

  xs::full_softmax<> full(num_classes, dim, false, init);
  train_and_report("full softmax", full, source);

  xs::knn_options knn;
  knn.graph.k = 50;
  knn.graph.method = xs::knn_build_method::ivf;  // approximate graph: k-means lists, 8 probed
  knn.rebuild_every = 20;
  xs::knn_softmax<> knn_head(num_classes, dim, knn, false, init);
  train_and_report("knn softmax, K = 50", knn_head, source);

  xs::knn_options refreshed = knn;
  refreshed.refreshes_between_rebuilds = 2;  // rebuild, refresh, refresh, rebuild, ...
  refreshed.graph.refine.moved = 0.02;       // a refresh also searches the 2 % that turned most
  xs::knn_softmax<> refreshed_head(num_classes, dim, refreshed, false, init);
  train_and_report("knn softmax, K = 50, refreshed", refreshed_head, source);

  xs::sampling_options sampling;
  sampling.num_sampled = 256;
  xs::selective_softmax<xs::sampled_negatives> sampled(xs::sampled_negatives::from_counts(freq, sampling),
                                                      num_classes, dim, false, init);
  train_and_report("sampled softmax, 256 negatives", sampled, source);
}
