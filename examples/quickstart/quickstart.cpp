// SPDX-License-Identifier: Apache-2.0
//
// quickstart: train a two-level hierarchical softmax over 100,000 classes on the CPU.
//
// The problem is synthetic but shaped like the real ones the library is for (a language model's
// vocabulary, product or identity recognition):
//   * N = 100,000 classes whose frequencies follow Zipf's law (a few classes are very common, most
//     are rare), as words and products do;
//   * every class c has a fixed "true" vector t_c in R^64, and a sample of class c arrives as the
//     hidden vector t_c + noise. The hidden vectors are fixed features: only the output layer (the
//     softmax head) is trained here, as if the network below it were frozen.
//
// The head is hierarchical_softmax over uniform_tree<2, 320>: a root with ceil(N / 320) = 313
// children, each a node over (at most) 320 classes. A sample's loss is
// -log p(group | h) - log p(class | group, h), so one step reads and updates only the root's 313
// rows and the 320-row blocks of the groups its batch's targets fall in, instead of all 100,000
// rows as the exact softmax would.
//
// Build and run (from the repository root):
//   cmake -S . -B build && cmake --build build -j2 --target quickstart && ./build/examples/quickstart

#include <xsoftmax/hierarchical_softmax.hpp>
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

constexpr index_t num_classes = 100'000;
constexpr index_t dim = 64;
constexpr index_t batch = 256;
constexpr int steps = 300;
constexpr int print_every = 25;

// Branching ~ sqrt(N): both levels then have ~sqrt(N) children per node, which minimises the rows
// a sample touches (313 + 320 instead of 100,000). N need not be 320^2: the last group is partial.
constexpr int branching = 320;
using tree = xs::uniform_tree<2, branching>;

// fp32 storage, OpenMP threads on the host. Swap `xs::fp32` for `xs::bf16` to halve the weights'
// memory (arithmetic stays fp32), or `xs::omp` for `xs::serial` to run on one thread.
using head_type = xs::hierarchical_softmax<tree, xs::fp32, xs::omp>;

/// Samples class ids with P(c) proportional to 1 / (c + 1)^s: class 0 is the most frequent.
class zipf_sampler {
 public:
  zipf_sampler(index_t n, double s) : cdf_(static_cast<std::size_t>(n)) {
    double total = 0;
    for (index_t c = 0; c < n; ++c) cdf_[c] = total += 1.0 / std::pow(double(c + 1), s);
    for (double& x : cdf_) x /= total;
  }
  template <class Rng>
  index_t operator()(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<index_t>(it - cdf_.begin(), static_cast<index_t>(cdf_.size()) - 1);
  }
  /// P(class < k): how often the k most frequent classes occur.
  [[nodiscard]] double head_mass(index_t k) const { return cdf_[static_cast<std::size_t>(k - 1)]; }

 private:
  std::vector<double> cdf_;
};

/// The fixed feature vectors of the synthetic problem.
struct synthetic_problem {
  std::vector<float> true_vectors;  // num_classes x dim
  float noise = 0.f;

  /// Fills `hidden` (batch x dim) and `targets` (batch) with fresh samples.
  template <class Rng>
  void sample(Rng& rng, const zipf_sampler& zipf, std::vector<float>& hidden, std::vector<index_t>& targets) const {
    std::normal_distribution<float> gauss(0.f, noise);
    for (index_t i = 0; i < batch; ++i) {
      const index_t c = zipf(rng);
      targets[i] = c;
      for (index_t j = 0; j < dim; ++j) hidden[i * dim + j] = true_vectors[c * dim + j] + gauss(rng);
    }
  }
};

synthetic_problem make_problem(std::mt19937_64& rng) {
  // Classes that share a tree node get similar true vectors: t_c = centre(group of c) + own offset.
  // A hierarchical softmax is only as good as its tree: the root must tell groups apart from h
  // alone, which is easy when a group's classes look alike and impossible when the grouping is
  // arbitrary. Real trees are built to make this true (k-means over class vectors, Brown clusters,
  // Huffman codes over frequency-sorted ids); here the data is generated to match the tree.
  std::normal_distribution<float> gauss(0.f, 1.f);
  const index_t groups = (num_classes + branching - 1) / branching;
  std::vector<float> centre(static_cast<std::size_t>(groups * dim));
  for (float& x : centre) x = gauss(rng) / std::sqrt(float(dim)) * 4.f;  // |centre| ~ 4
  synthetic_problem p;
  p.true_vectors.resize(static_cast<std::size_t>(num_classes * dim));
  for (index_t c = 0; c < num_classes; ++c)
    for (index_t j = 0; j < dim; ++j)
      p.true_vectors[c * dim + j] = centre[(c / branching) * dim + j] + gauss(rng) / std::sqrt(float(dim)) * 4.f;
  p.noise = 0.25f;  // per coordinate: |noise| ~ 2, half the distance between two classes' vectors
  return p;
}

}  // namespace

int main() {
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 rng(2024);
  const zipf_sampler zipf(num_classes, 1.05);
  const synthetic_problem problem = make_problem(rng);

  // The head owns its weights (tree.num_rows() x dim, here 313 + 100,000 rows) and a bias per row.
  // The bias lets it learn the class frequencies directly, which matters a lot under Zipf's law.
  xs::init_options init;
  init.seed = 1;
  init.scale = 0.01f;  // start near the uniform distribution: loss ~ log(313) + log(320) ~ 11.5
  head_type head(tree(num_classes), dim, /*with_bias=*/true, init);

  std::printf("hierarchical softmax: %lld classes, dim %lld, tree uniform<2, %d> (%lld weight rows), "
              "batch %lld, %d SGD steps\n",
              (long long)num_classes, (long long)dim, branching, (long long)head.tree().num_rows(),
              (long long)batch, steps);

  std::vector<float> hidden(static_cast<std::size_t>(batch * dim));
  std::vector<index_t> targets(static_cast<std::size_t>(batch));
  // The gradient of the hidden vectors: a full network would pass it to the layer below; here the
  // features are fixed, so it is computed and dropped.
  std::vector<float> grad_hidden(static_cast<std::size_t>(batch * dim));
  // The sparse weight gradient: only the rows this step touched. Reusing one object keeps its
  // buffers allocated between steps.
  head_type::gradient_type grad;

  // Plain SGD on the mean loss. The mean divides every row's gradient by the batch size, and a rare
  // class's row receives a gradient only from its few samples, so the step size is large.
  const float lr = 12.f;
  double window_loss = 0;
  index_t window_rows = 0;
  for (int step = 1; step <= steps; ++step) {
    problem.sample(rng, zipf, hidden, targets);
    const float loss = head.forward_backward(xs::matrix_view<const float>(hidden.data(), batch, dim),
                                             xs::vector_view<const index_t>(targets.data(), batch),
                                             xs::matrix_view<float>(grad_hidden.data(), batch, dim), grad);
    head.apply_sgd(grad, lr);
    window_loss += loss;
    ++window_rows;
    if (step == 1 || step % print_every == 0) {
      std::printf("step %4d  loss %7.4f  (mean of the last %lld steps; this step touched %lld of %lld rows)\n",
                  step, window_loss / window_rows, (long long)window_rows, (long long)grad.num_rows(),
                  (long long)head.tree().num_rows());
      window_loss = 0;
      window_rows = 0;
    }
  }

  // Held-out evaluation: fresh samples never seen in training, top-5 by exact best-first tree search.
  constexpr index_t k = 5;
  problem.sample(rng, zipf, hidden, targets);
  std::vector<index_t> top_classes(static_cast<std::size_t>(batch * k));
  std::vector<float> top_log_probs(static_cast<std::size_t>(batch * k));
  head.topk(xs::matrix_view<const float>(hidden.data(), batch, dim), k,
            xs::matrix_view<index_t>(top_classes.data(), batch, k),
            xs::matrix_view<float>(top_log_probs.data(), batch, k));
  index_t top1 = 0, top5 = 0;
  for (index_t i = 0; i < batch; ++i) {
    top1 += top_classes[i * k] == targets[i];
    top5 += std::count(&top_classes[i * k], &top_classes[i * k] + k, targets[i]) > 0;
  }
  const float held_out_loss = head.forward(xs::matrix_view<const float>(hidden.data(), batch, dim),
                                           xs::vector_view<const index_t>(targets.data(), batch));

  // Two baselines: guessing uniformly, and always answering the 5 most frequent classes (what a
  // model that learnt only the class frequencies would do).
  std::printf("held-out batch of %lld: loss %.4f, top-1 accuracy %.1f%%, top-5 accuracy %.1f%%\n",
              (long long)batch, held_out_loss, 100.0 * top1 / batch, 100.0 * top5 / batch);
  std::printf("baselines for top-5: uniform guess %.3f%%, the 5 most frequent classes %.1f%%\n",
              100.0 * k / num_classes, 100.0 * zipf.head_mass(k));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done in %.1f s\n", seconds);
  return 0;
}
