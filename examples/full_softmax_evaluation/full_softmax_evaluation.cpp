// SPDX-License-Identifier: Apache-2.0
//
// full_softmax_evaluation: a validation pass's loss and accuracy@k from one pass over the scores.
//
// An evaluation loop wants two things of the output layer: the validation loss and how often the
// target is among the k most probable classes. With `forward` then `topk` every class is scored
// twice (two score GEMMs of 2 x B x N x dim FLOPs). `full_softmax::forward_topk` keeps the top-k
// from the forward's own score chunks: the loss (bit for bit the forward's) and the top-k for one
// GEMM. Rows whose target is `ignore_index` (padding) get class -1 and log-probability -inf.
//
// The program trains a small exact softmax for 100 SGD steps on synthetic data (each class has a
// centre; a sample is its class's centre plus noise, 10 % of the rows are padding), then evaluates a
// held-out batch both ways, checks that they agree and prints loss, accuracy@1 and @5, and the time
// of each way (best of three).
//
// Build and run (from the repository root):
//   cmake -S . -B build && cmake --build build -j2 --target full_softmax_evaluation && ./build/examples/full_softmax_evaluation

#include <xsoftmax/full_softmax.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t num_classes = 5'000;
constexpr index_t dim = 64;
constexpr index_t batch = 512;
constexpr index_t k = 5;
constexpr index_t padding = -100;  // loss_options' default ignore_index

using head_type = xs::full_softmax<xs::fp32, xs::omp>;

/// A batch of synthetic samples: each row its class's centre plus noise; every tenth row padding.
struct batch_data {
  std::vector<float> hidden;
  std::vector<index_t> targets;
};

batch_data make_batch(const std::vector<float>& centres, std::mt19937& rng) {
  std::uniform_int_distribution<index_t> cls(0, num_classes - 1);
  std::normal_distribution<float> noise(0.f, 0.6f);
  batch_data b;
  b.hidden.resize(static_cast<std::size_t>(batch * dim));
  b.targets.resize(static_cast<std::size_t>(batch));
  for (index_t r = 0; r < batch; ++r) {
    const index_t c = cls(rng);
    for (index_t j = 0; j < dim; ++j)
      b.hidden[static_cast<std::size_t>(r * dim + j)] = centres[static_cast<std::size_t>(c * dim + j)] + noise(rng);
    b.targets[static_cast<std::size_t>(r)] = r % 10 == 9 ? padding : c;
  }
  return b;
}

template <class F>
double best_of_three(F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

/// Rows whose target is among their first `top` classes, over the rows that are not padding.
double accuracy(const std::vector<index_t>& classes, const std::vector<index_t>& targets, index_t top) {
  index_t hits = 0, counted = 0;
  for (index_t r = 0; r < batch; ++r) {
    const index_t t = targets[static_cast<std::size_t>(r)];
    if (t == padding) continue;
    ++counted;
    const auto row = classes.begin() + r * k;
    hits += std::find(row, row + top, t) != row + top;
  }
  return counted ? static_cast<double>(hits) / static_cast<double>(counted) : 0.0;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> unit(0.f, 1.f);
  std::vector<float> centres(static_cast<std::size_t>(num_classes * dim));
  for (float& x : centres) x = unit(rng) * 0.35f;

  head_type head(num_classes, dim, /*with_bias=*/true);
  std::vector<float> grad_hidden(static_cast<std::size_t>(batch * dim));
  head_type::gradient_type grad;
  std::printf("full_softmax_evaluation: %lld classes, dim %lld, batches of %lld rows (every tenth is padding)\n",
              static_cast<long long>(num_classes), static_cast<long long>(dim), static_cast<long long>(batch));
  for (int step = 0; step < 100; ++step) {
    const batch_data b = make_batch(centres, rng);
    const float loss = head.forward_backward(xs::matrix_view<const float>(b.hidden.data(), batch, dim),
                                             xs::vector_view<const index_t>(b.targets.data(), batch),
                                             xs::matrix_view<float>(grad_hidden.data(), batch, dim), grad);
    head.apply_sgd(grad, /*lr=*/100.f);
    if (step % 25 == 24) std::printf("  training step %2d: loss %.4f\n", step + 1, loss);
  }

  // A held-out batch, evaluated both ways.
  const batch_data v = make_batch(centres, rng);
  const xs::matrix_view<const float> h(v.hidden.data(), batch, dim);
  const xs::vector_view<const index_t> t(v.targets.data(), batch);
  std::vector<index_t> classes(static_cast<std::size_t>(batch * k)), classes_two(classes.size());
  std::vector<float> log_probs(classes.size()), log_probs_two(classes.size());
  float loss_one = 0, loss_two = 0;
  const double one_pass = best_of_three([&] {
    loss_one = head.forward_topk(h, t, k, xs::matrix_view<index_t>(classes.data(), batch, k),
                                 xs::matrix_view<float>(log_probs.data(), batch, k));
  });
  const double two_passes = best_of_three([&] {
    loss_two = head.forward(h, t);
    head.topk(h, k, xs::matrix_view<index_t>(classes_two.data(), batch, k),
              xs::matrix_view<float>(log_probs_two.data(), batch, k));
  });

  // The same loss, bit for bit, and the same top-k on every row that is not padding.
  bool same = loss_one == loss_two;
  for (index_t r = 0; r < batch; ++r) {
    if (v.targets[static_cast<std::size_t>(r)] == padding) {
      same = same && classes[static_cast<std::size_t>(r * k)] == -1;
      continue;
    }
    for (index_t j = 0; j < k; ++j)
      same = same && classes[static_cast<std::size_t>(r * k + j)] == classes_two[static_cast<std::size_t>(r * k + j)];
  }
  std::printf("validation: loss %.4f, accuracy@1 %.3f, accuracy@5 %.3f\n", loss_one, accuracy(classes, v.targets, 1),
              accuracy(classes, v.targets, k));
  std::printf("forward_topk (one pass):    %.2f ms\n", one_pass * 1e3);
  std::printf("forward, then topk:         %.2f ms (%.2fx)\n", two_passes * 1e3, two_passes / one_pass);
  std::printf("same loss and top-%lld both ways: %s\n", static_cast<long long>(k), same ? "yes" : "NO");
  return same ? 0 : 1;
}
