// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The power-of-two scale the tuned bf16/fp16 gradient GEMMs apply to dLoss/dscore before rounding
/// it to the storage type (dense_tuned.cuh, hs_grouped_tuned.cuh).

#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/types.hpp>

#include <thrust/transform_reduce.h>

#include <cmath>

namespace xsoftmax::detail::gpu {

/// |x| and max for thrust::transform_reduce.
struct abs_value {
  XSOFTMAX_HD float operator()(float x) const { return x < 0 ? -x : x; }
};
struct max_value {
  XSOFTMAX_HD float operator()(float a, float b) const { return a > b ? a : b; }
};

/// A power of two p such that max|upstream| * p is in [1, 2) (1 when every upstream is 0).
/// The softmax gradient of a row is bounded by its upstream value, so G * p is O(1): rounding it
/// to bf16/fp16 for the tensor-core GEMMs keeps its precision (fp16 would otherwise flush the tiny
/// probabilities of a 1M-class softmax times 1/B to zero), and multiplying back by 1/p through the
/// GEMM's alpha is exact.
inline float gradient_scale(const cuda_resources& res, const float* upstream, index_t rows) {
  if (rows == 0) return 1.f;
  const float m = thrust::transform_reduce(backend_traits<cuda>::policy(res), upstream, upstream + rows,
                                           abs_value{}, 0.f, max_value{});
  if (!(m > 0.f) || !std::isfinite(m)) return 1.f;
  int e = -std::ilogb(m);
  e = e < -100 ? -100 : (e > 100 ? 100 : e);  // 2^+-100 and its inverse stay normal floats
  return std::ldexp(1.f, e);
}

}  // namespace xsoftmax::detail::gpu
