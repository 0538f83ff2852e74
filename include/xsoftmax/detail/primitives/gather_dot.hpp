// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Gather-dot: one fp32 hidden row against a block of weight rows read in place in their storage
/// type, never copied. The per-sample path of the hierarchical softmax (deep or binary trees, small
/// runs) and of tree search.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax::detail {

/// h . w over `d` elements with 16 independent partial sums: a single running sum is a chain of
/// dependent adds the compiler may not reorder (no -ffast-math), i.e. one add per FP-add latency;
/// 16 lanes let it use one SIMD register (and stay deterministic: the order is fixed).
template <class T>
XSOFTMAX_HD inline float dot_row(const float* h, const T* w, index_t d) {
  constexpr index_t lanes = 16;
  float acc[lanes] = {};
  index_t p = 0;
  for (; p + lanes <= d; p += lanes)
    for (index_t k = 0; k < lanes; ++k) acc[k] += h[p + k] * to_float(w[p + k]);
  for (index_t k = 0; p < d; ++p, ++k) acc[k] += h[p] * to_float(w[p]);
  for (index_t width = lanes / 2; width > 0; width /= 2)
    for (index_t k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

/// out[j] = h . w[first + j] + bias[first + j] for j in [0, count).
template <class T>
XSOFTMAX_HD void gather_dot(const float* h, matrix_view<const T> w, const T* bias, index_t first, index_t count,
                float* out) {
  const index_t d = w.cols;
  for (index_t j = 0; j < count; ++j) {
    const float acc = dot_row(h, w.row(first + j), d);
    out[j] = bias ? acc + to_float(bias[first + j]) : acc;
  }
}

}  // namespace xsoftmax::detail
