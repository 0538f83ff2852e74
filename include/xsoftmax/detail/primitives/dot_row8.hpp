// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `dot_row8(h, w, d)`: h . w with 8 partial sums, for the per-(sample, node) dots of the sigmoid
/// hierarchical softmax (training and search) at word2vec widths (d ~ 100-300). `dot_row`'s 16
/// lanes, its element-by-element tail and its loop-shaped reduction cost about 230 instructions at
/// d = 100 on a 128-bit SIMD host; this shape (8 lanes = two SSE registers, a 4-wide step before
/// the scalar tail, an unrolled reduction) about 90. The order of the sums is fixed, so results are
/// deterministic and the same on every backend; they differ from `dot_row`'s by rounding only.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax::detail {

template <class T>
XSOFTMAX_HD inline float dot_row8(const float* h, const T* w, index_t d) {
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f, a4 = 0.f, a5 = 0.f, a6 = 0.f, a7 = 0.f;
  index_t p = 0;
  for (; p + 8 <= d; p += 8) {
    a0 += h[p] * to_float(w[p]);
    a1 += h[p + 1] * to_float(w[p + 1]);
    a2 += h[p + 2] * to_float(w[p + 2]);
    a3 += h[p + 3] * to_float(w[p + 3]);
    a4 += h[p + 4] * to_float(w[p + 4]);
    a5 += h[p + 5] * to_float(w[p + 5]);
    a6 += h[p + 6] * to_float(w[p + 6]);
    a7 += h[p + 7] * to_float(w[p + 7]);
  }
  if (p + 4 <= d) {
    a0 += h[p] * to_float(w[p]);
    a1 += h[p + 1] * to_float(w[p + 1]);
    a2 += h[p + 2] * to_float(w[p + 2]);
    a3 += h[p + 3] * to_float(w[p + 3]);
    p += 4;
  }
  if (p < d) a4 += h[p] * to_float(w[p]);
  if (p + 1 < d) a5 += h[p + 1] * to_float(w[p + 1]);
  if (p + 2 < d) a6 += h[p + 2] * to_float(w[p + 2]);
  a0 += a4;
  a1 += a5;
  a2 += a6;
  a3 += a7;
  return (a0 + a2) + (a1 + a3);
}

}  // namespace xsoftmax::detail
