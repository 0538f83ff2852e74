// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Launch helpers of the CUDA kernels: block size, grid sizes for grid-stride loops, thread indices
/// (host <-> device copies: `backend_ops<cuda>::copy`).
///
/// Conventions: all pointers are device pointers unless named `host_*`; every kernel runs on the
/// resources' stream; element offsets are computed in 64-bit `index_t`.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/types.hpp>

namespace xsoftmax::detail::gpu {

/// Threads per block of the element-wise kernels.
inline constexpr int block_threads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than the loop
/// needs, and within the grid limit whatever n is (the loops stride, so any n is covered).
[[nodiscard]] inline unsigned grid_for(index_t n, int threads = block_threads) {
  const index_t blocks = (n + threads - 1) / threads;
  constexpr index_t cap = index_t(1) << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

/// Blocks for kernels with one block per row (rows strided by the grid).
[[nodiscard]] inline unsigned grid_rows(index_t rows) {
  constexpr index_t cap = index_t(1) << 30;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > cap ? cap : rows));
}

/// How many of the n runs (sorted by their first row, member `first`) start at or before row r:
/// the run holding r is the one before, when it reaches r. A binary search; uniform across the
/// threads that share r.
template <class Run>
__device__ index_t runs_started_by(const Run* runs, index_t n, index_t r, index_t Run::*first) {
  index_t lo = 0, hi = n;
  while (lo < hi) {
    const index_t mid = lo + (hi - lo) / 2;
    if (runs[mid].*first <= r) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__device__ inline index_t global_thread() { return static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline index_t grid_threads() { return static_cast<index_t>(gridDim.x) * blockDim.x; }

}  // namespace xsoftmax::detail::gpu
