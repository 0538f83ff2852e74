// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A small, dependency-free writer and reader of the safetensors format
/// (https://github.com/huggingface/safetensors), which Python's `safetensors` reads and writes:
///
///   8 bytes   N, the header length, unsigned little-endian
///   N bytes   JSON header: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...,
///             "__metadata__": {"<key>": "<string value>", ...}}, padded with spaces so that the
///             data starts at a multiple of 8 bytes
///   the rest  the tensors' raw little-endian bytes, row-major; offsets are relative to this section
///
/// `safetensors_file` validates everything it reads before anything is handed out: the header
/// length against the file size, the JSON (a strict parser of the subset the format uses, see
/// io/detail/json_subset.hpp), known dtypes, non-negative shapes whose element count times the
/// dtype's size equals the tensor's byte range, and byte ranges that lie inside the data section,
/// neither overlap nor leave holes, and cover it exactly (as Python's reader requires). Every
/// failure throws `checkpoint_error` naming the file, the tensor and what is wrong.
///
/// Memory: the reader holds the whole file, the writer every tensor's bytes, on the host. `read`
/// takes only regular files and reads the header first: a header that does not fit the file, or
/// byte ranges that do not cover the file's data section exactly, are refused before the data is
/// read (a link to /dev/zero, or a valid file with gigabytes appended, costs nothing to refuse).

#include <xsoftmax/error.hpp>
#include <xsoftmax/io/detail/json_subset.hpp>
#include <xsoftmax/io/safetensors_types.hpp>
#include <xsoftmax/precision.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "xsoftmax/io/safetensors.hpp: the format is little-endian and this reader copies bytes as they are"
#endif

namespace xsoftmax::io {

/// Builds a safetensors file in memory and writes it. Tensors are laid out in the order they are
/// added; names must be unique and must not be "__metadata__".
class safetensors_writer {
 public:
  /// Adds tensor `name` of `type` and `shape` whose raw little-endian bytes are `bytes`. Throws
  /// `invalid_argument` for a duplicate or reserved name, a negative extent, or a byte count that
  /// is not the shape's element count times the dtype's size.
  void add(std::string name, dtype type, std::vector<std::int64_t> shape, std::vector<unsigned char> bytes) {
    const char* where = "safetensors_writer::add";
    xsoftmax::detail::expects(name != "__metadata__", where, ": \"__metadata__\" is reserved for the metadata");
    for (const auto& t : entries_)
      xsoftmax::detail::expects(t.name != name, where, ": tensor \"", name, "\" was added twice");
    std::uint64_t elements = 1;
    for (const auto s : shape) {
      xsoftmax::detail::expects(s >= 0, where, ": tensor \"", name, "\" has a negative extent ", s);
      elements *= static_cast<std::uint64_t>(s);
    }
    xsoftmax::detail::expects(elements * dtype_size(type) == bytes.size(), where, ": tensor \"", name, "\": ",
                              bytes.size(), " bytes for ", elements, " elements of ", dtype_name(type));
    tensor_entry e{std::move(name), type, std::move(shape), data_size_, data_size_ + bytes.size()};
    data_size_ = e.end;
    entries_.push_back(std::move(e));
    data_.push_back(std::move(bytes));
  }

  /// Adds tensor `name` of `shape` from `values` in host memory (the shape's element count of
  /// them), with the dtype of `T`.
  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, const T* values) {
    std::int64_t n = 1;
    for (const auto s : shape) n *= s;
    std::vector<unsigned char> bytes(static_cast<std::size_t>(n < 0 ? 0 : n) * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), values, bytes.size());
    add(std::move(name), dtype_of<T>(), std::move(shape), std::move(bytes));
  }

  /// Sets a `__metadata__` entry (the format allows string values only).
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  /// The complete file: length, header padded with spaces to a multiple of 8, data.
  [[nodiscard]] std::string bytes() const {
    std::string out = prefix();
    out.reserve(out.size() + data_size_);
    for (const auto& d : data_) out.append(reinterpret_cast<const char*>(d.data()), d.size());
    return out;
  }

  /// Writes the file to `path`, through a temporary file renamed over it, so that a failed write
  /// never leaves a truncated checkpoint in its place. Throws `checkpoint_error` naming the path.
  void write(const std::string& path) const {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw checkpoint_error(xsoftmax::detail::message(path, ": cannot open ", tmp, " for writing"));
      // Streamed piece by piece: a second in-memory copy of every tensor would double the peak.
      const std::string head = prefix();
      out.write(head.data(), static_cast<std::streamsize>(head.size()));
      for (const auto& d : data_) out.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size()));
      out.close();
      if (!out) {
        std::remove(tmp.c_str());
        throw checkpoint_error(xsoftmax::detail::message(path, ": writing ", tmp, " failed (disk full?)"));
      }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw checkpoint_error(xsoftmax::detail::message(path, ": cannot rename ", tmp, " to it"));
    }
  }

 private:
  /// The 8-byte length and the padded JSON header: everything before the data.
  [[nodiscard]] std::string prefix() const {
    std::string header = "{";
    if (!metadata_.empty()) {
      header += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [k, v] : metadata_) {
        header += (first ? "" : ",") + detail::json_quote(k) + ":" + detail::json_quote(v);
        first = false;
      }
      header += "}";
    }
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const auto& e = entries_[i];
      header += (i == 0 && metadata_.empty() ? "" : ",") + detail::json_quote(e.name) + ":{\"dtype\":\"" +
                dtype_name(e.type) + "\",\"shape\":[";
      for (std::size_t d = 0; d < e.shape.size(); ++d) header += (d ? "," : "") + std::to_string(e.shape[d]);
      header += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const std::uint64_t n = header.size();
    for (int b = 0; b < 8; ++b) out[static_cast<std::size_t>(b)] = static_cast<char>((n >> (8 * b)) & 0xFF);
    return out + header;
  }

  std::vector<tensor_entry> entries_;
  std::vector<std::vector<unsigned char>> data_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_size_ = 0;
};

/// A safetensors file read into memory and validated in full (see the file comment).
class safetensors_file {
 public:
  /// Reads and validates `path`. Throws `checkpoint_error` naming the path when it cannot be read
  /// or is not a valid file.
  [[nodiscard]] static safetensors_file read(const std::string& path) {
    namespace fs = std::filesystem;
    safetensors_file f;
    f.path_ = path;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) f.fail("cannot open the file", ec ? ": " + ec.message() : std::string());
    if (!fs::is_regular_file(status)) f.fail("not a regular file (a directory, a device or a pipe)");
    const std::uintmax_t size = fs::file_size(path, ec);
    if (ec) f.fail("cannot read the file's size: ", ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) f.fail("cannot open the file");
    const auto read_more = [&](std::uint64_t count) {  // appends `count` bytes (the file was checked to hold them)
      const std::size_t at = f.bytes_.size();
      f.bytes_.resize(at + static_cast<std::size_t>(count));
      if (count != 0 && !in.read(f.bytes_.data() + at, static_cast<std::streamsize>(count)))
        f.fail("reading failed (the file changed while it was read?)");
    };
    // The header length and the header first, checked against the file's size; then the data,
    // once the header's byte ranges cover exactly what the file holds.
    read_more(std::min<std::uintmax_t>(size, 8));
    if (size < 8) f.validate();  // throws: truncated
    const std::uint64_t n = f.header_length(size);
    read_more(n);
    f.validate_header(n, size - 8 - n);
    read_more(size - 8 - n);
    return f;
  }

  /// Validates the file content `bytes`; `name` stands for the file in messages.
  [[nodiscard]] static safetensors_file parse(std::string bytes, std::string name) {
    safetensors_file f;
    f.bytes_ = std::move(bytes);
    f.path_ = std::move(name);
    f.validate();
    return f;
  }

  /// The path (or name) the file was read from.
  [[nodiscard]] const std::string& path() const { return path_; }
  /// Every tensor, in the order of their byte ranges.
  [[nodiscard]] const std::vector<tensor_entry>& tensors() const { return entries_; }
  /// The `__metadata__` entries (empty when the header has none).
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The tensor named `name`, or null.
  [[nodiscard]] const tensor_entry* find(std::string_view name) const {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  /// The tensor named `name`; throws `checkpoint_error` naming the file and the tensor when absent.
  [[nodiscard]] const tensor_entry& tensor(std::string_view name) const {
    const tensor_entry* e = find(name);
    if (!e) fail("tensor \"", name, "\" is missing");
    return *e;
  }
  /// The metadata value of `key`; throws `checkpoint_error` naming the file and the key when absent.
  [[nodiscard]] const std::string& metadata(const std::string& key) const {
    const auto it = metadata_.find(key);
    if (it == metadata_.end()) fail("metadata key \"", key, "\" is missing");
    return it->second;
  }
  /// The raw bytes of `e` (a tensor of this file).
  [[nodiscard]] const unsigned char* data(const tensor_entry& e) const {
    return reinterpret_cast<const unsigned char*>(bytes_.data()) + data_start_ + e.begin;
  }

  /// The values of tensor `name` as `T`, checking its shape is `shape`. Bytes are copied as they
  /// are when the dtype is `T`'s; between floating types values go through float (F32/F16/BF16 to
  /// float is exact; float to bf16/fp16 rounds to nearest-even, as `from_float`; F64 rounds to
  /// float first); integers convert to integers when every value fits `T`. Anything else
  /// (floating to integer, a value out of range) throws `checkpoint_error` naming the tensor.
  template <class T>
  [[nodiscard]] std::vector<T> values(std::string_view name, const std::vector<std::int64_t>& shape) const {
    const tensor_entry& e = tensor(name);
    if (e.shape != shape) fail("tensor \"", name, "\" has shape ", shape_text(e.shape), ", expected ", shape_text(shape));
    const std::size_t n = static_cast<std::size_t>(e.elements());
    std::vector<T> out(n);
    const unsigned char* src = data(e);
    constexpr dtype want = dtype_of<T>();
    const bool convertible = is_floating(want) ? is_floating(e.type)
                                               : !is_floating(e.type) && e.type != dtype::boolean && want != dtype::boolean;
    if (e.type != want && !convertible)
      fail("tensor \"", name, "\" has dtype ", dtype_name(e.type), ", which does not convert to ", dtype_name(want));
    if (e.type == want) {
      if (n) std::memcpy(out.data(), src, n * sizeof(T));
    } else if constexpr (is_floating(want)) {
      for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(load_float(e.type, src + i * dtype_size(e.type)));
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto [v, negative] = load_integer(e.type, src + i * dtype_size(e.type));
        const bool fits = negative ? std::is_signed_v<T> && static_cast<std::int64_t>(v) >= std::int64_t(std::numeric_limits<T>::min())
                                   : v <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
        if (!fits) fail("tensor \"", name, "\": element ", i, " does not fit ", dtype_name(want));
        out[i] = static_cast<T>(v);
      }
    }
    return out;
  }

  /// "[2, 3]".
  [[nodiscard]] static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  /// Throws `checkpoint_error` "xsoftmax: <path>: <parts>".
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    throw checkpoint_error(xsoftmax::detail::message(path_, ": ", parts...));
  }

 private:
  // Python's safetensors refuses headers above 100 MB; so do we, before allocating anything.
  static constexpr std::uint64_t max_header_bytes = 100'000'000;

  static float load_float(dtype t, const unsigned char* p) {
    switch (t) {
      case dtype::f16: { __half h; std::memcpy(&h, p, 2); return to_float(h); }
      case dtype::bf16: { __nv_bfloat16 b; std::memcpy(&b, p, 2); return to_float(b); }
      case dtype::f32: { float f; std::memcpy(&f, p, 4); return f; }
      default: { double d; std::memcpy(&d, p, 8); return static_cast<float>(d); }
    }
  }
  /// |value| and its sign, for range checks that work for U64 and I64 alike.
  static std::pair<std::uint64_t, bool> load_integer(dtype t, const unsigned char* p) {
    const std::size_t size = dtype_size(t);
    std::uint64_t raw = 0;
    std::memcpy(&raw, p, size);
    const bool is_signed = t == dtype::i8 || t == dtype::i16 || t == dtype::i32 || t == dtype::i64;
    if (is_signed && size < 8 && (raw >> (8 * size - 1)) & 1) raw |= ~std::uint64_t(0) << (8 * size);  // sign-extend
    const bool negative = is_signed && static_cast<std::int64_t>(raw) < 0;
    return {raw, negative};
  }

  /// Every check of `bytes_`, the whole file.
  void validate() {
    if (bytes_.size() < 8) fail("truncated: ", bytes_.size(), " bytes, fewer than the 8-byte header length");
    const std::uint64_t n = header_length(bytes_.size());
    validate_header(n, bytes_.size() - 8 - n);
  }

  /// The header length in `bytes_`' first 8 bytes, checked against a file of `file_size` bytes.
  [[nodiscard]] std::uint64_t header_length(std::uint64_t file_size) const {
    std::uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes_[static_cast<std::size_t>(b)]);
    if (n > file_size - 8)
      fail("header length ", n, " exceeds the ", file_size - 8, " bytes that follow it (truncated or corrupt)");
    if (n > max_header_bytes) fail("header length ", n, " exceeds the format's limit of ", max_header_bytes);
    return n;
  }

  /// The header (`bytes_`' bytes [8, 8 + n)) for a data section of `data_size` bytes: its JSON,
  /// every tensor's entry, and byte ranges that tile the data section exactly. Needs no data byte.
  void validate_header(std::uint64_t n, std::uint64_t data_size) {
    if (n < 2 || bytes_[8] != '{') fail("the header does not start with '{'");
    data_start_ = 8 + n;
    const detail::json_value root = detail::json_subset_parser(std::string_view(bytes_).substr(8, n), path_).parse();
    if (root.type != detail::json_value::kind::object) fail("the header is not a JSON object");
    for (const auto& [name, v] : root.members) {
      if (name == "__metadata__") {
        if (v.type != detail::json_value::kind::object) fail("__metadata__ is not an object");
        for (const auto& [k, s] : v.members) {
          if (s.type != detail::json_value::kind::string) fail("__metadata__ \"", k, "\" is not a string");
          metadata_[k] = s.text;
        }
        continue;
      }
      entries_.push_back(entry(name, v, data_size));
    }
    // The byte ranges, in order, must tile the data section exactly.
    std::sort(entries_.begin(), entries_.end(),
              [](const tensor_entry& a, const tensor_entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    std::uint64_t covered = 0;
    const tensor_entry* previous = nullptr;
    for (const auto& e : entries_) {
      if (e.begin < covered)
        fail("tensors \"", previous->name, "\" [", previous->begin, ", ", previous->end, ") and \"", e.name, "\" [",
             e.begin, ", ", e.end, ") overlap");
      if (e.begin > covered) fail("hole in the data before tensor \"", e.name, "\": bytes [", covered, ", ", e.begin, ") belong to no tensor");
      covered = e.end;
      previous = &e;
    }
    if (covered != data_size)
      fail("the data section has ", data_size, " bytes but the tensors cover ", covered, " (truncated or trailing bytes)");
  }

  tensor_entry entry(const std::string& name, const detail::json_value& v, std::uint64_t data_size) const {
    using kind = detail::json_value::kind;
    if (v.type != kind::object) fail("tensor \"", name, "\": its entry is not an object");
    const auto* type = v.find("dtype");
    const auto* shape = v.find("shape");
    const auto* offsets = v.find("data_offsets");
    if (!type || type->type != kind::string) fail("tensor \"", name, "\": \"dtype\" is missing or not a string");
    if (!shape || shape->type != kind::array) fail("tensor \"", name, "\": \"shape\" is missing or not an array");
    if (!offsets || offsets->type != kind::array || offsets->items.size() != 2)
      fail("tensor \"", name, "\": \"data_offsets\" is missing or not an array of two integers");
    tensor_entry e;
    e.name = name;
    const auto t = dtype_from_name(type->text);
    if (!t) fail("tensor \"", name, "\": unknown dtype \"", type->text, "\"");
    e.type = *t;
    std::uint64_t elements = 1;
    bool overflow = false;
    for (const auto& s : shape->items) {
      if (s.type != kind::integer || s.integer < 0) fail("tensor \"", name, "\": the shape holds a value that is not a non-negative integer");
      e.shape.push_back(s.integer);
      overflow |= __builtin_mul_overflow(elements, static_cast<std::uint64_t>(s.integer), &elements);
    }
    for (const auto& o : offsets->items)
      if (o.type != kind::integer || o.integer < 0) fail("tensor \"", name, "\": data_offsets holds a value that is not a non-negative integer");
    e.begin = static_cast<std::uint64_t>(offsets->items[0].integer);
    e.end = static_cast<std::uint64_t>(offsets->items[1].integer);
    if (e.begin > e.end || e.end > data_size)
      fail("tensor \"", name, "\": data_offsets [", e.begin, ", ", e.end, ") are not a range inside the ", data_size,
           "-byte data section (file truncated or offsets corrupt)");
    std::uint64_t bytes = 0;
    overflow |= __builtin_mul_overflow(elements, dtype_size(e.type), &bytes);
    if (overflow || bytes != e.end - e.begin)
      fail("tensor \"", name, "\": shape ", shape_text(e.shape), " of ", dtype_name(e.type), " needs ",
           overflow ? std::string("more than 2^64") : std::to_string(bytes), " bytes but data_offsets span ", e.end - e.begin);
    return e;
  }

  std::string bytes_;
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::vector<tensor_entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace xsoftmax::io
