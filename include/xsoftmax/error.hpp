// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Typed exceptions. Every check that rejects user input throws one of these *before* any state is
/// changed, with a message naming the function, the argument and the offending value.

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace xsoftmax {

/// A value is outside its domain (k > N, empty batch, a non-positive size, bad option).
struct invalid_argument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Shapes of two arguments disagree (hidden width != weight width, B targets for B' rows, ...).
struct shape_error : invalid_argument {
  using invalid_argument::invalid_argument;
};

/// An input holds NaN or +-Inf where finite values are required.
struct non_finite_error : invalid_argument {
  using invalid_argument::invalid_argument;
};

/// A tree is malformed: cycle, orphan, leaf that is no class, class listed twice, class missing.
struct tree_error : invalid_argument {
  using invalid_argument::invalid_argument;
};

/// An index (a target label, a class id, a row) lies outside its valid range.
struct out_of_range : std::out_of_range {
  using std::out_of_range::out_of_range;
};

/// A file could not be read or written, is not a well-formed safetensors file (truncated, bad
/// header, overlapping offsets, unknown dtype...), or holds a checkpoint that does not match the
/// head or optimizer it is loaded into. The message names the file, the tensor or metadata key, and
/// what is wrong.
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime or library call failed.
struct cuda_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Concatenates anything streamable into one message, prefixed with "xsoftmax: ".
template <class... Parts>
[[nodiscard]] std::string message(const Parts&... parts) {
  std::ostringstream out;
  out << "xsoftmax: ";
  (out << ... << parts);
  return out.str();
}

/// Throws `Error` with the concatenated message when `condition` is false.
template <class Error = invalid_argument, class... Parts>
void expects(bool condition, const Parts&... parts) {
  if (!condition) throw Error(message(parts...));
}

/// a * b for sizes a, b >= 0, checked: throws `invalid_argument` naming `what` (say "num_classes x
/// dim") when the product does not fit `Int` (signed overflow would be undefined behaviour and
/// would size buffers wrongly), or, with `element_bytes` > 0, when a * b elements of that size
/// exceed what one allocation can address.
template <class Int>
[[nodiscard]] Int checked_product(const char* where, const char* what, Int a, Int b, std::size_t element_bytes = 0) {
  Int product = 0;
  const bool overflow = __builtin_mul_overflow(a, b, &product);
  expects(!overflow, where, ": ", what, " = ", a, " x ", b, " overflows a 64-bit element count");
  if (element_bytes > 0) {
    const auto limit = static_cast<unsigned long long>(PTRDIFF_MAX) / element_bytes;
    expects(static_cast<unsigned long long>(product) <= limit, where, ": ", what, " = ", a, " x ", b, " = ", product,
            " elements of ", element_bytes, " bytes exceed the largest possible allocation");
  }
  return product;
}

}  // namespace detail
}  // namespace xsoftmax
