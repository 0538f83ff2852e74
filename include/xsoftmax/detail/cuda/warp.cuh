// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Warp-level helpers of the tuned CUDA kernels that give one warp to one sample (the hierarchical
/// softmax's gather path and tree search): warp sums and dot products whose result every lane
/// holds, bit for bit.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

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

}  // namespace xsoftmax::detail::gpu
