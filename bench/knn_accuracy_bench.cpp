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
//   of the training labels, log-Q correction); hierarchical softmax (uniform two-level tree; and,
//   for the HS accuracy study, hs_tree: binary Huffman and k-means label trees).
//   Controls: KNN with K = 1 (a class is its own nearest neighbour: the batch's targets are the only
//   negatives) and uniformly drawn negatives as many as KNN-50's active set (same size, no graph).
// Each method is one Google Benchmark (one iteration: training + evaluation) whose counters are
// the results: top-1 on a held-out test set drawn from the same distribution (prediction scores
// every class), seconds per training step (graph rebuilds included), weight rows touched per
// step (rows of the sparse gradient), and for KNN the graph's build time and its recall against
// the exact graph on a sample of classes.
//
// Configuration through the environment (defaults in brackets; the study in bench/RESULTS.md uses
// the defaults): XSOFTMAX_STUDY_N [100000], _DIM [64], _BATCH [256], _STEPS [150], _LR [2048, for
// the mean-reduced loss], _ZIPF [1.0], _TEST [5000], _REBUILD [50], _NPROBE [8], _SAMPLED [2048],
// _WARMUP [30: full-softmax steps before the k-means tree of hs_tree/3], _THREADS [0: OpenMP
// default], _SEED [2024: the data], _EPOCHS [1], _KNN_IP [0: cosine graph; 1: inner product], _KNN_EXACT [0: IVF-built graph; 1: exact tiled graph], _KNN_CLASS_PROBES [0: each IVF
// list's members probe the lists nearest to their list; 1: each class the lists nearest to itself],
// _LISTS [0: the method's default], _KNN_REFRESH [-1: every rebuild from scratch; r >= 0: rebuilds
// warm-start k-means from the last centroids with r rounds], _KNN_REFRESHES [0: graph updates that
// refresh the last graph between full builds], _KNN_REFRESH_PASSES [1: passes a refresh],
// _KNN_MOVED [0: fraction of classes a refresh searches exactly, those that turned most],
// _KNN_REFINE [0: refine passes after each IVF build], _DUMP_WEIGHTS [unset; a prefix: the
// class weights after every _REBUILD-th step, for knn_graph_builds file:<path>]. Sampled softmax
// and HS also run at lr / 4.
// The normalised classifier (issue 13; features and class weights L2-normalised, logits
// s cos theta, as the 100M-class system trains it): _LOGITS [linear | cosine | cosface | arcface],
// _SCALE [30: s], _MARGIN [0.35 for cosface, 0.5 for arcface]; the default lr is then the one tuned
// for it. Prediction then ranks by cosine; HS (which defines no margin) is skipped. The data and the
// config live in knn_study_data.hpp. Run (see bench/RESULTS.md for why OPENBLAS_CORETYPE):
//   OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive build/bench/knn_accuracy_bench [--benchmark_filter=...]
// The stderr lines form the results table.

#include "knn_study_data.hpp"

#include <xsoftmax/xsoftmax.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using namespace knn_study;
using xsoftmax::index_t;
using clock_type = std::chrono::steady_clock;

/// What one training run measured.
struct outcome {
  double top1 = 0, seconds_per_step = 0, rows_per_step = 0, train_seconds = 0;
  double hook_seconds = 0;  ///< time spent in next_step (KNN: graph rebuilds), part of train_seconds
};

/// Top-1 over the test set through `head.topk` (every class scored).
template <class Head>
double top1_of(const Head& head) {
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

/// The weight rows of `head`, each divided by its norm (the caller's `unit` buffer, N x dim).
template <class Head>
xsoftmax::matrix_view<float> unit_rows(const Head& head, std::vector<float>& unit) {
  const index_t n = data().cfg.n, d = data().cfg.dim;
  unit.resize(static_cast<size_t>(n * d));
  const auto w = head.weights();
  for (index_t i = 0; i < n; ++i) {
    double s = 0;
    for (index_t p = 0; p < d; ++p) s += double(w(i, p)) * w(i, p);
    const double scale = 1 / std::max(std::sqrt(s), 1e-12);
    for (index_t p = 0; p < d; ++p) unit[i * d + p] = static_cast<float>(w(i, p) * scale);
  }
  return {unit.data(), n, d};
}

/// Top-1 of a trained head. Linear logits: the head's own `topk`. Normalised logits: the cosine
/// ranking the margin losses train for (the verbs' prediction is margin-free and would rank by
/// <h, w_j>, favouring large-norm rows): a full softmax over the unit-normalised weights; the
/// feature's norm scales every logit of a row alike, so it does not change the ranking.
template <class Head>
double top1(const Head& head) {
  if (!data().cfg.normalised()) return top1_of(head);
  std::vector<float> unit;
  return top1_of(xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::omp>(unit_rows(head, unit)));
}

template <class Head, class = void>
struct has_next_step : std::false_type {};
template <class Head>
struct has_next_step<Head, std::void_t<decltype(std::declval<Head&>().next_step())>> : std::true_type {};

/// XSOFTMAX_STUDY_DUMP_WEIGHTS=<prefix>: after every `rebuild`-th step, the class weights as
/// <prefix>.step<S>.f32 (N x dim fp32), the weights a graph rebuild sees there, for
/// `knn_graph_builds file:<path>` (recall and time of every builder on trained weights).
template <class Head>
void dump_weights(const Head& head, index_t step) {
  static const char* prefix = std::getenv("XSOFTMAX_STUDY_DUMP_WEIGHTS");
  const study_config& c = data().cfg;
  if (!prefix || !*prefix || step % c.rebuild != 0) return;
  const std::string path = std::string(prefix) + ".step" + std::to_string(step) + ".f32";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "knn_accuracy_bench: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  const auto w = head.weights();
  std::vector<float> row(static_cast<size_t>(c.dim));
  for (index_t i = 0; i < c.n; ++i) {
    for (index_t p = 0; p < c.dim; ++p) row[static_cast<size_t>(p)] = w(i, p);
    std::fwrite(row.data(), sizeof(float), row.size(), f);
  }
  std::fclose(f);
  std::fprintf(stderr, "#   weights of step %ld written to %s\n", long(step), path.c_str());
}

/// One pass over the training stream: forward_backward, apply_sgd, and (selective heads) next_step.
template <class Head>
outcome train(Head& head, float lr) {
  const dataset& ds = data();
  const study_config& c = ds.cfg;
  std::vector<float> gh(static_cast<size_t>(c.batch * c.dim));
  typename Head::gradient_type g;
  const xsoftmax::loss_options opt = c.loss();
  outcome o;
  double rows = 0;
  const index_t total = c.epochs * c.steps;  // the stream is replayed in the same order each epoch
  const auto t0 = clock_type::now();
  for (index_t s = 0; s < total; ++s) {
    const index_t b = s % c.steps;
    const xsoftmax::matrix_view<const float> h(ds.train_x.data() + b * c.batch * c.dim, c.batch, c.dim);
    const xsoftmax::vector_view<const index_t> y(ds.train_y.data() + b * c.batch, c.batch);
    head.forward_backward(h, y, xsoftmax::matrix_view<float>(gh.data(), c.batch, c.dim), g, opt);
    head.apply_sgd(g, lr);
    // Selective heads: the next draw / the graph schedule (not after the last step: nothing uses it).
    if constexpr (has_next_step<Head>::value) {
      if (s + 1 < total) {
        const auto h0 = clock_type::now();
        head.next_step();
        o.hook_seconds += std::chrono::duration<double>(clock_type::now() - h0).count();
      }
    }
    dump_weights(head, s + 1);
    rows += static_cast<double>(g.num_rows());
    if ((s + 1) % 50 == 0)
      std::fprintf(stderr, "#   step %ld / %ld, %.0f s\n", long(s + 1), long(total),
                   std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  o.train_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  o.seconds_per_step = o.train_seconds / total;
  o.rows_per_step = rows / total;
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
               o.seconds_per_step, (o.train_seconds - o.hook_seconds) / (c.epochs * c.steps), o.rows_per_step,
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
  std::vector<float> unit;
  if (g.metric() == xsoftmax::similarity::cosine) {
    unit_rows(head, unit);
  } else {
    const auto w = head.weights();
    unit.assign(w.data, w.data + c.n * d);
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
    o.graph.method = c.knn_exact            ? xsoftmax::knn_build_method::exact
                     : c.knn_class_probes ? xsoftmax::knn_build_method::ivf_class_probes
                                          : xsoftmax::knn_build_method::ivf;
    o.graph.nprobe = c.nprobe;
    o.graph.ivf.num_lists = c.lists;
    o.graph.refresh_iterations = c.refresh;
    o.graph.refine.build_passes = c.refine_build;
    o.graph.refine.refresh_passes = c.refine_refresh;
    o.graph.refine.moved = c.moved;
    o.refreshes_between_rebuilds = c.refreshes;
    o.rebuild_every = c.rebuild;
    const auto t0 = clock_type::now();
    xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::omp> head(c.n, c.dim, o, false, init());
    const double build = std::chrono::duration<double>(clock_type::now() - t0).count();
    const outcome out = train(head, c.lr);
    const std::string name = "KNN softmax, K = " + std::to_string(k) + (c.knn_inner_product ? ", inner product" : ", cosine") +
                             (c.knn_exact ? ", exact graph" : c.knn_class_probes ? ", IVF graph (class probes)" : ", IVF graph") +
                             (c.refresh >= 0 ? ", k-means warm-started" : "") +
                             (c.refine_build > 0 ? ", + " + std::to_string(c.refine_build) + " refine passes" : "") +
                             (c.refreshes > 0 ? ", " + std::to_string(c.refreshes) + " refreshes of " +
                                                    std::to_string(c.refine_refresh) + " passes" +
                                                    (c.moved > 0 ? " + " + std::to_string(100 * c.moved).substr(0, 4) +
                                                                       " % moved searched"
                                                                 : "") +
                                                    " between rebuilds"
                                              : "");
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

/// A control for KNN: negatives drawn uniformly, state.range(0) unique ones per step (about the size
/// of a KNN active set), so that an active set of the same size but without the neighbourhoods can
/// be compared with KNN's (uniform proposal: the log-Q correction is one constant, which cancels).
void bm_uniform(benchmark::State& state) {
  const study_config& c = data().cfg;
  for (auto _ : state) {
    xsoftmax::sampling_options so;
    so.num_sampled = state.range(0);
    so.unique = true;
    so.seed = 11;
    xsoftmax::selective_softmax<xsoftmax::sampled_negatives, xsoftmax::fp32, xsoftmax::omp> head(
        xsoftmax::sampled_negatives::from_counts(std::vector<double>(static_cast<size_t>(c.n), 1.0), so, 1.0), c.n,
        c.dim, false, init());
    const std::string name = "uniform negatives, m = " + std::to_string(state.range(0));
    report(state, name.c_str(), train(head, c.lr));
  }
}

void bm_hs(benchmark::State& state) {
  const study_config& c = data().cfg;
  if (c.normalised()) {  // its loss is a product of node softmaxes: no s cos theta over all classes
    state.SkipWithError("hierarchical softmax defines no margin / normalised logits");
    for (auto _ : state) {
    }
    return;
  }
  const float lr = c.lr / static_cast<float>(state.range(0));
  // Two levels of the smallest listed branching whose square holds N (317^2 >= 1e5, 1000^2 = 1e6).
  auto run = [&](auto branching) {
    using tree = xsoftmax::uniform_tree<2, decltype(branching)::value>;
    xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, xsoftmax::omp> head(tree(c.n), c.dim, false, init());
    const std::string name = "hierarchical softmax, uniform 2-level tree (b = " +
                             std::to_string(decltype(branching)::value) + "), lr / " + std::to_string(state.range(0));
    report(state, name.c_str(), train(head, lr));
  };
  for (auto _ : state) {
    if (c.n <= 317 * 317)
      run(std::integral_constant<int, 317>{});
    else
      run(std::integral_constant<int, 1000>{});  // beyond 1e6 classes the tree's constructor says so
  }
}

/// The HS accuracy study (issue 29): which label tree. Arg 0: 1 = binary Huffman over the training
/// counts (+1); 2 = balanced k-means (depth 2, the uniform tree's branching) over each class's
/// mean training feature (zero for classes never seen), node weights from those means; 3 = the same
/// k-means over the weights of a full softmax trained for XSOFTMAX_STUDY_WARMUP steps [30] of the
/// stream (its time reported apart), node weights from them. Arg 1: the lr divisor.
void bm_hs_tree(benchmark::State& state) {
  const study_config& c = data().cfg;
  if (c.normalised()) {
    state.SkipWithError("hierarchical softmax defines no margin / normalised logits");
    for (auto _ : state) {
    }
    return;
  }
  const index_t kind = state.range(0);
  const float lr = c.lr / static_cast<float>(state.range(1));
  const index_t branching = c.n <= 317 * 317 ? 317 : 1000;  // bm_hs's uniform tree's
  for (auto _ : state) {
    using tree_type = xsoftmax::runtime_tree<>;
    std::string name;
    if (kind == 1) {
      std::vector<double> counts = data().train_counts;
      for (auto& x : counts) x += 1;
      xsoftmax::hierarchical_softmax<tree_type, xsoftmax::fp32, xsoftmax::omp> head(tree_type::huffman(counts, 2),
                                                                                    c.dim, false, init());
      name = "hierarchical softmax, binary Huffman tree";
      report(state, (name + ", lr / " + std::to_string(state.range(1))).c_str(), train(head, lr));
      continue;
    }
    // Class vectors: mean training features, or a warmed-up full softmax's weights.
    std::vector<float> vectors(static_cast<size_t>(c.n * c.dim), 0.f);
    double warmup_s = 0;
    if (kind == 2) {
      const dataset& ds = data();
      for (size_t i = 0; i < ds.train_y.size(); ++i)
        for (index_t p = 0; p < c.dim; ++p) vectors[size_t(ds.train_y[i] * c.dim + p)] += ds.train_x[i * c.dim + p];
      for (index_t k = 0; k < c.n; ++k)
        for (index_t p = 0; p < c.dim; ++p)
          vectors[size_t(k * c.dim + p)] /= static_cast<float>(std::max(1.0, ds.train_counts[k]));
      name = "hierarchical softmax, k-means tree (b = " + std::to_string(branching) + ", depth 2) from mean features";
    } else {
      const index_t warmup = static_cast<index_t>(env_or("XSOFTMAX_STUDY_WARMUP", 30));
      const auto t0 = clock_type::now();
      xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::omp> full(c.n, c.dim, false, init());
      std::vector<float> gh(static_cast<size_t>(c.batch * c.dim));
      typename decltype(full)::gradient_type g;
      for (index_t s = 0; s < warmup; ++s) {
        const xsoftmax::matrix_view<const float> h(data().train_x.data() + s * c.batch * c.dim, c.batch, c.dim);
        const xsoftmax::vector_view<const index_t> y(data().train_y.data() + s * c.batch, c.batch);
        full.forward_backward(h, y, xsoftmax::matrix_view<float>(gh.data(), c.batch, c.dim), g, c.loss());
        full.apply_sgd(g, c.lr);
      }
      const auto w = full.weights();
      for (index_t k = 0; k < c.n; ++k)
        for (index_t p = 0; p < c.dim; ++p) vectors[size_t(k * c.dim + p)] = w(k, p);
      warmup_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      name = "hierarchical softmax, k-means tree (b = " + std::to_string(branching) + ", depth 2) from " +
             std::to_string(warmup) +
             " full-softmax steps";
    }
    const xsoftmax::matrix_view<const float> cv(vectors.data(), c.n, c.dim);
    xsoftmax::kmeans_tree_options to;
    to.branching = branching;
    to.max_depth = 2;
    const auto t1 = clock_type::now();
    const tree_type tree = xsoftmax::kmeans_label_tree<xsoftmax::omp>(cv, to);
    std::vector<float> rows(static_cast<size_t>(tree.num_rows() * c.dim));
    xsoftmax::init_tree_weights_from_class_vectors<xsoftmax::omp>(
        tree, cv, xsoftmax::matrix_view<float>(rows.data(), tree.num_rows(), c.dim));
    const double tree_s = std::chrono::duration<double>(clock_type::now() - t1).count();
    xsoftmax::hierarchical_softmax<tree_type, xsoftmax::fp32, xsoftmax::omp> head(
        tree, xsoftmax::matrix_view<float>(rows.data(), tree.num_rows(), c.dim));
    name += " (tree " + std::to_string(tree_s).substr(0, 5) + " s" +
            (warmup_s > 0 ? ", warm-up " + std::to_string(warmup_s).substr(0, 5) + " s" : std::string()) + ")";
    report(state, (name + ", lr / " + std::to_string(state.range(1))).c_str(), train(head, lr));
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
               "study: N = %ld, dim = %ld, batch = %ld, steps = %ld x %ld epochs, lr = %.3f, zipf = %.2f, test = %ld, "
               "rebuild every %ld, nprobe = %ld, sampled m = %ld, data seed %llu, logits %s, s = %.1f, m = %.2f\n",
               long(c.n), long(c.dim), long(c.batch), long(c.steps), long(c.epochs), c.lr, c.zipf, long(c.test), long(c.rebuild),
               long(c.nprobe), long(c.sampled), c.seed, c.logits_name(), c.scale,
               c.logits == logits_kind::cosine ? 0.0 : c.margin);
  std::fprintf(stderr,
               "| method | top-1 %% | s / step (all) | s / step (without graph rebuilds) | weight rows touched / step "
               "| graph build s (initial + rebuilds) | graph recall (any class) | graph recall (classes seen >= 5 times) |\n");
}

const bool registered = [] {
  auto unit = [](benchmark::internal::Benchmark* b) {
    b->Iterations(1)->Unit(benchmark::kSecond)->Setup([](const benchmark::State&) { setup(); });
  };
  unit(benchmark::RegisterBenchmark("knn_accuracy/full", bm_full));
  unit(benchmark::RegisterBenchmark("knn_accuracy/knn", bm_knn)->Arg(1)->Arg(50)->Arg(200)->Arg(1000));
  unit(benchmark::RegisterBenchmark("knn_accuracy/sampled", bm_sampled)->Arg(1)->Arg(4));
  unit(benchmark::RegisterBenchmark("knn_accuracy/uniform", bm_uniform)->Arg(8900));
  unit(benchmark::RegisterBenchmark("knn_accuracy/hs", bm_hs)->Arg(1)->Arg(4));
  unit(benchmark::RegisterBenchmark("knn_accuracy/hs_tree", bm_hs_tree)->ArgsProduct({{1, 2, 3}, {1, 4}}));
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
