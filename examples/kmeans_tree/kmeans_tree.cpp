// SPDX-License-Identifier: Apache-2.0
//
// kmeans_tree: a hierarchical softmax is only as good as its tree. This example builds a label
// tree by balanced hierarchical k-means over class vectors (`kmeans_label_tree`), initialises the
// head's node weights from those vectors (`init_tree_weights_from_class_vectors`), and trains a few
// SGD steps against two trees that ignore what the classes look like:
//   * uniform_tree<2, 64>: 64 groups of 64 classes in class-id order (an arbitrary grouping);
//   * a binary Huffman tree over the class frequencies (short paths for frequent classes);
//   * the k-means tree with the same shape as the uniform one (b = 64, max_depth = 2), from a
//     small random start and from the class vectors' means.
//
// The synthetic problem: N = 4096 classes in 256 clusters of 16 similar classes (class c is in
// cluster c % 256, so class ids say nothing about the clusters), Zipf-distributed frequencies, and
// samples h = t_c + noise of the class's true vector t_c. The "class vectors" the tree is built
// from are what a warm-up would give: the mean of 4 samples of each class.
//
// Build and run (from the repository root):
//   cmake -S . -B build && cmake --build build -j2 --target kmeans_tree && ./build/examples/kmeans_tree

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/kmeans_tree.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t clusters = 256, per_cluster = 16, num_classes = clusters * per_cluster, dim = 32;
constexpr index_t batch = 256;
constexpr int steps = 200;
constexpr float lr = 2.f;

struct problem {
  std::vector<float> truth;          // num_classes x dim
  std::vector<double> cdf;           // Zipf over classes
  std::vector<double> frequency;     // the same, per class (for the Huffman tree)
  std::vector<float> class_vectors;  // mean of 4 samples per class

  template <class Rng>
  index_t draw_class(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::min<index_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), num_classes - 1);
  }
  template <class Rng>
  void sample(Rng& rng, index_t c, float* h) const {
    std::normal_distribution<float> noise(0.f, 0.35f);
    for (index_t j = 0; j < dim; ++j) h[j] = truth[c * dim + j] + noise(rng);
  }
  template <class Rng>
  void batch_of(Rng& rng, std::vector<float>& hidden, std::vector<index_t>& targets) const {
    for (index_t i = 0; i < batch; ++i) {
      targets[i] = draw_class(rng);
      sample(rng, targets[i], hidden.data() + i * dim);
    }
  }
};

problem make_problem(std::mt19937_64& rng) {
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::vector<float> centre(static_cast<std::size_t>(clusters * dim));
  for (float& x : centre) x = gauss(rng);
  problem p;
  p.truth.resize(static_cast<std::size_t>(num_classes * dim));
  for (index_t c = 0; c < num_classes; ++c)
    for (index_t j = 0; j < dim; ++j) p.truth[c * dim + j] = centre[(c % clusters) * dim + j] + 0.4f * gauss(rng);
  double total = 0;
  for (index_t c = 0; c < num_classes; ++c) {
    p.frequency.push_back(1.0 / std::pow(double(c + 1), 1.0));
    p.cdf.push_back(total += p.frequency.back());
  }
  for (double& x : p.cdf) x /= total;
  p.class_vectors.assign(static_cast<std::size_t>(num_classes * dim), 0.f);
  std::vector<float> h(static_cast<std::size_t>(dim));
  for (index_t c = 0; c < num_classes; ++c)
    for (int s = 0; s < 4; ++s) {
      p.sample(rng, c, h.data());
      for (index_t j = 0; j < dim; ++j) p.class_vectors[c * dim + j] += 0.25f * h[j];
    }
  return p;
}

/// Trains `head` for `steps` SGD steps on fresh batches (the same batches for every head: the
/// generator is seeded alike), then returns the loss on a held-out batch.
template <class Head>
void train(const char* name, Head& head, const problem& p) {
  std::mt19937_64 rng(7);
  std::vector<float> hidden(static_cast<std::size_t>(batch * dim)), grad_hidden(hidden.size());
  std::vector<index_t> targets(static_cast<std::size_t>(batch));
  typename Head::gradient_type grad;
  const auto loss_now = [&] {
    return head.forward(xs::matrix_view<const float>(hidden.data(), batch, dim),
                        xs::vector_view<const index_t>(targets.data(), batch));
  };
  p.batch_of(rng, hidden, targets);
  const float first = loss_now();
  double last_window = 0;
  for (int step = 1; step <= steps; ++step) {
    p.batch_of(rng, hidden, targets);
    const float loss = head.forward_backward(xs::matrix_view<const float>(hidden.data(), batch, dim),
                                             xs::vector_view<const index_t>(targets.data(), batch),
                                             xs::matrix_view<float>(grad_hidden.data(), batch, dim), grad);
    head.apply_sgd(grad, lr);
    if (step > steps - 20) last_window += loss / 20.0;
  }
  std::mt19937_64 held_out(99);
  p.batch_of(held_out, hidden, targets);
  std::printf("  %-34s loss before %.3f, last 20 steps %.3f, held-out %.3f\n", name, first, last_window, loss_now());
}

/// Height and the sizes (in classes) of the root's children of a runtime tree.
void describe(const char* name, const xs::runtime_tree<>& t) {
  std::vector<index_t> below(static_cast<std::size_t>(t.num_rows()), 0);
  for (index_t c = 0; c < t.num_classes(); ++c)
    for (int l = 0; l < t.depth(c); ++l) ++below[static_cast<std::size_t>(t.path_row(c, l))];
  const auto root = below.begin() + t.root_block_size();
  std::printf("  %-10s height %d, %lld weight rows, root children %lld holding %lld..%lld classes\n", name,
              t.height(), (long long)t.num_rows(), (long long)t.root_block_size(),
              (long long)*std::min_element(below.begin(), root), (long long)*std::max_element(below.begin(), root));
}

}  // namespace

int main() {
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 rng(2029);
  const problem p = make_problem(rng);
  const xs::matrix_view<const float> class_vectors(p.class_vectors.data(), num_classes, dim);

  // The k-means trees: b = 64 with max_depth 2 (the two-level shape of uniform_tree<2, 64>), and
  // b = 4 without a limit (ceil(log_4 4096) = 6 levels).
  xs::kmeans_tree_options two_level;
  two_level.branching = 64;
  two_level.max_depth = 2;
  xs::kmeans_tree_options deep;
  deep.branching = 4;
  const auto t0 = std::chrono::steady_clock::now();
  const auto kmeans2 = xs::kmeans_label_tree<xs::omp>(class_vectors, two_level);
  const auto kmeans4 = xs::kmeans_label_tree<xs::omp>(class_vectors, deep);
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto huffman = xs::runtime_tree<>::huffman(p.frequency, 2);
  std::printf("%lld classes (%lld clusters of %lld), dim %lld; the two k-means trees built in %.3f s\n",
              (long long)num_classes, (long long)clusters, (long long)per_cluster, (long long)dim, build_s);
  describe("k-means/64", kmeans2);
  describe("k-means/4", kmeans4);
  describe("Huffman", huffman);

  // How well the two-level k-means tree groups the clusters: the share of each cluster's classes
  // under its most common root child (1.0: every cluster whole under one of the 64 nodes; grouping
  // by class id, as uniform_tree<2, 64> does, gives 1/16 here: a cluster's classes k, k + 256, ...
  // fall in 16 different groups).
  double purity = 0;
  for (index_t k = 0; k < clusters; ++k) {
    std::vector<index_t> count(static_cast<std::size_t>(kmeans2.root_block_size()), 0);
    for (index_t c = k; c < num_classes; c += clusters) ++count[static_cast<std::size_t>(kmeans2.path_row(c, 0))];
    purity += double(*std::max_element(count.begin(), count.end())) / per_cluster / clusters;
  }
  std::printf("cluster purity of the k-means/64 tree's root children: %.3f\n", purity);

  std::printf("%d SGD steps (batch %lld, lr %.1f), weights from a small random start unless stated:\n", steps,
              (long long)batch, lr);
  xs::init_options small;
  small.seed = 1;
  small.scale = 0.01f;
  {
    xs::hierarchical_softmax<xs::uniform_tree<2, 64>, xs::fp32, xs::omp> head(xs::uniform_tree<2, 64>(num_classes),
                                                                              dim, false, small);
    train("uniform_tree<2, 64> (id order)", head, p);
  }
  {
    xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::omp> head(huffman, dim, false, small);
    train("Huffman (binary)", head, p);
  }
  {
    xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::omp> head(kmeans2, dim, false, small);
    train("k-means b = 64, depth 2", head, p);
  }
  for (const auto* t : {&kmeans2, &kmeans4}) {
    // Node weights from the class vectors: each row the mean of the vectors below its child.
    std::vector<float> w(static_cast<std::size_t>(t->num_rows() * dim));
    xs::init_tree_weights_from_class_vectors<xs::omp>(*t, class_vectors,
                                                      xs::matrix_view<float>(w.data(), t->num_rows(), dim));
    xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::omp> head(
        *t, xs::matrix_view<float>(w.data(), t->num_rows(), dim));
    train(t == &kmeans2 ? "k-means b = 64, depth 2, mean init" : "k-means b = 4, mean init", head, p);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done in %.1f s\n", seconds);
  return 0;
}
