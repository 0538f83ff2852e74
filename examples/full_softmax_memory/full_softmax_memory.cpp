// SPDX-License-Identifier: Apache-2.0
//
// full_softmax_memory: the exact softmax's memory / speed trade-off, on the CPU.
//
// A training step of the exact softmax over N classes computes B x N scores. xsoftmax never holds
// them all: it scores chunks of classes, folds them into an online log-sum-exp and, in the
// backward pass, recomputes every chunk it did not keep. Two settings choose how much it keeps:
//   * set_score_cache_bytes(bytes): the first pass's chunks kept for the second while they fit;
//     every kept chunk saves one GEMM of the backward's recomputation. B x N x 4
//     bytes keeps them all: three GEMMs a step instead of four, as F.cross_entropy(F.linear(...)).
//   * keep_scores_in_row_blocks(R): the step solved in blocks of R rows (set_row_block), each a
//     complete softmax, their weight gradients added up, with a cache of R x N x 4 bytes
//     (set_score_cache_bytes), so that every score of a block is kept: three
//     GEMMs a step at R rows' memory instead of B rows'. Each extra block re-reads and re-writes the
//     N x d weight gradient once, which pays while R is above about 4 x (GEMM rate) / (memory
//     bandwidth): tens of rows on a CPU, about a thousand on an H100 (bench/RESULTS.md, "Row blocks").
// Until either is set the head chooses both itself (training_plan): on the CPU, blocks whose
// scores fit the larger of 64 MiB and the N x d weight gradient's size, each keeping every score.
//
// The program times one training step (forward_backward, best of three) of the same head, batch
// and weights under five settings, and shows that they compute the same step: the losses and
// gradients agree to rounding (bitwise for the cache alone; within rounding with row blocks,
// whose weight-gradient sums over rows are grouped by block). Then the weight gradient written
// into the caller's own dense buffer (`dense_gradient`): in fp32, and for bf16 weights in bf16;
// and the step with gradient filtering (`loss_options::gradient_filter`): its time and what it drops.
//
// Build and run (from the repository root):
//   cmake -S . -B build && cmake --build build -j2 --target full_softmax_memory && ./build/examples/full_softmax_memory

#include <xsoftmax/full_softmax.hpp>

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
constexpr index_t dim = 128;
constexpr index_t batch = 1024;

using head_type = xs::full_softmax<xs::fp32, xs::omp>;

/// One setting of the trade-off (a negative cache: the head's automatic plan).
struct setting {
  const char* name;
  index_t cache_bytes;
  index_t row_block;
};

/// What one step outputs, and how long it took.
struct step_result {
  float loss = 0;
  std::vector<float> grad_hidden;
  head_type::gradient_type grad;
  double seconds = 0;
};

step_result timed_step(head_type& head, const std::vector<float>& hidden, const std::vector<index_t>& targets) {
  step_result r;
  r.grad_hidden.assign(static_cast<std::size_t>(batch * dim), 0.f);
  const xs::matrix_view<const float> h(hidden.data(), batch, dim);
  const xs::vector_view<const index_t> t(targets.data(), batch);
  r.seconds = 1e30;
  for (int rep = 0; rep < 3; ++rep) {  // best of three: the first call also pays for page faults
    const auto start = std::chrono::steady_clock::now();
    r.loss = head.forward_backward(h, t, xs::matrix_view<float>(r.grad_hidden.data(), batch, dim), r.grad);
    r.seconds = std::min(r.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return r;
}

/// The largest |a - b| / (1 + |b|) over two equally long vectors of floats.
template <class V>
double largest_gap(const V& a, const V& b) {
  double gap = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    gap = std::max(gap, std::abs(double(a[i]) - double(b[i])) / (1.0 + std::abs(double(b[i]))));
  return gap;
}

}  // namespace

int main() {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::vector<float> hidden(static_cast<std::size_t>(batch * dim));
  for (float& x : hidden) x = gauss(rng) / std::sqrt(float(dim)) * 4.f;
  std::vector<index_t> targets(static_cast<std::size_t>(batch));
  for (index_t& t : targets) t = static_cast<index_t>(rng() % num_classes);

  // The head owns N x d weights, initialised from a seed (the same values on every backend).
  head_type head(num_classes, dim);
  const index_t score_bytes = index_t(sizeof(float)) * num_classes;  // one row's scores
  const setting settings[] = {
      {"default: the automatic plan (training_plan)", -1, 0},
      {"one block, 64 MiB cache, the rest recomputed", head_type::default_score_cache_bytes, 0},
      {"no cache: every chunk recomputed", 0, 0},
      {"every score kept (B x N x 4 bytes)", batch * score_bytes, 0},
      {"row blocks of 256, each keeping its scores", 256 * score_bytes, 256},
  };
  std::printf("exact softmax, N = %lld classes, d = %lld, batch %lld, one forward_backward step\n\n",
              static_cast<long long>(num_classes), static_cast<long long>(dim), static_cast<long long>(batch));
  std::printf("%-46s %10s %9s %9s %12s %12s\n", "setting", "cache MiB", "row block", "step ms", "loss", "grad gap");
  std::vector<step_result> results;
  for (const setting& s : settings) {
    head.use_automatic_plan();
    if (s.cache_bytes >= 0) {
      head.set_row_block(0);
      head.set_score_cache_bytes(s.cache_bytes);
      if (s.row_block > 0) head.keep_scores_in_row_blocks(s.row_block);  // and a cache of row_block x N x 4 bytes
    }
    const xs::dense_step_plan plan = head.training_plan(batch);
    results.push_back(timed_step(head, hidden, targets));
    const step_result& r = results.back();
    const step_result& first = results.front();
    // The gap of the hidden and weight gradients against the default setting's.
    const double gap = std::max(largest_gap(r.grad_hidden, first.grad_hidden), largest_gap(r.grad.values, first.grad.values));
    std::printf("%-46s %10.1f %9lld %9.1f %12.6f %12.2e\n", s.name,
                static_cast<double>(plan.score_cache_bytes) / (1 << 20), static_cast<long long>(plan.row_block),
                r.seconds * 1e3, r.loss, gap);
  }
  std::printf("\nThe settings without a full cache also use one batch x %lld-class chunk buffer (%.1f MiB).\n",
              static_cast<long long>(head.chunk_size_for(batch)),
              static_cast<double>(batch * head.chunk_size_for(batch) * 4) / (1 << 20));

  // The weight gradient written straight into the caller's dense N x d buffer (dense_gradient), as a
  // framework hands its gradient tensor over: no sparse_gradient object, no copy. fp32: bitwise the
  // sparse gradient's values. A bf16 head's gradient in bf16: half the bytes, no fp32 N x d buffer
  // and no conversion pass; each element rounded once per row block from its fp32 sum.
  head.use_automatic_plan();
  const xs::matrix_view<const float> h(hidden.data(), batch, dim);
  const xs::vector_view<const index_t> t(targets.data(), batch);
  std::vector<float> grad_hidden(static_cast<std::size_t>(batch * dim)), grad_w(static_cast<std::size_t>(num_classes * dim));
  (void)head.forward_backward(h, t, xs::matrix_view<float>(grad_hidden.data(), batch, dim),
                              xs::dense_gradient<float>{xs::matrix_view<float>(grad_w.data(), num_classes, dim)});
  const bool same = std::equal(grad_w.begin(), grad_w.end(), results.front().grad.values.begin());
  std::printf("\nInto the caller's dense fp32 buffer (dense_gradient<float>): %s the sparse gradient's values.\n",
              same ? "bitwise" : "NOT bitwise");

  using bf16_t = xs::bf16::storage_type;
  xs::full_softmax<xs::bf16, xs::omp> head16(num_classes, dim);  // the same initial values, stored in bf16
  head_type::gradient_type sparse16;
  std::vector<bf16_t> grad_w16(grad_w.size());
  double sparse_ms = 1e30, dense_ms = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    (void)head16.forward_backward(h, t, xs::matrix_view<float>(grad_hidden.data(), batch, dim), sparse16);
    sparse_ms = std::min(sparse_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    start = std::chrono::steady_clock::now();
    (void)head16.forward_backward(h, t, xs::matrix_view<float>(grad_hidden.data(), batch, dim),
                                  xs::dense_gradient<bf16_t>{xs::matrix_view<bf16_t>(grad_w16.data(), num_classes, dim)});
    dense_ms = std::min(dense_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  double gap = 0, largest = 0;
  for (std::size_t i = 0; i < grad_w16.size(); ++i) {
    gap = std::max(gap, std::abs(double(xs::to_float(grad_w16[i])) - double(sparse16.values[i])));
    largest = std::max(largest, std::abs(double(sparse16.values[i])));
  }
  std::printf("bf16 weights: step into an fp32 sparse gradient (%.0f MiB) %.1f ms, into a dense bf16 one (%.0f MiB) "
              "%.1f ms;\n  largest difference %.2e (bf16's rounding of the largest entry, %.2e: %.2e)\n",
              static_cast<double>(grad_w.size() * 4) / (1 << 20), sparse_ms,
              static_cast<double>(grad_w16.size() * 2) / (1 << 20), dense_ms, gap, largest, largest * 0x1p-8);

  // Gradient filtering (loss_options::gradient_filter, Cut Cross-Entropy's filter_eps per entry):
  // the backward drops every entry of dloss/dlogit below f times the row's upstream gradient, and
  // runs its GEMMs over the classes some row still keeps. A speed / exactness trade-off: this
  // untrained head's softmax is near-uniform (p ~ 1 / N, far below 2^-12), so only the targets'
  // entries survive -- the most time it can save, and the most gradient it drops. On a trained
  // model's peaked softmax far less is dropped (bench/RESULTS.md, "Gradient filtering").
  head_type::gradient_type exact, filtered;
  xs::loss_options filtering;
  filtering.gradient_filter = 0x1p-12f;
  double exact_ms = 1e30, filtered_ms = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    (void)head.forward_backward(h, t, xs::matrix_view<float>(grad_hidden.data(), batch, dim), exact);
    exact_ms = std::min(exact_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    start = std::chrono::steady_clock::now();
    (void)head.forward_backward(h, t, xs::matrix_view<float>(grad_hidden.data(), batch, dim), filtered, filtering);
    filtered_ms = std::min(filtered_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  double dropped = 0, total = 0;
  index_t zero_rows = 0;
  for (index_t c = 0; c < num_classes; ++c) {
    bool zero = true;
    for (index_t p = 0; p < dim; ++p) {
      const std::size_t i = static_cast<std::size_t>(c * dim + p);
      const double e = exact.values[i], f = filtered.values[i];
      dropped += (e - f) * (e - f), total += e * e;
      zero = zero && f == 0.f;
    }
    zero_rows += zero;
  }
  std::printf("\ngradient_filter 2^-12: step %.1f ms (exact %.1f ms); %lld of %lld weight-gradient rows zero; the "
              "dropped part is %.1f %% of the exact gradient's norm\n",
              filtered_ms, exact_ms, static_cast<long long>(zero_rows), static_cast<long long>(num_classes),
              100.0 * std::sqrt(dropped / total));
  return 0;
}
