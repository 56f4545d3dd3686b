// holdfast/handoff/flag_codec.hpp — the command codec for absl-style flag files (`flagfile`):
// one `--key=value` per line, read as absl's --flagfile reads them.
//
// Guarantees:
//   - flag_codec reads what absl's --flagfile reads (abseil-py _flagvalues.py) and what TF's
//     NCF main job writes ("--{}={}".format(k, v), Python str() values): blank lines and lines
//     whose first non-blank characters are `#` or `//` are skipped; each line is stripped of
//     leading and trailing whitespace; `--name=value` and `-name=value`; a bare `--name` is
//     true and a bare `--noname` sets `name` to false; a flag given twice takes the later
//     value; the last line needs no newline. Values arrive as strings that command's typed
//     getters convert.
//   - `--flagfile=<file>` is followed, as absl does: the named file's lines are read in its
//     place. A relative name is taken relative to the directory of the file that names it
//     (absl takes it relative to its working directory: the same when the job runs in the
//     cache root). A file already being read (same path, or same device and inode) is skipped,
//     as absl skips it, and the skip is recorded in command::warnings(); nesting deeper than
//     flag_codec::max_nesting_depth files, an unreadable or not regular file (a device, a FIFO,
//     a directory), or `--flagfile` without `=file` is a format_error naming the file that
//     holds the line and the one that included it. Reading never modifies anything.
//   - flag_codec never writes what would be read back differently: a value with a newline,
//     a NUL or trailing whitespace, or a key named `flagfile`, is refused (EINVAL).
// Caveats:
//   - Flag values cannot contain a newline or end in whitespace (publishing one throws EINVAL);
//     use json_codec.
//   - Without a schema a bare `--noname` always means name=false: a boolean whose own name
//     starts with "no" must be written with a value (`--notify=true`, as flag_codec writes).
//   - Nested flag files are read with posix_io whatever the Io policy of the await_* call.
#pragma once

#include <fcntl.h>     // O_RDONLY, O_NONBLOCK: a FIFO named by --flagfile must not block
#include <sys/stat.h>  // S_ISREG, the device and inode of a flag file

#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>  // error_code::message: why a nested flag file cannot be read
#include <vector>

#include "../error.hpp"
#include "../io.hpp"  // open_file, stat_fd, read_all
#include "command.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

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

HOLDFAST_NAMESPACE_END
