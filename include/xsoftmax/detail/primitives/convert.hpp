// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Widening storage rows to fp32 for an fp32 GEMM (fp32 rows are used in place, no copy), rounding
/// fp32 rows to the storage type for a GEMM that reads it, and zeroing storage elements.

#include <xsoftmax/detail/primitives/parallel_for.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/memory.h>

#include <type_traits>

namespace xsoftmax::detail {

/// v[i] = 0 (in T).
template <class T>
struct store_zero {
  T* v;
  XSOFTMAX_HD void operator()(index_t i) const { v[i] = from_float<T>(0.f); }
};

/// Rows [first, first + count) of `src` as a dense fp32 matrix. For fp32 sources this is a view of
/// `src`; otherwise the rows are widened into `scratch` (any vector of float in the execution's
/// memory, resized as needed) by the execution's threads.
template <class Ex, class T, class Scratch>
matrix_view<const float> rows_as_float(const Ex& ex, matrix_view<const T> src, index_t first, index_t count,
                                       Scratch& scratch) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    return {src.row(first), count, src.cols, src.stride};
  } else {
    const index_t d = src.cols;
    scratch.resize(static_cast<std::size_t>(count * d));
    float* out = thrust::raw_pointer_cast(scratch.data());
    XSOFTMAX_PARALLEL_FOR_2D(ex, count, d, i, j, { out[i * d + j] = to_float(src.row(first + i)[j]); });
    return {out, count, d};
  }
}

/// The reverse, for GEMMs that read the storage type: `src` rounded to T into `out` (dense,
/// src.rows x src.cols), by the execution's threads.
template <class Ex, class T>
void rows_to_storage(const Ex& ex, matrix_view<const float> src, T* out) {
  const index_t d = src.cols;
  XSOFTMAX_PARALLEL_FOR_2D(ex, src.rows, d, i, j, { out[i * d + j] = from_float<T>(src(i, j)); });
}

}  // namespace xsoftmax::detail
