// SPDX-License-Identifier: Apache-2.0
// The word2vec / fastText output layer: a binary Huffman tree over Zipf class counts with sigmoid
// nodes (d = 100, about 18 nodes per path at N = 1e5), on ONE core, against the per-example C++
// loops those libraries run, written here over the same tree, weights and samples:
//
//   train/xsoftmax        hierarchical_softmax<runtime_tree, fp32, serial, sigmoid_nodes>:
//                         forward_backward over a batch of 1024 + apply_sgd of its sparse gradient
//   train/per_example     for each sample, for each node on its path: dot, sigmoid, grad_h += g w,
//                         w += g h (fastText's HierarchicalSoftmaxLoss::forward + update)
//   topk/xsoftmax/k       head.topk (exact best-first search, batched)
//   topk/per_example/k    a best-first search per sample with a std::priority_queue (fastText's
//                         predict over its tree: dfs with a heap of the k best)
//
// Counter `samples_per_second`. Serial backend and one BLAS thread: per-core rates.
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./build/bench/huffman_bench

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <queue>
#include <random>
#include <utility>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t num_classes = 100'000;
constexpr index_t dim = 100;
constexpr index_t batch = 1024;
constexpr float lr = 0.05f;

using head_type = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial, xs::sigmoid_nodes>;

struct fixture {
  xs::runtime_tree<> tree;
  std::vector<float> hidden;          // batch x dim
  std::vector<index_t> targets;       // Zipf
  std::vector<float> weights;         // internal nodes x dim, for the per-example loops
  fixture() : tree(make_tree()) {
    std::mt19937_64 g(7);
    std::normal_distribution<float> nd(0.f, 0.3f);
    hidden.resize(static_cast<std::size_t>(batch * dim));
    for (auto& x : hidden) x = nd(g);
    std::discrete_distribution<index_t> zipf(counts().begin(), counts().end());
    targets.resize(static_cast<std::size_t>(batch));
    for (auto& t : targets) t = zipf(g);
    weights.resize(static_cast<std::size_t>(tree.num_rows() / 2 * dim));
    for (auto& x : weights) x = 0.1f * nd(g);
  }
  static const std::vector<double>& counts() {
    static const std::vector<double> c = [] {
      std::vector<double> v(static_cast<std::size_t>(num_classes));
      for (index_t i = 0; i < num_classes; ++i) v[i] = 1e7 / static_cast<double>(i + 1);
      return v;
    }();
    return c;
  }
  static xs::runtime_tree<> make_tree() { return xs::runtime_tree<>::huffman(counts(), 2); }
};

const fixture& data() {
  static const fixture f;
  return f;
}

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float log_sigmoid(float x) { return x > 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

void train_xsoftmax(benchmark::State& state) {
  const fixture& f = data();
  head_type head(f.tree, xs::matrix_view<float>(const_cast<float*>(f.weights.data()), f.tree.num_rows() / 2, dim));
  std::vector<float> w_copy(f.weights);  // train a private copy
  head_type own(f.tree, xs::matrix_view<float>(w_copy.data(), f.tree.num_rows() / 2, dim));
  std::vector<float> gh(static_cast<std::size_t>(batch * dim));
  head_type::gradient_type grad;
  double path_nodes = 0;
  for (index_t t : f.targets) path_nodes += f.tree.view().depth(t);
  for (auto _ : state) {
    benchmark::DoNotOptimize(own.forward_backward(xs::matrix_view<const float>(f.hidden.data(), batch, dim),
                                                  xs::vector_view<const index_t>(f.targets.data(), batch),
                                                  xs::matrix_view<float>(gh.data(), batch, dim), grad));
    own.apply_sgd(grad, lr);
  }
  state.counters["samples_per_second"] = benchmark::Counter(double(batch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["nodes_per_path"] = path_nodes / batch;
}

void train_per_example(benchmark::State& state) {
  const fixture& f = data();
  std::vector<float> w(f.weights);
  const auto tv = f.tree.view();
  std::vector<float> grad(static_cast<std::size_t>(dim));
  for (auto _ : state) {
    float loss = 0;
    for (index_t i = 0; i < batch; ++i) {
      const float* h = f.hidden.data() + i * dim;
      const index_t t = f.targets[i];
      std::fill(grad.begin(), grad.end(), 0.f);
      for (int l = 0; l < tv.depth(t); ++l) {
        const xs::path_step s = tv.step(t, l);
        float* wr = w.data() + s.block_begin / 2 * dim;
        float dot = 0;
        for (index_t p = 0; p < dim; ++p) dot += wr[p] * h[p];
        const bool label = s.child == 0;
        const float prob = sigmoid(dot);
        loss -= label ? std::log(prob + 1e-7f) : std::log(1.f - prob + 1e-7f);
        const float g = lr * ((label ? 1.f : 0.f) - prob);
        for (index_t p = 0; p < dim; ++p) grad[p] += g * wr[p];
        for (index_t p = 0; p < dim; ++p) wr[p] += g * h[p];
      }
      benchmark::DoNotOptimize(grad.data());
    }
    benchmark::DoNotOptimize(loss);
  }
  state.counters["samples_per_second"] = benchmark::Counter(double(batch), benchmark::Counter::kIsIterationInvariantRate);
}

void topk_xsoftmax(benchmark::State& state) {
  const fixture& f = data();
  const index_t k = state.range(0);
  head_type head(f.tree, xs::matrix_view<float>(const_cast<float*>(f.weights.data()), f.tree.num_rows() / 2, dim));
  std::vector<index_t> classes(static_cast<std::size_t>(batch * k));
  std::vector<float> lp(static_cast<std::size_t>(batch * k));
  for (auto _ : state) {
    head.topk(xs::matrix_view<const float>(f.hidden.data(), batch, dim), k,
              xs::matrix_view<index_t>(classes.data(), batch, k), xs::matrix_view<float>(lp.data(), batch, k));
    benchmark::DoNotOptimize(classes.data());
  }
  state.counters["samples_per_second"] = benchmark::Counter(double(batch), benchmark::Counter::kIsIterationInvariantRate);
}

void topk_per_example(benchmark::State& state) {
  const fixture& f = data();
  const index_t k = state.range(0);
  const auto tv = f.tree.view();
  using entry = std::pair<float, std::pair<index_t, index_t>>;  // (log p, (block_begin, class or -1))
  std::vector<index_t> out(static_cast<std::size_t>(k));
  for (auto _ : state) {
    for (index_t i = 0; i < batch; ++i) {
      const float* h = f.hidden.data() + i * dim;
      std::priority_queue<entry> open;
      open.push({0.f, {0, -1}});
      index_t found = 0;
      while (!open.empty() && found < k) {
        const entry e = open.top();
        open.pop();
        if (e.second.second >= 0) {
          out[found++] = e.second.second;
          continue;
        }
        const index_t block = e.second.first;
        const float* wr = f.weights.data() + block / 2 * dim;
        float dot = 0;
        for (index_t p = 0; p < dim; ++p) dot += wr[p] * h[p];
        for (index_t c = 0; c < 2; ++c) {
          const float lp = e.first + log_sigmoid(c == 0 ? dot : -dot);
          const xs::child_ref ch = tv.child(block + c);
          open.push({lp, {ch.block_begin, ch.is_leaf ? ch.leaf_class : -1}});
        }
      }
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["samples_per_second"] = benchmark::Counter(double(batch), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(train_xsoftmax)->Name("train/xsoftmax")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(train_per_example)->Name("train/per_example")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(topk_xsoftmax)->Name("topk/xsoftmax")->Arg(1)->Arg(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(topk_per_example)->Name("topk/per_example")->Arg(1)->Arg(5)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
