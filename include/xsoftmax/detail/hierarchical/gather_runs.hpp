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

/// Samples a sigmoid loop scores together: their dot products first, then their losses (several
/// independent dot-exp-log1p chains side by side in the core, where one sample at a time left it
/// waiting on each chain). The same values, bitwise, as scoring them one by one.
inline constexpr index_t sigmoid_group = node_lanes;

/// loss[j] = sigmoid_node_loss(s[j], first[j] != 0, &dscore[j]) for j < G: 8 lanes at once for
/// G = `node_lanes` (AVX2 on a host that has it), otherwise one by one. Bitwise the same values.
template <index_t G>
XSOFTMAX_HD inline void sigmoid_node_losses(const float* s, const float* first, float* loss, float* dscore) {
  if constexpr (G == node_lanes) sigmoid_node_loss8(s, first, loss, dscore);
  else
    for (index_t j = 0; j < G; ++j) loss[j] = sigmoid_node_loss(s[j], first[j] != 0.f, dscore + j);
}

/// m <= G (sample row[j], node row wr[j], node bias bias[j]) pairs of a sigmoid level: their
/// losses added to a.loss, *g[j] = dLoss/dscore * upstream (0 without gradients). The G dot
/// products first, then the G losses (`sigmoid_node_losses`); lanes past m score 0 and are dropped.
template <index_t G, class T>
XSOFTMAX_HD inline void score_sigmoid_pairs(const node_run_data<T>& a, const index_t* row, const T* const* wr,
                                            const float* bias, float* const* g, index_t m) {
  float sc[G] = {}, first[G] = {}, loss[G], ds[G];
  for (index_t j = 0; j < m; ++j) {
    const float dot = dot_row8(a.h + row[j] * a.dim, wr[j], a.dim);
    sc[j] = a.bias ? dot + bias[j] : dot;
    first[j] = a.child[row[j]] == 0 ? 1.f : 0.f;
  }
  sigmoid_node_losses<G>(sc, first, loss, ds);
  for (index_t j = 0; j < m; ++j) {
    a.loss[row[j]] += loss[j];
    *g[j] = a.backward() ? ds[j] * a.upstream[row[j]] : 0.f;
  }
}

/// Sigmoid runs [P t, P t + P) of `runs` (short ones) on one thread: first every sample's score,
/// loss and dLoss/dscore * upstream (into the scratch, one value per sample), scored G pairs at a
/// time across the runs (most runs are a few samples deep in the tree: scored one run at a time,
/// their exp/log1p chains would run one after another); then run by run, in sample order, the
/// samples' hidden-gradient rows and the node's gradient row (word2vec form: one row per internal
/// node, p(first child) = sigmoid(h . v)). G = `sigmoid_group` and P = 64 on a host backend; 1 and
/// 1 on a device. Each value is the same, bitwise, for every G and P.
template <class T, index_t G>
struct sigmoid_runs_step {
  node_run_data<T> a;
  const node_run* runs;
  index_t count, per_task;

  XSOFTMAX_HD void operator()(index_t t) const {
    const index_t k0 = t * per_task, k1 = k0 + per_task < count ? k0 + per_task : count, d = a.dim;
    index_t row[G] = {};
    const T* wr[G] = {};
    float bias[G] = {};
    float* g[G] = {};
    index_t m = 0;
    for (index_t k = k0; k < k1; ++k) {
      const node_run run = runs[k];
      const index_t node = run.block_begin / 2;
      for (index_t r = run.begin; r < run.end; ++r) {
        row[m] = r;
        wr[m] = a.w.row(node);
        bias[m] = a.bias ? to_float(a.bias[node]) : 0.f;
        g[m] = a.scratch + run.scratch_offset + (r - run.begin);
        if (++m == G) {
          score_sigmoid_pairs<G>(a, row, wr, bias, g, m);
          m = 0;
        }
      }
    }
    if (m > 0) score_sigmoid_pairs<G>(a, row, wr, bias, g, m);
    if (!a.backward()) return;
    for (index_t k = k0; k < k1; ++k) {
      const node_run run = runs[k];
      const index_t len = run.end - run.begin;
      const T* w = a.w.row(run.block_begin / 2);
      const float* gs = a.scratch + run.scratch_offset;
      float* gwr = a.grad_w + run.grad_offset * d;
      float bias_acc = 0.f;
      for (index_t i = 0; i < len; ++i) {
        const float* h = a.h + (run.begin + i) * d;
        axpy_row(gs[i], w, a.grad_h + (run.begin + i) * d, d);
        if (i == 0)  // the node's gradient row starts as the first sample's term (no zeroing pass)
          scale_row(gs[i], h, gwr, d);
        else
          axpy_row(gs[i], h, gwr, d);
        bias_acc += gs[i];
      }
      if (a.grad_b) a.grad_b[run.grad_offset] = bias_acc;
    }
  }

};

/// One short softmax-node gather run on one thread, fused: run k of `runs`.
template <class T>
struct gather_run_step {
  node_run_data<T> a;
  const node_run* runs;

  XSOFTMAX_HD void operator()(index_t k) const { softmax_run(runs[k]); }

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

/// Pass 1 of a long sigmoid run, samples [G c, G c + G) of it: scores, losses, dLoss/dscore into
/// `gs` (with gradients) and the samples' hidden-gradient rows. G: `sigmoid_group` on a host
/// backend, 1 on a device (a thread per sample).
template <class T, index_t G>
struct sigmoid_sample_step {
  node_run_data<T> a;
  node_run run;
  float* gs;
  XSOFTMAX_HD void operator()(index_t c) const {
    const index_t d = a.dim, len = run.end - run.begin, node = run.block_begin / 2, i0 = c * G;
    const index_t m = len - i0 < G ? len - i0 : G;
    index_t row[G] = {};
    const T* wr[G] = {};
    float bias[G] = {};
    float* g[G] = {};
    for (index_t j = 0; j < m; ++j) {
      row[j] = run.begin + i0 + j;
      wr[j] = a.w.row(node);
      bias[j] = a.bias ? to_float(a.bias[node]) : 0.f;
      g[j] = gs + i0 + j;
    }
    score_sigmoid_pairs<G>(a, row, wr, bias, g, m);
    if (!a.backward()) return;
    for (index_t j = 0; j < m; ++j) axpy_row(gs[i0 + j], wr[j], a.grad_h + row[j] * d, d);
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
  short_runs.reserve(runs.size());
  for (const node_run& run : runs) {
    const index_t len = run.end - run.begin;
    if (!Sigmoid || len < run_parallel_inside) {
      short_runs.push_back(run);
      continue;
    }
    float* gs = a.scratch + run.scratch_offset;
    constexpr index_t G = is_host_backend<B> ? sigmoid_group : 1;
    parallel_for(ex, (len + G - 1) / G, sigmoid_sample_step<T, G>{a, run, gs});
    if (!a.backward()) continue;
    const index_t d = a.dim, blocks = (d + sigmoid_column_block::width - 1) / sigmoid_column_block::width;
    parallel_for(ex, blocks,
                 sigmoid_column_block{a.h + run.begin * d, gs, len, d, a.grad_w + run.grad_offset * d,
                                      a.grad_b ? a.grad_b + run.grad_offset : nullptr});
  }
  const index_t n = static_cast<index_t>(short_runs.size());
  if (n == 0) return;
  // A host backend reads the list where it is; a device gets a copy.
  backend_vector<B, node_run> device_runs(is_host_backend<B> ? 0 : short_runs.size());
  const node_run* list = short_runs.data();
  if constexpr (!is_host_backend<B>) {
    execution<B>::ops::copy(ex.res, raw(device_runs), short_runs.data(), n);
    list = raw(device_runs);
  }
  if constexpr (Sigmoid) {
    constexpr index_t G = is_host_backend<B> ? sigmoid_group : 1, P = is_host_backend<B> ? 64 : 1;
    parallel_for(ex, (n + P - 1) / P, sigmoid_runs_step<T, G>{a, list, n, P});
  } else {
    parallel_for(ex, n, gather_run_step<T>{a, list});
  }
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
