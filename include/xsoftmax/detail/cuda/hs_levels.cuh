// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The kernels of the hierarchical softmax's forward / backward on the `cuda` backend, one group
/// per stage of `hs_run` (hierarchical_softmax.cuh): warp helpers, sorting and run planning, the
/// gather-dot path for short runs and sigmoid nodes, and the grouped dense path for a level's
/// many small GEMM runs. Why each path exists, and what it costs, is in hierarchical_softmax.cuh.

#include <xsoftmax/detail/cuda/packed_batch.cuh>
#include <xsoftmax/detail/cuda/dense.cuh>
#include <xsoftmax/detail/cuda/grouped_gemm.cuh>
#include <xsoftmax/tree/tree_types.hpp>

#include <climits>
#include <cstddef>

namespace xsoftmax::detail::gpu {

/// Blocks at most this wide may use the gather path (its flat buffer holds len x block scores).
inline constexpr index_t gather_max_block = 1024;

// ------------------------------------------------------------------------------------------------
// Warp helpers
// ------------------------------------------------------------------------------------------------

inline constexpr int warp_size = 32;
inline constexpr unsigned full_mask = 0xffffffffu;

/// Sum over the warp by butterfly shuffles: every lane ends with the same value, bit for bit
/// (each step adds the same two operands on both lanes of a pair).
__device__ inline float warp_sum(float v) {
  for (int o = warp_size / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

/// h . w over d elements (both in storage type, widened), lanes striding over d; all lanes get it.
template <class T>
__device__ float warp_dot(const T* h, const T* w, index_t d, int lane) {
  float acc = 0.f;
  for (index_t p = lane; p < d; p += warp_size) acc += to_float(h[p]) * to_float(w[p]);
  return warp_sum(acc);
}

__device__ inline float softplus_f(float x) { return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }
__device__ inline float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// ------------------------------------------------------------------------------------------------
// Sorting and planning
// ------------------------------------------------------------------------------------------------

template <class View>
__global__ void leaf_rank_kernel(View tv, const index_t* target, index_t rows, index_t* key) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) key[r] = tv.leaf_rank(target[r]);
}

/// Row r's node at `level`: key = its block_begin (-1 when r's path ended above), its block size
/// and the child r's target takes.
template <class View>
__global__ void level_steps_kernel(View tv, const index_t* target, index_t rows, int level, index_t* key,
                                   index_t* block_size, index_t* child) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) {
    const index_t t = target[r];
    if (tv.depth(t) > level) {
      const path_step s = tv.step(t, level);
      key[r] = s.block_begin;
      block_size[r] = s.block_size;
      child[r] = s.child;
    } else {
      key[r] = -1;
      block_size[r] = 0;
      child[r] = 0;
    }
  }
}

/// A run of sorted rows sharing one node at one level, and where its gradient rows go.
struct level_run {
  int level = 0;
  index_t begin = 0, end = 0;  ///< sorted rows
  index_t block_begin = 0, block_size = 0;
  index_t grad_offset = 0;  ///< first row of this run's block in the sparse gradient
};

/// A gather-path run as the kernels see it. `g_offset`: the run's first entry in the level's flat
/// buffer, which holds (end - begin) x width values (width = block_size, 1 for sigmoid nodes).
struct gather_run {
  index_t begin, end, block_begin, block_size, grad_offset, g_offset;
};

// ------------------------------------------------------------------------------------------------
// Gather-dot path
// ------------------------------------------------------------------------------------------------

/// One warp per sorted row r in a gather run of this level (rows of other runs, or whose path
/// ended, are skipped): scores against the node's rows read in place, loss[r] += -log p(child),
/// and, when grad_h is given, the row's dLoss/dscore into the flat buffer and grad_h[r] += G W.
/// The flat buffer `g` must be given for softmax nodes even without gradients (it holds scores).
template <bool Sigmoid, class T>
__global__ void gather_level_kernel(const gather_run* runs, index_t n_runs, index_t rows, const T* hs, index_t d,
                                    matrix_view<const T> w, const T* bias, const index_t* child,
                                    const float* upstream, float* loss, float* g, float* grad_h) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const index_t warps = grid_threads() / warp_size;
  for (index_t r = global_thread() / warp_size; r < rows; r += warps) {
    // The run holding r: the last one with begin <= r (runs are in row order). Warp-uniform.
    index_t lo = 0, hi = n_runs;
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (runs[mid].begin <= r) lo = mid + 1;
      else hi = mid;
    }
    if (lo == 0) continue;
    const gather_run run = runs[lo - 1];
    if (r >= run.end) continue;
    const T* h = hs + r * d;
    const index_t i = r - run.begin;
    const index_t c = child[r];
    if constexpr (Sigmoid) {
      // word2vec form: one row per internal node; p(first child) = sigmoid(h . v).
      const index_t node = run.block_begin / 2;
      const T* wr = w.row(node);
      const float s = warp_dot(h, wr, d, lane) + (bias ? to_float(bias[node]) : 0.f);
      const bool first = c == 0;
      if (lane == 0) loss[r] += softplus_f(first ? -s : s);
      if (grad_h) {
        const float gs = (sigmoid_f(s) - (first ? 1.f : 0.f)) * upstream[r];
        if (lane == 0) g[run.g_offset + i] = gs;
        for (index_t p = lane; p < d; p += warp_size) grad_h[r * d + p] += gs * to_float(wr[p]);
      }
    } else {
      const index_t bs = run.block_size;
      float* sr = g + run.g_offset + i * bs;
      float m = -INFINITY;
      for (index_t j = 0; j < bs; ++j) {
        const index_t row = run.block_begin + j;
        const float s = warp_dot(h, w.row(row), d, lane) + (bias ? to_float(bias[row]) : 0.f);
        if (lane == 0) sr[j] = s;
        m = s > m ? s : m;  // identical on every lane
      }
      __syncwarp();  // lane 0's score writes are visible to the warp
      float part = 0.f;
      for (index_t j = lane; j < bs; j += warp_size) part += expf(sr[j] - m);
      const float lse = m + logf(warp_sum(part));
      if (lane == 0) loss[r] += lse - sr[c];
      if (grad_h) {
        const float u = upstream[r];
        __syncwarp();  // every lane has read the scores it needs before they are overwritten
        for (index_t j = lane; j < bs; j += warp_size) {
          float gj = expf(sr[j] - lse) * u;
          if (j == c) gj -= u;
          sr[j] = gj;
        }
        __syncwarp();  // G visible to the warp
        for (index_t j = 0; j < bs; ++j) {
          const float gj = sr[j];
          const T* wr = w.row(run.block_begin + j);
          for (index_t p = lane; p < d; p += warp_size) grad_h[r * d + p] += gj * to_float(wr[p]);
        }
      }
    }
  }
}

/// Weight (and bias) gradient of the gather runs: block (run, y) handles the run's child rows
/// j = y, y + gridDim.y, ...; thread p sums G_ij * h_i[p] over the run's rows i in order.
template <bool Sigmoid, class T>
__global__ void gather_weight_grad_kernel(const gather_run* runs, const float* g, const T* hs, index_t d,
                                          float* grad_w, float* grad_b) {
  const gather_run run = runs[blockIdx.x];
  const index_t len = run.end - run.begin, width = Sigmoid ? 1 : run.block_size;
  const float* gr = g + run.g_offset;
  for (index_t j = blockIdx.y; j < width; j += gridDim.y) {
    float* out = grad_w + (run.grad_offset + j) * d;
    for (index_t p = threadIdx.x; p < d; p += blockDim.x) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += gr[i * width + j] * to_float(hs[(run.begin + i) * d + p]);
      out[p] = acc;
    }
    if (grad_b && threadIdx.x == 0) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += gr[i * width + j];
      grad_b[run.grad_offset + j] = acc;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Grouped dense path
// ------------------------------------------------------------------------------------------------

/// Scores (fp32 values) of one grouped batch at most; a batch holding a single run may exceed it.
/// 64 MiB of fp32 scores, twice what one run's chunk of the per-run path may take.
inline constexpr index_t grouped_budget_values = index_t(1) << 24;

/// A dense run of a grouped batch as the kernels see it. `row0`: its first row among the batch's
/// rows (the runs' rows counted in order); `s_offset`: where its scores (end - begin) x block_size,
/// row-major, start in the batch's buffer.
struct dense_run {
  index_t begin, end, block_begin, block_size, grad_offset, row0, s_offset;
};

/// One block per row of a grouped batch (runs' rows in order, `rows` in all): the same arithmetic
/// as dense_lse + dense_losses for a block that fits one chunk (lse_chunk_kernel's reductions):
/// adds the bias to the row's scores in place, loss[r] += lse - s[child]; and when `want_grad`,
/// turns the row into G = (softmax - onehot) * upstream in place (softmax_grad_kernel's formula),
/// with a storage-type copy scaled by `grad_scale` when `g_storage` is given.
template <int Threads, class T>
__global__ void __launch_bounds__(Threads)
    grouped_rows_kernel(const dense_run* runs, index_t n_runs, index_t rows, float* scores, T* g_storage,
                        const T* bias, const index_t* child, const float* upstream, float* loss, bool want_grad,
                        float grad_scale) {
  using block_reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename block_reduce::TempStorage temp;
  __shared__ float row_max, row_lse;
  for (index_t t = blockIdx.x; t < rows; t += gridDim.x) {
    // The run holding t: the last one with row0 <= t (block-uniform).
    index_t lo = 0, hi = n_runs;
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (runs[mid].row0 <= t) lo = mid + 1;
      else hi = mid;
    }
    const dense_run run = runs[lo - 1];
    const index_t i = t - run.row0, r = run.begin + i, bs = run.block_size;
    float* row = scores + run.s_offset + i * bs;
    const T* b = bias ? bias + run.block_begin : nullptr;
    float local_max = -INFINITY;
    for (index_t j = threadIdx.x; j < bs; j += Threads) {
      float v = row[j];
      if (b) {
        v += to_float(b[j]);
        row[j] = v;
      }
      local_max = v > local_max ? v : local_max;
    }
    const float m_reduced = block_reduce(temp).Reduce(local_max, max_op{});  // valid in thread 0
    if (threadIdx.x == 0) row_max = m_reduced;
    __syncthreads();  // publishes row_max and the biased row; frees `temp`
    const float m = row_max;
    float local_sum = 0.f;
    if (m != -INFINITY)
      for (index_t j = threadIdx.x; j < bs; j += Threads) local_sum += expf(row[j] - m);
    const float sum = block_reduce(temp).Sum(local_sum);  // valid in thread 0
    const index_t c = child[r];
    if (threadIdx.x == 0) {
      const float lse = m != -INFINITY ? m + logf(sum) : -INFINITY;
      row_lse = lse;
      loss[r] += lse - row[c];
    }
    __syncthreads();  // publishes row_lse; every thread has read what thread 0 reads above
    if (want_grad) {
      const float lse = row_lse, u = upstream[r];
      T* gs = g_storage ? g_storage + run.s_offset + i * bs : nullptr;
      for (index_t j = threadIdx.x; j < bs; j += Threads) {
        float g = expf(row[j] - lse) * u;
        if (j == c) g -= u;
        row[j] = g;
        if (gs) gs[j] = from_float<T>(g * grad_scale);
      }
    }
    __syncthreads();  // `temp`, row_max and row_lse are reused by the next row
  }
}

/// Bias gradient of a grouped batch: block x handles runs x, x + gridDim.x, ...; thread j sums
/// column j of the run's G over its rows in order (as column_sums_kernel).
template <class Unused = void>
__global__ void grouped_bias_grad_kernel(const dense_run* runs, index_t n_runs, const float* g, float* grad_b) {
  for (index_t k = blockIdx.x; k < n_runs; k += gridDim.x) {
    const dense_run run = runs[k];
    const index_t len = run.end - run.begin, bs = run.block_size;
    const float* gr = g + run.s_offset;
    for (index_t j = threadIdx.x; j < bs; j += blockDim.x) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += gr[i * bs + j];
      grad_b[run.grad_offset + j] = acc;
    }
  }
}

/// A batch of grouped runs (entries [first, first + count) of the call's dense_run list), its
/// GEMMs and where their device pointer arrays start.
template <class T>
struct grouped_batch {
  std::size_t first = 0, count = 0;
  index_t rows = 0, values = 0, max_block = 0;
  grouped_gemm<T> scores, grads;
  std::size_t scores_ptrs = 0, grads_ptrs = 0;  ///< offsets in the call's device pointer array
};


}  // namespace xsoftmax::detail::gpu
