// holdfast/handoff.hpp — command and ready files handed between jobs through a cache root.
//
// The pattern of TF models' NCF pipeline: the main job publishes a command (a flag file of
// `--key=value` lines, or a flat `command.json`) into a cache root named by a cache id; a data
// job, started as a subprocess or separately, waits for it, then publishes `ready.json` once per
// training cycle. Several workers meet on one root by sharing the cache id.
//
//   <data_dir>/<cache_id>/command.json                     (or `flagfile` with flag_codec)
//   <data_dir>/<cache_id>/training_cycle_<n>/ready.json
//
// Guarantees:
//   - Every file is published with publish.hpp (temp + rename), so a reader never sees it
//     partial; await_* read through one descriptor (wait.hpp).
//   - json_codec writes and reads a flat JSON object whose values are strings, integers
//     (int64, exact), booleans and doubles (always written with '.' or an exponent, so their
//     type survives), with RFC 8259 escapes. flag_codec writes `--key=value` lines, as absl
//     flag files; reading it gives string values that the typed getters convert.
//   - flag_codec reads what absl's --flagfile reads (abseil-py _flagvalues.py) and what TF's
//     NCF main job writes ("--{}={}".format(k, v), Python str() values): blank lines and lines
//     whose first non-blank characters are `#` or `//` are skipped; each line is stripped of
//     leading and trailing whitespace; `--name=value` and `-name=value`; a bare `--name` is
//     true and a bare `--noname` sets `name` to false; a flag given twice takes the later
//     value; the last line needs no newline. get_bool takes true/t/1/false/f/0 in any case
//     (Python's True/False) and yes/no; get_int takes decimal and, as absl, a `0x` (hex) or
//     `0o` (octal) prefix, lowercase, without a sign.
//   - `--flagfile=<file>` is followed, as absl does: the named file's lines are read in its
//     place. A relative name is taken relative to the directory of the file that names it
//     (absl takes it relative to its working directory: the same when the job runs in the
//     cache root). A file already being read (same path, or same device and inode) is skipped,
//     as absl skips it, and the skip is recorded in command::warnings(); nesting deeper than
//     flag_codec::max_nesting_depth files, an unreadable or not regular file (a device, a FIFO,
//     a directory), or `--flagfile` without `=file` is a format_error. An empty `--flagfile=` is
//     ignored, as in absl.
//   - flag_codec never writes what would be read back differently: a value with a newline,
//     a NUL or trailing whitespace, or a key named `flagfile`, is refused (EINVAL).
//   - Malformed input (bad syntax, a nested or null JSON value, a duplicate JSON key, an
//     unconvertible value) throws holdfast::format_error naming the file and the line (flag
//     files: the file that holds the line, and the one that included it) or byte offset
//     (JSON); a missing required key names the file and the key. Reading never modifies
//     anything.
//   - A cache id, a file name, or a key containing '/', "..", or NUL is rejected (EINVAL), as
//     is an empty one.
//   - basic_cache_root creates the root (mkdir) or joins an existing one; with the create_only
//     tag it only creates, and an existing root is an error (EEXIST). It removes the root at
//     destruction only if it created it, only in the process that created it, and only if the
//     directory there is still the one it created (same device and inode).
//   - The default cache id is the UTC time to the second, the host name (made a safe path
//     component), the pid and 32 random bits ("20240131T235959-node1-4242-9f86d081"): pids
//     repeat across containers, the host name and the random bits do not.
// Caveats:
//   - The "same directory" check compares device and inode: a root removed by someone else and
//     re-created may get the same inode number back, and is then removed.
//   - Flag values cannot contain a newline or end in whitespace (publishing one throws EINVAL);
//     use json_codec. Python's None arrives as the string "None" (get_string), as absl would
//     give it to a string flag.
//   - Without a schema a bare `--noname` always means name=false: a boolean whose own name
//     starts with "no" must be written with a value (`--notify=true`, as flag_codec writes).
//   - Nested flag files are read with posix_io whatever the Io policy of the await_* call.
//   - The default cache id is unique, so workers that must meet pass an explicit id.
#pragma once

#include <sys/stat.h>
#include <unistd.h>  // gethostname: the default cache id

#include <charconv>  // from_chars: typed getters on string values
#include <chrono>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <optional>
#include <random>  // random_device: 32 random bits in the default cache id
#include <string>
#include <string_view>
#include <system_error>  // error_code::message: why a nested flag file cannot be read
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/ascii.hpp"  // ascii_iequal: absl booleans in any case
#include "detail/json.hpp"
#include "error.hpp"
#include "io.hpp"
#include "publish.hpp"
#include "wait.hpp"

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

/// True for the ASCII characters Python's str.strip() drops: space, \t \n \v \f \r, \x1c-\x1f.
constexpr bool is_flag_space(char c) noexcept {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

/// `s` without leading and trailing is_flag_space characters (absl's `line.strip()`).
constexpr std::string_view strip_flag_space(std::string_view s) noexcept {
  while (!s.empty() && is_flag_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_flag_space(s.back())) s.remove_suffix(1);
  return s;
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

/// `s` as a safe path component for a cache id: ASCII letters, digits, '_', '-' and '.' kept
/// ('.' not first and not after another '.'), anything else '_'; at most 64 characters;
/// "host" when empty.
inline std::string path_safe(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-' || (c == '.' && !out.empty() && out.back() != '.');
    out += keep ? c : '_';
  }
  return out.empty() ? std::string("host") : out;
}

/// 32 random bits from std::random_device (getrandom on Linux); where it is unavailable, a mix
/// of the monotonic clock, the pid and a stack address (still differs between processes).
inline std::uint32_t random_bits32() noexcept {
  try {
    std::random_device rd;
    return static_cast<std::uint32_t>(rd());
  } catch (...) {
    int here = 0;
    auto x =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (static_cast<std::uint64_t>(::getpid()) << 32) ^
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&here));
    x ^= x >> 33;  // splitmix64 finalizer
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<std::uint32_t>(x);
  }
}

/// A flag file's identity for cycle detection: its path, and its device and inode when known.
struct flag_file_id {
  std::string path;
  bool known = false;
  dev_t dev = 0;
  ino_t ino = 0;

  template <class Io>
  static flag_file_id of(const std::string& path) {
    flag_file_id id{path};
    struct stat st {};
    if (Io::stat(path.c_str(), &st) == 0) {
      id.known = true;
      id.dev = st.st_dev;
      id.ino = st.st_ino;
    }
    return id;
  }
  bool same(const flag_file_id& o) const noexcept {
    return path == o.path || (known && o.known && dev == o.dev && ino == o.ino);
  }
};

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

/// Codec: a flat JSON object (strings, integers, booleans, doubles), file `command.json`.
struct json_codec {
  /// The default file name in a cache root.
  static constexpr std::string_view file_name = "command.json";

  /// The JSON text of `c`, one member per line.
  static std::string encode(const command& c) {
    detail::json_value obj{detail::json_value::object_t{}};
    for (const auto& e : c.entries()) {
      switch (e.val.kind) {
        case command::type::string:
          obj.set(e.key, e.val.text);
          break;
        case command::type::integer:
          obj.set(e.key, e.val.integer);
          break;
        case command::type::boolean:
          obj.set(e.key, e.val.boolean);
          break;
        case command::type::real:
          obj.set(e.key, e.val.real);
          break;
      }
    }
    return detail::to_json(obj, 2);
  }

  /// Parses `text` read from `source`; throws format_error naming source and byte offset.
  static command decode(std::string_view text, const std::string& source) {
    detail::json_value doc = detail::parse_json(text, source);
    auto offset_of = [&](const std::string& key) -> std::size_t {
      auto at = text.find(detail::json_quote(key));
      return at == std::string_view::npos ? 0 : at;
    };
    if (!doc.is_object())
      throw format_error(source, std::string("offset 0: expected a JSON object, got ") +
                                     detail::json_value::kind_name(doc.type()));
    command c(source);
    c.where_kind_ = "offset";
    for (const auto& m : doc.as_object()) {
      std::size_t at = offset_of(m.first);
      try {
        command::validate_key(m.first);
      } catch (const error& e) {
        throw format_error(source, "offset " + std::to_string(at) + ": bad key " +
                                       detail::json_quote(m.first) + ": " + e.what());
      }
      command::value v;
      const auto& j = m.second;
      if (j.is_string()) {
        v.text = j.as_string();
      } else if (j.is_bool()) {
        v.kind = command::type::boolean;
        v.boolean = j.as_bool();
        v.text = v.boolean ? "true" : "false";
      } else if (j.is_integer()) {
        v.kind = command::type::integer;
        v.text = j.number_text();
        try {
          v.integer = j.as_int64();
        } catch (const error&) {
          throw format_error(source, "offset " + std::to_string(at) + ": key '" + m.first +
                                         "': integer outside int64: " + v.text);
        }
      } else if (j.is_number()) {
        v.kind = command::type::real;
        v.text = j.number_text();
        try {
          v.real = j.as_double();
        } catch (const error&) {
          throw format_error(source, "offset " + std::to_string(at) + ": key '" + m.first +
                                         "': number outside double range: " + v.text);
        }
      } else {
        throw format_error(source, "offset " + std::to_string(at) + ": key '" + m.first +
                                       "': value must be a string, integer, boolean or "
                                       "double, not " +
                                       detail::json_value::kind_name(j.type()));
      }
      c.add_parsed(m.first, std::move(v), at, "offset");
    }
    return c;
  }
};

/// Codec: absl-style flag file, one `--key=value` per line, file `flagfile`.
struct flag_codec {
  /// The default file name in a cache root.
  static constexpr std::string_view file_name = "flagfile";
  /// How many `--flagfile=` files deep reading follows before it refuses.
  static constexpr std::size_t max_nesting_depth = 32;

  /// `--key=value` lines; throws holdfast::error(EINVAL) for what would read back differently:
  /// a value with a newline or NUL or ending in whitespace, or the key `flagfile`.
  static std::string encode(const command& c) {
    std::string out;
    for (const auto& e : c.entries()) {
      const std::string& v = e.val.text;
      if (e.key == "flagfile")
        throw error(EINVAL, "command", e.key, "'--flagfile=' names a nested file in a flag file");
      if (v.find_first_of(std::string_view("\n\r\0", 3)) != std::string::npos)
        throw error(EINVAL, "command", e.key, "a flag file value cannot contain a newline or NUL");
      if (!v.empty() && detail::is_flag_space(v.back()))
        throw error(EINVAL, "command", e.key,
                    "a flag file value cannot end in whitespace (readers strip it)");
      out += "--" + e.key + "=" + v + "\n";
    }
    return out;
  }

  /// Parses flag-file text read from `source` as absl does (see the top of this header),
  /// following `--flagfile=` into other files (read with Io), relative to `source`'s directory.
  template <class Io = posix_io>
  static command decode(std::string_view text, const std::string& source) {
    command c(source);
    c.where_kind_ = "line";
    std::vector<detail::flag_file_id> stack{detail::flag_file_id::of<Io>(source)};
    parse<Io>(c, text, source, stack, "");
    return c;
  }

 private:
  // Reads the lines of `text` (the content of `file`) into `c`; `stack` holds the files being
  // read, `context` says where `file` was included (appended to its errors).
  template <class Io>
  static void parse(command& c, std::string_view text, const std::string& file,
                    std::vector<detail::flag_file_id>& stack, const std::string& context) {
    std::size_t line_no = 0, pos = 0;
    while (pos < text.size()) {
      ++line_no;
      auto nl = text.find('\n', pos);
      std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
      pos = nl == std::string_view::npos ? text.size() : nl + 1;
      auto fail = [&](const std::string& why) {
        throw format_error(file, "line " + std::to_string(line_no) + ": " + why + context);
      };
      line = detail::strip_flag_space(line);
      if (line.empty() || line.front() == '#' || line.substr(0, 2) == "//") continue;
      if (line.find('\0') != std::string_view::npos) fail("NUL byte in line");
      std::string_view body = line.substr(line.substr(0, 2) == "--" ? 2 : 1);
      if (line.front() != '-' || body.empty())
        fail("expected --key=value, got '" + std::string(line) + "'");
      auto eq = body.find('=');
      std::string key(body.substr(0, eq));
      if (key == "flagfile") {
        if (eq == std::string_view::npos) fail("--flagfile needs a file name (--flagfile=<file>)");
        include<Io>(c, detail::strip_flag_space(body.substr(eq + 1)), file, line_no, stack, fail);
        continue;
      }
      command::value v;
      if (eq != std::string_view::npos) {
        v.text = std::string(body.substr(eq + 1));
      } else if (key.size() > 2 && key.compare(0, 2, "no") == 0) {
        key.erase(0, 2);  // a bare --noname: name is false
        v.text = "false";
      } else {
        v.text = "true";  // a bare --name
      }
      try {
        command::validate_key(key);
      } catch (const error& e) {
        fail("bad key '" + key + "': " + e.what());
      }
      c.set_parsed(std::move(key), std::move(v), line_no, stack.size() > 1 ? file : "");
    }
  }

  // Follows `--flagfile=<name>` found at `file`:`line_no`.
  template <class Io, class Fail>
  static void include(command& c, std::string_view name, const std::string& file,
                      std::size_t line_no, std::vector<detail::flag_file_id>& stack,
                      const Fail& fail) {
    if (name.empty()) return;  // absl ignores an empty --flagfile=
    const std::string directive = "--flagfile=" + std::string(name);
    std::string path(name);
    if (name.front() != '/') {
      auto slash = file.rfind('/');
      path = (slash == std::string::npos ? std::string(".") : file.substr(0, slash)) + "/" + path;
    }
    auto id = detail::flag_file_id::of<Io>(path);
    for (const auto& open : stack)
      if (open.same(id)) {
        c.warnings_.push_back(file + " line " + std::to_string(line_no) + ": " + directive +
                              " is already being read (circular); skipped, as absl does");
        return;
      }
    if (stack.size() > max_nesting_depth)
      fail(directive + ": nested deeper than " + std::to_string(max_nesting_depth) + " files");
    std::string text;
    bool regular = true;
    try {
      auto fd = open_file<Io>(path, O_RDONLY | O_NONBLOCK);  // a FIFO must not block the open
      regular = S_ISREG(stat_fd(fd).st_mode);
      if (regular) text = read_all(fd);
    } catch (const error& e) {
      fail(directive + ": cannot read " + path + ": " + e.code().message());
    }
    if (!regular) fail(directive + ": " + path + " is not a regular file");
    stack.push_back(std::move(id));
    parse<Io>(c, text, path, stack,
              " (included from " + file + " line " + std::to_string(line_no) + ")");
    stack.pop_back();
  }
};

/// A default cache id: the UTC time to the second, the host name, the pid and 32 random bits,
/// e.g. "20240131T235959-node1-4242-9f86d081"; always one valid path component.
template <class Io = posix_io>
std::string default_cache_id() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  static constexpr char hex[] = "0123456789abcdef";
  std::uint32_t r = detail::random_bits32();
  std::string bits(8, '0');
  for (int i = 7; i >= 0; --i, r >>= 4) bits[static_cast<std::size_t>(i)] = hex[r & 0xf];
  return std::string(buf) + "-" + detail::path_safe(host) + "-" + std::to_string(Io::getpid()) +
         "-" + bits;
}

/// Tag: basic_cache_root creates the root and fails with EEXIST if it exists (as
/// Boost.Interprocess create_only); without it, an existing root is joined.
struct create_only_t {
  explicit create_only_t() = default;
};
/// The create_only_t value.
inline constexpr create_only_t create_only{};

/// A cache root `<data_dir>/<cache_id>`: created or joined; removed at destruction only by
/// the process that created it.
template <class Io = posix_io>
class basic_cache_root {
 public:
  /// Creates `<data_dir>/<cache_id>` (mode 0755), or joins it when it exists. The data dir
  /// must exist. Throws EINVAL for a bad cache id.
  basic_cache_root(const std::string& data_dir, const std::string& cache_id)
      : basic_cache_root(data_dir, cache_id, false) {}
  /// A new root under `data_dir` with default_cache_id().
  explicit basic_cache_root(const std::string& data_dir)
      : basic_cache_root(data_dir, default_cache_id<Io>()) {}
  /// Creates `<data_dir>/<cache_id>`; throws holdfast::error(EEXIST, "mkdir") if it exists.
  basic_cache_root(create_only_t, const std::string& data_dir, const std::string& cache_id)
      : basic_cache_root(data_dir, cache_id, true) {}
  /// Creates a new root under `data_dir` with default_cache_id(); EEXIST if it exists.
  basic_cache_root(create_only_t, const std::string& data_dir)
      : basic_cache_root(data_dir, default_cache_id<Io>(), true) {}

 private:
  basic_cache_root(const std::string& data_dir, const std::string& cache_id, bool only_create)
      : id_(cache_id) {
    detail::validate_component(cache_id, "cache_id");
    path_ = data_dir + "/" + cache_id;
    if (Io::mkdir(path_.c_str(), 0755) == 0) {
      created_ = true;
      owner_ = Io::getpid();
    } else if (errno != EEXIST || only_create) {
      throw error(errno, "mkdir", path_);
    }
    struct stat st {};
    if (Io::stat(path_.c_str(), &st) != 0) {
      int e = errno;
      if (created_) Io::rmdir(path_.c_str());
      throw error(e, "stat", path_);
    }
    if (!S_ISDIR(st.st_mode)) throw error(ENOTDIR, "mkdir", path_, "exists and is not a directory");
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }

 public:
  basic_cache_root(basic_cache_root&& o) noexcept
      : id_(std::move(o.id_)),
        path_(std::move(o.path_)),
        created_(std::exchange(o.created_, false)),
        owner_(o.owner_),
        dev_(o.dev_),
        ino_(o.ino_) {}
  basic_cache_root& operator=(basic_cache_root&&) = delete;
  basic_cache_root(const basic_cache_root&) = delete;
  basic_cache_root& operator=(const basic_cache_root&) = delete;

  /// Removes the root if this object created it, in the creating process, and it is still the
  /// same directory. Errors are swallowed (a destructor); call remove() to see them.
  ~basic_cache_root() {
    try {
      remove();
    } catch (const error&) {
    }
  }

  /// The root's path.
  const std::string& path() const noexcept { return path_; }
  /// The cache id.
  const std::string& id() const noexcept { return id_; }
  /// True when this object created the root (and so owns it).
  bool owns() const noexcept { return created_; }
  /// Keeps the root on disk at destruction.
  void release() noexcept { created_ = false; }

  /// Removes the root now under the same conditions as the destructor; true when removed.
  bool remove() {
    if (!created_ || Io::getpid() != owner_) return false;
    created_ = false;
    struct stat st {};
    if (Io::lstat(path_.c_str(), &st) != 0) {
      if (errno == ENOENT) return false;
      throw error(errno, "lstat", path_);
    }
    if (!S_ISDIR(st.st_mode) || st.st_dev != dev_ || st.st_ino != ino_) return false;
    detail::remove_tree<Io>(path_);
    return true;
  }

 private:
  std::string id_;
  std::string path_;
  bool created_ = false;
  pid_t owner_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

/// The cache root for the default Io policy.
using cache_root = basic_cache_root<posix_io>;

/// The directory of one training cycle's files: `<root>/training_cycle_<cycle>`.
inline std::string cycle_directory(const std::string& root, std::uint64_t cycle) {
  return root + "/training_cycle_" + std::to_string(cycle);
}

/// Publishes `cmd` as `<root>/<name>` (default: the codec's file name), atomically.
template <class Codec = json_codec, class Durability = durable, class Io = posix_io>
void publish_command(const std::string& root, const command& cmd,
                     std::string_view name = Codec::file_name) {
  detail::validate_component(name, "command file name");
  basic_publisher<Durability, Io>().publish(root + "/" + std::string(name), Codec::encode(cmd));
}

/// Waits up to `timeout` for `<root>/<name>` with a kept waiter and decodes it; std::nullopt
/// on timeout.
template <class Codec = json_codec, class Wait, class Io>
std::optional<command> await_command(basic_file_waiter<Wait, Io>& waiter, const std::string& root,
                                     std::chrono::milliseconds timeout,
                                     std::string_view name = Codec::file_name) {
  detail::validate_component(name, "command file name");
  std::string path = root + "/" + std::string(name);
  auto text = waiter.await(path, timeout);
  if (!text) return std::nullopt;
  return Codec::decode(*text, path);
}

/// Waits up to `timeout` for `<root>/<name>` and decodes it; std::nullopt on timeout.
template <class Codec = json_codec, class Wait = inotify_wait, class Io = posix_io>
std::optional<command> await_command(const std::string& root, std::chrono::milliseconds timeout,
                                     std::string_view name = Codec::file_name) {
  basic_file_waiter<Wait, Io> waiter;
  return await_command<Codec>(waiter, root, timeout, name);
}

/// Publishes `<root>/training_cycle_<cycle>/ready.json` with `payload` (the directory is
/// created if needed).
template <class Durability = durable, class Io = posix_io>
void publish_ready(const std::string& root, std::uint64_t cycle, const command& payload) {
  std::string dir = cycle_directory(root, cycle);
  if (Io::mkdir(dir.c_str(), 0755) == 0) {
    if constexpr (Durability::sync_parent) {  // the new directory's entry in the root
      auto fd = open_file<Io>(root, O_RDONLY | O_DIRECTORY);
      detail::sync_dir_fd<Durability>(fd);
      fd.close();
    }
  } else if (errno != EEXIST) {
    throw error(errno, "mkdir", dir);
  }
  basic_publisher<Durability, Io>().publish(dir + "/ready.json", json_codec::encode(payload));
}

/// Waits up to `timeout` for cycle `cycle`'s ready.json with a kept waiter (one inotify
/// descriptor for every cycle); std::nullopt on timeout.
template <class Wait, class Io>
std::optional<command> await_ready(basic_file_waiter<Wait, Io>& waiter, const std::string& root,
                                   std::uint64_t cycle, std::chrono::milliseconds timeout) {
  std::string path = cycle_directory(root, cycle) + "/ready.json";
  auto text = waiter.await(path, timeout);
  if (!text) return std::nullopt;
  return json_codec::decode(*text, path);
}

/// Waits up to `timeout` for cycle `cycle`'s ready.json; std::nullopt on timeout.
template <class Wait = inotify_wait, class Io = posix_io>
std::optional<command> await_ready(const std::string& root, std::uint64_t cycle,
                                   std::chrono::milliseconds timeout) {
  basic_file_waiter<Wait, Io> waiter;
  return await_ready(waiter, root, cycle, timeout);
}

HOLDFAST_NAMESPACE_END
