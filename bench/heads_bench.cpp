// SPDX-License-Identifier: Apache-2.0
//
// heads_bench: one training step (forward + backward, i.e. `forward_backward`) of the exact
// full_softmax against hierarchical_softmax over several tree shapes, at N = 1e5 and 1e6 classes,
// d = 256, batch 1024, Zipf(1.0)-distributed targets, fp32 weights (and one bf16 variant), on the
// host `omp` backend.
//
// Tree shapes: uniform depth 1 (one node over all N classes: the full softmax's shape through the
// HS code path), depth 2 / 3 / 4 with branching ceil(N^(1/depth)), and a binary Huffman tree built
// from the Zipf class frequencies (runtime_tree), with softmax nodes and with word2vec-style sigmoid
// nodes.
//
// Counters, per step (averaged over the steps run; targets cycle through a few fixed batches):
//   items_per_second  samples per second (wall clock: the heads run on OpenMP threads)
//   rows              weight rows touched (rows of the sparse gradient)
//   MB                rows x d x sizeof(storage): bytes of weights the step must read at least once
//   GFLOP             useful multiply-adds x 2: 8BNd for the full softmax (score pass, recompute
//                     pass, two gradient GEMMs; 6BNd for full_softmax_rows256: row blocks of 256
//                     that keep every score, no recompute pass), 6 d x sum over samples and levels of the node's
//                     children for softmax nodes (score, dh, dW), 6 d x path length for sigmoid nodes
//   flop_floor_ms     GFLOP / the sgemm rate measured at start-up
//   mem_floor_ms      MB / the memory bandwidth measured at start-up (streaming read)
//   x_floor           measured time / max(flop_floor_ms, mem_floor_ms)
//   speedup           full_softmax's time at the same N / this benchmark's time
//   sgd_ms            one `apply_sgd` of the step's gradient (not in the timed region)
// The CPU column is the whole process's CPU time (all threads) per step.
//
// Run (see bench/RESULTS.md for the numbers and bench/README.md for the caveats, among them why
// OPENBLAS_CORETYPE matters on CPUs newer than the installed OpenBLAS):
//   OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive ./build/bench/heads_bench --benchmark_out=heads.json

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <benchmark/benchmark.h>

#if defined(XSOFTMAX_HAS_CBLAS)
#include <cblas.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

constexpr index_t dim = 256;
constexpr index_t batch = 1024;
constexpr double zipf_exponent = 1.0;
constexpr int num_target_batches = 4;  // steps cycle through these, so `rows` is an average

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ------------------------------------------------------------------------------------------------
// Machine calibration: the two rates the floors are computed from.
// ------------------------------------------------------------------------------------------------

struct machine_rates {
  double sgemm_gflops = 0;        ///< 1024^3 sgemm through CBLAS, best of several
  double sgemm_chunk_gflops = 0;  ///< the full softmax's score GEMM shape: 1024 x 8192 x 256 (NT)
  double read_gbps = 0;           ///< streaming read (sum) of 1 GiB on all threads
  double copy_gbps = 0;           ///< memcpy of 1 GiB on all threads, bytes read + bytes written
};
machine_rates rates;

double measure_sgemm(int m, int n, int k, bool transpose_b) {
#if defined(XSOFTMAX_HAS_CBLAS)
  std::vector<float> a(static_cast<std::size_t>(m) * k, 0.5f), b(static_cast<std::size_t>(k) * n, 0.25f),
      c(static_cast<std::size_t>(m) * n);
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = clock_type::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k, 1.f, a.data(), k,
                b.data(), transpose_b ? k : n, 0.f, c.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  benchmark::DoNotOptimize(c.data());
  return 2.0 * m * n * k / best / 1e9;
#else
  (void)m, (void)n, (void)k, (void)transpose_b;
  return 0;
#endif
}

void measure_memory(double& read_gbps, double& copy_gbps) {
  const std::size_t n = std::size_t(1) << 28;  // 2^28 floats = 1 GiB
  std::vector<float> src(n), dst(n);
  // First touch in parallel, so that pages are spread the way the benchmarks' threads use them.
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < static_cast<std::ptrdiff_t>(n); ++i) src[i] = 1.f, dst[i] = 0.f;
  double best_read = 1e30, best_copy = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    // Sum the buffer as 64-bit integers: integer adds may be reordered, so the loop vectorises and
    // is limited by memory, not by the latency of a chain of dependent float adds.
    auto t0 = clock_type::now();
    std::uint64_t total = 0;
    const auto* words = reinterpret_cast<const std::uint64_t*>(src.data());
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (std::ptrdiff_t i = 0; i < static_cast<std::ptrdiff_t>(n / 2); ++i) total += words[i];
    best_read = std::min(best_read, seconds_since(t0));
    benchmark::DoNotOptimize(total);
    t0 = clock_type::now();
#pragma omp parallel
    {
#if defined(_OPENMP)
      const std::size_t nt = static_cast<std::size_t>(omp_get_num_threads()), t = omp_get_thread_num();
#else
      const std::size_t nt = 1, t = 0;
#endif
      const std::size_t lo = n * t / nt, hi = n * (t + 1) / nt;
      std::memcpy(dst.data() + lo, src.data() + lo, (hi - lo) * sizeof(float));
    }
    best_copy = std::min(best_copy, seconds_since(t0));
    benchmark::DoNotOptimize(dst.data());
  }
  read_gbps = n * sizeof(float) / best_read / 1e9;
  copy_gbps = 2.0 * n * sizeof(float) / best_copy / 1e9;
}

// ------------------------------------------------------------------------------------------------
// The problem: Zipf targets and random hidden vectors (fixed; only timing matters here).
// ------------------------------------------------------------------------------------------------

struct problem {
  index_t n = 0;
  std::vector<double> pmf;                        // Zipf probabilities, class 0 most frequent
  std::vector<std::vector<index_t>> targets;      // num_target_batches x batch
  std::vector<float> hidden;                      // batch x dim
  mutable std::vector<float> grad_hidden;         // batch x dim, scratch output of every step
};

const problem& get_problem(index_t n) {
  static std::map<index_t, std::unique_ptr<problem>> cache;
  auto& slot = cache[n];
  if (slot) return *slot;
  slot = std::make_unique<problem>();
  problem& p = *slot;
  p.n = n;
  p.pmf.resize(static_cast<std::size_t>(n));
  std::vector<double> cdf(static_cast<std::size_t>(n));
  double total = 0;
  for (index_t c = 0; c < n; ++c) total += p.pmf[c] = 1.0 / std::pow(double(c + 1), zipf_exponent);
  double acc = 0;
  for (index_t c = 0; c < n; ++c) cdf[c] = (acc += p.pmf[c] /= total);
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> uni(0, 1);
  p.targets.assign(num_target_batches, std::vector<index_t>(static_cast<std::size_t>(batch)));
  for (auto& t : p.targets)
    for (auto& c : t) c = std::min<index_t>(std::lower_bound(cdf.begin(), cdf.end(), uni(rng)) - cdf.begin(), n - 1);
  std::normal_distribution<float> gauss(0.f, 1.f);
  p.hidden.resize(static_cast<std::size_t>(batch * dim));
  for (float& x : p.hidden) x = gauss(rng);
  p.grad_hidden.resize(p.hidden.size());
  return p;
}

const xs::runtime_tree<64>& huffman_tree(index_t n) {
  static std::map<index_t, xs::runtime_tree<64>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) it = cache.emplace(n, xs::runtime_tree<64>::huffman(get_problem(n).pmf, 2)).first;
  return it->second;
}

// ------------------------------------------------------------------------------------------------
// One head alive at a time (a 1e6-class head holds 1-2 GB of weights plus its gradient), reused
// across the repetitions and iteration-count probes of the same benchmark.
// ------------------------------------------------------------------------------------------------

template <class Head>
struct head_and_grad {
  Head head;
  typename Head::gradient_type grad;
};

struct {
  std::string key;
  std::shared_ptr<void> object;
} current_head;

template <class Head, class Make>
head_and_grad<Head>& cached_head(const std::string& key, Make make) {
  if (current_head.key != key) {
    current_head.object.reset();  // free the previous head before allocating the next
    current_head.key.clear();
    current_head.object = std::make_shared<head_and_grad<Head>>(head_and_grad<Head>{make(), {}});
    current_head.key = key;
  }
  return *static_cast<head_and_grad<Head>*>(current_head.object.get());
}

std::map<index_t, double> full_softmax_seconds;  // per N, for the speedup counter

/// Useful FLOPs of one HS step over the given targets (see the file comment).
template <class Tree, bool Sigmoid>
double hs_flops(const Tree& tree, const std::vector<index_t>& targets) {
  const auto tv = tree.view();
  double children = 0;
  for (index_t c : targets)
    for (int l = 0; l < tv.depth(c); ++l) children += Sigmoid ? 1 : tv.step(c, l).block_size;
  return 6.0 * dim * children;
}

/// The timed loop shared by every head.
/// `warm_up`: run one untimed step first, so that the gradient buffers exist and the allocator has
/// its pages (the first step of a fresh head pays page faults on every buffer it creates). Skipped
/// for the multi-second heads, whose timed step is long enough to absorb it.
template <class Head>
void time_steps(benchmark::State& state, head_and_grad<Head>& hg, const problem& p, double flops_per_step,
                bool is_full, bool warm_up) {
  using storage = typename Head::storage_type;
  const xs::matrix_view<const float> hidden(p.hidden.data(), batch, dim);
  const xs::matrix_view<float> grad_hidden(p.grad_hidden.data(), batch, dim);
  if (warm_up)
    hg.head.forward_backward(hidden, xs::vector_view<const index_t>(p.targets[0].data(), batch), grad_hidden,
                             hg.grad);
  double rows = 0, steps = 0;
  const auto t0 = clock_type::now();
  for (auto _ : state) {
    const auto& t = p.targets[static_cast<std::size_t>(steps) % p.targets.size()];
    const float loss = hg.head.forward_backward(hidden, xs::vector_view<const index_t>(t.data(), batch),
                                                grad_hidden, hg.grad);
    benchmark::DoNotOptimize(loss);
    rows += static_cast<double>(hg.grad.num_rows());
    steps += 1;
  }
  const double per_step = seconds_since(t0) / steps;
  const auto t1 = clock_type::now();
  hg.head.apply_sgd(hg.grad, 1e-3f);
  const double sgd = seconds_since(t1);

  const double touched_rows = rows / steps;
  const double bytes = touched_rows * dim * sizeof(storage);
  const double flop_floor = rates.sgemm_gflops > 0 ? flops_per_step / (rates.sgemm_gflops * 1e9) : 0;
  const double mem_floor = bytes / (rates.read_gbps * 1e9);
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["rows"] = touched_rows;
  state.counters["MB"] = bytes / 1e6;
  state.counters["GFLOP"] = flops_per_step / 1e9;
  state.counters["flop_floor_ms"] = flop_floor * 1e3;
  state.counters["mem_floor_ms"] = mem_floor * 1e3;
  state.counters["x_floor"] = per_step / std::max(flop_floor, mem_floor);
  state.counters["sgd_ms"] = sgd * 1e3;
  if (is_full) {
    full_softmax_seconds[p.n] = per_step;
  } else if (auto it = full_softmax_seconds.find(p.n); it != full_softmax_seconds.end()) {
    state.counters["speedup"] = it->second / per_step;
  }
}

// ------------------------------------------------------------------------------------------------
// Benchmarks
// ------------------------------------------------------------------------------------------------

/// The full softmax; with `row_block` > 0 solved in blocks of that many rows, each keeping all its
/// scores (a score cache of row_block x N x 4 bytes): no recompute pass, 6BNd useful FLOPs.
void bm_full(benchmark::State& state, index_t n, index_t row_block = 0) {
  using head_type = xs::full_softmax<xs::fp32, xs::omp>;
  const problem& p = get_problem(n);
  auto& hg = cached_head<head_type>("full/" + std::to_string(n) + "/" + std::to_string(row_block), [&] {
    head_type h(n, dim);
    if (row_block > 0) h.keep_scores_in_row_blocks(row_block);
    return h;
  });
  time_steps(state, hg, p, (row_block > 0 ? 6.0 : 8.0) * batch * double(n) * dim, /*is_full=*/row_block == 0,
             /*warm_up=*/false);
}

template <class Tree, class Precision, class NodeForm>
void bm_hs(benchmark::State& state, const std::string& key, index_t n, std::function<Tree()> make_tree,
           bool warm_up) {
  using head_type = xs::hierarchical_softmax<Tree, Precision, xs::omp, NodeForm>;
  const problem& p = get_problem(n);
  auto& hg = cached_head<head_type>(key, [&] { return head_type(make_tree(), dim); });
  double flops = 0;
  for (const auto& t : p.targets)
    flops += hs_flops<Tree, std::is_same_v<NodeForm, xs::sigmoid_nodes>>(hg.head.tree(), t);
  time_steps(state, hg, p, flops / p.targets.size(), /*is_full=*/false, warm_up);
}

/// Registers one HS benchmark. With `fixed_iterations` (a single node over all N classes: seconds
/// per step) it runs that many steps once; otherwise steps for at least 0.5 s, five times (the
/// machine is shared: take the fastest repetition, see bench/README.md).
template <class Tree, class Precision = xs::fp32, class NodeForm = xs::softmax_nodes>
void register_hs(const std::string& shape, index_t n, std::function<Tree()> make_tree, int fixed_iterations = 0) {
  const std::string name = "hs/" + shape + "/" + xs::element_name<typename Precision::storage_type>() + "/N=" +
                           std::to_string(n);
  auto* b = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
    bm_hs<Tree, Precision, NodeForm>(s, name, n, make_tree, fixed_iterations == 0);
  });
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
  if (fixed_iterations > 0) b->Iterations(fixed_iterations);
  else b->MinTime(0.5)->Repetitions(5);
}

template <index_t N, int B2, int B3, int B4>
void register_size() {
  constexpr index_t n = N;
  auto* full = benchmark::RegisterBenchmark(("full_softmax/fp32/N=" + std::to_string(n)).c_str(),
                                            [](benchmark::State& s) { bm_full(s, n); });
  full->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime()->Iterations(n >= 1'000'000 ? 1 : 3);
  // The same step in blocks of 256 rows, each keeping all its scores (keep_scores_in_row_blocks).
  auto* blocks = benchmark::RegisterBenchmark(("full_softmax_rows256/fp32/N=" + std::to_string(n)).c_str(),
                                              [](benchmark::State& s) { bm_full(s, n, 256); });
  blocks->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime()->Iterations(n >= 1'000'000 ? 1 : 3);

  static_assert(std::size_t(B2) * B2 >= std::size_t(N) && std::size_t(B2 - 1) * (B2 - 1) < std::size_t(N));
  static_assert(std::size_t(B3) * B3 * B3 >= std::size_t(N));
  static_assert(std::size_t(B4) * B4 * B4 * B4 >= std::size_t(N));
  register_hs<xs::uniform_tree<1, int(N)>>("uniform1x" + std::to_string(n), n,
                                            [] { return xs::uniform_tree<1, int(N)>(n); },
                                            n >= 1'000'000 ? 1 : 3);
  register_hs<xs::uniform_tree<2, B2>>("uniform2x" + std::to_string(B2), n, [] { return xs::uniform_tree<2, B2>(n); });
  register_hs<xs::uniform_tree<3, B3>>("uniform3x" + std::to_string(B3), n, [] { return xs::uniform_tree<3, B3>(n); });
  register_hs<xs::uniform_tree<4, B4>>("uniform4x" + std::to_string(B4), n, [] { return xs::uniform_tree<4, B4>(n); });
  register_hs<xs::runtime_tree<64>>("huffman2_softmax", n, [] { return huffman_tree(n); });
  register_hs<xs::runtime_tree<64>, xs::fp32, xs::sigmoid_nodes>("huffman2_sigmoid", n,
                                                                  [] { return huffman_tree(n); });
  if (n >= 1'000'000)
    register_hs<xs::uniform_tree<2, B2>, xs::bf16>("uniform2x" + std::to_string(B2), n,
                                                   [] { return xs::uniform_tree<2, B2>(n); });
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  rates.sgemm_gflops = measure_sgemm(1024, 1024, 1024, false);
  rates.sgemm_chunk_gflops = measure_sgemm(1024, 8192, 256, true);
  measure_memory(rates.read_gbps, rates.copy_gbps);
  char line[256];
  std::snprintf(line, sizeof line, "%.1f GFLOP/s (1024^3), %.1f GFLOP/s (1024x8192x256, B transposed)",
                rates.sgemm_gflops, rates.sgemm_chunk_gflops);
  benchmark::AddCustomContext("sgemm", line);
  std::snprintf(line, sizeof line, "read %.1f GB/s, memcpy %.1f GB/s (read + write bytes), 1 GiB, all threads",
                rates.read_gbps, rates.copy_gbps);
  benchmark::AddCustomContext("memory", line);
#if defined(_OPENMP)
  benchmark::AddCustomContext("omp_threads", std::to_string(omp_get_max_threads()));
#endif
#if defined(XSOFTMAX_HAS_CBLAS) && defined(OPENBLAS_VERSION)
  benchmark::AddCustomContext("openblas", std::string(openblas_get_config()) + ", core " + openblas_get_corename());
#elif defined(XSOFTMAX_HAS_CBLAS)
  benchmark::AddCustomContext("blas", "CBLAS");
#else
  benchmark::AddCustomContext("blas", "none: blocked-loop GEMM");
#endif
  benchmark::AddCustomContext("problem", "d = 256, batch = 1024, Zipf(1.0) targets, forward_backward per step");

  // Branching per depth: ceil(N^(1/depth)).
  register_size<100'000, 317, 47, 18>();
  register_size<1'000'000, 1000, 100, 32>();

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
