// SPDX-License-Identifier: Apache-2.0
// Convergence study (issue 13): at batch 8192, do LAMB or LARS with a linear warm-up reach the
// top-1 accuracy that SGD with momentum reaches at batch 1024, in fewer passes over the data?
//
// Problem: a synthetic 100,000-class task that a linear model can learn but not trivially.
// N classes in clusters of 50 (class centre = normalize(cluster centre + 0.7 · random unit
// vector), ids shuffled), Zipf(1.0) class frequencies; a sample is its class centre plus Gaussian
// noise of norm ≈ 0.6, then seen through a fixed ill-conditioned linear map A (singular values
// log-spaced from 1 to 1/10), so the model has two layers with something to learn in each:
//     h = W1 x            (W1: dim x dim, dense, trained: the "feature extractor")
//     loss = full softmax cross-entropy of h over all N classes (N x dim, trained: the head)
// A fixed training set (32,768 samples by default) is visited for the same number of passes
// (epochs) by every method, reshuffled each pass with the same seeded order for all; top-1 over
// every class on a held-out test set after each pass. Why a fixed set and passes, not a stream:
// "fewer passes" is the question, and with 100K classes most classes are seen a few times per pass.
//
// Methods (one Google Benchmark each, one iteration = the whole training run):
//   sgd_1k    SGD + momentum 0.9, batch 1024      (the reference)
//   lamb_8k   LAMB, batch 8192                    (dense LAMB on W1, sparse LAMB on the head's rows)
//   lars_8k   LARS, batch 8192                    (dense LARS on W1, sparse LARS on the head's rows)
//   sgd_8k    SGD + momentum 0.9, batch 8192, lr = 8 x sgd_1k's (linear scaling rule)
// Every method: linear warm-up over `warmup` passes, then cosine decay to 0 at the last step
// (xsoftmax::warmup_cosine), one learning rate for both layers (LARS/LAMB scale it per layer by
// their trust ratio), no weight decay unless XSOFTMAX_CONV_WD says so, mean-reduced loss. The full
// softmax's gradient touches every row, so the head's "layer" for LARS/LAMB is the whole N x dim
// matrix here. The problem (data, config, GEMM) is in convergence_problem.hpp; its class structure
// is the KNN study's (synthetic_classes.hpp).
//
// Configuration through the environment (defaults in brackets, which the study in
// bench/RESULTS.md uses unless it says otherwise):
//   XSOFTMAX_CONV_N [100000] classes, _DIM [32], _TRAIN [32768] training samples, _TEST [5000],
//   _EPOCHS [8] passes (the schedule's length: the cosine reaches 0 at the last step),
//   _WARMUP [1] passes of linear warm-up (every method), _ZIPF [1.0],
//   _SEED [2024] the data (centres, map A, samples; not the init or the pass order, which are fixed),
//   _LR_SGD1K [2], _LR_LAMB [0.1], _LR_LARS [16], _LR_SGD8K [8 x _LR_SGD1K], _LARS_ETA [0.001],
//   _WD [0] weight decay of whichever methods run (lamb_rule, lars_rule, momentum_rule: both layers),
//   _OUT [convergence.json] results of the methods run, rewritten after each.
// Progress (one line per pass per method) and a summary go to stderr. Google Benchmark names the
// runs convergence/<method>/iterations:1, so one method is --benchmark_filter=convergence/lamb_8k/.
// Run:
//   OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2 ./build/bench/convergence_bench
// then python3 bench/plot_convergence.py convergence.json -o bench/convergence.png

#include "convergence_problem.hpp"

#include <xsoftmax/optim/large_batch.hpp>
#include <xsoftmax/optim/schedules.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/xsoftmax.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using clock_type = std::chrono::steady_clock;
using convergence::cfg;
using convergence::conv_config;
using convergence::data;
using convergence::dataset;
using convergence::gemm;

enum class optimizer { sgd, lars, lamb };

struct method {
  std::string name;
  optimizer opt;
  index_t batch;
  float lr;
};

/// One pass's measurements.
struct pass_result {
  index_t epoch;
  double top1, train_loss, seconds, trust_w1, trust_head;
};

struct run_result {
  method m;
  std::vector<pass_result> passes;
};

std::vector<run_result>& results() {
  static std::vector<run_result> r;
  return r;
}

/// The JSON file the plot reads: the configuration and every finished method's curve.
void write_json() {
  const conv_config& c = cfg();
  std::FILE* f = std::fopen(c.out.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", c.out.c_str());
    return;
  }
  std::fprintf(f,
               "{\n  \"config\": {\"classes\": %ld, \"dim\": %ld, \"train\": %ld, \"test\": %ld, \"epochs\": %ld, "
               "\"warmup_passes\": %g, \"zipf\": %g, \"seed\": %llu, \"lars_eta\": %g, \"weight_decay\": %g, "
               "\"train_classes\": %ld, \"test_seen_fraction\": %.4f},\n  \"methods\": [",
               long(c.n), long(c.dim), long(c.train), long(c.test), long(c.epochs), c.warmup, c.zipf, c.seed,
               double(c.lars_eta), double(c.weight_decay), long(data().train_classes), data().test_seen);
  const char* opt_names[] = {"sgd_momentum", "lars", "lamb"};
  for (std::size_t i = 0; i < results().size(); ++i) {
    const run_result& r = results()[i];
    std::fprintf(f,
                 "%s\n    {\"name\": \"%s\", \"optimizer\": \"%s\", \"batch\": %ld, \"lr\": %g, "
                 "\"weight_decay\": %g, \"seed\": %llu, \"passes\": [",
                 i ? "," : "", r.m.name.c_str(), opt_names[int(r.m.opt)], long(r.m.batch), double(r.m.lr),
                 double(c.weight_decay), c.seed);
    for (std::size_t e = 0; e < r.passes.size(); ++e) {
      const pass_result& p = r.passes[e];
      std::fprintf(f,
                   "%s\n      {\"epoch\": %ld, \"top1\": %.4f, \"train_loss\": %.5f, \"seconds\": %.1f, "
                   "\"trust_w1\": %.5g, \"trust_head\": %.5g}",
                   e ? "," : "", long(p.epoch), p.top1, p.train_loss, p.seconds, p.trust_w1, p.trust_head);
    }
    std::fprintf(f, "]}");
  }
  std::fprintf(f, "\n  ]\n}\n");
  std::fclose(f);
}

using head_type = xs::full_softmax<xs::fp32, xs::omp>;

/// Top-1 over all classes on the test set: h = x W1^T, then the head's own `topk`.
double top1(const head_type& head, const std::vector<float>& w1) {
  const dataset& ds = data();
  const index_t dim = cfg().dim, rows = cfg().test, chunk = 2000;
  std::vector<float> h(static_cast<size_t>(chunk * dim)), lp(static_cast<size_t>(chunk));
  std::vector<index_t> cls(static_cast<size_t>(chunk));
  index_t correct = 0;
  for (index_t r0 = 0; r0 < rows; r0 += chunk) {
    const index_t rn = std::min(chunk, rows - r0);
    gemm(false, true, rn, dim, dim, ds.test_x.data() + r0 * dim, dim, w1.data(), dim, h.data());
    head.topk(xs::matrix_view<const float>(h.data(), rn, dim), 1, xs::matrix_view<index_t>(cls.data(), rn, 1),
              xs::matrix_view<float>(lp.data(), rn, 1));
    for (index_t i = 0; i < rn; ++i) correct += cls[i] == ds.test_y[r0 + i] ? 1 : 0;
  }
  return double(correct) / rows;
}

/// The optimizers of one method: one for the dense W1, one for the head's touched rows.
/// SGD's dense layer goes through the sparse optimizer with every row listed (same rule, same state).
struct optimizers {
  optimizer kind;
  std::unique_ptr<xs::sparse_momentum<xs::omp>> sgd_w1, sgd_head;
  std::unique_ptr<xs::lars<xs::omp>> lars_w1;
  std::unique_ptr<xs::sparse_lars<xs::omp>> lars_head;
  std::unique_ptr<xs::lamb<xs::omp>> lamb_w1;
  std::unique_ptr<xs::sparse_lamb<xs::omp>> lamb_head;
  head_type::gradient_type w1_grad;  ///< for SGD: W1's gradient as a sparse gradient of all rows

  optimizers(optimizer k, index_t n, index_t dim) : kind(k) {
    const float wd = cfg().weight_decay;
    const xs::momentum_rule mom(0.9f, false, wd);
    const xs::lars_rule lr(0.9f, wd, cfg().lars_eta);
    const xs::lamb_rule lb(0.9f, 0.999f, 1e-6f, wd);
    switch (k) {
      case optimizer::sgd:
        sgd_w1 = std::make_unique<xs::sparse_momentum<xs::omp>>(dim, dim, false, mom);
        sgd_head = std::make_unique<xs::sparse_momentum<xs::omp>>(n, dim, false, mom);
        w1_grad.dim = dim;
        w1_grad.rows.resize(static_cast<size_t>(dim));
        for (index_t r = 0; r < dim; ++r) w1_grad.rows[r] = r;
        w1_grad.values.resize(static_cast<size_t>(dim * dim));
        break;
      case optimizer::lars:
        lars_w1 = std::make_unique<xs::lars<xs::omp>>(std::vector<index_t>{dim * dim}, lr);
        lars_head = std::make_unique<xs::sparse_lars<xs::omp>>(n, dim, false, lr);
        break;
      case optimizer::lamb:
        lamb_w1 = std::make_unique<xs::lamb<xs::omp>>(std::vector<index_t>{dim * dim}, lb);
        lamb_head = std::make_unique<xs::sparse_lamb<xs::omp>>(n, dim, false, lb);
        break;
    }
  }

  /// One step of both layers at rate lr; returns the trust ratios (W1, head), 1 for SGD.
  std::pair<float, float> step(head_type& head, const head_type::gradient_type& g, std::vector<float>& w1,
                               const std::vector<float>& gw1, float lr) {
    const index_t dim = cfg().dim;
    const xs::dense_layer layer{xs::vector_view<float>(w1.data(), dim * dim),
                                xs::vector_view<const float>(gw1.data(), dim * dim)};
    switch (kind) {
      case optimizer::sgd:
        std::copy(gw1.begin(), gw1.end(), w1_grad.values.begin());
        sgd_w1->step(xs::matrix_view<float>(w1.data(), dim, dim), nullptr, w1_grad, lr);
        sgd_head->step(head, g, lr);
        return {1.f, 1.f};
      case optimizer::lars:
        lars_w1->step({layer}, lr);
        lars_head->step(head, g, lr);
        return {lars_w1->trust_ratios()[0], lars_head->trust_ratio()};
      case optimizer::lamb:
        lamb_w1->step({layer}, lr);
        lamb_head->step(head, g, lr);
        return {lamb_w1->trust_ratios()[0], lamb_head->trust_ratio()};
    }
    return {1.f, 1.f};
  }
};

/// Trains one method from the same initial weights for cfg().epochs passes; records every pass.
run_result train(const method& m) {
  const conv_config& c = cfg();
  const dataset& ds = data();
  const index_t n = c.n, dim = c.dim, b = m.batch;
  const index_t steps_per_pass = c.train / b;
  const index_t total = steps_per_pass * c.epochs;
  const auto warmup = static_cast<std::int64_t>(std::llround(c.warmup * double(steps_per_pass)));
  const xs::warmup_cosine schedule(m.lr, warmup, total);

  xs::init_options init;
  init.seed = 7;  // uniform in [-1/sqrt(dim), 1/sqrt(dim)]
  head_type head(n, dim, false, init);
  std::vector<float> w1(static_cast<size_t>(dim * dim)), gw1(w1.size());
  {
    std::mt19937_64 rng(8);
    std::normal_distribution<float> g(0.f, 1.f / std::sqrt(float(dim)));
    for (auto& v : w1) v = g(rng);
  }
  optimizers opt(m.opt, n, dim);
  std::vector<float> xb(static_cast<size_t>(b * dim)), hb(xb.size()), gh(xb.size());
  std::vector<index_t> yb(static_cast<size_t>(b)), order(static_cast<size_t>(c.train));
  head_type::gradient_type g;
  xs::loss_options lo;
  lo.reduce = xs::reduction::mean;

  run_result r{m, {}};
  std::int64_t t = 0;
  const auto t0 = clock_type::now();
  for (index_t e = 1; e <= c.epochs; ++e) {
    std::iota(order.begin(), order.end(), index_t(0));
    std::mt19937_64 shuffle_rng(1000 + static_cast<unsigned long long>(e));  // same order for every method
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    double loss_sum = 0, trust_w1 = 0, trust_head = 0;
    for (index_t s = 0; s < steps_per_pass; ++s, ++t) {
      for (index_t i = 0; i < b; ++i) {
        const index_t src = order[s * b + i];
        std::copy_n(ds.train_x.data() + src * dim, dim, xb.data() + i * dim);
        yb[i] = ds.train_y[src];
      }
      gemm(false, true, b, dim, dim, xb.data(), dim, w1.data(), dim, hb.data());  // h = x W1^T
      loss_sum += head.forward_backward(xs::matrix_view<const float>(hb.data(), b, dim),
                                        xs::vector_view<const index_t>(yb.data(), b),
                                        xs::matrix_view<float>(gh.data(), b, dim), g, lo);
      gemm(true, false, dim, dim, b, gh.data(), dim, xb.data(), dim, gw1.data());  // dL/dW1 = gh^T x
      const auto tr = opt.step(head, g, w1, gw1, schedule(t));
      trust_w1 = tr.first, trust_head = tr.second;
    }
    const double acc = top1(head, w1);
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    r.passes.push_back({e, acc, loss_sum / steps_per_pass, secs, trust_w1, trust_head});
    std::fprintf(stderr, "%-8s batch %5ld lr %-8g pass %2ld: top-1 %6.2f %%  train loss %.4f  lr now %.4g  "
                 "trust (W1, head) %.3g %.3g  %.0f s\n",
                 m.name.c_str(), long(b), double(m.lr), long(e), 100 * acc, loss_sum / steps_per_pass,
                 double(schedule(t - 1)), trust_w1, trust_head, secs);
  }
  return r;
}

void run_method(benchmark::State& state, const method& m) {
  for (auto _ : state) {
    run_result r = train(m);
    state.counters["final_top1_pct"] = 100 * r.passes.back().top1;
    state.counters["best_top1_pct"] =
        100 * std::max_element(r.passes.begin(), r.passes.end(), [](const pass_result& a, const pass_result& b) {
                return a.top1 < b.top1;
              })->top1;
    results().push_back(std::move(r));
    write_json();
  }
}

void setup() {
  static bool done = false;
  if (done) return;
  done = true;
  const conv_config& c = cfg();
  const dataset& ds = data();  // generated outside the runs
  std::fprintf(stderr,
               "convergence study: N = %ld, dim = %ld, train = %ld (distinct classes %ld), test = %ld "
               "(%.1f %% of test samples have a class seen in training), passes = %ld, warm-up = %g passes, "
               "zipf = %.2f, data seed %llu, weight decay %g\n",
               long(c.n), long(c.dim), long(c.train), long(ds.train_classes), long(c.test), 100 * ds.test_seen,
               long(c.epochs), c.warmup, c.zipf, c.seed, double(c.weight_decay));
}

const bool registered = [] {
  const conv_config& c = cfg();
  const method methods[] = {{"sgd_1k", optimizer::sgd, 1024, c.lr_sgd1k},
                            {"lamb_8k", optimizer::lamb, 8192, c.lr_lamb},
                            {"lars_8k", optimizer::lars, 8192, c.lr_lars},
                            {"sgd_8k", optimizer::sgd, 8192, c.lr_sgd8k}};
  for (const method& m : methods)
    benchmark::RegisterBenchmark(("convergence/" + m.name).c_str(), [m](benchmark::State& s) { run_method(s, m); })
        ->Iterations(1)
        ->Unit(benchmark::kSecond)
        ->Setup([](const benchmark::State&) { setup(); });
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
