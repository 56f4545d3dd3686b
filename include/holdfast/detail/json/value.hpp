// holdfast/detail/json/value.hpp — a JSON value (null, boolean, number kept as text, string,
// array, ordered object) and its writer.
//
// Guarantees:
//   - Numbers keep their text, so a 64-bit integer round-trips exactly (is_integer(),
//     as_int64(), as_uint64()); as_double() converts on demand.
//   - Objects keep insertion order; to_json writes members in that order.
//   - json_value(double) always writes a number with a '.' or an exponent, so a double reads
//     back as a double (3.0 is written "3.0", not "3").
//   - Formatting of numbers does not depend on the C locale.
//   - json_quote escapes `"`, `\` and every control character; other bytes pass through.
// Caveats:
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
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../error.hpp"

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

}  // namespace json_impl

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
