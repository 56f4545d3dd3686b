// holdfast/store/sync_manifest.hpp — the sync manifest, the mirror's state kept at the
// destination: its file names, sync_manifest and sync_manifest_entry, format_sync_manifest and
// the strict parse_sync_manifest, and origin ids (detail::new_origin_id, is_origin_id).
//
// Guarantees:
//   - Format version 1 is line-based text (see sync_manifest): files in path order, each line
//     ending with a newline, an end line counting the files, so truncation is detected.
//   - parse_sync_manifest(format_sync_manifest(m)) == m for every manifest whose paths pass the
//     path rules; paths are escaped (backslash, newline, other control bytes as \xNN with
//     detail::hex_digit decoding them).
//   - Bad input is reported, never obeyed: a wrong first line, a newer version, a malformed or
//     duplicate entry, a path that could leave the run directory (absolute, empty, '.' or '..'
//     component, NUL) or that names one of sync's own files, or a missing end line is a
//     holdfast::format_error naming the file and the line.
//   - An origin id is 128 random bits as 32 lowercase hex digits, mixed with the clock, the pid
//     and a counter in case random_device is weak or fails.
// Caveats:
//   - The manifest is read and rewritten whole: one line per file.
#pragma once

#include <charconv>  // to_chars: the manifest's numbers
#include <chrono>    // clocks: mixed into origin ids
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>  // prev: in-order insertion
#include <map>
#include <random>  // random_device: origin ids
#include <string>
#include <string_view>
#include <utility>

#include "../detail/ascii.hpp"  // hex_digit: the manifest's escapes
#include "../error.hpp"         // format_error
#include "fs_helpers.hpp"       // detail::store_next_serial: origin ids
#include "url.hpp"              // detail::store_starts_with

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// The sync manifest: the mirror's state, kept at the destination
// ---------------------------------------------------------------------------------------------

/// The manifest of a run's mirror, in the run directory (format below; see sync()).
inline constexpr std::string_view sync_manifest_name = ".holdfast-sync-manifest";
/// The lock file syncs of one run take (flock) from reading the manifest to publishing it.
inline constexpr std::string_view sync_lock_name = ".holdfast-sync-manifest.lock";
/// The file in a local directory that holds its origin id (made once, never copied).
inline constexpr std::string_view sync_origin_name = ".holdfast-origin";

/// One file of a sync manifest: the origin that uploaded it and the local version it copied.
struct sync_manifest_entry {
  std::string origin;         ///< origin id of the local directory (32 lowercase hex digits)
  std::int64_t size = 0;      ///< local size when copied
  std::int64_t mtime_ns = 0;  ///< local mtime when copied, nanoseconds since the epoch
  std::uint64_t ino = 0;      ///< local inode when copied
  std::uint32_t mode = 0;     ///< local st_mode when copied (type and permission bits)
  bool racy = false;          ///< modified within 20 ms of that sync's scan: copied again next
  bool operator==(const sync_manifest_entry& o) const noexcept {
    return origin == o.origin && size == o.size && mtime_ns == o.mtime_ns && ino == o.ino &&
           mode == o.mode && racy == o.racy;
  }
  bool operator!=(const sync_manifest_entry& o) const noexcept { return !(*this == o); }
};

/// A run's sync manifest: relative path -> entry. Format version 1, line-based text:
///
///     holdfast-sync-manifest 1
///     file <origin> <size> <mtime_ns> <ino> <mode, octal> <flags: - or r> <path>
///     ...
///     end <number of file lines>
///
/// Every line ends with a newline; fields are separated by one space; the path (relative to the
/// run directory, '/'-separated, no empty, "." or ".." component, not one of sync's own names)
/// is the rest of the line, with a backslash written as two backslashes, a newline as backslash
/// n, and other control bytes as backslash x and two lowercase hex digits. Files are written in
/// path order (read in any order, each once); the end line makes truncation detectable. Origin
/// ids are 32 lowercase hex digits; size, mtime (may be negative), inode are decimal.
struct sync_manifest {
  std::map<std::string, sync_manifest_entry> files;  ///< relative path -> entry
};

namespace detail {
inline constexpr std::string_view manifest_magic = "holdfast-sync-manifest";
inline constexpr unsigned manifest_version = 1;
inline constexpr std::size_t origin_id_length = 32;

inline bool is_origin_id(std::string_view s) noexcept {
  if (s.size() != origin_id_length) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A fresh origin id: 128 random bits as 32 lowercase hex digits (mixed with the clock and the
// pid, in case random_device is weak or fails).
inline std::string new_origin_id(std::uint64_t pid) {
  auto mix = [](std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  };
  auto t = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  auto s = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::uint64_t parts[2] = {mix(t ^ (pid << 40)), mix(s + store_next_serial())};
  try {
    std::random_device rd;
    for (auto& p : parts) p ^= (std::uint64_t{rd()} << 32) ^ std::uint64_t{rd()};
  } catch (const std::exception&) {  // no entropy source: the clock, pid and counter remain
  }
  static const char hex[] = "0123456789abcdef";
  std::string id(origin_id_length, '0');
  for (std::size_t i = 0; i < origin_id_length; ++i)
    id[i] = hex[(parts[i / 16] >> (60 - 4 * (i % 16))) & 15];
  return id;
}

inline std::string manifest_escape(std::string_view path) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

// Why `rel` cannot name a file under a run directory, or nullptr when it can.
inline const char* manifest_path_problem(std::string_view rel) noexcept {
  if (rel.empty()) return "empty path";
  if (rel.find('\0') != std::string_view::npos) return "NUL in the path";
  if (rel.front() == '/') return "absolute path";
  std::size_t start = 0;
  for (;;) {
    std::size_t slash = rel.find('/', start);
    std::string_view part = rel.substr(start, slash - start);
    if (part.empty()) return "empty path component";
    if (part == "." || part == "..") return "'.' or '..' path component";
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  std::string_view top = rel.substr(0, rel.find('/'));
  if (top == sync_manifest_name || top == sync_lock_name || top == sync_origin_name)
    return "a name sync reserves";
  return nullptr;
}

// Parses the manifest's unsigned decimal (or octal) field; false on anything else.
inline bool manifest_number(std::string_view s, unsigned base, std::uint64_t& out) noexcept {
  if (s.empty() || s.size() > 20) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c >= static_cast<char>('0' + base)) return false;
    auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (~std::uint64_t{0} - d) / base) return false;
    v = v * base + d;
  }
  out = v;
  return true;
}

[[noreturn]] inline void manifest_fail(const std::string& path, std::size_t line,
                                       const std::string& why) {
  throw format_error(path, "line " + std::to_string(line) + ": " + why);
}

inline bool manifest_signed(std::string_view s, std::int64_t& out) noexcept {
  bool neg = !s.empty() && s.front() == '-';
  if (neg) s.remove_prefix(1);
  std::uint64_t v = 0;
  if (!manifest_number(s, 10, v)) return false;
  if (v > static_cast<std::uint64_t>(INT64_MAX) + (neg ? 1 : 0)) return false;
  out = neg ? static_cast<std::int64_t>(0 - v) : static_cast<std::int64_t>(v);
  return true;
}
}  // namespace detail

/// The text of `m` in format version 1.
inline std::string format_sync_manifest(const sync_manifest& m) {
  std::string out;
  out.reserve(40 + m.files.size() * 112);
  out += detail::manifest_magic;
  out += ' ';
  out += std::to_string(detail::manifest_version);
  out += '\n';
  char num[24];
  auto append = [&](auto value, int base) {
    auto r = std::to_chars(num, num + sizeof num, value, base);
    out.append(num, r.ptr);
  };
  for (const auto& [path, e] : m.files) {
    out += "file ";
    out += e.origin;
    out += ' ';
    append(e.size, 10);
    out += ' ';
    append(e.mtime_ns, 10);
    out += ' ';
    append(e.ino, 10);
    out += ' ';
    append(e.mode, 8);
    out += e.racy ? " r " : " - ";
    out += detail::manifest_escape(path);
    out += '\n';
  }
  out += "end ";
  append(m.files.size(), 10);
  out += '\n';
  return out;
}

/// Parses manifest text strictly. Throws holdfast::format_error naming `path` (the file, for
/// the message) and the line: a wrong first line, a newer version, a malformed or duplicate
/// entry, a path that could leave the run directory, or a missing end line (truncation).
inline sync_manifest parse_sync_manifest(std::string_view text, const std::string& path) {
  sync_manifest m;
  std::size_t line_no = 0, pos = 0, count = 0;
  bool ended = false;
  auto fail = [&](const std::string& why) { detail::manifest_fail(path, line_no, why); };
  while (pos < text.size()) {
    ++line_no;
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos)
      detail::manifest_fail(path, line_no, "truncated: the last line has no newline");
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (ended) fail("text after the end line");
    if (line_no == 1) {
      std::string_view magic = line.substr(0, line.find(' '));
      if (magic != detail::manifest_magic)
        fail("not a holdfast sync manifest (expected '" + std::string(detail::manifest_magic) +
             " 1')");
      std::uint64_t format_version = 0;
      if (line.size() <= magic.size() + 1 ||
          !detail::manifest_number(line.substr(magic.size() + 1), 10, format_version))
        fail("bad format version");
      if (format_version != detail::manifest_version)
        fail("format version " + std::to_string(format_version) + " (this holdfast reads version " +
             std::to_string(detail::manifest_version) + ")");
      continue;
    }
    if (detail::store_starts_with(line, "end ")) {
      std::uint64_t n = 0;
      if (!detail::manifest_number(line.substr(4), 10, n)) fail("bad end line");
      if (n != count)
        fail("the end line counts " + std::to_string(n) + " files, the manifest lists " +
             std::to_string(count));
      ended = true;
      continue;
    }
    if (!detail::store_starts_with(line, "file ")) fail("expected 'file' or 'end'");
    // file <origin> <size> <mtime_ns> <ino> <mode> <flags> <path>
    std::string_view f[6];
    std::string_view rest = line.substr(5);
    for (auto& field : f) {
      std::size_t sp = rest.find(' ');
      if (sp == std::string_view::npos) fail("too few fields in a file line");
      field = rest.substr(0, sp);
      rest.remove_prefix(sp + 1);
    }
    sync_manifest_entry e;
    std::uint64_t size = 0, ino = 0, mode = 0;
    if (!detail::is_origin_id(f[0])) fail("bad origin id");
    e.origin = std::string(f[0]);
    if (!detail::manifest_number(f[1], 10, size) || size > static_cast<std::uint64_t>(INT64_MAX))
      fail("bad size");
    e.size = static_cast<std::int64_t>(size);
    if (!detail::manifest_signed(f[2], e.mtime_ns)) fail("bad mtime");
    if (!detail::manifest_number(f[3], 10, ino)) fail("bad inode");
    e.ino = ino;
    if (!detail::manifest_number(f[4], 8, mode) || mode > 0177777) fail("bad mode");
    e.mode = static_cast<std::uint32_t>(mode);
    if (f[5] != "-" && f[5] != "r") fail("bad flags (expected '-' or 'r')");
    e.racy = f[5] == "r";
    std::string rel;
    const bool escaped = rest.find('\\') != std::string_view::npos;
    if (!escaped) rel.assign(rest.data(), rest.size());
    for (std::size_t i = 0; escaped && i < rest.size(); ++i) {
      if (rest[i] != '\\') {
        rel += rest[i];
        continue;
      }
      if (i + 1 < rest.size() && (rest[i + 1] == '\\' || rest[i + 1] == 'n')) {
        rel += rest[i + 1] == 'n' ? '\n' : '\\';
        ++i;
        continue;
      }
      auto hexval = [](char c) { return detail::hex_digit(c, detail::hex_case::lower); };
      if (i + 3 >= rest.size() || rest[i + 1] != 'x' || hexval(rest[i + 2]) < 0 ||
          hexval(rest[i + 3]) < 0)
        fail("bad escape in the path");
      rel += static_cast<char>(hexval(rest[i + 2]) * 16 + hexval(rest[i + 3]));
      i += 3;
    }
    if (const char* why = detail::manifest_path_problem(rel))
      fail(std::string(why) + " '" + rel + "'");
    if (m.files.empty() || std::prev(m.files.end())->first < rel)  // in order, as written
      m.files.emplace_hint(m.files.end(), std::move(rel), std::move(e));
    else if (!m.files.try_emplace(rel, std::move(e)).second)
      fail("duplicate path '" + rel + "'");
    ++count;
  }
  if (line_no == 0) throw format_error(path, "line 1: empty file (truncated)");
  if (!ended) detail::manifest_fail(path, line_no, "truncated: no end line");
  return m;
}

HOLDFAST_NAMESPACE_END
