// holdfast/store/fs_helpers.hpp — the file operations the store is made of (internal): path
// joins, lstat, sorted directory listings, mkdir -p, tree removal, directory syncs, nanosecond
// mtimes and a process-wide serial for scratch names; every system call through the Io policy.
//
// Guarantees:
//   - store_list_dir lists names sorted, without "." and ".."; a missing directory lists empty.
//   - store_make_dirs returns the directories it created, outermost first (so a caller can
//     sync or remove exactly those).
//   - store_remove_tree never follows a symlink, even one swapped in mid-removal (publish.hpp's
//     remove_tree); a missing path is not an error.
//   - store_sync_dir syncs a directory exactly when the Durability policy syncs a publish's
//     parent.
// Caveats:
//   - store_next_serial is unique within a process only; scratch names pair it with the pid.
#pragma once

#include <dirent.h>    // DIR: directory scans through the Io policy
#include <fcntl.h>     // O_RDONLY, O_DIRECTORY
#include <sys/stat.h>  // struct stat: nanosecond mtimes

#include <algorithm>  // sort: listings
#include <atomic>     // the scratch-name serial
#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../detail/path.hpp"  // parent_directory
#include "../error.hpp"
#include "../io.hpp"
#include "../publish.hpp"  // remove_tree, detail::sync_dir_fd

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Filesystem helpers (every call through the Io policy)
// ---------------------------------------------------------------------------------------------

namespace detail {
inline std::string store_join(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

// lstat: false when the path does not exist; throws on any other failure.
template <class Io>
bool store_lstat(const std::string& path, struct stat& st) {
  if (Io::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw error(errno, "lstat", path);
}

// The names in `dir` (without "." and ".."), sorted. A missing directory lists as empty.
template <class Io>
std::vector<std::string> store_list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = Io::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return names;
    throw error(errno, "opendir", dir);
  }
  for (;;) {
    errno = 0;
    struct dirent* e = Io::readdir(d);
    if (!e) {
      int err = errno;
      Io::closedir(d);
      if (err != 0) throw error(err, "readdir", dir);
      break;
    }
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// mkdir -p; returns the directories it created, outermost first.
template <class Io>
std::vector<std::string> store_make_dirs(const std::string& path, mode_t mode = 0755) {
  std::vector<std::string> created;
  if (path.empty()) return created;
  struct stat st {};
  if (Io::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return created;
    throw error(ENOTDIR, "mkdir", path);
  }
  if (errno != ENOENT) throw error(errno, "stat", path);
  std::string parent = parent_directory(path);
  if (parent != path && parent != "." && parent != "/") created = store_make_dirs<Io>(parent, mode);
  if (Io::mkdir(path.c_str(), mode) != 0) {
    if (errno != EEXIST) throw error(errno, "mkdir", path);
  } else {
    created.push_back(path);
  }
  return created;
}

// rm -r without following any symlink (publish.hpp's remove_tree: every name below `path` is
// resolved relative to an open directory). A missing path is not an error.
template <class Io>
void store_remove_tree(const std::string& path) {
  remove_tree<Io>(path);
}

// A process-wide counter for unique scratch names (with the pid).
inline std::uint64_t store_next_serial() noexcept {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}

// Makes a directory's entries durable, as the Durability policy syncs a publish's parent.
template <class Durability, class Io>
void store_sync_dir(const std::string& dir) {
  if constexpr (Durability::sync_parent) {
    auto fd = open_file<Io>(dir, O_RDONLY | O_DIRECTORY);
    sync_dir_fd<Durability>(fd);
    fd.close();
  } else {
    (void)dir;
  }
}

inline std::int64_t store_mtime_ns(const struct stat& st) noexcept {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 +
         static_cast<std::int64_t>(st.st_mtim.tv_nsec);
}
}  // namespace detail

HOLDFAST_NAMESPACE_END
