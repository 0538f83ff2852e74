// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA specialisation of the hierarchical softmax's gather path
/// (detail/hierarchical/gather_runs.hpp): one warp per sample instead of one thread per run, so a
/// level's many short runs fill the GPU (one block per sample when the level's blocks are wide:
/// `gather_level_wide_kernel`). The warp reads the node's rows in place, writes the
/// sample's dLoss/dscore values to the level's scratch and adds into its own grad_hidden row; then
/// one block per (run, child row) sums G_ij * h_i over the run's samples in order. Same results as
/// the generic version up to summation order inside a dot product (the lanes' partial sums); no
/// atomics, deterministic. The generic version is its oracle in the GPU tests.

#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/warp.cuh>
#include <xsoftmax/detail/hierarchical/gather_runs.hpp>

#include <algorithm>
#include <climits>
#include <vector>

namespace xsoftmax::detail {
namespace gpu {

/// One warp per sorted row r in [row0, row0 + rows) that lies in one of the level's gather runs:
/// scores against the node's rows, loss[r] += -log p(child), and with gradients the row's
/// dLoss/dscore into the scratch and grad_h[r] += G W.
template <bool Sigmoid, class T>
__global__ void gather_level_kernel(const node_run* runs, index_t n_runs, index_t row0, index_t rows,
                                    node_run_data<T> a) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const index_t warps = grid_threads() / warp_size, d = a.dim;
  for (index_t r = row0 + global_thread() / warp_size; r < row0 + rows; r += warps) {
    // The run holding r: the last one with begin <= r (runs are in row order). Warp-uniform.
    const index_t lo = runs_started_by(runs, n_runs, r, &node_run::begin);
    if (lo == 0) continue;
    const node_run run = runs[lo - 1];
    if (r >= run.end) continue;
    const float* h = a.h + r * d;
    const index_t i = r - run.begin, c = a.child[r];
    if constexpr (Sigmoid) {
      const index_t node = run.block_begin / 2;
      const T* wr = a.w.row(node);
      const float s = warp_dot(h, wr, d, lane) + (a.bias ? to_float(a.bias[node]) : 0.f);
      const bool first = c == 0;
      if (lane == 0) a.loss[r] += softplus(first ? -s : s);
      if (a.backward()) {
        const float gs = (sigmoid(s) - (first ? 1.f : 0.f)) * a.upstream[r];
        if (lane == 0) a.scratch[run.scratch_offset + i] = gs;
        for (index_t p = lane; p < d; p += warp_size) a.grad_h[r * d + p] += gs * to_float(wr[p]);
      }
    } else {
      const index_t bs = run.block_size;
      float* sr = a.scratch + run.scratch_offset + i * bs;
      float m = -INFINITY;
      for (index_t j = 0; j < bs; ++j) {
        const index_t row = run.block_begin + j;
        const float s = warp_dot(h, a.w.row(row), d, lane) + (a.bias ? to_float(a.bias[row]) : 0.f);
        if (lane == 0) sr[j] = s;
        m = s > m ? s : m;  // identical on every lane
      }
      __syncwarp();  // lane 0's score writes are visible to the warp
      float part = 0.f;
      for (index_t j = lane; j < bs; j += warp_size) part += expf(sr[j] - m);
      const float lse = m + logf(warp_sum(part));
      if (lane == 0) a.loss[r] += lse - sr[c];
      if (a.backward()) {
        const float u = a.upstream[r];
        __syncwarp();  // every lane has read the scores it needs before they are overwritten
        for (index_t j = lane; j < bs; j += warp_size) {
          float gj = expf(sr[j] - lse) * u;
          if (j == c) gj -= u;
          sr[j] = gj;
        }
        __syncwarp();  // G visible to the warp
        for (index_t j = 0; j < bs; ++j) {
          const float gj = sr[j];
          const T* wr = a.w.row(run.block_begin + j);
          for (index_t p = lane; p < d; p += warp_size) a.grad_h[r * d + p] += gj * to_float(wr[p]);
        }
      }
    }
  }
}

/// Blocks of at least this many children take `gather_level_wide_kernel`: with one warp scoring a
/// 1024-child node alone (1024 dependent dot products), the level took 9.4 ms a call on an H100
/// (bench/RESULTS.md, "second GPU session").
inline constexpr index_t gather_wide_block = 64;

/// `gather_level_kernel` for softmax nodes with wide blocks: one block of Threads threads per
/// sorted row, its warps splitting the node's children (a warp per child's dot product, as there),
/// the row's max and sum of exp by block reductions (`block_max_sum`), and grad_h's columns split
/// over the threads, each adding G_j w_j[p] over the children j in order (the warp kernel's order).
template <int Threads, class T>
__global__ void __launch_bounds__(Threads)
    gather_level_wide_kernel(const node_run* runs, index_t n_runs, index_t row0, index_t rows, node_run_data<T> a) {
  __shared__ typename cub::BlockReduce<float, Threads>::TempStorage temp;
  constexpr int warps = Threads / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size, warp = static_cast<int>(threadIdx.x) / warp_size;
  const index_t d = a.dim;
  for (index_t r = row0 + blockIdx.x; r < row0 + rows; r += gridDim.x) {
    // The run holding r (block-uniform, so the barriers below are reached by every thread).
    const index_t lo = runs_started_by(runs, n_runs, r, &node_run::begin);
    if (lo == 0) continue;
    const node_run run = runs[lo - 1];
    if (r >= run.end) continue;
    const float* h = a.h + r * d;
    const index_t i = r - run.begin, c = a.child[r], bs = run.block_size;
    float* sr = a.scratch + run.scratch_offset + i * bs;
    for (index_t j = warp; j < bs; j += warps) {
      const index_t row = run.block_begin + j;
      const float s = warp_dot(h, a.w.row(row), d, lane) + (a.bias ? to_float(a.bias[row]) : 0.f);
      if (lane == 0) sr[j] = s;
    }
    __syncthreads();  // every score written before any thread reads them
    const float2 ms = block_max_sum<Threads>(sr, bs, temp);
    const float lse = ms.x != -INFINITY ? ms.x + logf(ms.y) : -INFINITY;
    // The thread that owns entry c (it overwrites it below, after this read).
    if (threadIdx.x == c % Threads) a.loss[r] += lse - sr[c];
    if (!a.backward()) continue;
    const float u = a.upstream[r];
    for (index_t j = threadIdx.x; j < bs; j += Threads) {
      float gj = expf(sr[j] - lse) * u;
      if (j == c) gj -= u;
      sr[j] = gj;
    }
    __syncthreads();  // G visible to the block
    for (index_t p = threadIdx.x; p < d; p += Threads) {
      float acc = a.grad_h[r * d + p];
      for (index_t j = 0; j < bs; ++j) acc += sr[j] * to_float(a.w.row(run.block_begin + j)[p]);
      a.grad_h[r * d + p] = acc;
    }
  }
}

/// Weight (and bias) gradient of the gather runs: block (run, y) handles the run's child rows
/// j = y, y + gridDim.y, ...; thread p sums G_ij * h_i[p] over the run's rows i in order.
template <bool Sigmoid, class T>
__global__ void gather_weight_grad_kernel(const node_run* runs, node_run_data<T> a) {
  const node_run run = runs[blockIdx.x];
  const index_t d = a.dim, len = run.end - run.begin, width = Sigmoid ? 1 : run.block_size;
  const float* g = a.scratch + run.scratch_offset;
  for (index_t j = blockIdx.y; j < width; j += gridDim.y) {
    float* out = a.grad_w + (run.grad_offset + j) * d;
    for (index_t p = threadIdx.x; p < d; p += blockDim.x) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += g[i * width + j] * a.h[(run.begin + i) * d + p];
      out[p] = acc;
    }
    if (a.grad_b && threadIdx.x == 0) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += g[i * width + j];
      a.grad_b[run.grad_offset + j] = acc;
    }
  }
}

}  // namespace gpu

template <class T, bool Sigmoid>
struct gather_runs_tuning<::xsoftmax::cuda, T, Sigmoid> {
  static constexpr bool available = true;

  static void run(const execution<::xsoftmax::cuda>& ex, const node_run_data<T>& a,
                  const std::vector<node_run>& runs) {
    const cudaStream_t stream = ex.res.stream();
    const index_t n_runs = static_cast<index_t>(runs.size());
    backend_vector<::xsoftmax::cuda, node_run> device_runs(runs.size());
    backend_ops<::xsoftmax::cuda>::copy(ex.res, raw(device_runs), runs.data(), n_runs);
    const index_t row0 = runs.front().begin, rows = runs.back().end - row0;
    index_t max_width = 1;
    for (const node_run& run : runs) max_width = std::max(max_width, Sigmoid ? index_t(1) : run.block_size);
    constexpr int warps_per_block = gpu::block_threads / gpu::warp_size;
    if (!Sigmoid && max_width >= gpu::gather_wide_block)
      gpu::gather_level_wide_kernel<gpu::block_threads, T><<<gpu::grid_rows(rows), gpu::block_threads, 0, stream>>>(
          raw(device_runs), n_runs, row0, rows, a);
    else
      gpu::gather_level_kernel<Sigmoid, T><<<gpu::grid_for(rows, warps_per_block), gpu::block_threads, 0, stream>>>(
          raw(device_runs), n_runs, row0, rows, a);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    if (!a.backward()) return;
    expects(n_runs <= static_cast<index_t>(INT_MAX), "hierarchical_softmax: ", n_runs,
            " gather runs in one level exceed the CUDA grid limit");
    const dim3 grid(static_cast<unsigned>(n_runs), static_cast<unsigned>(std::min<index_t>(max_width, 64)));
    gpu::gather_weight_grad_kernel<Sigmoid, T><<<grid, 128, 0, stream>>>(raw(device_runs), a);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace xsoftmax::detail
