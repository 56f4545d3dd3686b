// holdfast/detail/json.hpp — a small strict JSON (RFC 8259) value, parser and writer.
//
// Used for command files (handoff.hpp), ready markers, and the etcd JSON gateway (kv/etcd.hpp).
//
// Guarantees:
//   - parse_json accepts exactly RFC 8259 JSON text: no comments, no trailing commas, no
//     leading zeros, no control characters in strings, valid UTF-8 only, surrogate pairs in
//     \u escapes combined (a lone surrogate is an error). Duplicate object keys are rejected.
//   - Every parse error is a holdfast::format_error naming the source and the byte offset:
//     "parse 'cmd.json' (offset 17: expected ':' after object key)".
//   - Numbers keep their text, so a 64-bit integer round-trips exactly (is_integer(),
//     as_int64(), as_uint64()); as_double() converts on demand.
//   - Objects keep insertion order; to_json writes members in that order.
//   - json_value(double) always writes a number with a '.' or an exponent, so a double reads
//     back as a double (3.0 is written "3.0", not "3").
//   - Formatting and parsing of numbers do not depend on the C locale.
// Caveats:
//   - Nesting deeper than 512 levels is rejected (the parser is recursive).
//   - Non-finite doubles (NaN, infinities) cannot be represented: constructing one throws.
//   - Accessors on the wrong type throw holdfast::error(EINVAL, "json", ...).
#pragma once

#include <cerrno>
#include <charconv>  // to_chars/from_chars: locale-independent numbers
#include <clocale>   // localeconv: the strtod fallback
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "ascii.hpp"  // hex_digit: \u escapes

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// A JSON value: null, boolean, number (kept as text), string, array or object (ordered).
class json_value {
 public:
  /// The six JSON types.
  enum class kind { null, boolean, number, string, array, object };
  /// An array's elements.
  using array_t = std::vector<json_value>;
  /// An object's members in insertion order.
  using object_t = std::vector<std::pair<std::string, json_value>>;

  /// null
  json_value() noexcept = default;
  /// null
  json_value(std::nullptr_t) noexcept {}
  /// true or false
  json_value(bool b) noexcept : kind_(kind::boolean), bool_(b) {}
  /// An integer, written exactly.
  template <class T, std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value &&
                                          !std::is_same<T, char>::value,
                                      int> = 0>
  json_value(T v) : kind_(kind::number), text_(std::to_string(v)) {}
  /// A finite double, written in the shortest form that reads back equal (always with '.' or
  /// an exponent). Throws holdfast::error(EDOM) for NaN or an infinity.
  json_value(double d) : kind_(kind::number), text_(format_double(d)) {}
  /// A string (UTF-8 expected; it is written as given, with RFC 8259 escapes).
  json_value(const char* s) : kind_(kind::string), text_(s) {}
  /// A string.
  json_value(std::string s) noexcept : kind_(kind::string), text_(std::move(s)) {}
  /// A string.
  json_value(std::string_view s) : kind_(kind::string), text_(s) {}
  /// An array.
  json_value(array_t a) noexcept : kind_(kind::array), array_(std::move(a)) {}
  /// An object.
  json_value(object_t o) noexcept : kind_(kind::object), object_(std::move(o)) {}

  /// A number from its JSON text; throws holdfast::error(EINVAL) when `text` is not a JSON
  /// number.
  static json_value number_from_text(std::string text) {
    if (!valid_number(text)) throw error(EINVAL, "json", "", "not a JSON number: " + text);
    json_value v;
    v.kind_ = kind::number;
    v.text_ = std::move(text);
    return v;
  }

  /// The type of this value.
  kind type() const noexcept { return kind_; }
  /// True for null.
  bool is_null() const noexcept { return kind_ == kind::null; }
  /// True for true/false.
  bool is_bool() const noexcept { return kind_ == kind::boolean; }
  /// True for any number.
  bool is_number() const noexcept { return kind_ == kind::number; }
  /// True for a number written without fraction or exponent (it may still exceed int64).
  bool is_integer() const noexcept {
    return kind_ == kind::number && text_.find_first_of(".eE") == std::string::npos;
  }
  /// True for a string.
  bool is_string() const noexcept { return kind_ == kind::string; }
  /// True for an array.
  bool is_array() const noexcept { return kind_ == kind::array; }
  /// True for an object.
  bool is_object() const noexcept { return kind_ == kind::object; }

  /// The boolean; throws holdfast::error(EINVAL) on another type.
  bool as_bool() const {
    expect(kind::boolean);
    return bool_;
  }
  /// The integer; throws EINVAL when not an integer, ERANGE when outside int64.
  std::int64_t as_int64() const {
    expect_integer();
    std::int64_t v = 0;
    auto r = std::from_chars(text_.data(), text_.data() + text_.size(), v);
    if (r.ec != std::errc() || r.ptr != text_.data() + text_.size())
      throw error(ERANGE, "json", "", "integer out of int64 range: " + text_);
    return v;
  }
  /// The integer; throws EINVAL when not an integer, ERANGE when negative or above uint64.
  std::uint64_t as_uint64() const {
    expect_integer();
    std::uint64_t v = 0;
    auto r = std::from_chars(text_.data(), text_.data() + text_.size(), v);
    if (r.ec != std::errc() || r.ptr != text_.data() + text_.size())
      throw error(ERANGE, "json", "", "integer out of uint64 range: " + text_);
    return v;
  }
  /// The number as a double (nearest value; huge magnitudes give ERANGE).
  double as_double() const {
    expect(kind::number);
    return parse_double(text_);
  }
  /// The number exactly as written.
  const std::string& number_text() const {
    expect(kind::number);
    return text_;
  }
  /// The string; throws holdfast::error(EINVAL) on another type.
  const std::string& as_string() const {
    expect(kind::string);
    return text_;
  }
  /// The elements; throws holdfast::error(EINVAL) on another type.
  const array_t& as_array() const {
    expect(kind::array);
    return array_;
  }
  /// The elements, mutable.
  array_t& as_array() {
    expect(kind::array);
    return array_;
  }
  /// The members in order; throws holdfast::error(EINVAL) on another type.
  const object_t& as_object() const {
    expect(kind::object);
    return object_;
  }
  /// The members, mutable (keep keys unique).
  object_t& as_object() {
    expect(kind::object);
    return object_;
  }

  /// The member named `key`, or nullptr when absent or when this is not an object.
  const json_value* find(std::string_view key) const noexcept {
    if (kind_ != kind::object) return nullptr;
    for (const auto& m : object_)
      if (m.first == key) return &m.second;
    return nullptr;
  }
  /// Sets member `key` (replacing an existing one in place) and returns the member; a null
  /// value becomes an object.
  json_value& set(std::string key, json_value v) {
    if (kind_ == kind::null) kind_ = kind::object;
    expect(kind::object);
    for (auto& m : object_)
      if (m.first == key) return m.second = std::move(v);
    object_.emplace_back(std::move(key), std::move(v));
    return object_.back().second;
  }
  /// Appends to an array and returns the new element; a null value becomes an array.
  json_value& push_back(json_value v) {
    if (kind_ == kind::null) kind_ = kind::array;
    expect(kind::array);
    array_.push_back(std::move(v));
    return array_.back();
  }

  /// The name of a kind ("null", "boolean", "number", "string", "array", "object").
  static const char* kind_name(kind k) noexcept {
    switch (k) {
      case kind::null:
        return "null";
      case kind::boolean:
        return "boolean";
      case kind::number:
        return "number";
      case kind::string:
        return "string";
      case kind::array:
        return "array";
      case kind::object:
        return "object";
    }
    return "?";
  }

  /// Structural equality; numbers compare by value when both are integers or both convert.
  friend bool operator==(const json_value& a, const json_value& b) {
    if (a.kind_ != b.kind_) return false;
    switch (a.kind_) {
      case kind::null:
        return true;
      case kind::boolean:
        return a.bool_ == b.bool_;
      case kind::number:
        return a.text_ == b.text_ ||
               (!a.is_integer() && !b.is_integer() && a.as_double() == b.as_double());
      case kind::string:
        return a.text_ == b.text_;
      case kind::array:
        return a.array_ == b.array_;
      case kind::object:
        return a.object_ == b.object_;
    }
    return false;
  }
  /// Negation of ==.
  friend bool operator!=(const json_value& a, const json_value& b) { return !(a == b); }

  /// True when `text` is an RFC 8259 number.
  static bool valid_number(std::string_view t) noexcept {
    std::size_t i = 0, n = t.size();
    auto digit = [&](std::size_t k) { return k < n && t[k] >= '0' && t[k] <= '9'; };
    if (i < n && t[i] == '-') ++i;
    if (!digit(i)) return false;
    if (t[i] == '0') {
      ++i;
    } else {
      while (digit(i)) ++i;
    }
    if (i < n && t[i] == '.') {
      ++i;
      if (!digit(i)) return false;
      while (digit(i)) ++i;
    }
    if (i < n && (t[i] == 'e' || t[i] == 'E')) {
      ++i;
      if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
      if (!digit(i)) return false;
      while (digit(i)) ++i;
    }
    return i == n;
  }

 private:
  void expect(kind k) const {
    if (kind_ != k)
      throw error(EINVAL, "json", "",
                  std::string("value is ") + kind_name(kind_) + ", not " + kind_name(k));
  }
  void expect_integer() const {
    expect(kind::number);
    if (!is_integer()) throw error(EINVAL, "json", "", "number is not an integer: " + text_);
  }

  static std::string format_double(double d) {
    if (!std::isfinite(d)) throw error(EDOM, "json", "", "NaN and infinities are not JSON");
    char buf[64];
    std::size_t len = 0;
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    auto r = std::to_chars(buf, buf + sizeof buf, d);
    len = static_cast<std::size_t>(r.ptr - buf);
#else
    for (int prec = 15; prec <= 17; ++prec) {
      int w = std::snprintf(buf, sizeof buf, "%.*g", prec, d);
      len = static_cast<std::size_t>(w);
      for (std::size_t i = 0; i < len; ++i)
        if (buf[i] == ',') buf[i] = '.';  // a locale's decimal comma
      if (parse_double(std::string(buf, len)) == d) break;
    }
#endif
    std::string s(buf, len);
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  }

  static double parse_double(const std::string& t) {
    double v = 0;
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (r.ec == std::errc::result_out_of_range)
      throw error(ERANGE, "json", "", "number out of double range: " + t);
    if (r.ec != std::errc()) throw error(EINVAL, "json", "", "not a number: " + t);
#else
    // strtod honours the C locale's decimal point: substitute it for '.'.
    std::string local = t;
    const char* point = std::localeconv()->decimal_point;
    auto dot = local.find('.');
    if (dot != std::string::npos && point && point[0] != '.') local.replace(dot, 1, point);
    errno = 0;
    v = std::strtod(local.c_str(), nullptr);
    if (errno == ERANGE && std::isinf(v))
      throw error(ERANGE, "json", "", "number out of double range: " + t);
#endif
    return v;
  }

  kind kind_ = kind::null;
  bool bool_ = false;
  std::string text_;  // a string's bytes or a number's text
  array_t array_;
  object_t object_;
};

/// `s` as a JSON string literal, quotes included: `"`, `\` and control characters escaped
/// (\b \f \n \r \t, others as \u00XX); every other byte, UTF-8 included, passed through.
inline std::string json_quote(std::string_view s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

namespace json_impl {

inline void write(std::string& out, const json_value& v, int indent, int depth) {
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(d), ' ');
  };
  switch (v.type()) {
    case json_value::kind::null:
      out += "null";
      break;
    case json_value::kind::boolean:
      out += v.as_bool() ? "true" : "false";
      break;
    case json_value::kind::number:
      out += v.number_text();
      break;
    case json_value::kind::string:
      out += json_quote(v.as_string());
      break;
    case json_value::kind::array: {
      const auto& a = v.as_array();
      out += '[';
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i) out += ',';
        newline(depth + 1);
        write(out, a[i], indent, depth + 1);
      }
      if (!a.empty()) newline(depth);
      out += ']';
      break;
    }
    case json_value::kind::object: {
      const auto& o = v.as_object();
      out += '{';
      for (std::size_t i = 0; i < o.size(); ++i) {
        if (i) out += ',';
        newline(depth + 1);
        out += json_quote(o[i].first);
        out += indent > 0 ? ": " : ":";
        write(out, o[i].second, indent, depth + 1);
      }
      if (!o.empty()) newline(depth);
      out += '}';
      break;
    }
  }
}

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

/// Compact JSON text of `v` (no whitespace), members in insertion order.
inline std::string to_json(const json_value& v) {
  std::string out;
  json_impl::write(out, v, 0, 0);
  return out;
}

/// JSON text of `v` indented by `indent` spaces per level (0: compact), for files people read.
inline std::string to_json(const json_value& v, int indent) {
  std::string out;
  json_impl::write(out, v, indent, 0);
  if (indent > 0) out += '\n';
  return out;
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
