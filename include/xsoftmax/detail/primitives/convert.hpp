// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Widening storage rows to fp32 for the host GEMM. fp32 rows are used in place (no copy).

#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// Rows [first, first + count) of `src` as a dense fp32 matrix. For fp32 sources with a dense layout
/// this is a view of `src`; otherwise the rows are widened into `scratch` (resized as needed).
template <class T>
matrix_view<const float> rows_as_float(matrix_view<const T> src, index_t first, index_t count,
                                       std::vector<float>& scratch) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    return {src.row(first), count, src.cols, src.stride};
  } else {
    scratch.resize(static_cast<std::size_t>(count * src.cols));
    for (index_t i = 0; i < count; ++i) {
      const T* in = src.row(first + i);
      float* out = scratch.data() + i * src.cols;
      for (index_t j = 0; j < src.cols; ++j) out[j] = to_float(in[j]);
    }
    return {scratch.data(), count, src.cols};
  }
}

}  // namespace xsoftmax::detail
