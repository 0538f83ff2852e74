// SPDX-License-Identifier: Apache-2.0
// Issue 30: our binary-Huffman hierarchical softmax against fastText's OWN C++ (v0.9.2, from the
// `fasttext-wheel` sdist: bench/fasttext/fetch_fasttext.sh), on the word2vec / fastText output
// layer: N = 50,000 classes (and 100,000), d = 100, a binary Huffman tree over Zipf counts
// count_i = floor(1e7 / (i + 1)), sigmoid nodes, a batch of 1024 samples (Zipf targets), lr 0.05.
//
// Both sides run on exactly the same tree: fastText builds its Huffman tree from the counts
// (HierarchicalSoftmaxLoss::buildTree); a subclass reads its protected `tree_`, `paths_`, `codes_`
// and we build our runtime_tree from it with `runtime_tree::from_parents` (nodes renumbered so that
// fastText's `right` child, the one whose probability is sigmoid(w . h), is our child 0, which
// sigmoid_nodes scores with sigmoid(w . h)). Our weight row of each internal node is a copy of
// fastText's row of the same node (fastText's row = node id - osz_); the hidden rows and targets are
// the same.
//
// Start-up checks per class count (the program exits with status 1 and every benchmark of that
// class count is skipped with an error when one fails):
//   * every class has the same depth on both sides, and every path visits the same nodes with the
//     same branch (fastText's code bit 1 = our child 0);
//   * per-sample losses, same weights and hidden rows: ours (`forward`, reduction none) against the
//     exact loss of fastText's paths/codes over fastText's own `wo->dotRow`, relative error <= 1e-4;
//     and against fastText's own `forward(backprop = false)`, which uses 512-entry sigmoid and log
//     tables (so only within a table-sized tolerance, 5e-2 relative; the deviation is printed);
//   * the hidden gradient of sample 0: fastText's `state.grad` after `forward(backprop = true)` (=
//     lr * sum (label - sigmoid_table) w) against -lr * our grad_hidden row 0 (reduction sum),
//     within 5e-2 relative (table sigmoid again);
//   * top-1 and top-5: fastText's `predict` (exact sigmoid, log(p + 1e-5), threshold 0, its
//     default) against our `topk`: every class fastText returns must be within 1e-4 (log-prob,
//     ours) of our k-th best, i.e. the lists agree up to near-ties; exact agreement is counted.
//
// Benchmarks (counter `samples_per_second`, wall time; the CPU column is the whole process's CPU
// time, all threads; all over the same 1024 hidden rows and targets):
//   train/fasttext                 fastText's per-example step of its output layer as
//                                  Model::update runs it: grad.zero(), loss->forward(targets, i,
//                                  state, lr, backprop = true) (updates wo in place, accumulates
//                                  state.grad). Hogwild: T threads, each with its own Model::State,
//                                  each a contiguous share of the 1024 samples (fastText splits its
//                                  input file the same way), on the shared matrix. The threads are a
//                                  persistent pool created before the timed loop (fastText starts
//                                  its threads once per training run); each iteration releases them
//                                  and waits for all (sync/pool measures that round trip alone).
//                                  The hidden row is copied into state.hidden per sample (fastText's
//                                  computeHidden writes it there).
//   train/xsoftmax/serial          hierarchical_softmax<runtime_tree<>, fp32, serial, sigmoid_nodes>:
//                                  forward_backward over the batch (reduction sum, i.e. each sample
//                                  contributes lr * its gradient, as in fastText) + apply_sgd(lr)
//   train/xsoftmax/omp             the same head on the omp backend, omp_set_num_threads(T)
//   topk/fasttext                  fastText's predict(k, threshold 0, heap, state) per sample,
//                                  T threads (pool as above)
//   topk/xsoftmax/serial, /omp     head.topk (exact best-first search, batched)
//   sync/pool                      one release + wait of the T-thread pool with no work
// Arguments: classes (50000, 100000), k, threads. The weights start from the same random values
// (0.1 * N(0, 0.3)) on both sides in every benchmark; hidden rows N(0, 0.3).
//
// Profile: `fasttext_peer_bench --profile WHO [classes] [steps]` runs one 1-thread benchmark's batch
// alone (WHO: ours, fasttext, ours_topk1/5, fasttext_topk1/5; see `profile` below) for callgrind:
// --toggle-collect='*measured<*'.
//
// Build: cmake -DXSOFTMAX_FASTTEXT_SRC="$(bench/fasttext/fetch_fasttext.sh)"; see bench/README.md.
// Run:   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive OPENBLAS_CORETYPE=Haswell
//          ./build/bench/fasttext_peer_bench --benchmark_filter='classes:50000/'

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <benchmark/benchmark.h>

// fastText's own headers (XSOFTMAX_FASTTEXT_SRC); its .cc files are compiled with its Makefile's flags.
#include "densematrix.h"
#include "loss.h"
#include "model.h"
#include "vector.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t dim = 100;
constexpr index_t batch = 1024;
constexpr float lr = 0.05f;

using serial_head = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial, xs::sigmoid_nodes>;
using omp_head = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::omp, xs::sigmoid_nodes>;

bool g_check_failed = false;

/// fastText's HierarchicalSoftmaxLoss, with its protected tree and paths readable.
class ft_hs : public fasttext::HierarchicalSoftmaxLoss {
 public:
  ft_hs(std::shared_ptr<fasttext::Matrix>& wo, const std::vector<int64_t>& counts)
      : fasttext::HierarchicalSoftmaxLoss(wo, counts) {}
  int32_t osz() const { return osz_; }
  int32_t parent(int32_t node) const { return tree_[node].parent; }
  int32_t left(int32_t node) const { return tree_[node].left; }
  int32_t right(int32_t node) const { return tree_[node].right; }
  int32_t num_nodes() const { return static_cast<int32_t>(tree_.size()); }
  /// Rows of wo (node id - osz) from the class's leaf up to the root, and the label of each.
  const std::vector<int32_t>& path(int32_t c) const { return paths_[c]; }
  const std::vector<bool>& code(int32_t c) const { return codes_[c]; }
};

/// T workers (the calling thread is worker 0) kept between iterations; run(job) calls job(t) on
/// every worker and returns when all are done. Waiting blocks (condition variables): no spinning
/// on a shared 2-core machine.
class worker_pool {
 public:
  explicit worker_pool(int threads) : threads_(threads) {
    for (int t = 1; t < threads; ++t) helpers_.emplace_back([this, t] { loop(t); });
  }
  ~worker_pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
      ++generation_;
    }
    start_.notify_all();
    for (auto& th : helpers_) th.join();
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  void run(const std::function<void(int)>& job) {
    if (threads_ == 1) {
      job(0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      job_ = &job;
      pending_ = threads_ - 1;
      ++generation_;
    }
    start_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void loop(int t) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(m_);
        start_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        job = job_;
      }
      (*job)(t);
      {
        std::lock_guard<std::mutex> lock(m_);
        if (--pending_ == 0) done_.notify_one();
      }
    }
  }
  int threads_;
  std::vector<std::thread> helpers_;
  std::mutex m_;
  std::condition_variable start_, done_;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;
};

/// Samples [lo, hi) of worker t of T: contiguous shares.
std::pair<index_t, index_t> share(int t, int threads) {
  return {batch * t / threads, batch * (t + 1) / threads};
}

double log_sigmoid(double x) { return x > 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

struct problem {
  index_t n = 0;
  std::vector<int64_t> counts;
  std::shared_ptr<fasttext::Matrix> wo;  // fastText's output matrix (n x dim; rows 0..n-2 used)
  std::unique_ptr<ft_hs> ft;             // holds a reference to `wo` (this object never moves)
  xs::runtime_tree<> tree;
  std::vector<int32_t> ft_row_of;  // our sigmoid row (internal node) -> fastText's row of that node
  std::vector<float> w0_ft;        // n x dim, the initial weights in fastText's row order
  std::vector<float> w0_ours;      // (tree.num_rows() / 2) x dim, the same rows in our order
  std::vector<float> hidden;       // batch x dim
  std::vector<index_t> targets;    // Zipf
  std::vector<int32_t> targets32;  // the same, as fastText's forward takes them
  double nodes_per_path = 0;
  std::string error;  // non-empty when a start-up check failed

  explicit problem(index_t classes) : n(classes) {
    counts.resize(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) counts[i] = static_cast<int64_t>(1e7 / static_cast<double>(i + 1));
    wo = std::make_shared<fasttext::DenseMatrix>(n, dim);
    ft = std::make_unique<ft_hs>(wo, counts);
    build_tree();
    map_rows();
    if (!error.empty()) return;
    make_data();
    check();
  }

  fasttext::DenseMatrix& wo_dense() { return static_cast<fasttext::DenseMatrix&>(*wo); }
  void reset_ft_weights() { std::copy(w0_ft.begin(), w0_ft.end(), wo_dense().data()); }
  index_t our_rows() const { return tree.num_rows() / 2; }

  void fail(const std::string& what) {
    if (error.empty()) error = "classes=" + std::to_string(n) + ": " + what;
  }

  // fastText's nodes renumbered breadth-first from its root, each node's right child first: our
  // children are ordered by node index, so fastText's right child becomes our child 0.
  void build_tree() {
    const int32_t m = ft->num_nodes(), osz = ft->osz(), root = m - 1;
    std::vector<index_t> id(static_cast<std::size_t>(m), -1);
    std::vector<int32_t> order{root};
    id[root] = 0;
    index_t next = 1;
    for (std::size_t q = 0; q < order.size(); ++q) {
      const int32_t v = order[q];
      if (ft->left(v) == -1 && ft->right(v) == -1) continue;
      for (const int32_t c : {ft->right(v), ft->left(v)}) {
        id[c] = next++;
        order.push_back(c);
      }
    }
    std::vector<index_t> parent(static_cast<std::size_t>(m)), leaf_class(static_cast<std::size_t>(m), -1);
    for (int32_t v = 0; v < m; ++v) {
      parent[id[v]] = ft->parent(v) == -1 ? -1 : id[ft->parent(v)];
      if (v < osz) leaf_class[id[v]] = v;  // fastText's nodes 0..osz-1 are the leaves, node c = class c
    }
    tree = xs::runtime_tree<>::from_parents(std::move(parent), std::move(leaf_class), n);
  }

  // Walks every class's path on both sides: same depth, same nodes, same branches.
  void map_rows() {
    ft_row_of.assign(static_cast<std::size_t>(our_rows()), -1);
    const auto tv = tree.view();
    double total = 0;
    for (index_t c = 0; c < n; ++c) {
      const auto& path = ft->path(static_cast<int32_t>(c));
      const auto& code = ft->code(static_cast<int32_t>(c));
      const int depth = tv.depth(c);
      if (depth != static_cast<int>(path.size())) {
        fail("class " + std::to_string(c) + " has depth " + std::to_string(depth) + " in ours, " +
             std::to_string(path.size()) + " in fastText's tree");
        return;
      }
      total += depth;
      for (int l = 0; l < depth; ++l) {
        const xs::path_step s = tv.step(c, l);
        const int32_t f = path[static_cast<std::size_t>(depth - 1 - l)];  // fastText's path runs leaf -> root
        const bool positive = code[static_cast<std::size_t>(depth - 1 - l)];
        const index_t r = s.block_begin / 2;
        if (s.block_size != 2 || s.block_begin % 2 != 0) {
          fail("our tree is not binary at row " + std::to_string(s.block_begin));
          return;
        }
        if (ft_row_of[r] == -1) ft_row_of[r] = f;
        if (ft_row_of[r] != f || positive != (s.child == 0)) {
          fail("class " + std::to_string(c) + " level " + std::to_string(l) + ": our node " + std::to_string(r) +
               " is fastText's row " + std::to_string(ft_row_of[r]) + " on another path, here row " +
               std::to_string(f) + " (branch ours " + std::to_string(s.child) + ", fastText code " +
               std::to_string(positive) + ")");
          return;
        }
      }
    }
    for (index_t r = 0; r < our_rows(); ++r)
      if (ft_row_of[r] < 0) {
        fail("our node " + std::to_string(r) + " is on no path");
        return;
      }
    nodes_per_path = total / static_cast<double>(n);
  }

  void make_data() {
    std::mt19937_64 g(7);
    std::normal_distribution<float> nd(0.f, 0.3f);
    hidden.resize(static_cast<std::size_t>(batch * dim));
    for (auto& x : hidden) x = nd(g);
    std::discrete_distribution<index_t> zipf(counts.begin(), counts.end());
    targets.resize(static_cast<std::size_t>(batch));
    for (auto& t : targets) t = zipf(g);
    targets32.assign(targets.begin(), targets.end());
    w0_ft.assign(static_cast<std::size_t>(n * dim), 0.f);
    for (index_t r = 0; r + 1 < n; ++r)
      for (index_t p = 0; p < dim; ++p) w0_ft[static_cast<std::size_t>(r * dim + p)] = 0.1f * nd(g);
    w0_ours.resize(static_cast<std::size_t>(our_rows() * dim));
    for (index_t r = 0; r < our_rows(); ++r)
      std::copy_n(w0_ft.data() + ft_row_of[r] * dim, dim, w0_ours.data() + r * dim);
    reset_ft_weights();
  }

  void check() {
    std::ostringstream log;
    log << "fasttext_peer_bench check, classes=" << n << ": tree " << tree.num_internal_nodes()
        << " internal nodes, height " << tree.height() << ", mean depth over classes " << nodes_per_path;
    std::vector<float> w(w0_ours);
    serial_head head(tree, xs::matrix_view<float>(w.data(), our_rows(), dim));
    const xs::matrix_view<const float> hv(hidden.data(), batch, dim);
    const xs::vector_view<const index_t> tv(targets.data(), batch);

    // Losses.
    std::vector<float> ours(static_cast<std::size_t>(batch));
    xs::loss_options none;
    none.reduce = xs::reduction::none;
    head.forward(hv, tv, none, xs::vector_view<float>(ours.data(), batch));
    fasttext::Model::State st(static_cast<int32_t>(dim), static_cast<int32_t>(n), 0);
    double max_exact = 0, max_table = 0, sum_table = 0, path_len = 0;
    for (index_t i = 0; i < batch; ++i) {
      std::memcpy(st.hidden.data(), hidden.data() + i * dim, dim * sizeof(float));
      const int32_t t = targets32[i];
      double exact = 0;
      const auto& path = ft->path(t);
      const auto& code = ft->code(t);
      for (std::size_t j = 0; j < path.size(); ++j) {
        const double dot = wo->dotRow(st.hidden, path[j]);
        exact -= log_sigmoid(code[j] ? dot : -dot);
      }
      path_len += static_cast<double>(path.size());
      st.grad.zero();
      const double table = ft->forward(targets32, static_cast<int32_t>(i), st, lr, /*backprop=*/false);
      const double o = ours[i];
      max_exact = std::max(max_exact, std::abs(o - exact) / std::abs(exact));
      const double rt = std::abs(o - table) / std::abs(o);
      max_table = std::max(max_table, rt);
      sum_table += rt;
    }
    log << "\n  per-sample loss (mean path " << path_len / batch << " nodes, mean loss "
        << [&] { double s = 0; for (float x : ours) s += x; return s / batch; }()
        << "): ours vs exact loss over fastText's paths/codes/dotRow: max rel err " << max_exact
        << " (tol 1e-4); ours vs fastText's forward (sigmoid/log tables): max rel dev " << max_table << ", mean "
        << sum_table / batch << " (tol 5e-2)";
    if (!(max_exact <= 1e-4)) fail("per-sample loss vs fastText's exact path loss: max rel err " + std::to_string(max_exact));
    if (!(max_table <= 5e-2)) fail("per-sample loss vs fastText's forward: max rel dev " + std::to_string(max_table));

    // Hidden gradient of sample 0.
    {
      std::vector<float> gh(static_cast<std::size_t>(batch * dim));
      serial_head::gradient_type grad;
      xs::loss_options sum;
      sum.reduce = xs::reduction::sum;
      head.forward_backward(hv, tv, xs::matrix_view<float>(gh.data(), batch, dim), grad, sum);
      std::memcpy(st.hidden.data(), hidden.data(), dim * sizeof(float));
      st.grad.zero();
      ft->forward(targets32, 0, st, lr, /*backprop=*/true);  // updates wo: restored below
      double num = 0, den = 0;
      for (index_t p = 0; p < dim; ++p) {
        const double a = st.grad[p], b = -static_cast<double>(lr) * gh[p];
        num += (a - b) * (a - b);
        den += b * b;
      }
      const double rel = std::sqrt(num / den);
      log << "\n  grad_hidden of sample 0: |fastText state.grad - (-lr * ours)| / |lr * ours| = " << rel << " (tol 5e-2)";
      if (!(rel <= 5e-2)) fail("hidden gradient of sample 0: rel dev " + std::to_string(rel));
      reset_ft_weights();
    }

    // Top-1 and top-5.
    for (const index_t k : {index_t(1), index_t(5)}) {
      std::vector<index_t> cls(static_cast<std::size_t>(batch * k));
      std::vector<float> lps(static_cast<std::size_t>(batch * k));
      head.topk(hv, k, xs::matrix_view<index_t>(cls.data(), batch, k), xs::matrix_view<float>(lps.data(), batch, k));
      std::vector<index_t> ftc(static_cast<std::size_t>(batch * k));
      std::vector<float> fts(static_cast<std::size_t>(batch * k));
      fasttext::Predictions heap;
      heap.reserve(static_cast<std::size_t>(k + 1));
      for (index_t i = 0; i < batch; ++i) {
        std::memcpy(st.hidden.data(), hidden.data() + i * dim, dim * sizeof(float));
        heap.clear();
        ft->predict(static_cast<int32_t>(k), 0.0f, heap, st);
        if (static_cast<index_t>(heap.size()) != k) {
          fail("fastText's predict returned " + std::to_string(heap.size()) + " classes for k=" + std::to_string(k));
          break;
        }
        for (index_t j = 0; j < k; ++j) {
          ftc[i * k + j] = heap[j].second;
          fts[i * k + j] = heap[j].first;
        }
      }
      index_t same_list = 0, same_set = 0, near_tie = 0;
      double max_score_dev = 0;
      std::vector<float> lp_of(static_cast<std::size_t>(batch));
      std::vector<index_t> col(static_cast<std::size_t>(batch));
      std::vector<float> ours_lp_of_ft(static_cast<std::size_t>(batch * k));
      for (index_t j = 0; j < k; ++j) {
        for (index_t i = 0; i < batch; ++i) col[i] = ftc[i * k + j];
        head.log_prob(hv, xs::vector_view<const index_t>(col.data(), batch), xs::vector_view<float>(lp_of.data(), batch));
        for (index_t i = 0; i < batch; ++i) ours_lp_of_ft[i * k + j] = lp_of[i];
      }
      for (index_t i = 0; i < batch; ++i) {
        bool list = true, set = true, ok = true;
        for (index_t j = 0; j < k; ++j) {
          list = list && ftc[i * k + j] == cls[i * k + j];
          set = set && std::find(cls.begin() + i * k, cls.begin() + (i + 1) * k, ftc[i * k + j]) != cls.begin() + (i + 1) * k;
          // fastText's class must be one of our k best up to a near-tie with our k-th best.
          ok = ok && ours_lp_of_ft[i * k + j] >= lps[i * k + k - 1] - 1e-4f;
          max_score_dev = std::max(max_score_dev, std::abs(double(fts[i * k + j]) - ours_lp_of_ft[i * k + j]));
        }
        same_list += list;
        same_set += set;
        if (!set && ok) ++near_tie;
        if (!ok) fail("top-" + std::to_string(k) + " of sample " + std::to_string(i) + ": fastText's class " +
                      std::to_string(ftc[i * k]) + "... is not among our best");
      }
      log << "\n  top-" << k << ": same ordered list " << same_list << "/" << batch << ", same set " << same_set << "/"
          << batch << ", differing sets that are near-ties (<= 1e-4 in log-prob) " << near_tie
          << "; max |fastText score (sum log(p + 1e-5)) - our log-prob| " << max_score_dev;
    }
    reset_ft_weights();
    std::fprintf(stderr, "%s\n  => %s\n", log.str().c_str(), error.empty() ? "OK" : ("FAILED: " + error).c_str());
    if (!error.empty()) g_check_failed = true;
  }
};

problem& data(index_t classes) {
  static std::map<index_t, std::unique_ptr<problem>> cache;
  auto& p = cache[classes];
  if (!p) p = std::make_unique<problem>(classes);
  return *p;
}

bool usable(benchmark::State& state, problem& p) {
  if (p.error.empty()) return true;
  g_check_failed = true;
  state.SkipWithError(p.error.c_str());
  return false;
}

void set_counters(benchmark::State& state, const problem& p, int threads) {
  state.counters["samples_per_second"] = benchmark::Counter(double(batch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["nodes_per_path"] = [&] {
    double s = 0;
    for (index_t t : p.targets) s += p.tree.view().depth(t);
    return s / batch;
  }();
  state.counters["threads"] = threads;
}

void set_omp_threads(int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

// --- training -------------------------------------------------------------------------------------

void train_fasttext(benchmark::State& state) {
  problem& p = data(state.range(0));
  if (!usable(state, p)) return;
  const int threads = static_cast<int>(state.range(1));
  p.reset_ft_weights();
  std::vector<std::unique_ptr<fasttext::Model::State>> states;
  for (int t = 0; t < threads; ++t)
    states.push_back(std::make_unique<fasttext::Model::State>(static_cast<int32_t>(dim), static_cast<int32_t>(p.n), t));
  struct alignas(64) padded_loss { double v = 0; };
  std::vector<padded_loss> loss(static_cast<std::size_t>(threads));
  const std::function<void(int)> job = [&](int t) {
    fasttext::Model::State& st = *states[t];
    const auto [lo, hi] = share(t, threads);
    double l = 0;
    for (index_t i = lo; i < hi; ++i) {
      std::memcpy(st.hidden.data(), p.hidden.data() + i * dim, dim * sizeof(float));  // computeHidden's output
      st.grad.zero();
      const fasttext::real li = p.ft->forward(p.targets32, static_cast<int32_t>(i), st, lr, /*backprop=*/true);
      st.incrementNExamples(li);
      l += li;
    }
    loss[t].v += l;
  };
  worker_pool pool(threads);
  for (auto _ : state) pool.run(job);
  benchmark::DoNotOptimize(loss.data());
  set_counters(state, p, threads);
  p.reset_ft_weights();
}

template <class Head>
void train_xsoftmax(benchmark::State& state) {
  problem& p = data(state.range(0));
  if (!usable(state, p)) return;
  const int threads = static_cast<int>(state.range(1));
  set_omp_threads(threads);
  std::vector<float> w(p.w0_ours);
  Head head(p.tree, xs::matrix_view<float>(w.data(), p.our_rows(), dim));
  std::vector<float> gh(static_cast<std::size_t>(batch * dim));
  typename Head::gradient_type grad;
  xs::loss_options sum;
  sum.reduce = xs::reduction::sum;  // each sample contributes lr * its gradient, as fastText's SGD
  const xs::matrix_view<const float> hv(p.hidden.data(), batch, dim);
  const xs::vector_view<const index_t> tv(p.targets.data(), batch);
  for (auto _ : state) {
    benchmark::DoNotOptimize(head.forward_backward(hv, tv, xs::matrix_view<float>(gh.data(), batch, dim), grad, sum));
    head.apply_sgd(grad, lr);
  }
  set_counters(state, p, threads);
}

// --- top-k ----------------------------------------------------------------------------------------

void topk_fasttext(benchmark::State& state) {
  problem& p = data(state.range(0));
  if (!usable(state, p)) return;
  const int32_t k = static_cast<int32_t>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  p.reset_ft_weights();
  std::vector<std::unique_ptr<fasttext::Model::State>> states;
  std::vector<fasttext::Predictions> heaps(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    states.push_back(std::make_unique<fasttext::Model::State>(static_cast<int32_t>(dim), static_cast<int32_t>(p.n), t));
    heaps[t].reserve(static_cast<std::size_t>(k + 1));  // Model::predict's reserve
  }
  std::vector<int32_t> top1(static_cast<std::size_t>(batch));
  const std::function<void(int)> job = [&](int t) {
    fasttext::Model::State& st = *states[t];
    fasttext::Predictions& heap = heaps[t];
    const auto [lo, hi] = share(t, threads);
    for (index_t i = lo; i < hi; ++i) {
      std::memcpy(st.hidden.data(), p.hidden.data() + i * dim, dim * sizeof(float));
      heap.clear();
      p.ft->predict(k, 0.0f, heap, st);  // threshold 0: fastText's default
      top1[i] = heap.front().second;
    }
  };
  worker_pool pool(threads);
  for (auto _ : state) {
    pool.run(job);
    benchmark::DoNotOptimize(top1.data());
  }
  set_counters(state, p, threads);
}

template <class Head>
void topk_xsoftmax(benchmark::State& state) {
  problem& p = data(state.range(0));
  if (!usable(state, p)) return;
  const index_t k = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  set_omp_threads(threads);
  std::vector<float> w(p.w0_ours);
  Head head(p.tree, xs::matrix_view<float>(w.data(), p.our_rows(), dim));
  std::vector<index_t> classes(static_cast<std::size_t>(batch * k));
  std::vector<float> lp(static_cast<std::size_t>(batch * k));
  for (auto _ : state) {
    head.topk(xs::matrix_view<const float>(p.hidden.data(), batch, dim), k,
              xs::matrix_view<index_t>(classes.data(), batch, k), xs::matrix_view<float>(lp.data(), batch, k));
    benchmark::DoNotOptimize(classes.data());
  }
  set_counters(state, p, threads);
}

void sync_pool(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  worker_pool pool(threads);
  std::atomic<int> calls{0};
  const std::function<void(int)> job = [&](int) { calls.fetch_add(1, std::memory_order_relaxed); };
  for (auto _ : state) pool.run(job);
  benchmark::DoNotOptimize(calls.load());
}

void train_args(benchmark::internal::Benchmark* b, std::initializer_list<int> threads) {
  b->ArgNames({"classes", "threads"});
  for (const int n : {50'000, 100'000})
    for (const int t : threads) b->Args({n, t});
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
}
void topk_args(benchmark::internal::Benchmark* b, std::initializer_list<int> threads) {
  b->ArgNames({"classes", "k", "threads"});
  for (const int n : {50'000, 100'000})
    for (const int k : {1, 5})
      for (const int t : threads) b->Args({n, k, t});
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
}

}  // namespace

BENCHMARK(train_fasttext)->Name("train/fasttext")->Apply([](auto* b) { train_args(b, {1, 2}); });
BENCHMARK(train_xsoftmax<serial_head>)->Name("train/xsoftmax/serial")->Apply([](auto* b) { train_args(b, {1}); });
BENCHMARK(train_xsoftmax<omp_head>)->Name("train/xsoftmax/omp")->Apply([](auto* b) { train_args(b, {1, 2}); });
BENCHMARK(topk_fasttext)->Name("topk/fasttext")->Apply([](auto* b) { topk_args(b, {1, 2}); });
BENCHMARK(topk_xsoftmax<serial_head>)->Name("topk/xsoftmax/serial")->Apply([](auto* b) { topk_args(b, {1}); });
BENCHMARK(topk_xsoftmax<omp_head>)->Name("topk/xsoftmax/omp")->Apply([](auto* b) { topk_args(b, {1, 2}); });
BENCHMARK(sync_pool)->Name("sync/pool")->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime()->MeasureProcessCPUTime();

namespace {
/// Runs f; a call callgrind can isolate with --toggle-collect='*measured<*'.
template <class F>
__attribute__((noinline)) void measured(F&& f) {
  f();
}

/// `--profile WHO [classes] [steps]`: `steps` batches of one 1-thread benchmark after one warm-up
/// batch, inside `measured`, without Google Benchmark: WHO = ours (serial head, forward_backward +
/// apply_sgd), fasttext (its per-example training loop), ours_topk1 / ours_topk5 (head.topk),
/// fasttext_topk1 / fasttext_topk5 (its predict per sample). For
///   valgrind --tool=callgrind --toggle-collect='*measured<*' fasttext_peer_bench --profile ours
int profile(const std::string& who, index_t classes, int steps) {
  problem& p = data(classes);
  if (!p.error.empty()) return 1;
  double loss = 0;
  if (who == "ours") {
    std::vector<float> w(p.w0_ours);
    serial_head head(p.tree, xs::matrix_view<float>(w.data(), p.our_rows(), dim));
    std::vector<float> gh(static_cast<std::size_t>(batch * dim));
    serial_head::gradient_type grad;
    xs::loss_options sum;
    sum.reduce = xs::reduction::sum;
    const xs::matrix_view<const float> hv(p.hidden.data(), batch, dim);
    const xs::vector_view<const index_t> tv(p.targets.data(), batch);
    const auto step = [&] {
      loss += head.forward_backward(hv, tv, xs::matrix_view<float>(gh.data(), batch, dim), grad, sum);
      head.apply_sgd(grad, lr);
    };
    step();
    measured([&] {
      for (int s = 0; s < steps; ++s) step();
    });
  } else if (who == "fasttext") {
    fasttext::Model::State st(static_cast<int32_t>(dim), static_cast<int32_t>(p.n), 0);
    const auto step = [&] {
      for (index_t i = 0; i < batch; ++i) {
        std::memcpy(st.hidden.data(), p.hidden.data() + i * dim, dim * sizeof(float));
        st.grad.zero();
        loss += p.ft->forward(p.targets32, static_cast<int32_t>(i), st, lr, /*backprop=*/true);
      }
    };
    step();
    measured([&] {
      for (int s = 0; s < steps; ++s) step();
    });
  } else if (who == "ours_topk1" || who == "ours_topk5") {
    const index_t k = who.back() - '0';
    std::vector<float> w(p.w0_ours);
    serial_head head(p.tree, xs::matrix_view<float>(w.data(), p.our_rows(), dim));
    std::vector<index_t> cls(static_cast<std::size_t>(batch * k));
    std::vector<float> lps(static_cast<std::size_t>(batch * k));
    const auto step = [&] {
      head.topk(xs::matrix_view<const float>(p.hidden.data(), batch, dim), k,
                xs::matrix_view<index_t>(cls.data(), batch, k), xs::matrix_view<float>(lps.data(), batch, k));
      loss += lps[0];
    };
    step();
    measured([&] {
      for (int s = 0; s < steps; ++s) step();
    });
  } else if (who == "fasttext_topk1" || who == "fasttext_topk5") {
    const int32_t k = who.back() - '0';
    fasttext::Model::State st(static_cast<int32_t>(dim), static_cast<int32_t>(p.n), 0);
    fasttext::Predictions heap;
    heap.reserve(static_cast<std::size_t>(k + 1));
    const auto step = [&] {
      for (index_t i = 0; i < batch; ++i) {
        std::memcpy(st.hidden.data(), p.hidden.data() + i * dim, dim * sizeof(float));
        heap.clear();
        p.ft->predict(k, 0.0f, heap, st);
        loss += heap.front().first;
      }
    };
    step();
    measured([&] {
      for (int s = 0; s < steps; ++s) step();
    });
  } else {
    std::fprintf(stderr, "fasttext_peer_bench --profile: expected ours, fasttext, ours_topk1, ours_topk5, "
                         "fasttext_topk1 or fasttext_topk5, got %s\n", who.c_str());
    return 1;
  }
  std::printf("profile %s classes=%lld steps=%d loss %g\n", who.c_str(), static_cast<long long>(classes), steps, loss);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--profile")
    return profile(argv[2], argc >= 4 ? std::atoll(argv[3]) : 50'000, argc >= 5 ? std::atoi(argv[4]) : 10);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("fasttext_src", XSOFTMAX_FASTTEXT_SRC_STRING);
  benchmark::AddCustomContext("fasttext_flags", XSOFTMAX_FASTTEXT_FLAGS_STRING);
  benchmark::AddCustomContext("xsoftmax_flags", XSOFTMAX_BENCH_FLAGS_STRING);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_check_failed) {
    std::fprintf(stderr, "fasttext_peer_bench: a start-up check FAILED (see above)\n");
    return 1;
  }
  return 0;
}
