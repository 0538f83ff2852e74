// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The gather-dot path of a hierarchical-softmax level: the runs too short for a GEMM, and every
/// run of sigmoid nodes. Each sample is scored against its node's rows read in place (never
/// copied or widened), its loss and dLoss/dscore follow, then its hidden-gradient row and the
/// node's weight-gradient rows, summed over the run's samples in order (deterministic, no atomics).
///
/// The generic version runs a short run on one thread, fused (no buffer for sigmoid nodes); a long
/// sigmoid run (the root's is most of a binary tree's work) takes two passes over the whole
/// execution: per sample, then per column block of the node's gradient row, each column summed in
/// the one-thread order, so results are bitwise the same for every thread count. A backend may
/// specialise `gather_runs_tuning` (the cuda backend: one warp per sample); the generic version
/// stays its oracle.

#include <xsoftmax/detail/hierarchical/node_runs.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>

#include <vector>

namespace xsoftmax::detail {

/// One short gather run on one thread, fused: run k of `runs`.
template <bool Sigmoid, class T>
struct gather_run_step {
  node_run_data<T> a;
  const node_run* runs;

  XSOFTMAX_HD void operator()(index_t k) const {
    const node_run run = runs[k];
    if constexpr (Sigmoid) sigmoid_run(run);
    else softmax_run(run);
  }

  /// word2vec form: one row per internal node; p(first child) = sigmoid(h . v). One pass per
  /// sample: score, loss, dLoss/dscore, then the sample's hidden-gradient row and the node's
  /// gradient row (`axpy_row`s).
  XSOFTMAX_HD void sigmoid_run(const node_run& run) const {
    const index_t d = a.dim, len = run.end - run.begin, node = run.block_begin / 2;
    const T* wr = a.w.row(node);
    const float b = a.bias ? to_float(a.bias[node]) : 0.f;
    float* gwr = a.backward() ? a.grad_w + run.grad_offset * d : nullptr;
    float bias_acc = 0.f;
    for (index_t i = 0; i < len; ++i) {
      const index_t r = run.begin + i;
      const float* h = a.h + r * d;
      const float sc = a.bias ? dot_row8(h, wr, d) + b : dot_row8(h, wr, d);
      const bool first = a.child[r] == 0;
      float ds = 0.f;
      a.loss[r] += sigmoid_node_loss(sc, first, gwr ? &ds : nullptr);
      if (!gwr) continue;
      const float g = ds * a.upstream[r];
      axpy_row(g, wr, a.grad_h + r * d, d);
      if (i == 0)  // the node's gradient row starts as the first sample's term (no zeroing pass)
        for (index_t p = 0; p < d; ++p) gwr[p] = g * h[p];
      else
        axpy_row(g, h, gwr, d);
      bias_acc += g;
    }
    if (gwr && a.grad_b) a.grad_b[run.grad_offset] = bias_acc;
  }

  /// Softmax over the node's children: scores into the run's scratch (len x block), the loss, and
  /// with gradients G = (softmax - onehot) * upstream in place, then grad_h += G W, grad_w = G^T H.
  XSOFTMAX_HD void softmax_run(const node_run& run) const {
    const index_t d = a.dim, len = run.end - run.begin, bs = run.block_size;
    float* s = a.scratch + run.scratch_offset;
    const float* h = a.h + run.begin * d;
    for (index_t i = 0; i < len; ++i) gather_dot(h + i * d, a.w, a.bias, run.block_begin, bs, s + i * bs);
    for (index_t i = 0; i < len; ++i) {
      const index_t r = run.begin + i;
      float* si = s + i * bs;
      const index_t c = a.child[r];
      const float lse = row_logsumexp(si, bs);
      a.loss[r] += lse - si[c];
      if (a.backward()) {
        const float u = a.upstream[r];
        for (index_t j = 0; j < bs; ++j) si[j] = ::expf(si[j] - lse) * u;
        si[c] -= u;
      }
    }
    if (!a.backward()) return;
    float* gwb = a.grad_w + run.grad_offset * d;
    float* ghr = a.grad_h + run.begin * d;
    for (index_t e = 0; e < bs * d; ++e) gwb[e] = 0.f;
    for (index_t i = 0; i < len; ++i)
      for (index_t j = 0; j < bs; ++j) {
        const float gij = s[i * bs + j];
        const T* wr = a.w.row(run.block_begin + j);
        float* gwr = gwb + j * d;
        for (index_t p = 0; p < d; ++p) {
          ghr[i * d + p] += gij * to_float(wr[p]);
          gwr[p] += gij * h[i * d + p];
        }
      }
    if (a.grad_b)
      for (index_t j = 0; j < bs; ++j) {
        float acc = 0.f;
        for (index_t i = 0; i < len; ++i) acc += s[i * bs + j];
        a.grad_b[run.grad_offset + j] = acc;
      }
  }
};

/// Pass 1 of a long sigmoid run, sample i of it: score, loss, dLoss/dscore into `gs[i]` (with
/// gradients) and the sample's hidden-gradient row.
template <class T>
struct sigmoid_sample_step {
  node_run_data<T> a;
  node_run run;
  float* gs;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t d = a.dim, r = run.begin + i, node = run.block_begin / 2;
    const T* wr = a.w.row(node);
    const float* h = a.h + r * d;
    const float sc = a.bias ? dot_row8(h, wr, d) + to_float(a.bias[node]) : dot_row8(h, wr, d);
    const bool first = a.child[r] == 0;
    float ds = 0.f;
    a.loss[r] += sigmoid_node_loss(sc, first, a.backward() ? &ds : nullptr);
    if (!a.backward()) return;
    const float g = ds * a.upstream[r];
    gs[i] = g;
    axpy_row(g, wr, a.grad_h + r * d, d);
  }
};

/// Pass 2 of a long sigmoid run: columns [16 cb, 16 cb + 16) of the node's gradient row, each the
/// sum over the run's samples in order of gs[i] * h_i; block 0 also sums the bias gradient.
struct sigmoid_column_block {
  static constexpr index_t width = 16;  // 64 bytes of a row per sample and block
  const float* h;                        ///< the run's first row
  const float* gs;
  index_t len, d;
  float* grad_row;
  float* grad_bias;  ///< may be null
  XSOFTMAX_HD void operator()(index_t cb) const {
    const index_t p0 = cb * width, p1 = p0 + width < d ? p0 + width : d;
    float acc[width] = {};
    for (index_t i = 0; i < len; ++i)
      for (index_t p = p0; p < p1; ++p) acc[p - p0] += gs[i] * h[i * d + p];
    for (index_t p = p0; p < p1; ++p) grad_row[p] = acc[p - p0];
    if (cb == 0 && grad_bias) {
      float b = 0.f;
      for (index_t i = 0; i < len; ++i) b += gs[i];
      *grad_bias = b;
    }
  }
};

/// A backend's tuned gather path for storage type T and node form, when it has one: specialised
/// with `available = true` and `run(ex, data, runs)`.
template <class Backend, class T, bool Sigmoid>
struct gather_runs_tuning {
  static constexpr bool available = false;
};

/// The generic gather path over `runs` (one level's; host memory, in row order).
template <bool Sigmoid, class B, class T>
void gather_runs_generic(const execution<B>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs) {
  std::vector<node_run> short_runs;
  for (const node_run& run : runs) {
    const index_t len = run.end - run.begin;
    if (!Sigmoid || len < run_parallel_inside) {
      short_runs.push_back(run);
      continue;
    }
    float* gs = a.scratch + run.scratch_offset;
    parallel_for(ex, len, sigmoid_sample_step<T>{a, run, gs});
    if (!a.backward()) continue;
    const index_t d = a.dim, blocks = (d + sigmoid_column_block::width - 1) / sigmoid_column_block::width;
    parallel_for(ex, blocks,
                 sigmoid_column_block{a.h + run.begin * d, gs, len, d, a.grad_w + run.grad_offset * d,
                                      a.grad_b ? a.grad_b + run.grad_offset : nullptr});
  }
  const index_t n = static_cast<index_t>(short_runs.size());
  if (n == 0) return;
  backend_vector<B, node_run> device_runs(short_runs.size());
  execution<B>::ops::copy(ex.res, raw(device_runs), short_runs.data(), n);
  parallel_for(ex, n, gather_run_step<Sigmoid, T>{a, raw(device_runs)});
}

/// The gather path over one level's `runs`: the backend's tuned version when it has one.
template <bool Sigmoid, class B, class T>
void gather_runs(const execution<B>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs) {
  if (runs.empty()) return;
  using tuning = gather_runs_tuning<B, T, Sigmoid>;
  if constexpr (tuning::available) tuning::run(ex, a, runs);
  else gather_runs_generic<Sigmoid>(ex, a, runs);
}

}  // namespace xsoftmax::detail
