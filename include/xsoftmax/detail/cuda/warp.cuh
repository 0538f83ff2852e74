// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Reductions of the tuned CUDA kernels: for those that give one warp to one sample (the
/// hierarchical softmax's gather path), warp sums and dot products whose result every lane holds,
/// bit for bit; for those that give one block to one row of scores, the row's max and sum of exp.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda/functional>

namespace xsoftmax::detail::gpu {

inline constexpr int warp_size = 32;
inline constexpr unsigned full_mask = 0xffffffffu;

/// Sum over the warp by butterfly shuffles: every lane ends with the same value, bit for bit
/// (each step adds the same two operands on both lanes of a pair).
__device__ inline float warp_sum(float v) {
  for (int o = warp_size / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

/// h . w over d elements (each widened to fp32), lanes striding over d; all lanes get it.
template <class H, class T>
__device__ float warp_dot(const H* h, const T* w, index_t d, int lane) {
  float acc = 0.f;
  for (index_t p = lane; p < d; p += warp_size) acc += to_float(h[p]) * to_float(w[p]);
  return warp_sum(acc);
}

/// (max, sum of exp(x - max)) of row[0, n) by a block of Threads threads, in every thread ((-inf, 0)
/// for a row of -inf: -inf - -inf would be NaN). Each thread reads the entries j = threadIdx.x +
/// k * Threads (it may have written them just before). Ends with a barrier: `temp` is free again.
template <int Threads>
__device__ float2 block_max_sum(const float* row, index_t n,
                                typename cub::BlockReduce<float, Threads>::TempStorage& temp) {
  using block_reduce = cub::BlockReduce<float, Threads>;
  __shared__ float2 result;
  float local_max = -INFINITY;
  for (index_t j = threadIdx.x; j < n; j += Threads) local_max = row[j] > local_max ? row[j] : local_max;
  const float m = block_reduce(temp).Reduce(local_max, ::cuda::maximum<float>{});  // valid in thread 0
  if (threadIdx.x == 0) result.x = m;
  __syncthreads();  // publishes the max; frees `temp`
  const float mx = result.x;
  float local_sum = 0.f;
  if (mx != -INFINITY)
    for (index_t j = threadIdx.x; j < n; j += Threads) local_sum += expf(row[j] - mx);
  const float sum = block_reduce(temp).Sum(local_sum);  // valid in thread 0
  if (threadIdx.x == 0) result.y = sum;
  __syncthreads();  // publishes the sum
  const float2 out = result;
  __syncthreads();  // every thread has read `result` (rewritten by the next call) and `temp` is free
  return out;
}

}  // namespace xsoftmax::detail::gpu
