// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Gather-dot: one fp32 hidden row against a block of weight rows read in place in their storage
/// type, never copied. The per-sample path of the hierarchical softmax (deep or binary trees, small
/// runs) and of tree search.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax::detail {

/// out[j] = h . w[first + j] + bias[first + j] for j in [0, count).
template <class T>
void gather_dot(const float* h, matrix_view<const T> w, const T* bias, index_t first, index_t count,
                float* out) {
  const index_t d = w.cols;
  for (index_t j = 0; j < count; ++j) {
    const T* wr = w.row(first + j);
    float acc = 0.f;
    for (index_t p = 0; p < d; ++p) acc += h[p] * to_float(wr[p]);
    out[j] = bias ? acc + to_float(bias[first + j]) : acc;
  }
}

}  // namespace xsoftmax::detail
