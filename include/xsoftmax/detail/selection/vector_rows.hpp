// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Row operations of the index builders (KNN graph, IVF, k-means) on an execution: fp32 copies of
/// class vectors, inverse norms, unit rows, row gathers and column scaling. Norms are summed in
/// double in row order, so a row's result does not depend on the backend's thread count.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/precision.hpp>

#include <math.h>

namespace xsoftmax::detail {

/// inv[i] = 1 / |w_i| for the rows of `w` (0 for a zero row: its similarity to everything is 0).
template <class Ex, class T>
void inverse_row_norms(const Ex& ex, matrix_view<const T> w, float* inv) {
  const index_t d = w.cols;
  XSOFTMAX_PARALLEL_FOR(ex, w.rows, i, {
    const T* r = w.row(i);
    double s = 0;
    for (index_t p = 0; p < d; ++p) s += static_cast<double>(to_float(r[p])) * to_float(r[p]);
    inv[i] = s > 0 ? static_cast<float>(1.0 / ::sqrt(s)) : 0.f;
  });
}

/// out (count x d, dense fp32) = rows [first, first + count) of `w`, row i times scale[first + i]
/// when `scale` is given.
template <class Ex, class T>
void widen_rows(const Ex& ex, matrix_view<const T> w, index_t first, index_t count, const float* scale, float* out) {
  const index_t d = w.cols;
  XSOFTMAX_PARALLEL_FOR(ex, count, i, {
    const T* r = w.row(first + i);
    if (scale) {
      const float s = scale[first + i];
      for (index_t p = 0; p < d; ++p) out[i * d + p] = to_float(r[p]) * s;
    } else {
      for (index_t p = 0; p < d; ++p) out[i * d + p] = to_float(r[p]);
    }
  });
}

/// Scales every row of `x` (n x d, dense) to unit length in place (zero rows stay zero).
template <class Ex>
void unit_rows(const Ex& ex, float* x, index_t n, index_t d) {
  XSOFTMAX_PARALLEL_FOR(ex, n, i, {
    float* r = x + i * d;
    double s = 0;
    for (index_t p = 0; p < d; ++p) s += static_cast<double>(r[p]) * r[p];
    const float inv = s > 0 ? static_cast<float>(1.0 / ::sqrt(s)) : 0.f;
    for (index_t p = 0; p < d; ++p) r[p] *= inv;
  });
}

/// dst row i = src row rows[i] (rows of d values, dense), for i in [0, count).
template <class Ex, class T>
void copy_listed_rows(const Ex& ex, const T* src, index_t d, const index_t* rows, index_t count, T* dst) {
  XSOFTMAX_PARALLEL_FOR(ex, count, i, {
    const T* s = src + rows[i] * d;
    for (index_t p = 0; p < d; ++p) dst[i * d + p] = s[p];
  });
}

/// s(i, j) *= scale[j] for a rows x cols block (leading dimension `lds`).
template <class Ex>
void scale_columns(const Ex& ex, float* s, index_t rows, index_t cols, index_t lds, const float* scale) {
  XSOFTMAX_PARALLEL_FOR(ex, rows, i, {
    for (index_t j = 0; j < cols; ++j) s[i * lds + j] *= scale[j];
  });
}

}  // namespace xsoftmax::detail
