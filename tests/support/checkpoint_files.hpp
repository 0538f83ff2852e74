// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Test support for the checkpoint tests: whole-file reads and writes, and edits of a safetensors
/// file's JSON header or of one tensor's bytes, to make the corrupt files the loaders must refuse.

#include <xsoftmax/io/safetensors.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

namespace xsoftmax_test {

inline std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The file with `from` replaced by `to` in its JSON header, re-padded and with its length updated.
inline std::string edit_header(const std::string& file, const std::string& from, const std::string& to) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string header = file.substr(8, n);
  const auto at = header.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "header has no ", from);
  header.replace(at, from.size(), to);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::uint64_t m = header.size();
  return std::string(reinterpret_cast<const char*>(&m), 8) + header + file.substr(8 + n);
}

/// The file with element `index` of tensor `name` (8-byte elements, e.g. I64) set to `value`.
inline std::string set_int64_element(const std::string& file, const std::string& name, std::int64_t index,
                                     std::int64_t value) {
  const auto f = xsoftmax::io::safetensors_file::parse(file, name);
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string out = file;
  const std::size_t at = static_cast<std::size_t>(8 + n + f.tensor(name).begin + 8 * static_cast<std::uint64_t>(index));
  std::memcpy(&out[at], &value, 8);
  return out;
}

}  // namespace xsoftmax_test
