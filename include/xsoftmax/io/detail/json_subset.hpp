// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The subset of JSON a safetensors header is written in: objects, arrays, strings and integers
/// (no floating-point numbers, no true/false/null: the format has no use for them). A parser of
/// exactly that grammar, strict where JSON is strict (no trailing commas, no leading zeros, no raw
/// control characters in strings, nothing after the top-level value), and the string quoting the
/// writer needs. Dependency-free on purpose: the library must not pull in a JSON library for a
/// header of a few hundred bytes.

#include <xsoftmax/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace xsoftmax::io::detail {

/// One parsed value. Objects keep their members in file order (duplicates are rejected while
/// parsing, as Python's safetensors rejects them).
struct json_value {
  enum class kind { string, integer, array, object };
  kind type = kind::object;
  std::string text;                                          ///< kind::string
  std::int64_t integer = 0;                                  ///< kind::integer
  std::vector<json_value> items;                             ///< kind::array
  std::vector<std::pair<std::string, json_value>> members;   ///< kind::object

  /// The member named `key` of an object, or null.
  [[nodiscard]] const json_value* find(std::string_view key) const {
    for (const auto& m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
};

/// Parses `text`; throws `checkpoint_error` "<where>: JSON header, byte <i>: <what>" on any
/// departure from the grammar.
class json_subset_parser {
 public:
  json_subset_parser(std::string_view text, std::string where) : text_(text), where_(std::move(where)) {}

  [[nodiscard]] json_value parse() {
    json_value v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected characters after the top-level value");
    return v;
  }

 private:
  // The format nests three deep (header -> tensor -> shape); a hostile file must not overflow the
  // stack with "[[[[...".
  static constexpr int max_nesting = 16;

  [[noreturn]] void fail(const std::string& what) const {
    throw checkpoint_error(xsoftmax::detail::message(where_, ": JSON header, byte ", pos_, ": ", what));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  [[nodiscard]] char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of the header");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', found '" + text_[pos_] + "'");
    ++pos_;
  }

  json_value value(int depth) {
    if (depth > max_nesting) fail("nesting deeper than " + std::to_string(max_nesting));
    const char c = peek();
    json_value v;
    if (c == '{') {
      v.type = json_value::kind::object;
      ++pos_;
      if (peek() == '}') return ++pos_, v;
      std::unordered_set<std::string> names;  // the duplicate check in constant time per member
      for (;;) {
        if (peek() != '"') fail("expected a member name in quotes");
        std::string key = string();
        if (!names.insert(key).second) fail("duplicate key \"" + key + "\"");
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
        if (peek() == '}') return ++pos_, v;
        expect(',');
      }
    }
    if (c == '[') {
      v.type = json_value::kind::array;
      ++pos_;
      if (peek() == ']') return ++pos_, v;
      for (;;) {
        v.items.push_back(value(depth + 1));
        if (peek() == ']') return ++pos_, v;
        expect(',');
      }
    }
    if (c == '"') {
      v.type = json_value::kind::string;
      v.text = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = json_value::kind::integer;
      v.integer = integer();
      return v;
    }
    fail(std::string("unexpected '") + c + "' (the header holds only objects, arrays, strings and integers)");
  }

  std::int64_t integer() {
    const bool negative = text_[pos_] == '-';
    if (negative) ++pos_;
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') fail("expected a digit");
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
      fail("leading zero in a number");
    // Accumulate negatively: -2^63 fits, +2^63 does not.
    std::int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int d = text_[pos_] - '0';
      if (v < (INT64_MIN + d) / 10) fail("integer does not fit 64 bits");
      v = v * 10 - d;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail("a non-integer number (the header holds only integers)");
    if (!negative) {
      if (v == INT64_MIN) fail("integer does not fit 64 bits");
      v = -v;
    }
    return v;
  }

  [[nodiscard]] unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad hex digit in a \\u escape");
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++pos_;  // the opening quote, checked by the caller
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      switch (const char e = text_[pos_++]) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair encodes one code point above U+FFFF
            if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
              fail("unpaired high surrogate in a \\u escape");
            pos_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("bad low surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired low surrogate in a \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  std::string_view text_;
  std::string where_;
  std::size_t pos_ = 0;
};

/// `s` as a JSON string literal: quotes, backslashes and control characters escaped; other bytes
/// (UTF-8 included) verbatim.
[[nodiscard]] inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xF];
      out += hex[c & 0xF];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace xsoftmax::io::detail
