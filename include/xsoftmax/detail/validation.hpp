// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Output-argument checks shared by every head (the input checks that scan data on the backend are
/// in primitives/batch_rows.hpp and finite_scan.hpp). Each runs before any state changes and throws
/// a typed exception naming the function, the argument and the offending value.

#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax::detail {

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
