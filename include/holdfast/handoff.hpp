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
//   - Malformed input (bad syntax, a truncated file, a nested or null JSON value, a duplicate
//     key, an unconvertible value) throws holdfast::format_error naming the file and the line
//     (flag files) or byte offset (JSON); a missing required key names the file and the key.
//     Reading never modifies anything.
//   - A cache id, a file name, or a key containing '/', "..", or NUL is rejected (EINVAL), as
//     is an empty one.
//   - basic_cache_root creates the root (mkdir) or joins an existing one; it removes the root
//     at destruction only if it created it, only in the process that created it, and only if
//     the directory there is still the one it created (same device and inode).
// Caveats:
//   - The "same directory" check compares device and inode: a root removed by someone else and
//     re-created may get the same inode number back, and is then removed.
//   - Flag values cannot contain a newline (publishing one throws EINVAL); use json_codec.
//   - The default cache id is the UTC time to the second plus the pid ("20240131T235959-4242"):
//     workers that must meet pass an explicit id.
#pragma once

#include <sys/stat.h>

#include <charconv>  // from_chars: typed getters on string values
#include <chrono>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

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

  /// Throws format_error(source, "missing required key 'k'") for the first key absent.
  void require(std::initializer_list<std::string_view> keys) const {
    for (auto k : keys) (void)at(k);
  }

  /// A string value (any value's text).
  const std::string& get_string(std::string_view key) const { return at(key).val.text; }
  /// An integer value; a string value is parsed as an integer.
  std::int64_t get_int(std::string_view key) const {
    const entry& e = at(key);
    if (e.val.kind == type::integer) return e.val.integer;
    if (e.val.kind == type::string) {
      std::int64_t v = 0;
      const auto& t = e.val.text;
      auto r = std::from_chars(t.data(), t.data() + t.size(), v);
      if (r.ec == std::errc() && r.ptr == t.data() + t.size() && !t.empty()) return v;
    }
    throw bad_value(e, "an integer");
  }
  /// A boolean value; a string value may be true/false/1/0/yes/no.
  bool get_bool(std::string_view key) const {
    const entry& e = at(key);
    if (e.val.kind == type::boolean) return e.val.boolean;
    if (e.val.kind == type::string) {
      const auto& t = e.val.text;
      if (t == "true" || t == "1" || t == "yes") return true;
      if (t == "false" || t == "0" || t == "no") return false;
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
    entries_.push_back(entry{std::move(key), std::move(v), where});
  }
  command& put(std::string key, value v) {
    validate_key(key);
    for (auto& e : entries_)
      if (e.key == key) {
        e.val = std::move(v);
        return *this;
      }
    entries_.push_back(entry{std::move(key), std::move(v), 0});
    return *this;
  }
  const entry& at(std::string_view key) const {
    if (const entry* e = find(key)) return *e;
    throw format_error(source_.empty() ? std::string("command") : source_,
                       "missing required key '" + std::string(key) + "'");
  }
  format_error bad_value(const entry& e, const char* wanted) const {
    std::string where = e.where ? where_kind_ + " " + std::to_string(e.where) + ": " : "";
    return format_error(
        source_.empty() ? std::string("command") : source_,
        where + "key '" + e.key + "': expected " + wanted + ", got '" + e.val.text + "'");
  }

  friend struct json_codec;
  friend struct flag_codec;

  std::string source_;
  std::vector<entry> entries_;
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

  /// `--key=value` lines; throws holdfast::error(EINVAL) for a value with a newline.
  static std::string encode(const command& c) {
    std::string out;
    for (const auto& e : c.entries()) {
      if (e.val.text.find_first_of("\n\r") != std::string::npos)
        throw error(EINVAL, "command", e.key, "a flag file value cannot contain a newline");
      out += "--" + e.key + "=" + e.val.text + "\n";
    }
    return out;
  }

  /// Parses flag-file text: blank lines and '#' comments skipped, `--key=value` or `--key`
  /// (true); every line must end with a newline (a missing one means a truncated file).
  static command decode(std::string_view text, const std::string& source) {
    command c(source);
    c.where_kind_ = "line";
    std::size_t line_no = 0, pos = 0;
    while (pos < text.size()) {
      ++line_no;
      auto nl = text.find('\n', pos);
      auto fail = [&](const std::string& why) {
        throw format_error(source, "line " + std::to_string(line_no) + ": " + why);
      };
      if (nl == std::string_view::npos) fail("no newline at end of file (truncated?)");
      std::string_view line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      if (line.empty() || line.front() == '#') continue;
      if (line.substr(0, 2) != "--") fail("expected --key=value, got '" + std::string(line) + "'");
      line.remove_prefix(2);
      auto eq = line.find('=');
      std::string key(line.substr(0, eq));
      try {
        command::validate_key(key);
      } catch (const error& e) {
        fail("bad key '" + key + "': " + e.what());
      }
      if (line.find('\0') != std::string_view::npos) fail("NUL byte in line");
      command::value v;
      v.text = eq == std::string_view::npos ? "true" : std::string(line.substr(eq + 1));
      c.add_parsed(std::move(key), std::move(v), line_no, "line");
    }
    return c;
  }
};

/// A default cache id: the UTC time to the second and the pid, e.g. "20240131T235959-4242".
template <class Io = posix_io>
std::string default_cache_id() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  return std::string(buf) + "-" + std::to_string(Io::getpid());
}

/// A cache root `<data_dir>/<cache_id>`: created or joined; removed at destruction only by
/// the process that created it.
template <class Io = posix_io>
class basic_cache_root {
 public:
  /// Creates `<data_dir>/<cache_id>` (mode 0755), or joins it when it exists. The data dir
  /// must exist. Throws EINVAL for a bad cache id.
  basic_cache_root(const std::string& data_dir, const std::string& cache_id) : id_(cache_id) {
    detail::validate_component(cache_id, "cache_id");
    path_ = data_dir + "/" + cache_id;
    if (Io::mkdir(path_.c_str(), 0755) == 0) {
      created_ = true;
      owner_ = Io::getpid();
    } else if (errno != EEXIST) {
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
  /// A new root under `data_dir` with default_cache_id().
  explicit basic_cache_root(const std::string& data_dir)
      : basic_cache_root(data_dir, default_cache_id<Io>()) {}

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
