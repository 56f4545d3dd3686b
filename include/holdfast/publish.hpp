// holdfast/publish.hpp — publish a file or a directory so no reader ever sees it partial.
//
// A publisher writes the bytes to a temp file in the target's directory and renames it over the
// target (REFERENCE.md §7: folly writeFileAtomic, LevelDB SetCurrentFile). A reader that opens
// the target sees the old version or the new one, whole.
//
// Protocol of publish(target, bytes, mode), every call through the Io policy:
//   0. lstat the target: a directory there is refused (EISDIR), before any temp is written;
//   1. open "<dir>/.holdfast-tmp.<pid>.<16 hex>.<name>" O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|
//      O_CLOEXEC, mode 0600 (a new suffix on EEXIST);
//   2. write everything (short writes and EINTR finished);
//   3. fchmod to `mode` (applied exactly; the umask does not apply);
//   4. fsync or fdatasync the temp, per Durability;
//   5. close, checked;
//   6. (durable) open the parent directory;
//   7. rename over the target. durable: renameat2 RENAME_EXCHANGE, so the old version stays at
//      the temp name until step 8 succeeds (no target yet: rename; no exchange support: a hard
//      link of the old version as backup, then rename); an lstat of the temp name then checks
//      that what was exchanged is no directory made since step 0 (else it is exchanged back).
//      publish_once: renameat2 RENAME_NOREPLACE, falling back to link + unlink on
//      ENOSYS/EINVAL/EOPNOTSUPP;
//   8. (durable) fsync the parent directory, close it checked; unlink the old version.
//
// Guarantees:
//   - On any failure the temp is unlinked, the target is left as it was (after step 7 the
//     previous version is exchanged or renamed back, or the new name unlinked when there was
//     none), and the first error is thrown (holdfast::error naming the failing operation),
//     never one from cleanup.
//   - Durability policies: `durable` (fsync file + fsync directory; a directory fsync answering
//     EINVAL is an error), `durable_tolerate_einval` (the same, but EINVAL from the directory
//     fsync — some NFS and FUSE filesystems — is accepted: the rename is then as durable as that
//     filesystem makes it), `data_only` (fdatasync of the file only: survives a crash of the
//     process, and a power loss once the directory entry reaches disk), `no_sync` (atomic for
//     concurrent readers only). A custom policy states all three members (see durable).
//   - publish_once never replaces an existing target: it returns false, and leaves no temp.
//   - publish replaces files only: an existing directory at the target is refused under every
//     Durability policy with holdfast::error(EISDIR, "publish", target) and left untouched —
//     never renamed, never exchanged to a temp name. (publish_once over one returns false.)
//   - A target or staging path containing NUL is refused (EINVAL, the path shown with \x00),
//     never cut short at the NUL by the system calls.
//   - detail::remove_tree (publish_directory's displaced tree, remove_committed_directory,
//     store.hpp) never follows a symlink: below the given path, names are resolved relative to
//     open directories (openat O_NOFOLLOW|O_DIRECTORY, fstatat and unlinkat
//     AT_SYMLINK_NOFOLLOW), so a symlink swapped in mid-removal is unlinked, not entered.
//   - Temps match one pattern (is_temp_name), so sweep_stale_temps can remove what a killed
//     writer left and nothing else.
//   - publish_directory syncs every file and directory in the staging tree, renames it into
//     place (replacing only when asked, with RENAME_EXCHANGE), then syncs the parent.
//   - Commit-marker mode (commit_directory / is_committed) for filesystems where rename is copy
//     + delete (gcsfuse, object-store mounts): files are written in place and synced, then the
//     marker `commit_success.txt` is published last; readers treat a directory without it as
//     absent. A failed commit leaves no marker.
// Caveats:
//   - The temp lives in the target's directory: the process needs write permission there, and
//     the directory must not be on another filesystem than the target (rename would be EXDEV).
//   - After a successful publish, a failed unlink of the displaced old version (durable) or of
//     the linked temp (publish_once on the link fallback) is not reported: the publish
//     succeeded. The leftover matches the temp pattern and sweep_stale_temps removes it.
//   - A rollback after a failed directory sync is itself not synced; a concurrent reader may
//     have seen the new version before the rollback. Concurrent publishers to one target are
//     fine (last rename wins), but a rollback restores the version this publisher displaced.
//   - Where neither RENAME_EXCHANGE nor hard links are supported, durable publish runs without
//     a backup and cannot roll back a failed directory sync.
//   - Replacing a directory needs RENAME_EXCHANGE (Linux 3.15, ext4/xfs/btrfs/tmpfs); elsewhere
//     the old directory is renamed aside first, leaving a short window with no target.
#pragma once

#include <fcntl.h>     // AT_FDCWD, O_* flags
#include <sys/stat.h>  // S_ISDIR, S_ISREG

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/ascii.hpp"  // printable: paths in messages
#include "error.hpp"
#include "io.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// How a publisher syncs the temp file before renaming it.
enum class file_sync {
  none,  ///< no sync of the file
  data,  ///< fdatasync: the data and the metadata needed to read it (size)
  full   ///< fsync: data and all metadata
};

/// What a Durability policy does when the directory fsync answers EINVAL.
enum class directory_einval {
  fail,   ///< an error: the publish is rolled back and holdfast::error(EINVAL, "fsync") thrown
  accept  ///< counts as done: the filesystem gives no stronger guarantee for the rename
};

/// Default Durability: fsync the file, fsync the parent directory; EINVAL from it is an error.
struct durable {
  static constexpr file_sync file = file_sync::full;  ///< fsync the temp before the rename
  static constexpr bool sync_parent = true;           ///< fsync the directory after the rename
  /// EINVAL from the directory fsync is an error.
  static constexpr directory_einval on_directory_einval = directory_einval::fail;
};

/// As durable, but a directory fsync answering EINVAL (some NFS/FUSE mounts) counts as done.
struct durable_tolerate_einval {
  static constexpr file_sync file = file_sync::full;  ///< fsync the temp before the rename
  static constexpr bool sync_parent = true;           ///< fsync the directory after the rename
  /// EINVAL from the directory fsync counts as done (the documented NFS/FUSE choice).
  static constexpr directory_einval on_directory_einval = directory_einval::accept;
};

/// fdatasync of the file only; the rename itself is not synced.
struct data_only {
  static constexpr file_sync file = file_sync::data;  ///< fdatasync the temp
  static constexpr bool sync_parent = false;          ///< the rename is not synced
  /// Unused (no directory sync); stated because every policy must state it.
  static constexpr directory_einval on_directory_einval = directory_einval::fail;
};

/// No sync at all: atomic for concurrent readers, not for power loss.
struct no_sync {
  static constexpr file_sync file = file_sync::none;  ///< no file sync
  static constexpr bool sync_parent = false;          ///< no directory sync
  /// Unused (no directory sync); stated because every policy must state it.
  static constexpr directory_einval on_directory_einval = directory_einval::fail;
};

/// Tag: publish_directory may replace an existing target directory.
struct replace_existing_t {
  explicit replace_existing_t() = default;
};
/// The replace_existing_t value.
inline constexpr replace_existing_t replace_existing{};

/// The prefix of every temp name holdfast creates: ".holdfast-tmp.<pid>.<hex>.<name>".
inline constexpr std::string_view temp_prefix = ".holdfast-tmp.";

/// The marker file commit_directory writes last (the name Orbax uses).
inline constexpr std::string_view commit_marker_name = "commit_success.txt";

namespace detail {

template <class T>
using dur_file = decltype(T::file);
template <class T>
using dur_parent = decltype(T::sync_parent);
template <class T>
using dur_einval = decltype(T::on_directory_einval);

/// Checks a Durability policy, naming the missing member.
template <class D>
constexpr bool check_durability_policy() {
  static_assert(detect<dur_file, D>::value,
                "holdfast: a Durability policy needs static constexpr file_sync file");
  static_assert(detect<dur_parent, D>::value,
                "holdfast: a Durability policy needs static constexpr bool sync_parent");
  static_assert(detect<dur_einval, D>::value,
                "holdfast: a Durability policy needs static constexpr directory_einval "
                "on_directory_einval (what an EINVAL directory fsync means must be a choice)");
  return true;
}

/// True when D states file, sync_parent and on_directory_einval.
template <class D>
inline constexpr bool is_durability_policy_v =
    detect<dur_file, D>::value&& detect<dur_parent, D>::value&& detect<dur_einval, D>::value;

inline constexpr unsigned rename_noreplace = 1u;  // RENAME_NOREPLACE
inline constexpr unsigned rename_exchange = 2u;   // RENAME_EXCHANGE

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

/// Syncs an open file per the Durability policy.
template <class D, class Io>
void sync_per(const basic_fd<Io>& fd) {
  if constexpr (D::file == file_sync::full) {
    sync_file(fd);
  } else if constexpr (D::file == file_sync::data) {
    datasync_file(fd);
  } else {
    (void)fd;
  }
}

/// fsync of an open directory per the policy's EINVAL choice.
template <class D, class Io>
void sync_dir_fd(const basic_fd<Io>& dir) {
  while (Io::fsync(dir.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL && D::on_directory_einval == directory_einval::accept) return;
    throw error(errno, "fsync", dir.path(), "directory sync");
  }
}

/// True when the errno means "this filesystem cannot do that", not a real failure.
inline bool unsupported(int e) noexcept {
  return e == ENOSYS || e == EINVAL || e == EOPNOTSUPP || e == ENOTSUP;
}

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

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of the Durability policy check.
template <class D>
concept durability_policy = detail::is_durability_policy_v<D>;
#endif

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

/// Publishes files and directories atomically; Durability says what is synced.
template <class Durability = durable, class Io = posix_io>
class basic_publisher {
  static_assert(check_io_policy<Io>());
  static_assert(detail::check_durability_policy<Durability>());

 public:
  /// The Durability policy.
  using durability_type = Durability;
  /// The Io policy.
  using io_type = Io;
  /// The descriptor a streaming writer receives.
  using fd_type = basic_fd<Io>;

  /// Makes each file's temp in the target's directory.
  basic_publisher() = default;
  /// Makes each file's temp in `temp_dir` instead, which must be on the same filesystem as
  /// every target (else rename fails with EXDEV). A watcher of a target's directory (inotify)
  /// then sees one event per publish, the final rename, and nothing of the temp. Directories
  /// (publish_directory) are unaffected.
  explicit basic_publisher(std::string temp_dir) : temp_dir_(std::move(temp_dir)) {}

  /// Replaces `target` with `bytes` atomically, file mode `mode`.
  void publish(const std::string& target, std::string_view bytes, mode_t mode = 0644) const {
    publish_with(target, bytes_writer{bytes}, mode);
  }

  /// Creates `target` with `bytes` unless it exists; false (and nothing changed) when it does.
  bool publish_once(const std::string& target, std::string_view bytes, mode_t mode = 0644) const {
    return publish_once_with(target, bytes_writer{bytes}, mode);
  }

  /// As publish, but `writer(const fd_type&)` writes the content into the temp descriptor.
  template <class Writer>
  void publish_with(const std::string& target, Writer&& writer, mode_t mode = 0644) const {
    run(target, writer, mode, false);
  }

  /// As publish_once, with a streaming writer.
  template <class Writer>
  bool publish_once_with(const std::string& target, Writer&& writer, mode_t mode = 0644) const {
    return run(target, writer, mode, true);
  }

  /// Syncs the staging tree, then renames it to `target` unless that exists (false then).
  bool publish_directory(const std::string& staging, const std::string& target) const {
    return move_directory(staging, target, false);
  }

  /// Syncs the staging tree, then puts it at `target`, replacing a directory already there.
  void publish_directory(const std::string& staging, const std::string& target,
                         replace_existing_t) const {
    move_directory(staging, target, true);
  }

  /// Commit-marker mode: syncs every file in `dir` (written in place), then publishes
  /// `dir/commit_success.txt` last (temp + rename, so a failure leaves no marker). For
  /// filesystems where rename copies: the marker's content does not matter, only its presence.
  void commit_directory(const std::string& dir) const {
    sync_tree(dir);
    publish(dir + "/" + std::string(commit_marker_name), "committed\n", 0644);
  }

  /// True when `dir` carries its commit marker (a directory without it counts as absent).
  static bool is_committed(const std::string& dir) {
    struct stat st {};
    std::string marker = dir + "/" + std::string(commit_marker_name);
    if (Io::stat(marker.c_str(), &st) == 0) return S_ISREG(st.st_mode);
    if (errno == ENOENT || errno == ENOTDIR) return false;
    throw error(errno, "stat", marker);
  }

  /// Removes a committed directory: the marker first (synced), so a half-removed directory is
  /// never seen as committed, then the rest.
  void remove_committed_directory(const std::string& dir) const {
    std::string marker = dir + "/" + std::string(commit_marker_name);
    if (Io::unlink(marker.c_str()) != 0 && errno != ENOENT) throw error(errno, "unlink", marker);
    if constexpr (Durability::sync_parent) sync_dir(dir);
    detail::remove_tree<Io>(dir);
  }

 private:
  struct bytes_writer {
    std::string_view bytes;
    void operator()(const fd_type& fd) const { write_all(fd, bytes.data(), bytes.size()); }
  };

  // A path with NUL would be cut at it by every system call: refused, as is a missing name.
  static void check_path(const std::string& path) {
    if (path.find('\0') != std::string::npos)
      throw error(EINVAL, "publish", detail::printable(path), "the path contains NUL");
  }
  static void check_name(const std::string& target, const std::string& name) {
    check_path(target);
    if (name.empty() || name == "." || name == "..")
      throw error(EINVAL, "publish", target, "the target must name a file");
  }

  // publish replaces files: an existing directory at the target is refused before any temp is
  // written (a rename over it would fail, and an exchange would move the directory aside).
  static void refuse_directory(const std::string& target) {
    struct stat st {};
    if (Io::lstat(target.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) throw_is_directory(target);
    } else if (errno != ENOENT && errno != ENOTDIR) {
      throw error(errno, "lstat", target);
    }
  }
  [[noreturn]] static void throw_is_directory(const std::string& target) {
    throw error(EISDIR, "publish", target, "the target is a directory; publish replaces files");
  }

  static void sync_dir(const std::string& dir) {
    auto fd = open_file<Io>(dir, O_RDONLY | O_DIRECTORY);
    detail::sync_dir_fd<Durability>(fd);
    fd.close();
  }

  template <class Writer>
  bool run(const std::string& target, Writer& writer, mode_t mode, bool once) const {
    auto [dir, name] = detail::split_path(target);
    check_name(target, name);
    if (!once) refuse_directory(target);
    fd_type fd = detail::create_temp<Io>(temp_dir_.empty() ? dir : temp_dir_, name);
    detail::unlink_guard<Io> temp(fd.path());
    writer(static_cast<const fd_type&>(fd));
    if (Io::fchmod(fd.get(), mode & 07777) != 0) throw error(errno, "fchmod", temp.path());
    detail::sync_per<Durability>(fd);
    fd.close();

    fd_type dirfd;
    if constexpr (Durability::sync_parent) dirfd = open_file<Io>(dir, O_RDONLY | O_DIRECTORY);

    if (once) return link_once(target, temp, dirfd);
    if constexpr (!Durability::sync_parent) {
      if (Io::rename(temp.path().c_str(), target.c_str()) != 0) {
        if (errno == EISDIR) throw_is_directory(target);  // made since refuse_directory
        throw error(errno, "rename", target);
      }
      temp.release();
      return true;
    } else {
      replace_with_rollback(dir, name, target, temp, dirfd);
      return true;
    }
  }

  // publish_once: renameat2 NOREPLACE, else link + unlink; false when the target exists.
  static bool link_once(const std::string& target, detail::unlink_guard<Io>& temp, fd_type& dirfd) {
    if (Io::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, target.c_str(),
                      detail::rename_noreplace) == 0) {
      temp.release();
    } else {
      if (errno == EEXIST) return false;
      if (!detail::unsupported(errno)) throw error(errno, "renameat2", target);
      if (Io::link(temp.path().c_str(), target.c_str()) != 0) {
        if (errno == EEXIST) return false;
        throw error(errno, "link", target);
      }
      // the temp name is unlinked by its guard; the target keeps the inode
    }
    if constexpr (Durability::sync_parent) {
      try {
        detail::sync_dir_fd<Durability>(dirfd);
        dirfd.close();
      } catch (...) {
        Io::unlink(target.c_str());  // ours: it did not exist before
        throw;
      }
    }
    return true;
  }

  // Replaces the target so a failed directory sync can be undone. RENAME_EXCHANGE swaps the
  // temp and the target (the old version then sits at the temp name until the sync is done);
  // with no target, a plain rename (undo: unlink); where exchange is unsupported, a hard-link
  // backup of the old version, then rename (undo: rename the backup back).
  void replace_with_rollback(const std::string& dir, const std::string& name,
                             const std::string& target, detail::unlink_guard<Io>& temp,
                             fd_type& dirfd) const {
    bool exchanged = false, created = false;
    std::string backup;
    if (Io::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, target.c_str(),
                      detail::rename_exchange) == 0) {
      exchanged = true;  // temp's guard now unlinks the old version
      // An exchange swaps a directory as readily as a file: one made at the target since
      // refuse_directory goes back, untouched, instead of sitting at a temp name for good.
      struct stat st {};
      if (Io::lstat(temp.path().c_str(), &st) != 0 || S_ISDIR(st.st_mode)) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
        Io::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, target.c_str(),
                      detail::rename_exchange);
        if (e == EISDIR) throw_is_directory(target);
        throw error(e, "lstat", temp.path());
      }
    } else if (errno != ENOENT && !detail::unsupported(errno)) {
      throw error(errno, "renameat2", target);
    } else {
      if (errno == ENOENT)
        created = true;
      else
        backup = take_backup(dir, name, target, created);
      if (Io::rename(temp.path().c_str(), target.c_str()) != 0) {
        int e = errno;
        if (!backup.empty()) Io::unlink(backup.c_str());
        if (e == EISDIR) throw_is_directory(target);
        throw error(e, "rename", target);
      }
      temp.release();
    }
    detail::unlink_guard<Io> old(backup);
    try {
      detail::sync_dir_fd<Durability>(dirfd);
      dirfd.close();
    } catch (...) {
      if (exchanged) {
        Io::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, target.c_str(),
                      detail::rename_exchange);  // the temp's guard unlinks the new version
      } else if (!backup.empty() && Io::rename(backup.c_str(), target.c_str()) == 0) {
        old.release();
      } else if (created) {
        Io::unlink(target.c_str());
      }
      throw;
    }
  }

  // Links the current target to a backup temp name; "" when there is none (or no hard links).
  static std::string take_backup(const std::string& dir, const std::string& name,
                                 const std::string& target, bool& created) {
    for (unsigned attempt = 0;; ++attempt) {
      std::string b = detail::temp_path_for<Io>(dir, name, attempt + 100);
      if (Io::link(target.c_str(), b.c_str()) == 0) return b;
      int e = errno;
      if (e == ENOENT) {
        created = true;
        return std::string();
      }
      if (e == EPERM || e == EOPNOTSUPP || e == ENOTSUP || e == EMLINK) return std::string();
      if (e == EEXIST && attempt < 16) continue;
      if (e == EINTR) continue;
      throw error(e, "link", target, "backup for rollback");
    }
  }

  // Syncs every regular file and directory under `root`, the root last.
  void sync_tree(const std::string& root) const {
    if constexpr (Durability::file != file_sync::none || Durability::sync_parent) {
      for (const auto& n : detail::list_directory<Io>(root)) {
        std::string p = root + "/" + n;
        struct stat st {};
        if (Io::lstat(p.c_str(), &st) != 0) throw error(errno, "lstat", p);
        if (S_ISDIR(st.st_mode)) {
          sync_tree(p);
        } else if (S_ISREG(st.st_mode) && Durability::file != file_sync::none) {
          auto fd = open_file<Io>(p, O_RDONLY | O_NOFOLLOW);
          detail::sync_per<Durability>(fd);
          fd.close();
        }
      }
      if (Durability::file != file_sync::none) {
        auto fd = open_file<Io>(root, O_RDONLY | O_DIRECTORY);
        detail::sync_dir_fd<Durability>(fd);
        fd.close();
      }
    }
  }

  bool move_directory(const std::string& staging, const std::string& target, bool replace) const {
    auto [tdir, tname] = detail::split_path(target);
    check_name(target, tname);
    check_path(staging);
    std::string sdir = detail::split_path(staging).first;
    sync_tree(staging);

    fd_type dirfd;
    if constexpr (Durability::sync_parent) dirfd = open_file<Io>(tdir, O_RDONLY | O_DIRECTORY);

    bool exchanged = false;
    std::string aside;  // the fallback replace: the old directory renamed aside
    if (replace) {
      if (Io::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(),
                        detail::rename_exchange) == 0) {
        exchanged = true;
      } else if (errno == ENOENT) {
        if (!rename_noreplace_dir(staging, target))
          throw error(EEXIST, "renameat2", target, "created concurrently");
      } else if (detail::unsupported(errno)) {
        aside = detail::temp_path_for<Io>(tdir, tname, 0);
        if (Io::rename(target.c_str(), aside.c_str()) != 0) {
          if (errno != ENOENT) throw error(errno, "rename", target);
          aside.clear();
        }
        if (Io::rename(staging.c_str(), target.c_str()) != 0) {
          int e = errno;
          if (!aside.empty()) Io::rename(aside.c_str(), target.c_str());
          throw error(e, "rename", target);
        }
      } else {
        throw error(errno, "renameat2", target);
      }
    } else if (!rename_noreplace_dir(staging, target)) {
      return false;
    }

    try {
      if constexpr (Durability::sync_parent) {
        detail::sync_dir_fd<Durability>(dirfd);
        dirfd.close();
        if (sdir != tdir) sync_dir(sdir);
      }
    } catch (...) {
      if (exchanged)
        Io::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), detail::rename_exchange);
      else if (Io::rename(target.c_str(), staging.c_str()) == 0 && !aside.empty())
        Io::rename(aside.c_str(), target.c_str());
      throw;
    }
    // The old tree now sits at `staging` (exchange) or at `aside`: the publish is done, so a
    // failure to remove it is not reported (sweep_stale_temps does not remove directories).
    try {
      if (exchanged) detail::remove_tree<Io>(staging);
      if (!aside.empty()) detail::remove_tree<Io>(aside);
    } catch (const error&) {
    }
    return true;
  }

  // renameat2 NOREPLACE for a directory, falling back to lstat + rename (a short race window).
  static bool rename_noreplace_dir(const std::string& staging, const std::string& target) {
    if (Io::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(),
                      detail::rename_noreplace) == 0)
      return true;
    if (errno == EEXIST || errno == ENOTEMPTY) return false;
    if (!detail::unsupported(errno)) throw error(errno, "renameat2", target);
    struct stat st {};
    if (Io::lstat(target.c_str(), &st) == 0) return false;
    if (errno != ENOENT) throw error(errno, "lstat", target);
    if (Io::rename(staging.c_str(), target.c_str()) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) return false;
      throw error(errno, "rename", target);
    }
    return true;
  }

  std::string temp_dir_;  // where file temps are made; empty: the target's directory
};

/// The default publisher: durable, POSIX.
using publisher = basic_publisher<>;

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
