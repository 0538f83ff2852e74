// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Input checks shared by every head. Each runs before any state changes and throws a typed
/// exception naming the function, the argument and the offending value.

#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <cmath>

namespace xsoftmax::detail {

/// `hidden` must be a non-empty (B x dim) matrix of finite values in host memory.
template <class H>
void check_hidden(const char* where, matrix_view<const H> hidden, index_t dim) {
  static_assert(is_supported_element<H>, "xsoftmax: hidden must be float, double, bf16 or fp16");
  expects<shape_error>(hidden.cols == dim, where, ": hidden has ", hidden.cols,
                       " columns but the head's dim is ", dim);
  expects(hidden.rows > 0, where, ": empty batch (hidden.rows = ", hidden.rows, ")");
  expects(hidden.data != nullptr, where, ": hidden.data is null");
  expects<shape_error>(hidden.stride >= hidden.cols, where, ": hidden.stride = ", hidden.stride,
                       " is smaller than hidden.cols = ", hidden.cols);
  for (index_t i = 0; i < hidden.rows; ++i) {
    const H* row = hidden.row(i);
    for (index_t j = 0; j < hidden.cols; ++j) {
      const float v = to_float(row[j]);
      expects<non_finite_error>(std::isfinite(v), where, ": hidden[", i, "][", j, "] = ", v,
                                " is not finite");
    }
  }
}

/// One target per hidden row, each in [0, num_classes) or equal to `ignore_index`.
inline void check_targets(const char* where, vector_view<const index_t> targets, index_t rows,
                          index_t num_classes, index_t ignore_index) {
  expects<shape_error>(targets.size == rows, where, ": targets has ", targets.size,
                       " entries but hidden has ", rows, " rows");
  expects(targets.data != nullptr || rows == 0, where, ": targets.data is null");
  for (index_t i = 0; i < targets.size; ++i) {
    const index_t t = targets[i];
    expects<out_of_range>(t == ignore_index || (t >= 0 && t < num_classes), where, ": targets[", i,
                          "] = ", t, " is out of range [0, ", num_classes, ")",
                          " and is not ignore_index (", ignore_index, ")");
  }
}

/// An output matrix must have exactly the expected shape.
template <class T>
void check_output(const char* where, const char* name, matrix_view<T> out, index_t rows, index_t cols) {
  expects<shape_error>(out.rows == rows && out.cols == cols, where, ": ", name, " is ", out.rows,
                       " x ", out.cols, ", expected ", rows, " x ", cols);
  expects(out.data != nullptr || rows * cols == 0, where, ": ", name, ".data is null");
  expects<shape_error>(out.stride >= out.cols, where, ": ", name, ".stride = ", out.stride,
                       " is smaller than its cols = ", out.cols);
}

/// An output vector must have exactly the expected length.
template <class T>
void check_output(const char* where, const char* name, vector_view<T> out, index_t size) {
  expects<shape_error>(out.size == size, where, ": ", name, " has ", out.size, " entries, expected ",
                       size);
  expects(out.data != nullptr || size == 0, where, ": ", name, ".data is null");
}

}  // namespace xsoftmax::detail
