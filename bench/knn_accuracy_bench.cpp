// SPDX-License-Identifier: Apache-2.0
// Accuracy study: does KNN softmax stay within 1 point top-1 of the full softmax at a fraction of
// its cost (the claim of Alibaba's "Large-Scale Training System for 100-Million Classification")?
//
// A synthetic problem with clustered classes: N classes in clusters of 50 (class centres around a
// cluster centre), class ids shuffled so they carry no cluster information, long-tailed (Zipf)
// class frequencies as in product and vocabulary data. Input features are fixed (generated once:
// class centre + noise); the same linear classifier (N x d weights, same initialisation, same
// sample order, same plain SGD learning rate) is trained once per method, in one pass over the
// training stream:
//   full softmax; KNN softmax with K = 50, 200, 1000 (graph over the weights by cosine, IVF-built,
//   rebuilt every R steps); sampled softmax (unique negatives from the unigram^0.75 distribution
//   of the training labels, log-Q correction); hierarchical softmax (uniform two-level tree).
// Each method is one Google Benchmark (one iteration: training + evaluation) whose counters are
// the results: top-1 on a held-out test set drawn from the same distribution (prediction scores
// every class), seconds per training step (graph rebuilds included), weight rows touched per
// step (rows of the sparse gradient), and for KNN the graph's build time and its recall against
// the exact graph on a sample of classes.
//
// Configuration through the environment (defaults in brackets; the study in bench/RESULTS.md uses
// the defaults): XSOFTMAX_STUDY_N [100000], _DIM [64], _BATCH [256], _STEPS [150], _LR [2048, for
// the mean-reduced loss], _ZIPF [1.0], _TEST [5000], _REBUILD [50], _NPROBE [8], _SAMPLED [2048],
// _THREADS [0: OpenMP default], _SEED [2024: the data], _KNN_IP [0: cosine graph; 1: inner
// product], _KNN_EXACT [0: IVF-built graph; 1: exact tiled graph]. Sampled softmax and HS also run
// at lr / 4. Run (see bench/RESULTS.md for why OPENBLAS_CORETYPE):
//   OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive build/bench/knn_accuracy_bench [--benchmark_filter=...]
// The stderr lines form the results table.

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
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using xsoftmax::index_t;
using clock_type = std::chrono::steady_clock;

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

struct study_config {
  index_t n = static_cast<index_t>(env_or("XSOFTMAX_STUDY_N", 100000));
  index_t dim = static_cast<index_t>(env_or("XSOFTMAX_STUDY_DIM", 64));
  index_t batch = static_cast<index_t>(env_or("XSOFTMAX_STUDY_BATCH", 256));
  index_t steps = static_cast<index_t>(env_or("XSOFTMAX_STUDY_STEPS", 150));
  float lr = static_cast<float>(env_or("XSOFTMAX_STUDY_LR", 2048));  // mean reduction: 8 per sample at B = 256
  double zipf = env_or("XSOFTMAX_STUDY_ZIPF", 1.0);
  index_t test = static_cast<index_t>(env_or("XSOFTMAX_STUDY_TEST", 5000));
  index_t rebuild = static_cast<index_t>(env_or("XSOFTMAX_STUDY_REBUILD", 50));
  index_t nprobe = static_cast<index_t>(env_or("XSOFTMAX_STUDY_NPROBE", 8));
  index_t sampled = static_cast<index_t>(env_or("XSOFTMAX_STUDY_SAMPLED", 2048));
  bool knn_inner_product = env_or("XSOFTMAX_STUDY_KNN_IP", 0) != 0;  ///< graph by inner product, not cosine
  bool knn_exact = env_or("XSOFTMAX_STUDY_KNN_EXACT", 0) != 0;        ///< exact tiled graph, not IVF
  unsigned long long seed = static_cast<unsigned long long>(env_or("XSOFTMAX_STUDY_SEED", 2024));  ///< data
  index_t cluster_size = 50;
  double spread = 0.7;  ///< class centre = normalize(cluster centre + spread * unit noise)
  double noise = 0.6;   ///< sample = class centre + noise (norm ~ `noise`)
  float init_scale = 0.01f;
};

/// Fixed features and labels of the training stream and the test set.
struct dataset {
  study_config cfg;
  std::vector<float> train_x, test_x;  ///< rows x dim
  std::vector<index_t> train_y, test_y;
  std::vector<double> train_counts;  ///< per class
};

const dataset& data() {
  static const std::unique_ptr<dataset> d = [] {
    auto ds = std::make_unique<dataset>();
    const study_config& c = ds->cfg;
    const index_t n = c.n, dim = c.dim;
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<float> gauss;
    auto unit = [&](float* v) {
      double s = 0;
      for (index_t p = 0; p < dim; ++p) v[p] = gauss(rng), s += double(v[p]) * v[p];
      for (index_t p = 0; p < dim; ++p) v[p] = static_cast<float>(v[p] / std::sqrt(s));
    };
    // Clusters of `cluster_size` classes; ids shuffled so that neighbouring ids are unrelated.
    const index_t clusters = (n + c.cluster_size - 1) / c.cluster_size;
    std::vector<float> mu(static_cast<size_t>(clusters * dim)), centre(static_cast<size_t>(n * dim)), u(dim);
    for (index_t g = 0; g < clusters; ++g) unit(mu.data() + g * dim);
    std::vector<index_t> id(static_cast<size_t>(n));
    std::iota(id.begin(), id.end(), index_t(0));
    std::shuffle(id.begin(), id.end(), rng);
    for (index_t j = 0; j < n; ++j) {
      float* m = centre.data() + id[j] * dim;
      unit(u.data());
      double s = 0;
      for (index_t p = 0; p < dim; ++p) m[p] = mu[(j / c.cluster_size) * dim + p] + float(c.spread) * u[p], s += double(m[p]) * m[p];
      for (index_t p = 0; p < dim; ++p) m[p] = static_cast<float>(m[p] / std::sqrt(s));
    }
    // Zipf frequencies over a random ranking of the classes.
    std::vector<index_t> rank(static_cast<size_t>(n));
    std::iota(rank.begin(), rank.end(), index_t(0));
    std::shuffle(rank.begin(), rank.end(), rng);
    std::vector<double> cdf(static_cast<size_t>(n));
    double total = 0;
    for (index_t k = 0; k < n; ++k) total += std::pow(double(k + 1), -c.zipf), cdf[k] = total;
    std::uniform_real_distribution<double> u01(0.0, total);
    auto draw = [&](std::vector<float>& xs, std::vector<index_t>& ys, index_t rows) {
      xs.resize(static_cast<size_t>(rows * dim));
      ys.resize(static_cast<size_t>(rows));
      const float sd = static_cast<float>(c.noise / std::sqrt(double(dim)));
      for (index_t i = 0; i < rows; ++i) {
        const index_t k = std::min<index_t>(n - 1, std::upper_bound(cdf.begin(), cdf.end(), u01(rng)) - cdf.begin());
        const index_t y = rank[k];
        ys[i] = y;
        for (index_t p = 0; p < dim; ++p) xs[i * dim + p] = centre[y * dim + p] + sd * gauss(rng);
      }
    };
    draw(ds->train_x, ds->train_y, c.steps * c.batch);
    draw(ds->test_x, ds->test_y, c.test);
    ds->train_counts.assign(static_cast<size_t>(n), 0.0);
    for (index_t y : ds->train_y) ds->train_counts[y] += 1;
    return ds;
  }();
  return *d;
}

xsoftmax::init_options init() {
  xsoftmax::init_options o;
  o.seed = 7;
  o.scale = data().cfg.init_scale;
  return o;
}

/// What one training run measured.
struct outcome {
  double top1 = 0, seconds_per_step = 0, rows_per_step = 0, train_seconds = 0;
  double hook_seconds = 0;  ///< time spent in next_step (KNN: graph rebuilds), part of train_seconds
};

/// Top-1 over the test set through the head's own `topk` (every class scored).
template <class Head>
double top1(const Head& head) {
  const dataset& ds = data();
  const index_t dim = ds.cfg.dim, rows = ds.cfg.test, chunk = 1000;
  std::vector<index_t> cls(static_cast<size_t>(chunk));
  std::vector<float> lp(static_cast<size_t>(chunk));
  index_t correct = 0;
  for (index_t r0 = 0; r0 < rows; r0 += chunk) {
    const index_t rn = std::min(chunk, rows - r0);
    head.topk(xsoftmax::matrix_view<const float>(ds.test_x.data() + r0 * dim, rn, dim), 1,
              xsoftmax::matrix_view<index_t>(cls.data(), rn, 1), xsoftmax::matrix_view<float>(lp.data(), rn, 1));
    for (index_t i = 0; i < rn; ++i) correct += cls[i] == ds.test_y[r0 + i] ? 1 : 0;
  }
  return double(correct) / rows;
}

template <class Head, class = void>
struct has_next_step : std::false_type {};
template <class Head>
struct has_next_step<Head, std::void_t<decltype(std::declval<Head&>().next_step())>> : std::true_type {};

/// One pass over the training stream: forward_backward, apply_sgd, and (selective heads) next_step.
template <class Head>
outcome train(Head& head, float lr) {
  const dataset& ds = data();
  const study_config& c = ds.cfg;
  std::vector<float> gh(static_cast<size_t>(c.batch * c.dim));
  typename Head::gradient_type g;
  xsoftmax::loss_options opt;
  opt.reduce = xsoftmax::reduction::mean;
  outcome o;
  double rows = 0;
  const auto t0 = clock_type::now();
  for (index_t s = 0; s < c.steps; ++s) {
    const xsoftmax::matrix_view<const float> h(ds.train_x.data() + s * c.batch * c.dim, c.batch, c.dim);
    const xsoftmax::vector_view<const index_t> y(ds.train_y.data() + s * c.batch, c.batch);
    head.forward_backward(h, y, xsoftmax::matrix_view<float>(gh.data(), c.batch, c.dim), g, opt);
    head.apply_sgd(g, lr);
    // Selective heads: the next draw / the graph schedule (not after the last step: nothing uses it).
    if constexpr (has_next_step<Head>::value) {
      if (s + 1 < c.steps) {
        const auto h0 = clock_type::now();
        head.next_step();
        o.hook_seconds += std::chrono::duration<double>(clock_type::now() - h0).count();
      }
    }
    rows += static_cast<double>(g.num_rows());
  }
  o.train_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  o.seconds_per_step = o.train_seconds / c.steps;
  o.rows_per_step = rows / c.steps;
  o.top1 = top1(head);
  return o;
}

/// Counters of one method, and one line of the results table on stderr. `initial_build`: seconds of
/// the graph build at construction (KNN), outside the training loop; rebuilds are inside it.
void report(benchmark::State& state, const char* method, const outcome& o, double initial_build = -1,
            double recall = -1, double recall_trained = -1) {
  const study_config& c = data().cfg;
  state.counters["top1_pct"] = 100 * o.top1;
  state.counters["s_per_step"] = o.seconds_per_step;
  state.counters["rows_per_step"] = o.rows_per_step;
  state.counters["rows_fraction"] = o.rows_per_step / c.n;
  auto fmt = [](double v, const char* f) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return std::string(buf);
  };
  if (initial_build >= 0) {
    state.counters["graph_initial_build_s"] = initial_build;
    state.counters["graph_rebuilds_s"] = o.hook_seconds;
    state.counters["graph_recall"] = recall;
    state.counters["graph_recall_seen5"] = recall_trained;
  }
  std::fprintf(stderr, "| %s | %.2f | %.3f | %.3f | %.0f (%.1f%%) | %s | %s | %s |\n", method, 100 * o.top1,
               o.seconds_per_step, (o.train_seconds - o.hook_seconds) / c.steps, o.rows_per_step,
               100 * o.rows_per_step / c.n,
               initial_build >= 0 ? (fmt(initial_build, "%.1f") + " + " + fmt(o.hook_seconds, "%.1f")).c_str() : "-",
               recall >= 0 ? fmt(recall, "%.3f").c_str() : "-",
               recall_trained >= 0 ? fmt(recall_trained, "%.3f").c_str() : "-");
}

void bm_full(benchmark::State& state) {
  for (auto _ : state) {
    xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::omp> head(data().cfg.n, data().cfg.dim, false, init());
    report(state, "full softmax", train(head, data().cfg.lr));
  }
}

/// Recall of the KNN head's graph against the exact neighbours (the graph's metric), over up to 1000
/// sampled classes seen at least `min_count` times in training (0: any class). Exact top-K by a
/// full softmax over the (unit-normalised, for cosine) weights: one GEMM per chunk, never N x N.
template <class Head>
double sampled_recall(const Head& head, double min_count) {
  const study_config& c = data().cfg;
  const auto& g = head.graph();
  const index_t k = g.k(), d = c.dim;
  std::vector<index_t> pool;
  for (index_t i = 0; i < c.n; ++i)
    if (data().train_counts[i] >= min_count) pool.push_back(i);
  std::mt19937_64 rng(5);
  std::shuffle(pool.begin(), pool.end(), rng);
  const index_t q = std::min<index_t>(1000, static_cast<index_t>(pool.size()));
  if (q == 0) return -1;
  std::vector<float> unit(static_cast<size_t>(c.n * d));
  const auto w = head.weights();
  for (index_t i = 0; i < c.n; ++i) {
    double s = 0;
    for (index_t p = 0; p < d; ++p) s += double(w(i, p)) * w(i, p);
    const double scale = g.metric() == xsoftmax::similarity::cosine ? 1 / std::sqrt(s) : 1.0;
    for (index_t p = 0; p < d; ++p) unit[i * d + p] = static_cast<float>(w(i, p) * scale);
  }
  xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::omp> cosine(xsoftmax::matrix_view<float>(unit.data(), c.n, d));
  std::vector<float> qs(static_cast<size_t>(q * d));
  for (index_t i = 0; i < q; ++i) std::copy(unit.begin() + pool[i] * d, unit.begin() + (pool[i] + 1) * d, qs.begin() + i * d);
  std::vector<index_t> exact(static_cast<size_t>(q * k));
  std::vector<float> lp(exact.size());
  cosine.topk(xsoftmax::matrix_view<const float>(qs.data(), q, d), k, xsoftmax::matrix_view<index_t>(exact.data(), q, k),
              xsoftmax::matrix_view<float>(lp.data(), q, k));
  double hit = 0;
  for (index_t i = 0; i < q; ++i) {
    std::vector<index_t> a(g.neighbors(pool[i]), g.neighbors(pool[i]) + k), e(exact.begin() + i * k, exact.begin() + (i + 1) * k);
    std::sort(a.begin(), a.end());
    std::sort(e.begin(), e.end());
    std::vector<index_t> both;
    std::set_intersection(a.begin(), a.end(), e.begin(), e.end(), std::back_inserter(both));
    hit += double(both.size()) / k;
  }
  return hit / q;
}

void bm_knn(benchmark::State& state) {
  const study_config& c = data().cfg;
  const index_t k = state.range(0);
  for (auto _ : state) {
    xsoftmax::knn_options o;
    o.graph.k = k;
    o.graph.metric = c.knn_inner_product ? xsoftmax::similarity::inner_product : xsoftmax::similarity::cosine;
    o.graph.method = c.knn_exact ? xsoftmax::knn_build_method::exact : xsoftmax::knn_build_method::ivf;
    o.graph.nprobe = c.nprobe;
    o.rebuild_every = c.rebuild;
    const auto t0 = clock_type::now();
    xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::omp> head(c.n, c.dim, o, false, init());
    const double build = std::chrono::duration<double>(clock_type::now() - t0).count();
    const outcome out = train(head, c.lr);
    const std::string name = "KNN softmax, K = " + std::to_string(k) + (c.knn_inner_product ? ", inner product" : ", cosine") +
                             (c.knn_exact ? ", exact graph" : ", IVF graph");
    report(state, name.c_str(), out, build, sampled_recall(head, 0), sampled_recall(head, 5));
  }
}

/// Sampled softmax and HS also run at lr / state.range(0): the cheap methods get a second chance at
/// a smaller learning rate (the shared one is tuned for the full softmax).
void bm_sampled(benchmark::State& state) {
  const study_config& c = data().cfg;
  const float lr = c.lr / static_cast<float>(state.range(0));
  for (auto _ : state) {
    xsoftmax::sampling_options so;
    so.num_sampled = c.sampled;
    so.unique = true;
    so.seed = 11;
    std::vector<double> counts = data().train_counts;
    for (auto& x : counts) x += 1;  // every class can be drawn
    xsoftmax::selective_softmax<xsoftmax::sampled_negatives, xsoftmax::fp32, xsoftmax::omp> head(
        xsoftmax::sampled_negatives::from_counts(counts, so, 0.75), c.n, c.dim, false, init());
    const std::string name = "sampled softmax, m = " + std::to_string(c.sampled) + ", lr / " +
                             std::to_string(state.range(0));
    report(state, name.c_str(), train(head, lr));
  }
}

void bm_hs(benchmark::State& state) {
  const study_config& c = data().cfg;
  const float lr = c.lr / static_cast<float>(state.range(0));
  for (auto _ : state) {
    using tree = xsoftmax::uniform_tree<2, 317>;  // 317^2 >= 100K; other N: at most 317^2 classes
    xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, xsoftmax::omp> head(tree(c.n), c.dim, false, init());
    const std::string name = "hierarchical softmax, uniform 2-level tree, lr / " + std::to_string(state.range(0));
    report(state, name.c_str(), train(head, lr));
  }
}

void setup() {
  static bool done = false;
  if (done) return;
  done = true;
#if defined(_OPENMP)
  const int threads = static_cast<int>(env_or("XSOFTMAX_STUDY_THREADS", 0));
  if (threads > 0) omp_set_num_threads(threads);
#endif
  const study_config& c = data().cfg;  // generate the data outside every timed region
  std::fprintf(stderr,
               "study: N = %ld, dim = %ld, batch = %ld, steps = %ld, lr = %.3f, zipf = %.2f, test = %ld, "
               "rebuild every %ld, nprobe = %ld, sampled m = %ld, data seed %llu\n",
               long(c.n), long(c.dim), long(c.batch), long(c.steps), c.lr, c.zipf, long(c.test), long(c.rebuild),
               long(c.nprobe), long(c.sampled), c.seed);
  std::fprintf(stderr,
               "| method | top-1 %% | s / step (all) | s / step (without graph rebuilds) | weight rows touched / step "
               "| graph build s (initial + rebuilds) | graph recall (any class) | graph recall (classes seen >= 5 times) |\n");
}

const bool registered = [] {
  auto unit = [](benchmark::internal::Benchmark* b) {
    b->Iterations(1)->Unit(benchmark::kSecond)->Setup([](const benchmark::State&) { setup(); });
  };
  unit(benchmark::RegisterBenchmark("knn_accuracy/full", bm_full));
  unit(benchmark::RegisterBenchmark("knn_accuracy/knn", bm_knn)->Arg(50)->Arg(200)->Arg(1000));
  unit(benchmark::RegisterBenchmark("knn_accuracy/sampled", bm_sampled)->Arg(1)->Arg(4));
  unit(benchmark::RegisterBenchmark("knn_accuracy/hs", bm_hs)->Arg(1)->Arg(4));
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
