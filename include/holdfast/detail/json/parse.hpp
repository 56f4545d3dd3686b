// holdfast/detail/json/parse.hpp — the strict RFC 8259 parser.
//
// Guarantees:
//   - parse_json accepts exactly RFC 8259 JSON text: no comments, no trailing commas, no
//     leading zeros, no control characters in strings, valid UTF-8 only, surrogate pairs in
//     \u escapes combined (a lone surrogate is an error). Duplicate object keys are rejected.
//   - Every parse error is a holdfast::format_error naming the source and the byte offset:
//     "parse 'cmd.json' (offset 17: expected ':' after object key)".
//   - Parsing numbers does not depend on the C locale.
// Caveats:
//   - Nesting deeper than 512 levels is rejected (the parser is recursive).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>  // snprintf: a byte shown in an error
#include <string>
#include <string_view>
#include <unordered_set>  // duplicate object keys
#include <utility>

#include "../../error.hpp"
#include "../ascii.hpp"  // hex_digit: \u escapes
#include "value.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

namespace json_impl {

class parser {
 public:
  parser(std::string_view text, const std::string& source) : t_(text), source_(source) {}

  json_value document() {
    skip_ws();
    json_value v = value(0);
    skip_ws();
    if (i_ != t_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  static constexpr int max_depth = 512;

  [[noreturn]] void fail(const std::string& why) const { fail_at(i_, why); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& why) const {
    throw format_error(source_, "offset " + std::to_string(at) + ": " + why);
  }
  [[noreturn]] void fail_eof(const char* what) const {
    fail(std::string("unexpected end of input (truncated?) ") + what);
  }

  void skip_ws() noexcept {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r'))
      ++i_;
  }

  static std::string describe(char c) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", u);
    return std::string("byte ") + buf;
  }

  json_value value(int depth) {
    if (i_ >= t_.size()) fail_eof("where a value was expected");
    char c = t_[i_];
    switch (c) {
      case '{':
        return object(depth);
      case '[':
        return array(depth);
      case '"':
        return json_value(string());
      case 't':
        return literal("true", json_value(true));
      case 'f':
        return literal("false", json_value(false));
      case 'n':
        return literal("null", json_value());
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return number();
        fail("expected a value, found " + describe(c));
    }
  }

  json_value literal(std::string_view word, json_value v) {
    if (t_.substr(i_, word.size()) != word) {
      if (t_.size() - i_ < word.size() && word.substr(0, t_.size() - i_) == t_.substr(i_))
        fail_eof("inside a literal");
      fail("invalid literal (expected " + std::string(word) + ")");
    }
    i_ += word.size();
    return v;
  }

  json_value number() {
    std::size_t start = i_;
    auto digit = [&] { return i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9'; };
    if (t_[i_] == '-') ++i_;
    if (!digit()) {
      if (i_ >= t_.size()) fail_eof("inside a number");
      fail("expected a digit in number");
    }
    if (t_[i_] == '0') {
      ++i_;
      if (digit()) fail("leading zero in number");
    } else {
      while (digit()) ++i_;
    }
    if (i_ < t_.size() && t_[i_] == '.') {
      ++i_;
      if (!digit()) {
        if (i_ >= t_.size()) fail_eof("inside a number");
        fail("expected a digit after '.' in number");
      }
      while (digit()) ++i_;
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      ++i_;
      if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
      if (!digit()) {
        if (i_ >= t_.size()) fail_eof("inside a number");
        fail("expected a digit in exponent");
      }
      while (digit()) ++i_;
    }
    return json_value::number_from_text(std::string(t_.substr(start, i_ - start)));
  }

  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::uint32_t hex4() {
    if (t_.size() - i_ < 4) {
      i_ = t_.size();
      fail_eof("inside a \\u escape");
    }
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      char c = t_[i_];
      int digit = hex_digit(c);
      if (digit < 0) fail("expected a hex digit in \\u escape, found " + describe(c));
      v = v << 4 | static_cast<std::uint32_t>(digit);
    }
    return v;
  }

  // Validates one UTF-8 sequence starting at i_ (a lead byte >= 0x80) and copies it.
  void utf8_sequence(std::string& out) {
    std::size_t start = i_;
    auto lead = static_cast<unsigned char>(t_[i_]);
    std::size_t len;
    std::uint32_t cp;
    if (lead >= 0xc2 && lead <= 0xdf) {
      len = 2;
      cp = lead & 0x1fu;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      len = 3;
      cp = lead & 0x0fu;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      len = 4;
      cp = lead & 0x07u;
    } else {
      fail("invalid UTF-8 byte " + describe(t_[i_]).substr(5) + " in string");
    }
    if (t_.size() - start < len) {
      i_ = t_.size();
      fail_eof("inside a UTF-8 sequence");
    }
    for (std::size_t k = 1; k < len; ++k) {
      auto b = static_cast<unsigned char>(t_[start + k]);
      if ((b & 0xc0) != 0x80) fail_at(start, "invalid UTF-8 sequence in string");
      cp = (cp << 6) | (b & 0x3fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
      fail_at(start, "invalid UTF-8 sequence in string");
    out.append(t_.substr(start, len));
    i_ = start + len;
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (i_ >= t_.size()) fail_eof("inside a string");
      char c = t_[i_];
      auto u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (u < 0x20) fail("unescaped control character " + describe(c) + " in string");
      if (u >= 0x80) {
        utf8_sequence(out);
        continue;
      }
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      std::size_t esc = i_++;
      if (i_ >= t_.size()) fail_eof("inside an escape");
      char e = t_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) fail_at(esc, "lone low surrogate in \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (t_.substr(i_, 2) != "\\u") fail_at(esc, "high surrogate without a low surrogate");
            i_ += 2;
            std::uint32_t lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) fail_at(esc, "high surrogate without a low surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail_at(esc, "invalid escape character " + describe(e));
      }
    }
  }

  json_value array(int depth) {
    if (depth >= max_depth) fail("nesting deeper than 512 levels");
    ++i_;
    json_value::array_t a;
    skip_ws();
    if (i_ < t_.size() && t_[i_] == ']') {
      ++i_;
      return json_value(std::move(a));
    }
    for (;;) {
      skip_ws();
      a.push_back(value(depth + 1));
      skip_ws();
      if (i_ >= t_.size()) fail_eof("inside an array (expected ',' or ']')");
      if (t_[i_] == ']') {
        ++i_;
        return json_value(std::move(a));
      }
      if (t_[i_] != ',') fail("expected ',' or ']' in array, found " + describe(t_[i_]));
      ++i_;
      skip_ws();
      if (i_ < t_.size() && t_[i_] == ']') fail("trailing comma in array");
    }
  }

  json_value object(int depth) {
    if (depth >= max_depth) fail("nesting deeper than 512 levels");
    ++i_;
    json_value::object_t o;
    std::unordered_set<std::string> seen;  // filled only for large objects
    skip_ws();
    if (i_ < t_.size() && t_[i_] == '}') {
      ++i_;
      return json_value(std::move(o));
    }
    for (;;) {
      skip_ws();
      if (i_ >= t_.size()) fail_eof("inside an object (expected a key)");
      if (t_[i_] != '"') {
        if (t_[i_] == '}' && !o.empty()) fail("trailing comma in object");
        fail("expected a string key in object, found " + describe(t_[i_]));
      }
      std::size_t key_at = i_;
      std::string key = string();
      if (is_duplicate(o, seen, key)) fail_at(key_at, "duplicate key " + json_quote(key));
      skip_ws();
      if (i_ >= t_.size()) fail_eof("inside an object (expected ':')");
      if (t_[i_] != ':') fail("expected ':' after object key, found " + describe(t_[i_]));
      ++i_;
      skip_ws();
      json_value v = value(depth + 1);
      o.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (i_ >= t_.size()) fail_eof("inside an object (expected ',' or '}')");
      if (t_[i_] == '}') {
        ++i_;
        return json_value(std::move(o));
      }
      if (t_[i_] != ',') fail("expected ',' or '}' in object, found " + describe(t_[i_]));
      ++i_;
    }
  }

  static bool is_duplicate(const json_value::object_t& o, std::unordered_set<std::string>& seen,
                           const std::string& key) {
    constexpr std::size_t linear_limit = 16;
    if (o.size() < linear_limit) {
      for (const auto& m : o)
        if (m.first == key) return true;
      return false;
    }
    if (seen.empty())
      for (const auto& m : o) seen.insert(m.first);
    return !seen.insert(key).second;
  }

  std::string_view t_;
  const std::string& source_;
  std::size_t i_ = 0;
};

}  // namespace json_impl

/// Parses RFC 8259 JSON text; throws holdfast::format_error(source, "offset N: why").
inline json_value parse_json(std::string_view text, const std::string& source) {
  return json_impl::parser(text, source).document();
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
