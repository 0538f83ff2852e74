// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The power-of-two scale the tuned bf16/fp16 gradient GEMMs apply to dLoss/dscore before rounding
/// it to the storage type (dense_tuned.cuh, hs_grouped_tuned.cuh).

#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/types.hpp>

#include <cuda/functional>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <type_traits>

namespace xsoftmax::detail::gpu {

/// Whether the gradient GEMMs of storage type T read G scaled by a power of two (gradient_scale).
/// fp16 needs it: G = (softmax - onehot) * upstream is often far below fp16's smallest normal
/// (2^-14), e.g. 1/N times a mean's 1/B. bf16 has fp32's exponent range, so scaling by a power of
/// two would change no bit of the result: bf16 skips it (and its reduction and host read). fp32
/// GEMMs read G itself.
template <class T>
inline constexpr bool scales_gradient = std::is_same_v<T, __half>;

/// |x|, for thrust::transform_reduce.
struct abs_value {
  XSOFTMAX_HD float operator()(float x) const { return x < 0 ? -x : x; }
};

/// A power of two p such that max|upstream| * p is in [1, 2) (1 when every upstream is 0).
/// The softmax gradient of a row is bounded by its upstream value, so G * p is O(1): rounding it
/// to bf16/fp16 for the tensor-core GEMMs keeps its precision (fp16 would otherwise flush the tiny
/// probabilities of a 1M-class softmax times 1/B to zero), and multiplying back by 1/p through the
/// GEMM's alpha is exact.
inline float gradient_scale(const cuda_resources& res, const float* upstream, index_t rows) {
  if (rows == 0) return 1.f;
  const float m = thrust::transform_reduce(backend_traits<cuda>::policy(res), upstream, upstream + rows,
                                           abs_value{}, 0.f, ::cuda::maximum<float>{});
  if (!(m > 0.f) || !std::isfinite(m)) return 1.f;
  int e = -std::ilogb(m);
  e = e < -100 ? -100 : (e > 100 ? 100 : e);  // 2^+-100 and its inverse stay normal floats
  return std::ldexp(1.f, e);
}

}  // namespace xsoftmax::detail::gpu
