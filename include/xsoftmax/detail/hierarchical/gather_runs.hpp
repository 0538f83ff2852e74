// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The gather-dot path of a hierarchical-softmax level: the softmax-node runs too short for a GEMM.
/// Each sample is scored against its node's rows read in place (never copied or widened), its loss
/// and dLoss/dscore follow, then its hidden-gradient row and the node's weight-gradient rows,
/// summed over the run's samples in order (deterministic, no atomics), one run per thread.
///
/// Sigmoid nodes take every level at once (sigmoid_levels.hpp) on a backend without a tuned path;
/// this file holds the pieces both share. A backend may specialise `gather_runs_tuning` (the cuda
/// backend: one warp per sample, level by level, both node forms); the generic versions stay its
/// oracles.

#include <xsoftmax/detail/hierarchical/node_runs.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

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

/// A long sigmoid run's node-gradient row, columns [16 cb, 16 cb + 16): each the sum over the run's
/// samples in order of gs[i] * h_i (bitwise `scale_row` then `axpy_row` in sample order, without
/// FMA contraction); block 0 also sums the bias gradient.
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

/// The generic gather path over one level's softmax-node `runs` (host memory, in row order): a
/// task per run. (Sigmoid runs: `sigmoid_levels_generic`, every level at once.)
template <bool Sigmoid, class B, class T>
void gather_runs_generic(const execution<B>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs) {
  static_assert(!Sigmoid, "xsoftmax: sigmoid-node runs take sigmoid_levels_generic (sigmoid_levels.hpp)");
  const index_t n = static_cast<index_t>(runs.size());
  if (n == 0) return;
  // A host backend reads the list where it is; a device gets it uploaded into the call's working
  // memory (`to_scratch`: no cudaMalloc, fill or synchronising cudaFree, and no wait).
  scratch_vector<B, node_run> device_runs;
  if constexpr (!is_host_backend<B>) device_runs = to_scratch(ex, runs);
  parallel_for(ex, n, gather_run_step<T>{a, is_host_backend<B> ? runs.data() : raw(device_runs)});
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
