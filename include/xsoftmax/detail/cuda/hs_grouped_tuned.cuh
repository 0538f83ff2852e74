// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA specialisation of the hierarchical softmax's GEMM path
/// (detail/hierarchical/dense_runs.hpp): a level's dense runs whose node block fits one chunk of
/// scores go through one grouped scores GEMM, one segmented kernel (bias, log-sum-exp, target
/// logit, loss, dLoss/dscore), one grouped GEMM for both gradients of every run and one bias-sum
/// kernel, whatever the level's node count (see `xsoftmax::dense_grouping`). A level with
/// thousands of small nodes is otherwise launch-bound (~6+ launches per run, each doing a few
/// kFLOPs). FLOPs: the same, minus the backward's recomputation of the scores (kept from the
/// forward here). Bytes: the same weight, hidden and gradient traffic; the scores of every grouped
/// run are held at once, in batches of at most `grouped_budget_values` values. cuBLAS's grouped
/// GEMM takes no 16-bit inputs with fp32 outputs, so for bf16/fp16 storage the GEMMs stay one per
/// run (grouped_gemm.cuh) and only the kernels are grouped. The other runs take the generic path
/// (`dense_run`, one dense softmax each), which is also the grouped path's oracle in the tests.

#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/detail/cuda/gradient_scale.cuh>
#include <xsoftmax/detail/cuda/grouped_gemm.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/warp.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>
#include <xsoftmax/detail/hierarchical/dense_runs.hpp>
#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {
namespace gpu {

/// Scores (fp32 values) of one grouped batch at most; a batch holding a single run may exceed it.
/// 64 MiB of fp32 scores, twice what one run's chunk of the per-run path may take.
inline constexpr index_t grouped_budget_values = index_t(1) << 24;

/// A dense run of a grouped batch as the kernels see it. `row0`: its first row among the batch's
/// rows (the runs' rows counted in order); `s_offset`: where its scores (end - begin) x block_size,
/// row-major, start in the batch's buffer.
struct grouped_run {
  index_t begin, end, block_begin, block_size, grad_offset, row0, s_offset;
};

/// One block per row of a grouped batch (runs' rows in order, `rows` in all): the dense softmax's
/// arithmetic for a block that fits one chunk (block_max_sum's reductions): adds the bias to the
/// row's scores in place, loss[r] += lse - s[child]; and when `want_grad`, turns the row into
/// G = (softmax - onehot) * upstream in place, with a storage-type copy scaled by `grad_scale` when
/// `g_storage` is given.
template <int Threads, class T>
__global__ void __launch_bounds__(Threads)
    grouped_rows_kernel(const grouped_run* runs, index_t n_runs, index_t rows, float* scores, T* g_storage,
                        const T* bias, const index_t* child, const float* upstream, float* loss, bool want_grad,
                        float grad_scale) {
  __shared__ typename cub::BlockReduce<float, Threads>::TempStorage temp;
  for (index_t t = blockIdx.x; t < rows; t += gridDim.x) {
    // The run holding t: the last one with row0 <= t (block-uniform).
    const grouped_run run = runs[runs_started_by(runs, n_runs, t, &grouped_run::row0) - 1];
    const index_t i = t - run.row0, r = run.begin + i, bs = run.block_size, c = child[r];
    float* row = scores + run.s_offset + i * bs;
    if (bias)  // in place: later passes read biased scores; each thread keeps to its own entries
      for (index_t j = threadIdx.x; j < bs; j += Threads) row[j] += to_float(bias[run.block_begin + j]);
    const float2 ms = block_max_sum<Threads>(row, bs, temp);
    const float lse = ms.x != -INFINITY ? ms.x + logf(ms.y) : -INFINITY;
    if (threadIdx.x == c % Threads) loss[r] += lse - row[c];  // the thread that owns entry c
    if (!want_grad) continue;
    const float u = upstream[r];
    T* gs = g_storage ? g_storage + run.s_offset + i * bs : nullptr;
    for (index_t j = threadIdx.x; j < bs; j += Threads) {
      float g = expf(row[j] - lse) * u;
      if (j == c) g -= u;
      row[j] = g;
      if (gs) gs[j] = from_float<T>(g * grad_scale);
    }
  }
}

/// Bias gradient of a grouped batch: block x handles runs x, x + gridDim.x, ...; thread j sums
/// column j of the run's G over its rows in order (as the dense softmax's bias gradient).
template <class Unused = void>
__global__ void grouped_bias_grad_kernel(const grouped_run* runs, index_t n_runs, const float* g, float* grad_b) {
  for (index_t k = blockIdx.x; k < n_runs; k += gridDim.x) {
    const grouped_run run = runs[k];
    const index_t len = run.end - run.begin, bs = run.block_size;
    const float* gr = g + run.s_offset;
    for (index_t j = threadIdx.x; j < bs; j += blockDim.x) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += gr[i * bs + j];
      grad_b[run.grad_offset + j] = acc;
    }
  }
}

/// A batch of grouped runs (entries [first, first + count) of the call's grouped_run list), its
/// GEMMs and where their device pointer arrays start.
template <class T>
struct grouped_batch {
  std::size_t first = 0, count = 0;
  index_t rows = 0, values = 0, max_block = 0;
  grouped_gemm<T> scores, grads;
  std::size_t scores_ptrs = 0, grads_ptrs = 0;  ///< offsets in the call's device pointer array
};

/// Runs the grouped batches of one level: `runs` are the level's eligible dense runs.
template <class T>
void run_grouped_level(const execution<::xsoftmax::cuda>& ex, const node_run_data<T>& a,
                       const std::vector<node_run>& runs) {
  const cuda_resources& res = ex.res;
  const cudaStream_t stream = res.stream();
  constexpr bool fp32 = std::is_same_v<T, float>;
  const index_t d = a.dim;
  const bool want_grad = a.backward();
  // Batches of at most grouped_budget_values scores.
  std::vector<grouped_run> grouped;
  std::vector<grouped_batch<T>> batches;
  index_t grouped_values = 0, row_lo = runs.front().begin, row_hi = runs.back().end;
  for (const node_run& run : runs) {
    const index_t len = run.end - run.begin, values = len * run.block_size;
    if (batches.empty() || batches.back().values + values > grouped_budget_values) {
      batches.emplace_back();
      batches.back().first = grouped.size();
    }
    grouped_batch<T>& bt = batches.back();
    grouped.push_back({run.begin, run.end, run.block_begin, run.block_size, run.grad_offset, bt.rows, bt.values});
    ++bt.count;
    bt.rows += len;
    bt.values += values;
    bt.max_block = std::max(bt.max_block, run.block_size);
    grouped_values = std::max(grouped_values, bt.values);
  }
  arena scratch(res.workspace());
  float* g_scores = scratch.take<float>(grouped_values);
  T* g_storage = want_grad && !fp32 ? scratch.take<T>(grouped_values) : nullptr;
  // The GEMMs read the rows in the storage type: fp32 rows in place, else narrowed once.
  const T* hs = reinterpret_cast<const T*>(a.h);
  if constexpr (!fp32) {
    T* narrowed = scratch.take<T>((row_hi - row_lo) * d);
    rows_to_storage(ex, matrix_view<const float>(a.h + row_lo * d, row_hi - row_lo, d), narrowed);
    hs = narrowed - row_lo * d;  // indexed by sorted row, like a.h
  }
  const float g_scale = want_grad && scales_gradient<T> ? gradient_scale(res, a.upstream + row_lo, row_hi - row_lo)
                                                        : 1.f;
  const float g_alpha = 1.f / g_scale;  // exact: a power of two
  const T* g_values = fp32 ? reinterpret_cast<const T*>(g_scores) : g_storage;  // G as the GEMMs read it
  std::vector<const void*> host_ptrs;
  for (grouped_batch<T>& bt : batches) {
    for (std::size_t k = bt.first; k < bt.first + bt.count; ++k) {
      const grouped_run& run = grouped[k];
      const index_t len = run.end - run.begin, bs = run.block_size;
      const T* h_run = hs + run.begin * d;
      const T* w_block = a.w.row(run.block_begin);
      // S (len x bs) = H_run W_block^T
      bt.scores.add({op::none, op::transpose, len, bs, d, 1.f, h_run, d, w_block, a.w.stride, 0.f,
                     g_scores + run.s_offset, bs});
      if (want_grad) {
        // grad_h[run] += G W_block;  grad_w[grad_offset ...] = G^T H_run
        bt.grads.add({op::none, op::none, len, d, bs, g_alpha, g_values + run.s_offset, bs, w_block, a.w.stride,
                      1.f, a.grad_h + run.begin * d, d});
        bt.grads.add({op::transpose, op::none, bs, d, len, g_alpha, g_values + run.s_offset, bs, h_run, d, 0.f,
                      a.grad_w + run.grad_offset * d, d});
      }
    }
    bt.scores_ptrs = host_ptrs.size();
    bt.scores.pointers(host_ptrs);
    bt.grads_ptrs = host_ptrs.size();
    bt.grads.pointers(host_ptrs);
  }
  grouped_run* d_runs = scratch.take<grouped_run>(static_cast<index_t>(grouped.size()));
  const void** d_ptrs = scratch.take<const void*>(static_cast<index_t>(host_ptrs.size()));
  backend_ops<::xsoftmax::cuda>::upload(res, d_runs, grouped.data(), static_cast<index_t>(grouped.size()));
  backend_ops<::xsoftmax::cuda>::upload(res, d_ptrs, host_ptrs.data(), static_cast<index_t>(host_ptrs.size()));
  for (const grouped_batch<T>& bt : batches) {
    const grouped_run* dr = d_runs + bt.first;
    const index_t n = static_cast<index_t>(bt.count);
    bt.scores.run(res.cublas(), d_ptrs + bt.scores_ptrs);
    T* gst = want_grad ? g_storage : nullptr;
    // Narrow blocks (the common case in deep trees) waste fewer idle threads with one warp per row.
    if (bt.max_block <= 2 * warp_size)
      grouped_rows_kernel<warp_size, T><<<grid_rows(bt.rows), warp_size, 0, stream>>>(
          dr, n, bt.rows, g_scores, gst, a.bias, a.child, a.upstream, a.loss, want_grad, g_scale);
    else
      grouped_rows_kernel<block_threads, T><<<grid_rows(bt.rows), block_threads, 0, stream>>>(
          dr, n, bt.rows, g_scores, gst, a.bias, a.child, a.upstream, a.loss, want_grad, g_scale);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    if (!want_grad) continue;
    bt.grads.run(res.cublas(), d_ptrs + bt.grads_ptrs);
    if (a.grad_b) {
      grouped_bias_grad_kernel<><<<grid_rows(n), 128, 0, stream>>>(dr, n, g_scores, a.grad_b);
      XSOFTMAX_CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace gpu

template <class T>
struct dense_runs_tuning<::xsoftmax::cuda, T> {
  static constexpr bool available = true;

  /// Groups the level's runs whose block fits one chunk when `grouping` says so; the others (or
  /// all, for `per_run`) run one by one through the generic dense softmax.
  static void run(const execution<::xsoftmax::cuda>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs,
                  xsoftmax::dense_grouping grouping) {
    std::vector<node_run> eligible, rest;
    for (const node_run& run : runs)
      (default_chunk_columns(run.end - run.begin) >= run.block_size ? eligible : rest).push_back(run);
    const bool group = grouping == xsoftmax::dense_grouping::grouped
                           ? !eligible.empty()
                           : grouping == xsoftmax::dense_grouping::automatic && eligible.size() >= 2;
    if (group) gpu::run_grouped_level(ex, a, eligible);  // its workspace arena ends here
    else rest.insert(rest.end(), eligible.begin(), eligible.end());
    for (const node_run& run : rest) dense_run(ex, a, run);
  }
};

}  // namespace xsoftmax::detail
