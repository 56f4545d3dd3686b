// holdfast/handoff/command.hpp — a command: ordered keys with string, integer, boolean or double
// values, the payload a job hands another (command.json, a flag file, ready.json).
//
// Guarantees:
//   - Keys are kept in the order they were set; setting a key again replaces its value in place.
//   - Typed getters convert string values as absl does: get_bool takes true/t/1/false/f/0 in
//     any case (Python's True/False) and yes/no; get_int takes decimal and, as absl, a `0x`
//     (hex) or `0o` (octal) prefix, lowercase, without a sign; an unconvertible value throws
//     holdfast::format_error naming the file and the line or offset it was read from, and a
//     missing required key names the file and the key.
//   - A key, a cache id or a file name containing '/', "..", or NUL, or an empty one, is
//     rejected (EINVAL): each is one path component (validate_component).
// Caveats:
//   - Python's None arrives as the string "None" (get_string), as absl would give it to a
//     string flag.
#pragma once

#include <charconv>  // from_chars: typed getters on string values
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/ascii.hpp"  // ascii_iequal: absl booleans in any case
#include "../detail/json.hpp"   // json_value: the number grammar of double values
#include "../error.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

/// Throws holdfast::error(EINVAL, what, s) unless `s` is a non-empty single path component
/// without '/', "..", or NUL.
inline void validate_component(std::string_view s, const char* what) {
  const char* why = nullptr;
  if (s.empty())
    why = "must not be empty";
  else if (s.find('/') != std::string_view::npos)
    why = "must not contain '/'";
  else if (s.find('\0') != std::string_view::npos)
    why = "must not contain NUL";
  else if (s.find("..") != std::string_view::npos)
    why = "must not contain \"..\"";
  else if (s == ".")
    why = "must not be \".\"";
  if (why) throw error(EINVAL, what, std::string(s), why);
}

/// Parses an int64 as absl's IntegerParser does: decimal with an optional '-', or a lowercase
/// `0x` (hex) or `0o` (octal) prefix without a sign; false when `t` is not one.
inline bool parse_flag_int(std::string_view t, std::int64_t& out) noexcept {
  int base = 10;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'o')) {
    base = t[1] == 'x' ? 16 : 8;
    t.remove_prefix(2);
    if (t.front() == '-') return false;
  }
  if (t.empty()) return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out, base);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

}  // namespace detail

struct json_codec;
struct flag_codec;

/// A command: ordered keys with string, integer, boolean or double values.
class command {
 public:
  /// The four value types.
  enum class type { string, integer, boolean, real };

  /// One value; `text` holds a string's bytes, other types hold their canonical text too.
  struct value {
    type kind = type::string;
    std::string text;
    std::int64_t integer = 0;
    bool boolean = false;
    double real = 0;
    friend bool operator==(const value& a, const value& b) {
      if (a.kind != b.kind) return false;
      switch (a.kind) {
        case type::string:
          return a.text == b.text;
        case type::integer:
          return a.integer == b.integer;
        case type::boolean:
          return a.boolean == b.boolean;
        case type::real:
          return a.real == b.real;
      }
      return false;
    }
    friend bool operator!=(const value& a, const value& b) { return !(a == b); }
  };

  /// One entry and where it was read (line for flag files, byte offset for JSON; 0 if built).
  struct entry {
    std::string key;
    value val;
    std::size_t where = 0;
    std::string file;  ///< the nested flag file it was read from; empty: source()
  };

  command() = default;
  /// An empty command that names `source` (a file) in its errors.
  explicit command(std::string source) : source_(std::move(source)) {}

  /// Sets a string value (keys: non-empty, no '=', '/', "..", NUL, whitespace; not '-' first).
  command& set(std::string key, std::string v) {
    value x;
    x.text = std::move(v);
    return put(std::move(key), std::move(x));
  }
  /// Sets a string value.
  command& set(std::string key, const char* v) { return set(std::move(key), std::string(v)); }
  /// Sets a boolean value.
  command& set(std::string key, bool v) {
    value x;
    x.kind = type::boolean;
    x.boolean = v;
    x.text = v ? "true" : "false";
    return put(std::move(key), std::move(x));
  }
  /// Sets an integer value.
  template <class T, std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value &&
                                          !std::is_same<T, char>::value,
                                      int> = 0>
  command& set(std::string key, T v) {
    value x;
    x.kind = type::integer;
    if constexpr (std::is_unsigned<T>::value) {
      if (v > static_cast<std::make_unsigned_t<std::int64_t>>(INT64_MAX))
        throw error(ERANGE, "command", key, "integer above int64");
    }
    x.integer = static_cast<std::int64_t>(v);
    x.text = std::to_string(x.integer);
    return put(std::move(key), std::move(x));
  }
  /// Sets a double value (finite only).
  command& set(std::string key, double v) {
    value x;
    x.kind = type::real;
    x.real = v;
    x.text = detail::json_value(v).number_text();  // throws for NaN and infinities
    return put(std::move(key), std::move(x));
  }

  /// True when `key` is present.
  bool contains(std::string_view key) const noexcept { return find(key) != nullptr; }
  /// The entry for `key`, or nullptr.
  const entry* find(std::string_view key) const noexcept {
    for (const auto& e : entries_)
      if (e.key == key) return &e;
    return nullptr;
  }
  /// The entries in order.
  const std::vector<entry>& entries() const noexcept { return entries_; }
  /// The number of entries.
  std::size_t size() const noexcept { return entries_.size(); }
  /// The file this command was read from ("" when built in memory).
  const std::string& source() const noexcept { return source_; }
  /// What reading accepted but noted, as absl warns (a circular --flagfile skipped).
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }

  /// Throws format_error(source, "missing required key 'k'") for the first key absent.
  void require(std::initializer_list<std::string_view> keys) const {
    for (auto k : keys) (void)at(k);
  }

  /// A string value (any value's text).
  const std::string& get_string(std::string_view key) const { return at(key).val.text; }
  /// An integer value; a string value is parsed as absl parses one (decimal, `0x`, `0o`).
  std::int64_t get_int(std::string_view key) const {
    const entry& e = at(key);
    if (e.val.kind == type::integer) return e.val.integer;
    std::int64_t v = 0;
    if (e.val.kind == type::string && detail::parse_flag_int(e.val.text, v)) return v;
    throw bad_value(e, "an integer");
  }
  /// A boolean value; a string value may be true/t/1/yes or false/f/0/no, in any case.
  bool get_bool(std::string_view key) const {
    const entry& e = at(key);
    if (e.val.kind == type::boolean) return e.val.boolean;
    if (e.val.kind == type::string) {
      const std::string_view t = e.val.text;
      for (std::string_view yes : {"true", "t", "1", "yes"})
        if (detail::ascii_iequal(t, yes)) return true;
      for (std::string_view no : {"false", "f", "0", "no"})
        if (detail::ascii_iequal(t, no)) return false;
    }
    throw bad_value(e, "a boolean");
  }
  /// A double value; integers convert, a string value is parsed as a JSON number.
  double get_double(std::string_view key) const {
    const entry& e = at(key);
    if (e.val.kind == type::real) return e.val.real;
    if (e.val.kind == type::integer) return static_cast<double>(e.val.integer);
    if (e.val.kind == type::string && detail::json_value::valid_number(e.val.text))
      return detail::json_value::number_from_text(e.val.text).as_double();
    throw bad_value(e, "a number");
  }

  /// Same keys in the same order with equal typed values (sources and positions ignored).
  friend bool operator==(const command& a, const command& b) {
    if (a.entries_.size() != b.entries_.size()) return false;
    for (std::size_t i = 0; i < a.entries_.size(); ++i)
      if (a.entries_[i].key != b.entries_[i].key || a.entries_[i].val != b.entries_[i].val)
        return false;
    return true;
  }
  friend bool operator!=(const command& a, const command& b) { return !(a == b); }

  /// Validates a key: throws holdfast::error(EINVAL, "command key", key) when unusable.
  static void validate_key(std::string_view key) {
    detail::validate_component(key, "command key");
    for (char c : key)
      if (c == '=' || c == ' ' || c == '\t' || c == '\n' || c == '\r')
        throw error(EINVAL, "command key", std::string(key), "must not contain '=' or whitespace");
    if (key.front() == '-') throw error(EINVAL, "command key", std::string(key), "starts with '-'");
  }

  /// Where entries were read: "line" (flag files) or "offset" (JSON); 0 when built.
  const std::string& position_kind() const noexcept { return where_kind_; }

 private:
  // Adds an entry read from a file (used by the codecs); rejects a duplicate key.
  void add_parsed(std::string key, value v, std::size_t where, const char* where_kind) {
    if (find(key)) {
      throw format_error(source_, std::string(where_kind) + " " + std::to_string(where) +
                                      ": duplicate key '" + key + "'");
    }
    entries_.push_back(entry{std::move(key), std::move(v), where, {}});
  }
  // Sets an entry read from a flag file (from `file` when nested): a later line wins.
  void set_parsed(std::string key, value v, std::size_t where, const std::string& file) {
    for (auto& e : entries_)
      if (e.key == key) {
        e.val = std::move(v);
        e.where = where;
        e.file = file;
        return;
      }
    entries_.push_back(entry{std::move(key), std::move(v), where, file});
  }
  command& put(std::string key, value v) {
    validate_key(key);
    for (auto& e : entries_)
      if (e.key == key) {
        e.val = std::move(v);
        return *this;
      }
    entries_.push_back(entry{std::move(key), std::move(v), 0, {}});
    return *this;
  }
  const entry& at(std::string_view key) const {
    if (const entry* e = find(key)) return *e;
    throw format_error(source_.empty() ? std::string("command") : source_,
                       "missing required key '" + std::string(key) + "'");
  }
  format_error bad_value(const entry& e, const char* wanted) const {
    std::string where = e.where ? where_kind_ + " " + std::to_string(e.where) + ": " : "";
    const std::string& file = e.file.empty() ? source_ : e.file;
    return format_error(
        file.empty() ? std::string("command") : file,
        where + "key '" + e.key + "': expected " + wanted + ", got '" + e.val.text + "'");
  }

  friend struct json_codec;
  friend struct flag_codec;

  std::string source_;
  std::vector<entry> entries_;
  std::vector<std::string> warnings_;
  std::string where_kind_ = "line";  // how entry::where counts: "line" or "offset"
};

HOLDFAST_NAMESPACE_END
