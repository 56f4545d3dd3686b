// holdfast/publish/remove.hpp — listing and removing directory trees without ever following a
// symlink (publish_directory's displaced tree, remove_committed_directory, the store's removals).
//
// Guarantees:
//   - detail::remove_tree never follows a symlink: below the given path, names are resolved
//     relative to open directories (openat O_NOFOLLOW|O_DIRECTORY, fstatat and unlinkat
//     AT_SYMLINK_NOFOLLOW), so a symlink swapped in mid-removal is unlinked, not entered.
//   - ENOENT is not an error (someone else removed it first); any other failure throws
//     holdfast::error naming the path.
// Caveats:
//   - A tree that another process keeps filling may need another removal.
#pragma once

#include <fcntl.h>     // O_* flags, AT_SYMLINK_NOFOLLOW, AT_REMOVEDIR
#include <sys/stat.h>  // S_ISDIR

#include <cerrno>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../io.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

/// Lists a directory's entries (without "." and "..").
template <class Io>
std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = Io::opendir(dir.c_str());
  if (!d) throw error(errno, "opendir", dir);
  for (;;) {
    errno = 0;
    dirent* e = Io::readdir(d);
    if (!e) {
      int err = errno;
      if (err != 0) {
        Io::closedir(d);
        throw error(err, "readdir", dir);
      }
      if (Io::closedir(d) != 0) throw error(errno, "closedir", dir);
      return names;
    }
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
}

/// unlinkat; ENOENT is not an error.
template <class Io>
void unlink_at(int dir, const std::string& name, int flags, const std::string& shown) {
  if (Io::unlinkat(dir, name.c_str(), flags) != 0 && errno != ENOENT)
    throw error(errno, "unlinkat", shown);
}

/// Removes the entries of the directory open as `fd` (owned: closed here), then nothing else.
/// Every name is resolved relative to a directory descriptor and never through a symlink.
template <class Io>
void remove_entries(int fd, const std::string& shown);

/// Removes `name` in the open directory `dir` — a file, a symlink (the link itself), or a whole
/// tree — never following a symlink, even one swapped in while the removal runs.
template <class Io>
void remove_at(int dir, const std::string& name, const std::string& shown) {
  struct stat st {};
  if (Io::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    throw error(errno, "fstatat", shown);
  }
  if (!S_ISDIR(st.st_mode)) return unlink_at<Io>(dir, name, 0, shown);
  int fd = Io::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return;
    // ELOOP: replaced by a symlink since the fstatat; ENOTDIR: by a file. Unlink it, unfollowed.
    if (errno == ELOOP || errno == ENOTDIR) return unlink_at<Io>(dir, name, 0, shown);
    throw error(errno, "openat", shown);
  }
  remove_entries<Io>(fd, shown);
  if (Io::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0) {
    if (errno == ENOENT) return;
    if (errno == ENOTDIR) return unlink_at<Io>(dir, name, 0, shown);  // a symlink swapped in
    throw error(errno, "unlinkat", shown);
  }
}

template <class Io>
void remove_entries(int fd, const std::string& shown) {
  DIR* d = Io::fdopendir(fd);
  if (!d) {
    int e = errno;
    Io::close(fd);
    throw error(e, "fdopendir", shown);
  }
  // The stream stays open (its descriptor anchors the *at calls) until the entries are gone.
  struct closer {
    DIR* d;
    ~closer() {
      if (d) Io::closedir(d);
    }
  } keep{d};
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    dirent* e = Io::readdir(d);
    if (!e) {
      if (errno != 0) throw error(errno, "readdir", shown);
      break;
    }
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  for (const auto& n : names) remove_at<Io>(::dirfd(d), n, shown + "/" + n);
}

/// Removes a file or a directory tree. No symlink is ever followed: below `path`, every name is
/// resolved relative to an open directory (openat O_NOFOLLOW|O_DIRECTORY, fstatat and unlinkat
/// with AT_SYMLINK_NOFOLLOW), so a symlink swapped in mid-removal is unlinked, not entered.
/// ENOENT is not an error.
template <class Io>
void remove_tree(const std::string& path) {
  struct stat st {};
  if (Io::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw error(errno, "lstat", path);
  }
  auto unlink_path = [&] {
    if (Io::unlink(path.c_str()) != 0 && errno != ENOENT) throw error(errno, "unlink", path);
  };
  if (!S_ISDIR(st.st_mode)) return unlink_path();
  int fd = Io::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return;
    if (errno == ELOOP || errno == ENOTDIR) return unlink_path();  // swapped since the lstat
    throw error(errno, "open", path);
  }
  remove_entries<Io>(fd, path);
  if (Io::rmdir(path.c_str()) != 0) {
    if (errno == ENOENT) return;
    if (errno == ENOTDIR) return unlink_path();
    throw error(errno, "rmdir", path);
  }
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
