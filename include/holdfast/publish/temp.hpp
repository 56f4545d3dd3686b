// holdfast/publish/temp.hpp — the temp files publishing writes first, their one name pattern,
// and the sweep that removes what a killed writer left.
//
// Guarantees:
//   - Every temp holdfast creates is "<dir>/.holdfast-tmp.<pid>.<16 hex>.<name>" (or another
//     given prefix), created O_CREAT|O_EXCL|O_NOFOLLOW with mode 0600 and a fresh suffix on
//     EEXIST, the name cut so the whole stays within 255 bytes; is_temp_name recognizes
//     exactly that pattern.
//   - sweep_stale_temps removes only names matching is_temp_name whose last change (the later
//     of mtime and ctime, so a fresh hard link counts as a change) is older than the given
//     age; other names, and directories, are never touched.
//   - detail::unlink_guard unlinks its path on destruction unless released, and never throws.
// Caveats:
//   - The age is compared with the wall clock: a clock stepped backwards makes temps look
//     younger (kept longer), never older.
#pragma once

#include <fcntl.h>     // O_* flags of a new temp
#include <sys/stat.h>  // S_ISREG: only files are swept

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "../error.hpp"
#include "../io.hpp"
#include "remove.hpp"  // detail::list_directory: the sweep's listing

HOLDFAST_NAMESPACE_BEGIN

/// The prefix of every temp name holdfast creates: ".holdfast-tmp.<pid>.<hex>.<name>".
inline constexpr std::string_view temp_prefix = ".holdfast-tmp.";

namespace detail {

/// {directory, name} of a path; the directory is "." for a bare name.
inline std::pair<std::string, std::string> split_path(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto slash = p.rfind('/');
  if (slash == std::string::npos) return {".", p};
  if (slash == 0) return {"/", p.substr(1)};
  return {p.substr(0, slash), p.substr(slash + 1)};
}

/// A name unlikely to collide, without global state: clock, stack address and an attempt count.
inline std::string temp_suffix(unsigned attempt) {
  int marker = 0;
  auto t = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  auto a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&marker));
  std::uint64_t x = t ^ (a * 0x9e3779b97f4a7c15ull) ^ (std::uint64_t{attempt} << 56);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  static const char hex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, x >>= 4) s[static_cast<std::size_t>(i)] = hex[x & 0xf];
  return s;
}

/// "<dir>/<prefix><pid>.<hex>.<name>" (prefix ".holdfast-tmp." unless given), the name cut so
/// the whole stays within 255 bytes.
template <class Io>
std::string temp_path_for(const std::string& dir, const std::string& name, unsigned attempt,
                          std::string_view prefix = temp_prefix) {
  std::string base =
      std::string(prefix) + std::to_string(Io::getpid()) + "." + temp_suffix(attempt) + ".";
  constexpr std::size_t name_max = 255;
  base += name.substr(0, name_max > base.size() ? name_max - base.size() : 0);
  return dir == "/" ? "/" + base : dir + "/" + base;
}

/// Creates a fresh temp next to `target` (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), named with `prefix`.
template <class Io>
basic_fd<Io> create_temp(const std::string& dir, const std::string& name, int extra_flags = 0,
                         std::string_view prefix = temp_prefix) {
  for (unsigned attempt = 0;; ++attempt) {
    std::string temp = temp_path_for<Io>(dir, name, attempt, prefix);
    int fd = Io::open(temp.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags, 0600);
    if (fd >= 0) return basic_fd<Io>(fd, temp);
    if (errno == EINTR || (errno == EEXIST && attempt < 16)) continue;
    throw error(errno, "open", temp);
  }
}

/// Unlinks a path on destruction unless released; never throws.
template <class Io>
class unlink_guard {
 public:
  explicit unlink_guard(std::string path) : path_(std::move(path)) {}
  unlink_guard(const unlink_guard&) = delete;
  unlink_guard& operator=(const unlink_guard&) = delete;
  ~unlink_guard() {
    if (!path_.empty()) Io::unlink(path_.c_str());
  }
  void release() noexcept { path_.clear(); }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace detail

/// True when `name` (a bare file name) has the form of a holdfast temp.
inline bool is_temp_name(std::string_view name) noexcept {
  if (name.substr(0, temp_prefix.size()) != temp_prefix) return false;
  std::size_t i = temp_prefix.size(), digits = 0, hexes = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i, ++digits;
  if (digits == 0 || i >= name.size() || name[i] != '.') return false;
  ++i;
  while (i < name.size() &&
         ((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
    ++i, ++hexes;
  return hexes == 16 && i < name.size() && name[i] == '.';
}

namespace detail {

/// The wall clock as sweep_stale_temps compares it with a file's times.
inline std::chrono::nanoseconds sweep_clock_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::system_clock::now().time_since_epoch());
}

/// sweep_stale_temps's age test: whether `st` last changed (the later of mtime and ctime, so a
/// fresh hard link counts as a change) at least `older_than` before `now`.
inline bool is_stale(const struct stat& st, std::chrono::nanoseconds now,
                     std::chrono::milliseconds older_than) {
  auto ns = [](const timespec& ts) {
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  return now - std::max(ns(st.st_mtim), ns(st.st_ctim)) >= older_than;
}

}  // namespace detail

/// Removes holdfast temps in `dir` (names matching is_temp_name) whose last change (the later
/// of mtime and ctime, so a fresh hard link counts as a change) is older than `older_than`;
/// returns how many it removed. Other names, and directories, are never touched. Run it at
/// start-up, with a threshold well above the longest publish, to clean up after killed writers.
template <class Io = posix_io>
std::size_t sweep_stale_temps(const std::string& dir, std::chrono::milliseconds older_than) {
  const auto now = detail::sweep_clock_now();
  std::size_t removed = 0;
  for (const auto& n : detail::list_directory<Io>(dir)) {
    if (!is_temp_name(n)) continue;
    std::string p = dir + "/" + n;
    struct stat st {};
    if (Io::lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      throw error(errno, "lstat", p);
    }
    if (S_ISDIR(st.st_mode) || !detail::is_stale(st, now, older_than)) continue;
    if (Io::unlink(p.c_str()) != 0) {
      if (errno == ENOENT) continue;
      throw error(errno, "unlink", p);
    }
    ++removed;
  }
  return removed;
}

HOLDFAST_NAMESPACE_END
