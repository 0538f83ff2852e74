// SPDX-License-Identifier: Apache-2.0
// The safetensors writer and reader on their own: the layout Python expects (little-endian length,
// header padded with spaces to 8 bytes, offsets relative to the data), metadata and names that need
// JSON escaping, dtype conversions, and every malformed input rejected with checkpoint_error naming
// the file, the tensor and the problem.

#include <xsoftmax/io/safetensors.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace io = xsoftmax::io;

/// A file from a literal header (padded here) and data bytes.
std::string file_of(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

/// Parsing `bytes` throws checkpoint_error whose message names the file and contains `words`.
void check_rejected(const std::string& bytes, const std::string& words) {
  try {
    (void)io::safetensors_file::parse(bytes, "bad.safetensors");
    FAIL("accepted; expected an error containing: ", words);
  } catch (const xsoftmax::checkpoint_error& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("bad.safetensors") != std::string::npos, what);
    CHECK_MESSAGE(what.find(words) != std::string::npos, what);
  }
}

}  // namespace

TEST_CASE("safetensors: the writer's layout, read back") {
  io::safetensors_writer w;
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const std::int64_t ids[3] = {-1, 0, 1LL << 40};
  w.add("layer \"0\"\n/a", {2, 3}, a);
  w.add("ids", {3}, ids);
  w.add("empty", {0, 4}, static_cast<const float*>(nullptr));
  w.set_metadata("note", "tab\there, quote \" and backslash \\ and é");
  const std::string bytes = w.bytes();

  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);
  CHECK(bytes[8] == '{');
  CHECK(bytes.size() == 8 + n + 6 * 4 + 3 * 8);

  const auto f = io::safetensors_file::parse(bytes, "mem");
  CHECK(f.tensors().size() == 3);
  CHECK(f.metadata("note") == "tab\there, quote \" and backslash \\ and é");
  CHECK(f.tensor("layer \"0\"\n/a").type == io::dtype::f32);
  CHECK(f.values<float>("layer \"0\"\n/a", {2, 3}) == std::vector<float>(a, a + 6));
  CHECK(f.values<std::int64_t>("ids", {3}) == std::vector<std::int64_t>(ids, ids + 3));
  CHECK(f.values<float>("empty", {0, 4}).empty());
  CHECK_THROWS_AS((void)f.values<std::int32_t>("ids", {3}), xsoftmax::checkpoint_error);  // 2^40 does not fit
  CHECK_THROWS_AS((void)f.values<std::int64_t>("layer \"0\"\n/a", {2, 3}), xsoftmax::checkpoint_error);
  CHECK_THROWS_AS((void)f.values<float>("layer \"0\"\n/a", {3, 2}), xsoftmax::checkpoint_error);
  CHECK_THROWS_AS((void)f.tensor("missing"), xsoftmax::checkpoint_error);
  CHECK_THROWS_AS(w.add("ids", {1}, ids), xsoftmax::invalid_argument);
  CHECK_THROWS_AS(w.add("__metadata__", {1}, ids), xsoftmax::invalid_argument);
}

TEST_CASE("safetensors: floating conversions go through float, rounding to nearest-even") {
  io::safetensors_writer w;
  const float x[3] = {1.f + 1.f / 256, 1.f + 3.f / 256, 70000.f};  // bf16 ties to even; fp16 overflows
  const double d[1] = {0.1};
  w.add("x", {3}, x);
  w.add("d", {1}, d);
  const auto f = io::safetensors_file::parse(w.bytes(), "mem");
  const auto b = f.values<__nv_bfloat16>("x", {3});
  CHECK(xsoftmax::to_float(b[0]) == 1.f);
  CHECK(xsoftmax::to_float(b[1]) == 1.f + 4.f / 256);
  const auto h = f.values<__half>("x", {3});
  CHECK(xsoftmax::to_float(h[2]) == std::numeric_limits<float>::infinity());
  CHECK(f.values<float>("d", {1})[0] == 0.1f);
}

TEST_CASE("safetensors: Python-style headers (spaces, any member order, no metadata) are read") {
  const std::string data(8, '\x01');
  const auto f = io::safetensors_file::parse(
      file_of(R"({ "b" : {"shape":[2],"data_offsets":[4,8],"dtype":"F16"}, "a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]} } )",
              data),
      "py");
  CHECK(f.tensors().size() == 2);
  CHECK(f.tensors()[0].name == "a");  // in the order of their bytes
  CHECK(f.metadata().empty());
  CHECK(f.values<std::int64_t>("a", {2, 2}) == std::vector<std::int64_t>(4, 1));
}

TEST_CASE("safetensors: malformed files are rejected with the file, tensor and problem named") {
  const std::string t = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  CHECK_NOTHROW((void)io::safetensors_file::parse(file_of(t, data), "ok"));

  check_rejected("", "truncated");
  check_rejected(std::string(7, '\0'), "truncated");
  check_rejected(file_of(t, data).substr(0, 20), "exceeds");
  check_rejected(file_of(t, data.substr(0, 4)), "truncated");
  check_rejected(file_of(t, data + "xx"), "trailing");
  check_rejected(file_of("[1]", ""), "does not start with '{'");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},})", data), "JSON header");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x)", data), "after the top-level");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data), "non-integer");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}})", data), "leading zero");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{}})", data), "duplicate key");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8], "x": true}})", data), "unexpected 't'");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,99999999999999999999]}})", data), "64 bits");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":1}})", data), "not a string");
  check_rejected(file_of("{\"t\":" + std::string(40, '[') + std::string(40, ']') + "}", ""), "nesting");
  check_rejected(file_of(R"({"t":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype \"F31\"");
  check_rejected(file_of(R"({"t":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", data), "tensor \"t\": shape [2] of F64 needs 16 bytes");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "non-negative");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data), "data_offsets");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data), "not a range");
  check_rejected(file_of(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", data), "\"dtype\" is missing");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", data),
                 "more than 2^64");
  // Two tensors: overlapping, and with a hole between them.
  check_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})",
                         std::string(10, '\0')),
                 "overlap");
  check_rejected(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})",
                         std::string(10, '\0')),
                 "hole");
  check_rejected(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"m":"\ud800x"})", data), "surrogate");
  CHECK_THROWS_AS((void)io::safetensors_file::read("/nonexistent/x.safetensors"), xsoftmax::checkpoint_error);
}
