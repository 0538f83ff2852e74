// SPDX-License-Identifier: Apache-2.0
// GPU benchmark of the cuda heads: forward, forward_backward and top-k time, and the memory the
// calls use, for the configurations of the CUDA issue. A plain program (no Google Benchmark):
// CUDA events around `reps` calls after one warm-up call; prints one line per configuration.
//
//   heads_cuda_bench            all configurations
//   heads_cuda_bench --quick    small sizes only (a smoke run)
//   heads_cuda_bench --filter full_bf16   configurations whose name contains the string
//   heads_cuda_bench --only forward_backward   one measurement of each (forward, forward_backward,
//                               forward_backward_async, topk, forward_topk, forward_backward_dense:
//                               the full softmax's step into a dense gradient in the weights' type;
//                               forward_backward_filtered: the same with gradient_filter 2^-12;
//                               the others print nan), e.g. under a profiler
//   heads_cuda_bench --reps 3   timed calls per measurement (default 10, 3 with --quick)
//   heads_cuda_bench --filter hs_uniform --train-steps 300 [--train-lr 1]   then 300 SGD steps on
//                               the head's inputs and the forward and top-10 again, with the HS
//                               search's expansions a row before and after (issue 26, target 4)
//   heads_cuda_bench --filter knn_1m   (or sampled_1m) the selective heads at 1M classes
//   heads_cuda_bench --filter hs_scale [--scale-n 100000000]   one HS and one KNN softmax training
//                               step at scale (the KNN softmax on a given random graph, K = 10)
//   heads_cuda_bench --sweep bench/heads_tree_shapes_gpu.json [--sweep-n 1000000,10000000]
//                               the tree-shape sweep (see run_sweep), drawn by bench/plot_heads.py
//   heads_cuda_bench --filter full_bf16_256k --row-blocks 0,1024,2048 --chunks 0,4096
//                               the full softmax heads once per (row block, chunk) pair: row block R
//                               > 0 solves the backward in blocks of R rows, each keeping all its
//                               scores (full_softmax::keep_scores_in_row_blocks: a score cache
//                               of R x N x 4 bytes); chunk 0 is the automatic chunk size (default: 0 and 0)
//
// Compare the first line with bench/cuda/torch_peer.py (PyTorch F.cross_entropy(F.linear(h, W))
// in bf16 at the same shape). Memory columns: `ws` is the head's cached workspace after the calls
// (its scratch: packed rows, score chunks), `grad` the sparse gradient's bytes, `peak` the largest
// device memory in use that cudaMemGetInfo showed, polled every 0.2 ms on a second thread during
// each measurement's untimed warm-up call (so transient buffers such as the score cache count,
// and the timed calls are not disturbed), minus what was in use before the inputs were allocated:
// sampled, not tracked, so a buffer that lives well under 0.2 ms can be missed.

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/detail/primitives/mix_seed.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <thrust/device_vector.h>
#include <thrust/functional.h>
#include <thrust/reduce.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;

#define BENCH_CUDA(call)                                                                         \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

std::size_t used_bytes() {
  std::size_t free_b = 0, total_b = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

/// The measurement `--only` names (empty: all).
std::string only_measurement;
/// --train-steps S / --train-lr L: after the measurements, S steps of plain SGD (mean loss, rate L)
/// on the head's own inputs, then the top-10 again (issue 26 target 4: the search on trained weights).
int train_steps = 0;
float train_lr = 1.0f;

/// A comma-separated list of integers >= `least` ("0,1024"), or false.
bool parse_list(const char* text, long long least, std::vector<index_t>& out) {
  out.clear();
  for (const char* p = text; *p;) {
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || v < least || (*end != ',' && *end != '\0')) return false;
    out.push_back(static_cast<index_t>(v));
    p = *end == ',' ? end + 1 : end;
  }
  return !out.empty();
}

/// While alive, polls the device memory in use every 0.2 ms on its own thread; `peak()` is the
/// largest value seen (the caller's thread keeps launching meanwhile).
class memory_sampler {
 public:
  memory_sampler() : thread_([this] {
    while (!stop_.load()) {
      const std::size_t now = used_bytes();
      if (now > peak_.load()) peak_.store(now);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }) {}
  memory_sampler(const memory_sampler&) = delete;
  memory_sampler& operator=(const memory_sampler&) = delete;
  ~memory_sampler() {
    stop_.store(true);
    thread_.join();
  }
  [[nodiscard]] std::size_t peak() const { return peak_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> peak_{0};
  std::thread thread_;  // last: starts once the atomics exist
};

/// Milliseconds per call of f over `reps` calls, after one warm-up call (during which `peak` takes
/// the memory_sampler's largest reading); NaN when `--only` names another measurement than `what`.
double time_ms(const char* what, const std::function<void()>& f, int reps, std::size_t& peak) {
  if (!only_measurement.empty() && only_measurement != what) return std::nan("");
  {
    const memory_sampler sampler;
    f();
    BENCH_CUDA(cudaDeviceSynchronize());  // the call's queued work (an _async verb's) has run
    peak = std::max({peak, sampler.peak(), used_bytes()});
  }
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  BENCH_CUDA(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) f();
  BENCH_CUDA(cudaEventRecord(stop));
  BENCH_CUDA(cudaEventSynchronize(stop));
  peak = std::max(peak, used_bytes());
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  return ms / reps;
}

/// Random bf16 hidden rows (uniform in [-1, 1]) and targets drawn from `target_of(u)`.
struct inputs {
  thrust::device_vector<__nv_bfloat16> h;
  thrust::device_vector<index_t> t;
  thrust::device_vector<float> grad_h;
  index_t rows, dim;
  inputs(index_t rows_, index_t dim_, index_t num_classes, bool zipf, unsigned seed) : rows(rows_), dim(dim_) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<__nv_bfloat16> hh(static_cast<std::size_t>(rows * dim));
    for (auto& x : hh) x = __float2bfloat16(u(g));
    std::vector<index_t> tt(static_cast<std::size_t>(rows));
    // Zipf-like targets (frequent classes first, as a Huffman tree over these counts expects).
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (auto& x : tt)
      x = zipf ? std::min<index_t>(num_classes - 1, static_cast<index_t>(std::pow(static_cast<double>(num_classes), u01(g))) - 1)
               : static_cast<index_t>(u01(g) * static_cast<double>(num_classes)) % num_classes;
    h.assign(hh.begin(), hh.end());
    t.assign(tt.begin(), tt.end());
    grad_h.resize(static_cast<std::size_t>(rows * dim));
  }
  xs::matrix_view<const __nv_bfloat16> hv() const { return {thrust::raw_pointer_cast(h.data()), rows, dim}; }
  xs::vector_view<const index_t> tv() const { return {thrust::raw_pointer_cast(t.data()), rows}; }
  xs::matrix_view<float> ghv() { return {thrust::raw_pointer_cast(grad_h.data()), rows, dim}; }
};

/// The search options of a head's top-k: `extra` (or the defaults), with each row's expansions into
/// `counts` when the head's search counts them (the hierarchical softmax).
template <class Head>
typename Head::search_options_type counted_search(thrust::device_vector<index_t>& counts, index_t rows,
                                                  typename Head::search_options_type extra = {}) {
  if constexpr (std::is_same_v<typename Head::search_options_type, xs::search_options>) {
    counts.resize(static_cast<std::size_t>(rows));
    extra.expansions = xs::vector_view<index_t>(thrust::raw_pointer_cast(counts.data()), rows);
  }
  return extra;
}

/// One untimed top-10 of `h`, and a line with the mean and largest expansions a row (heads whose
/// search counts them).
template <class Head, class... TopkExtra>
void report_expansions(const std::string& name, const char* when, const Head& head,
                       xs::matrix_view<const __nv_bfloat16> h, TopkExtra... topk_extra) {
  if constexpr (std::is_same_v<typename Head::search_options_type, xs::search_options>) {
    const index_t rows = h.rows, k = 10;
    thrust::device_vector<index_t> cls(static_cast<std::size_t>(rows * k)), counts;
    thrust::device_vector<float> lp(static_cast<std::size_t>(rows * k));
    head.topk(h, k, xs::matrix_view<index_t>(thrust::raw_pointer_cast(cls.data()), rows, k),
              xs::matrix_view<float>(thrust::raw_pointer_cast(lp.data()), rows, k),
              counted_search<Head>(counts, rows, topk_extra...));
    const index_t sum = thrust::reduce(counts.begin(), counts.end(), index_t(0));
    const index_t most = thrust::reduce(counts.begin(), counts.end(), index_t(0), thrust::maximum<index_t>());
    std::printf("%-34s top10 expansions a row (%s): mean %.1f, max %lld\n", name.c_str(), when,
                double(sum) / double(rows), static_cast<long long>(most));
    std::fflush(stdout);
  }
}

/// Whether `Head` has the full softmax's `forward_topk` (the loss and the top-k in one pass).
template <class Head, class = void>
struct has_forward_topk : std::false_type {};
template <class Head>
struct has_forward_topk<Head, std::void_t<decltype(&Head::template forward_topk<const __nv_bfloat16>)>>
    : std::true_type {};

template <class Head, class... TopkExtra>
void run_head(const std::string& name, Head& head, index_t rows, index_t num_classes, bool zipf, int reps,
              std::size_t base, TopkExtra... topk_extra) {
  // Progress on stderr, one line a measurement: where a slow head spends its time shows even when
  // the run is cut short (its result line comes only at the end).
  // Each line says the seconds since the head's first line: a measurement's wall time is the gap.
  const auto t0 = std::chrono::steady_clock::now();
  const auto progress = [&](const char* what) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "  %s: %8.3f s  %s\n", name.c_str(), s, what);
    std::fflush(stderr);
  };
  progress("inputs");
  inputs in(rows, head.dim(), num_classes, zipf, 1);
  typename Head::gradient_type g;
  std::size_t peak = used_bytes();
  float loss = 0;
  progress("forward");
  const double fwd = time_ms("forward", [&] { loss = head.forward(in.hv(), in.tv()); }, reps, peak);
  progress("forward_backward");
  const double fb = time_ms("forward_backward", [&] { loss = head.forward_backward(in.hv(), in.tv(), in.ghv(), g); }, reps, peak);
  // The same step queued without waiting (the loss stays on the device): what a training loop that
  // never reads the loss back per step pays. The events bracket the queued work on the stream.
  thrust::device_vector<float> loss_d(1);
  progress("forward_backward_async");
  const double fba = time_ms("forward_backward_async", 
      [&] {
        head.forward_backward_async(in.hv(), in.tv(), in.ghv(), g,
                                    xs::vector_view<float>(thrust::raw_pointer_cast(loss_d.data()), 1));
      },
      reps, peak);
  head.resources().check();
  const index_t k = 10;
  progress("topk");
  thrust::device_vector<index_t> cls(static_cast<std::size_t>(rows * k));
  thrust::device_vector<float> lp(static_cast<std::size_t>(rows * k));
  const double tk = time_ms("topk", 
      [&] {
        head.topk(in.hv(), k, xs::matrix_view<index_t>(thrust::raw_pointer_cast(cls.data()), rows, k),
                  xs::matrix_view<float>(thrust::raw_pointer_cast(lp.data()), rows, k), topk_extra...);
      },
      std::max(1, reps / 2), peak);
  report_expansions(name, "untrained", head, in.hv(), topk_extra...);
  // The full softmax's loss and top-10 from one pass over the scores (full_softmax::forward_topk),
  // against the forward alone and forward + topk.
  if constexpr (has_forward_topk<Head>::value) {
    progress("forward_topk");
    const double ftk = time_ms("forward_topk",
        [&] {
          loss = head.forward_topk(in.hv(), in.tv(), k,
                                   xs::matrix_view<index_t>(thrust::raw_pointer_cast(cls.data()), rows, k),
                                   xs::matrix_view<float>(thrust::raw_pointer_cast(lp.data()), rows, k));
        },
        std::max(1, reps / 2), peak);
    std::printf("%-34s loss + top10 in one pass (forward_topk) %9.3f ms: %.2fx fwd (fwd then topk: %.2fx)\n",
                name.c_str(), ftk, ftk / fwd, (fwd + tk) / fwd);
  }
  if (train_steps > 0) {  // the top-10 again on weights trained on these inputs (target 4)
    progress("training");
    xs::loss_options mean;
    mean.reduce = xs::reduction::mean;
    float trained_loss = 0;
    for (int s = 0; s < train_steps; ++s) {
      trained_loss = head.forward_backward(in.hv(), in.tv(), in.ghv(), g, mean);
      head.apply_sgd(g, train_lr);
    }
    progress("topk, trained");
    std::size_t trained_peak = peak;
    const double trained_fwd = time_ms("forward", [&] { head.forward(in.hv(), in.tv()); }, reps, trained_peak);
    const double trained_tk = time_ms("topk",
        [&] {
          head.topk(in.hv(), k, xs::matrix_view<index_t>(thrust::raw_pointer_cast(cls.data()), rows, k),
                    xs::matrix_view<float>(thrust::raw_pointer_cast(lp.data()), rows, k), topk_extra...);
        },
        std::max(1, reps / 2), trained_peak);
    std::printf("%-34s after %d SGD steps (lr %g, loss %.4f): fwd %9.3f ms  top10 %9.3f ms (%.2fx fwd)\n",
                name.c_str(), train_steps, double(train_lr), trained_loss, trained_fwd, trained_tk,
                trained_tk / trained_fwd);
    report_expansions(name, "trained", head, in.hv(), topk_extra...);
  }
  progress("done");
  const double grad_mb = (static_cast<double>(g.values.size()) * 4 + static_cast<double>(g.rows.size()) * 8) / 1e6;
  std::printf("%-34s B=%-6lld d=%-5lld N=%-10lld fwd %9.3f ms  fwd+bwd %9.3f ms  fwd+bwd async %9.3f ms  "
              "top10 %9.3f ms  ws %8.1f MB  grad %9.1f MB (%lld rows)  peak %9.1f MB  loss %.4f\n",
              name.c_str(), static_cast<long long>(rows), static_cast<long long>(head.dim()),
              static_cast<long long>(num_classes), fwd, fb, fba, tk, head.resources().workspace_bytes() / 1e6, grad_mb,
              static_cast<long long>(g.num_rows()), (peak - base) / 1e6, loss);
  std::fflush(stdout);
  // The full softmax's step into a dense weight gradient in the weights' storage type (its
  // `dense_gradient` overloads: what a framework's bf16 `.grad` is), with the sparse fp32
  // gradient's buffers freed first, so that the peak is this step's own.
  if constexpr (has_forward_topk<Head>::value) {
    using storage = typename Head::storage_type;
    g = typename Head::gradient_type{};
    thrust::device_vector<storage> dense(static_cast<std::size_t>(num_classes * head.dim()));
    std::size_t dense_peak = used_bytes();
    progress("forward_backward_dense");
    const double fbd = time_ms("forward_backward_dense",
        [&] {
          loss = head.forward_backward(in.hv(), in.tv(), in.ghv(),
                                       xs::dense_gradient<storage>{xs::matrix_view<storage>(
                                           thrust::raw_pointer_cast(dense.data()), num_classes, head.dim())});
        },
        reps, dense_peak);
    std::printf("%-34s fwd+bwd into a dense %s gradient %9.3f ms (%.2fx the sparse fp32 one)  grad %9.1f MB  "
                "peak %9.1f MB\n",
                name.c_str(), xs::element_name<storage>(), fbd, fbd / fb,
                static_cast<double>(dense.size() * sizeof(storage)) / 1e6, (dense_peak - base) / 1e6);
    // The same step with gradient filtering at Cut Cross-Entropy's bf16 default, 2^-12
    // (`loss_options::gradient_filter`): on these inputs (random weights of scale 1 / sqrt(d): a
    // near-uniform softmax, p ~ 1 / N) only the targets' entries pass, so the gradient GEMMs run
    // over the chunks' target columns alone -- the most filtering can save, not a trained model's.
    xs::loss_options filtered;
    filtered.gradient_filter = 1.f / 4096.f;
    std::size_t filtered_peak = used_bytes();
    progress("forward_backward_filtered");
    const double fbf = time_ms("forward_backward_filtered",
        [&] {
          loss = head.forward_backward(in.hv(), in.tv(), in.ghv(),
                                       xs::dense_gradient<storage>{xs::matrix_view<storage>(
                                           thrust::raw_pointer_cast(dense.data()), num_classes, head.dim())},
                                       filtered);
        },
        reps, filtered_peak);
    std::printf("%-34s fwd+bwd into a dense %s gradient, gradient_filter 2^-12 %9.3f ms (%.2fx unfiltered, "
                "%.2fx fwd)  peak %9.1f MB\n",
                name.c_str(), xs::element_name<storage>(), fbf, fbf / fbd, fbf / fwd, (filtered_peak - base) / 1e6);
    std::fflush(stdout);
  }
}

std::vector<double> zipf_counts(index_t n) {
  std::vector<double> c(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) c[static_cast<std::size_t>(i)] = 1e9 / static_cast<double>(i + 1);
  return c;
}

/// A complete `branching`-ary tree over n >= 2 classes as a runtime tree: consecutive nodes of a
/// level share a parent (the last group of a level may be smaller), so its depth is
/// ceil(log_branching n) and branching >= n gives one node over every class.
xs::runtime_tree<> complete_tree(index_t n, index_t branching) {
  std::vector<index_t> parent(static_cast<std::size_t>(n), -1);
  index_t level_begin = 0, level_size = n;
  while (level_size > 1) {
    const index_t groups = (level_size + branching - 1) / branching;
    const index_t next_begin = static_cast<index_t>(parent.size());
    parent.resize(parent.size() + static_cast<std::size_t>(groups), -1);
    for (index_t i = 0; i < level_size; ++i) parent[static_cast<std::size_t>(level_begin + i)] = next_begin + i / branching;
    level_begin = next_begin;
    level_size = groups;
  }
  return xs::runtime_tree<>::from_parents(std::move(parent), n);
}

/// The tree-shape sweep of the CUDA issue: forward_backward of the HS over complete trees of
/// branching 2, 4, 16, 64, N^(1/4), N^(1/3), N^(1/2) and N (depth 1: every class under the root)
/// and of the full softmax, for each N of `sizes`, B = 8192, d = 512, bf16, Zipf targets. Writes
/// `path` as Google Benchmark-style JSON (one record per shape: name "hs/depth<D>_b<branching>/
/// bf16/N=<n>" or "full_softmax/bf16/N=<n>", real_time in ms, items_per_second in samples), which
/// bench/plot_heads.py draws. A shape whose head does not fit the GPU is reported and skipped.
int run_sweep(const std::string& path, const std::vector<index_t>& sizes, int reps) {
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "heads_cuda_bench: cannot write %s\n", path.c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const index_t rows = 8192, dim = 512;
  std::fprintf(out, "{\n  \"context\": {\"device\": \"%s\", \"B\": %lld, \"d\": %lld, \"storage\": \"bf16\", "
               "\"measure\": \"forward_backward\", \"reps\": %d},\n  \"benchmarks\": [",
               prop.name, static_cast<long long>(rows), static_cast<long long>(dim), reps);
  bool first = true;
  const auto record = [&](const std::string& name, int depth, index_t branching, double ms, index_t grad_rows) {
    std::fprintf(out, "%s\n    {\"name\": \"%s\", \"run_name\": \"%s\", \"run_type\": \"iteration\", "
                 "\"real_time\": %.4f, \"time_unit\": \"ms\", \"items_per_second\": %.1f, \"depth\": %d, "
                 "\"branching\": %lld, \"rows\": %lld}",
                 first ? "" : ",", name.c_str(), name.c_str(), ms, static_cast<double>(rows) / (ms * 1e-3), depth,
                 static_cast<long long>(branching), static_cast<long long>(grad_rows));
    first = false;
    std::fflush(out);
    std::printf("%-40s depth %2d  branching %9lld  fwd+bwd %9.3f ms  %7.3f us/sample  grad rows %lld\n", name.c_str(),
                depth, static_cast<long long>(branching), ms, ms * 1e3 / static_cast<double>(rows),
                static_cast<long long>(grad_rows));
    std::fflush(stdout);
  };
  for (const index_t n : sizes) {
    const inputs in(rows, dim, n, true, 1);
    std::vector<index_t> branchings = {2, 4, 16, 64, n};
    for (const double root : {4.0, 3.0, 2.0}) branchings.push_back(static_cast<index_t>(std::ceil(std::pow(double(n), 1.0 / root))));
    std::sort(branchings.begin(), branchings.end());
    branchings.erase(std::unique(branchings.begin(), branchings.end()), branchings.end());
    for (const index_t b : branchings) {
      int depth = 0;
      for (index_t level = n; level > 1; level = (level + b - 1) / b) ++depth;
      const std::string name = "hs/depth" + std::to_string(depth) + "_b" + std::to_string(b) + "/bf16/N=" + std::to_string(n);
      std::fprintf(stderr, "  sweep: %s\n", name.c_str());
      try {
        using R = xs::runtime_tree<>;
        xs::hierarchical_softmax<R, xs::bf16, xs::cuda> head(complete_tree(n, b), dim);
        typename decltype(head)::gradient_type g;
        thrust::device_vector<float> grad_h(static_cast<std::size_t>(rows * dim));
        const xs::matrix_view<float> ghv(thrust::raw_pointer_cast(grad_h.data()), rows, dim);
        std::size_t peak = 0;
        const double ms = time_ms("forward_backward", [&] { head.forward_backward(in.hv(), in.tv(), ghv, g); }, reps, peak);
        record(name, depth, b, ms, g.num_rows());
      } catch (const std::exception& e) {
        std::printf("%-40s skipped: %s\n", name.c_str(), e.what());
        (void)cudaGetLastError();
      }
    }
    const std::string name = "full_softmax/bf16/N=" + std::to_string(n);
    std::fprintf(stderr, "  sweep: %s\n", name.c_str());
    try {
      xs::full_softmax<xs::bf16, xs::cuda> head(n, dim);
      typename decltype(head)::gradient_type g;
      thrust::device_vector<float> grad_h(static_cast<std::size_t>(rows * dim));
      const xs::matrix_view<float> ghv(thrust::raw_pointer_cast(grad_h.data()), rows, dim);
      std::size_t peak = 0;
      const double ms = time_ms("forward_backward", [&] { head.forward_backward(in.hv(), in.tv(), ghv, g); }, reps, peak);
      record(name, 1, n, ms, g.num_rows());
    } catch (const std::exception& e) {
      std::printf("%-40s skipped: %s\n", name.c_str(), e.what());
      (void)cudaGetLastError();
    }
  }
  std::fprintf(out, "\n  ]\n}\n");
  std::fclose(out);
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string filter;
  int reps_option = 0;
  std::string sweep_path;
  std::vector<index_t> sweep_sizes = {1000000, 10000000};
  index_t scale_n = 100000000;
  std::vector<index_t> row_blocks = {0}, chunks = {0};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only_measurement = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps_option = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--train-steps") && i + 1 < argc) train_steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--train-lr") && i + 1 < argc) train_lr = static_cast<float>(std::atof(argv[++i]));
    else if (!std::strcmp(argv[i], "--sweep") && i + 1 < argc) sweep_path = argv[++i];
    else if (!std::strcmp(argv[i], "--scale-n") && i + 1 < argc) scale_n = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--sweep-n") && i + 1 < argc) {
      if (!parse_list(argv[++i], 2, sweep_sizes)) {
        std::fprintf(stderr, "heads_cuda_bench: --sweep-n wants class counts >= 2 separated by commas, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--row-blocks") && i + 1 < argc) {
      if (!parse_list(argv[++i], 0, row_blocks)) {
        std::fprintf(stderr, "heads_cuda_bench: --row-blocks wants row counts >= 0 separated by commas, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--chunks") && i + 1 < argc) {
      if (!parse_list(argv[++i], 0, chunks)) {
        std::fprintf(stderr, "heads_cuda_bench: --chunks wants column counts >= 0 separated by commas, got '%s'\n", argv[i]);
        return 2;
      }
    }
    else {
      std::fprintf(stderr, "heads_cuda_bench: unknown option '%s' (see the file's header)\n", argv[i]);
      return 2;
    }
  }
  if (!only_measurement.empty() && only_measurement != "forward" && only_measurement != "forward_backward" &&
      only_measurement != "forward_backward_async" && only_measurement != "topk" &&
      only_measurement != "forward_topk" && only_measurement != "forward_backward_dense" &&
      only_measurement != "forward_backward_filtered") {
    std::fprintf(stderr, "heads_cuda_bench: --only '%s' is not forward, forward_backward, forward_backward_async, "
                 "topk, forward_topk, forward_backward_dense or forward_backward_filtered\n", only_measurement.c_str());
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("heads_cuda_bench: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("heads_cuda_bench on %s (%.1f GiB), bf16 weights and hidden rows, k = 10%s\n", prop.name,
              prop.totalGlobalMem / double(1 << 30), quick ? ", --quick sizes" : "");
  const int reps = reps_option > 0 ? reps_option : quick ? 3 : 10;
  if (!sweep_path.empty()) return run_sweep(sweep_path, sweep_sizes, reps_option > 0 ? reps_option : 3);
  const auto want = [&](const std::string& name) { return filter.empty() || name.find(filter) != std::string::npos; };

  // Uniformly random neighbour lists (K a class) for a KNN softmax over n classes of width dim: the
  // worst case for the active set (a trained graph's neighbourhoods of frequent targets overlap).
  // Filled by 16 threads from the library's counter-based mixer (a second on 1e9 ids).
  const auto random_graph = [](index_t n, index_t dim, index_t k) {
    std::vector<index_t> ids(static_cast<std::size_t>(n * k));
    std::vector<std::thread> fill;
    const std::size_t parts = 16, size = ids.size();
    for (std::size_t p = 0; p < parts; ++p)
      fill.emplace_back([&, p] {
        for (std::size_t i = size * p / parts; i < size * (p + 1) / parts; ++i)
          ids[i] = static_cast<index_t>(xs::detail::mix_seed(i) % static_cast<std::uint64_t>(n));
      });
    for (auto& t : fill) t.join();
    return xs::knn_graph::from_lists(n, dim, k, std::move(ids));
  };

  using full = xs::full_softmax<xs::bf16, xs::cuda>;
  // A full softmax head once per (row block, chunk) of --row-blocks and --chunks; the name says
  // which when either list is not just {0}.
  const bool variants = row_blocks != std::vector<index_t>{0} || chunks != std::vector<index_t>{0};
  const auto run_full = [&](const std::string& name, index_t n, index_t dim, index_t rows) {
    for (const index_t r : row_blocks)
      for (const index_t c : chunks) {
        const std::size_t base = used_bytes();
        full head(n, dim);  // a fresh head each time: its workspace (and peak) is this variant's own
        if (r > 0) head.keep_scores_in_row_blocks(r);
        head.set_chunk_size(c);
        const std::string label = variants ? name + "_r" + std::to_string(r) + "_c" + std::to_string(c) : name;
        run_head(label, head, rows, n, false, reps, base);
      }
  };
  // The PyTorch peer's shape (bench/cuda/torch_peer.py): 8192 x 2304 x 256K.
  if (want("full_bf16_256k")) run_full("full_bf16_256k", quick ? 32768 : 262144, 2304, quick ? 1024 : 8192);
  if (want("full_bf16_1m")) run_full("full_bf16_1m", quick ? 65536 : 1 << 20, 512, quick ? 512 : 4096);
  // Two-level sqrt(N) tree over 1M classes (1024 x 1024): top level one GEMM, second level runs.
  if (want("hs_uniform2_1m")) {
    using T = xs::uniform_tree<2, 1024>;
    const index_t n = quick ? 65536 : 1 << 20;
    const std::size_t base = used_bytes();
    xs::hierarchical_softmax<T, xs::bf16, xs::cuda> head(T(n), 512);
    run_head("hs_uniform2_1m", head, quick ? 1024 : 8192, n, true, reps, base);
  }
  // Three levels of 100 (1M classes): more, smaller runs.
  if (want("hs_uniform3_1m")) {
    using T = xs::uniform_tree<3, 100>;
    const index_t n = quick ? 100000 : 1000000;
    const std::size_t base = used_bytes();
    xs::hierarchical_softmax<T, xs::bf16, xs::cuda> head(T(n), 512);
    run_head("hs_uniform3_1m", head, quick ? 1024 : 8192, n, true, reps, base);
  }
  // The same tree with each dense run of a level issued on its own (dense_grouping::per_run): what
  // the grouped GEMMs and the segmented log-sum-exp kernel save on a level of 100 nodes x 100 runs.
  if (want("hs_uniform3_1m_per_run")) {
    using T = xs::uniform_tree<3, 100>;
    const index_t n = quick ? 100000 : 1000000;
    const std::size_t base = used_bytes();
    xs::hierarchical_softmax<T, xs::bf16, xs::cuda> head(T(n), 512);
    head.set_dense_grouping(xs::dense_grouping::per_run);
    run_head("hs_uniform3_1m_per_run", head, quick ? 1024 : 8192, n, true, reps, base);
  }
  // word2vec: binary Huffman tree over Zipf counts, sigmoid nodes (gather-dot path), d = 300.
  if (want("hs_huffman_sigmoid_1m")) {
    using R = xs::runtime_tree<>;
    const index_t n = quick ? 100000 : 1000000;
    const R tree = R::huffman(zipf_counts(n), 2);
    const std::size_t base = used_bytes();
    xs::hierarchical_softmax<R, xs::bf16, xs::cuda, xs::sigmoid_nodes> head(tree, 300);
    run_head("hs_huffman_sigmoid_1m", head, quick ? 1024 : 8192, n, true, reps, base, xs::search_options{64});
  }
  // The selective heads at 1M classes, d = 512: the KNN softmax (a given random graph, K = 10) and
  // sampled softmax (8,192 log-uniform negatives). Their steps' per-call buffers and active set are
  // scratch since stop 48 (were 7 and 11 device vectors a step): the quick sizes show the fixed
  // host-side cost a step.
  if (want("knn_1m")) {
    const index_t n = quick ? 100000 : 1000000, k = 10;
    xs::knn_options options;
    options.graph.k = k;
    options.rebuild_every = 0;
    const std::size_t base = used_bytes();
    xs::selective_softmax<xs::knn_selector, xs::bf16, xs::cuda> head(xs::knn_selector(random_graph(n, 512, k), options),
                                                                      n, 512);
    run_head("knn_1m", head, quick ? 1024 : 8192, n, true, reps, base);
  }
  if (want("sampled_1m")) {
    const index_t n = quick ? 100000 : 1000000;
    xs::sampling_options options;
    options.num_sampled = 8192;
    const std::size_t base = used_bytes();
    xs::selective_softmax<xs::sampled_negatives, xs::bf16, xs::cuda> head(
        xs::sampled_negatives::log_uniform(n, options), n, 512);
    run_head("sampled_1m", head, quick ? 1024 : 8192, n, true, reps, base);
  }
  // 10M classes, two levels of ~3163 (the seed question's setting), d = 300.
  if (!quick && want("hs_uniform2_10m")) {
    using T = xs::uniform_tree<2, 3163>;
    const index_t n = 10000000;
    const std::size_t base = used_bytes();
    xs::hierarchical_softmax<T, xs::bf16, xs::cuda> head(T(n), 300);
    run_head("hs_uniform2_10m", head, 8192, n, true, reps, base);
  }
  // Scale: one training step of a 3-level HS (465^3 >= 100M leaves) over --scale-n classes (default
  // 100M, d = 512, bf16: 102 GB of weights, an H200's size; on an H100 pass the largest N that fits).
  // Only forward_backward is timed (an exact top-k on untrained weights expands every node). A head
  // that does not fit the GPU says so.
  if (!quick && filter.find("hs_scale") != std::string::npos) {
    using T = xs::uniform_tree<3, 465>;
    const index_t n = scale_n;
    std::printf("hs_scale: N = %lld, d = 512, bf16 weights %.1f GB\n", static_cast<long long>(n),
                static_cast<double>(n) * 512 * 2 / 1e9);
    std::fflush(stdout);
    only_measurement = "forward_backward";
    try {
      const std::size_t base = used_bytes();
      xs::hierarchical_softmax<T, xs::bf16, xs::cuda> head(T(n), 512);
      run_head("hs_scale_" + std::to_string(n), head, 8192, n, true, reps, base);
    } catch (const std::exception& e) {
      std::printf("hs_scale: N = %lld does not fit or failed: %s\n", static_cast<long long>(n), e.what());
    }
    std::fflush(stdout);
    // The KNN softmax at the same N: a selective softmax over the union of the batch targets' K =
    // 10 graph neighbours. Its graph is given, not built (an exact build is O(N^2 d): days at
    // 100M): uniformly random neighbour lists, the worst case for the active set (a trained
    // graph's neighbourhoods of frequent targets overlap). Times the training step only.
    try {
      const index_t k = 10;
      const auto t_graph = std::chrono::steady_clock::now();
      xs::knn_options options;
      options.graph.k = k;
      options.rebuild_every = 0;
      xs::knn_selector selector(random_graph(n, 512, k), options);
      std::printf("knn_scale: N = %lld, K = %lld random neighbours, graph made on the host in %.1f s\n",
                  static_cast<long long>(n), static_cast<long long>(k),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t_graph).count());
      std::fflush(stdout);
      const std::size_t base = used_bytes();
      xs::selective_softmax<xs::knn_selector, xs::bf16, xs::cuda> head(std::move(selector), n, 512);
      run_head("knn_scale_" + std::to_string(n), head, 8192, n, true, reps, base);
    } catch (const std::exception& e) {
      std::printf("knn_scale: N = %lld does not fit or failed: %s\n", static_cast<long long>(n), e.what());
    }
  }
  return 0;
}
