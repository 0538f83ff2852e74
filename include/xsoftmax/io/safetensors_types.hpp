// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The plain types of the safetensors format (see io/safetensors.hpp): its element types (`dtype`,
/// named as the header names them) and a tensor's table entry.

#include <xsoftmax/precision.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace xsoftmax::io {

/// Element types of the format, named as the header names them (`dtype_name`).
enum class dtype { boolean, u8, i8, i16, u16, f16, bf16, i32, u32, f32, i64, u64, f64 };

/// The header's name of `t`: "BOOL", "U8", ..., "F16", "BF16", "F32", "I64", "F64".
[[nodiscard]] constexpr const char* dtype_name(dtype t) {
  constexpr const char* names[] = {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "I64", "U64", "F64"};
  return names[static_cast<int>(t)];
}

/// Bytes per element of `t`.
[[nodiscard]] constexpr std::size_t dtype_size(dtype t) {
  constexpr std::size_t sizes[] = {1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
  return sizes[static_cast<int>(t)];
}

/// The dtype a header names `name`, or nothing for a name this reader does not know.
[[nodiscard]] inline std::optional<dtype> dtype_from_name(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(dtype::f64); ++i)
    if (name == dtype_name(static_cast<dtype>(i))) return static_cast<dtype>(i);
  return std::nullopt;
}

/// True for F16, BF16, F32 and F64.
[[nodiscard]] constexpr bool is_floating(dtype t) {
  return t == dtype::f16 || t == dtype::bf16 || t == dtype::f32 || t == dtype::f64;
}

/// The dtype of the C++ element type `T` (float, double, __nv_bfloat16, __half, the fixed-width
/// integers, bool).
template <class T>
[[nodiscard]] constexpr dtype dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return dtype::f32;
  else if constexpr (std::is_same_v<U, double>) return dtype::f64;
  else if constexpr (std::is_same_v<U, __nv_bfloat16>) return dtype::bf16;
  else if constexpr (std::is_same_v<U, __half>) return dtype::f16;
  else if constexpr (std::is_same_v<U, bool>) return dtype::boolean;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 1) return std::is_signed_v<U> ? dtype::i8 : dtype::u8;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 2) return std::is_signed_v<U> ? dtype::i16 : dtype::u16;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 4) return std::is_signed_v<U> ? dtype::i32 : dtype::u32;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 8) return std::is_signed_v<U> ? dtype::i64 : dtype::u64;
  else static_assert(sizeof(U) == 0, "xsoftmax::io::dtype_of<T>: no safetensors dtype for T");
}

/// One tensor of a file: name, dtype, shape, and its byte range [begin, end) in the data section.
struct tensor_entry {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;

  /// Product of the shape (1 for a scalar, shape []).
  [[nodiscard]] std::int64_t elements() const {
    std::int64_t n = 1;
    for (const auto s : shape) n *= s;
    return n;
  }
};

}  // namespace xsoftmax::io
