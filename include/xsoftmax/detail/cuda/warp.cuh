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

#include <cstdint>

namespace xsoftmax::detail::gpu {

inline constexpr int warp_size = 32;
inline constexpr unsigned full_mask = 0xffffffffu;

/// Sum over the warp by butterfly shuffles: every lane ends with the same value, bit for bit
/// (each step adds the same two operands on both lanes of a pair).
__device__ inline float warp_sum(float v) {
  for (int o = warp_size / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

/// Max over the warp by butterfly shuffles, every lane ending with it; a NaN is passed over (each
/// step keeps x only when x > m), as the host loops' `s > m ? s : m` does.
__device__ inline float warp_max(float m) {
  for (int o = warp_size / 2; o > 0; o >>= 1) {
    const float x = __shfl_xor_sync(full_mask, m, o);
    m = x > m ? x : m;
  }
  return m;
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

/// A row's (max, sum of exp(x - max)) so far: folds one value in, rescaling the sum when the max
/// grows (an online log-sum-exp); -inf values add nothing, NaN and +inf make the sum NaN as the
/// two-pass `block_max_sum` does.
struct max_sum {
  float m = -INFINITY, s = 0.f;
  __device__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.f;  // m = -inf: expf(-inf) = 0
      m = x;
    } else if (x != -INFINITY) {
      s += expf(x - m);
    }
  }
};

/// Two partial (max, sum) pairs as one.
struct combine_max_sum {
  __device__ float2 operator()(const float2& a, const float2& b) const {
    const float m = a.x > b.x ? a.x : b.x;
    if (m == -INFINITY) return make_float2(-INFINITY, 0.f);
    return make_float2(m, a.y * expf(a.x - m) + b.y * expf(b.x - m));
  }
};

/// `block_max_sum` in one pass over the row (each value read once, with 16-byte loads where the row
/// is 16-byte aligned): the result in thread 0 only. Within rounding of the two-pass form, not
/// bitwise. No barrier at the end: call again only after a __syncthreads().
template <int Threads>
__device__ float2 block_online_max_sum(const float* row, index_t n,
                                       typename cub::BlockReduce<float2, Threads>::TempStorage& temp) {
  max_sum acc;
  index_t j0 = 0;
  if ((reinterpret_cast<std::uintptr_t>(row) & 15) == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const index_t n4 = n / 4;
    for (index_t q = threadIdx.x; q < n4; q += Threads) {
      const float4 v = row4[q];
      acc.add(v.x);
      acc.add(v.y);
      acc.add(v.z);
      acc.add(v.w);
    }
    j0 = n4 * 4;
  }
  for (index_t j = j0 + threadIdx.x; j < n; j += Threads) acc.add(row[j]);
  return cub::BlockReduce<float2, Threads>(temp).Reduce(make_float2(acc.m, acc.s), combine_max_sum{});
}

}  // namespace xsoftmax::detail::gpu
