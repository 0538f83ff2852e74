// SPDX-License-Identifier: Apache-2.0
// Built against xsoftmax from outside the tree by .ci/run, twice: through an installed package
// (find_package) and through FetchContent from a local path. Trains a few steps of every head —
// full, hierarchical (uniform and Huffman trees), sampled, KNN — with apply_sgd and a sparse Adam
// optimizer, and fails unless every loss is finite and falls: proves the headers, the CMake
// package (include directories, OpenMP, CBLAS) and the optimisation flags work for a user.
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/xsoftmax.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t classes = 1000, dim = 32, batch = 256;

struct data {
  std::vector<float> hidden;
  std::vector<index_t> targets;
};

/// A learnable problem: 50 classes in use, each sample its class's random centre plus a little noise,
/// so a linear layer separates them and the loss of every head can fall far within a few steps.
data make_data() {
  constexpr index_t used = 50;
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> centre(static_cast<std::size_t>(used * dim));
  for (auto& x : centre) x = nd(g);
  data d;
  d.hidden.resize(static_cast<std::size_t>(batch * dim));
  for (index_t i = 0; i < batch; ++i) {
    const index_t t = (i * 37) % used;
    d.targets.push_back(t);
    for (index_t j = 0; j < dim; ++j) d.hidden[i * dim + j] = centre[t * dim + j] + 0.3f * nd(g);
  }
  return d;
}

/// Trains `head` for `steps` steps with `update(grad)`; returns true when the loss fell by half.
template <class Head, class Update>
bool train(const char* name, Head& head, const data& d, int steps, Update update) {
  std::vector<float> grad_hidden(d.hidden.size());
  typename Head::gradient_type grad;
  float first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    last = head.forward_backward(xs::matrix_view<const float>(d.hidden.data(), batch, dim),
                                 xs::vector_view<const index_t>(d.targets.data(), batch),
                                 xs::matrix_view<float>(grad_hidden.data(), batch, dim), grad);
    if (s == 0) first = last;
    update(grad);
  }
  const bool ok = std::isfinite(last) && last < 0.5f * first;
  std::printf("%-28s loss %.3f -> %.3f %s\n", name, first, last, ok ? "ok" : "DID NOT FALL");
  return ok;
}

}  // namespace

int main() {
  const data d = make_data();
  bool ok = true;
  const int steps = 40;

  xs::full_softmax<xs::fp32, xs::omp> full(classes, dim, true);
  ok &= train("full_softmax + apply_sgd", full, d, steps, [&](const auto& g) { full.apply_sgd(g, 0.5f); });

  xs::full_softmax<xs::bf16, xs::omp> full16(classes, dim);
  xs::sparse_adam<xs::omp, float> adam(classes, dim, false, xs::adam_rule(0.9f, 0.999f));
  ok &= train("full_softmax bf16 + adam", full16, d, steps, [&](const auto& g) { adam.step(full16, g, 0.02f); });

  using tree = xs::uniform_tree<2, 32>;
  xs::hierarchical_softmax<tree, xs::fp32, xs::omp> hs(tree(classes), dim);
  ok &= train("hierarchical uniform<2,32>", hs, d, steps, [&](const auto& g) { hs.apply_sgd(g, 0.5f); });

  std::vector<double> counts(static_cast<std::size_t>(classes));
  for (index_t c = 0; c < classes; ++c) counts[c] = 1.0 / static_cast<double>(c + 1);
  xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::omp, xs::sigmoid_nodes> huffman(
      xs::runtime_tree<>::huffman(counts, 2), dim);
  ok &= train("hierarchical binary Huffman", huffman, d, steps, [&](const auto& g) { huffman.apply_sgd(g, 0.5f); });

  xs::sampling_options so;
  so.num_sampled = 64;
  xs::selective_softmax<xs::sampled_negatives, xs::fp32, xs::omp> sampled(xs::sampled_negatives::uniform(classes, so),
                                                                            classes, dim);
  ok &= train("sampled softmax", sampled, d, steps, [&](const auto& g) {
    sampled.apply_sgd(g, 0.5f);
    sampled.next_step();
  });

  xs::knn_options ko;
  ko.graph.k = 20;
  ko.rebuild_every = 10;
  xs::knn_softmax<xs::fp32, xs::omp> knn(classes, dim, ko);
  ok &= train("knn softmax", knn, d, steps, [&](const auto& g) {
    knn.apply_sgd(g, 0.5f);
    knn.next_step();
  });

  std::printf("xsoftmax %d.%d.%d usable from outside the tree (cblas: %s): %s\n", XSOFTMAX_VERSION_MAJOR,
              XSOFTMAX_VERSION_MINOR, XSOFTMAX_VERSION_PATCH,
#if defined(XSOFTMAX_HAS_CBLAS) && XSOFTMAX_HAS_CBLAS
              "yes",
#else
              "no",
#endif
              ok ? "every head trained" : "FAILED");
  return ok ? 0 : 1;
}
