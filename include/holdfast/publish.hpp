// holdfast/publish.hpp — publish a file or a directory so no reader ever sees it partial.
//
// A publisher writes the bytes to a temp file in the target's directory and renames it over the
// target (REFERENCE.md §7: folly writeFileAtomic, LevelDB SetCurrentFile). A reader that opens
// the target sees the old version or the new one, whole.
//
// Protocol of publish(target, bytes, mode), every call through the Io policy:
//   0. (durable) lstat the target: a directory there is refused (EISDIR), before any temp is
//      written (an exchange would move it aside); without the exchange, the rename of step 7
//      refuses it itself (EISDIR) and the temp is unlinked, so no syscall is added for it;
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
//   - Durability policies (publish/durability.hpp): `durable`, `durable_tolerate_einval`,
//     `data_only`, `no_sync`, or a custom policy stating all three members.
//   - publish_once never replaces an existing target: it returns false, and leaves no temp.
//   - publish replaces files only: an existing directory at the target is refused under every
//     Durability policy with holdfast::error(EISDIR, "publish", target) and left untouched —
//     never renamed, never exchanged to a temp name. (publish_once over one returns false.)
//   - A target or staging path containing NUL is refused (EINVAL, the path shown with \x00),
//     never cut short at the NUL by the system calls.
//   - Displaced trees are removed by detail::remove_tree (publish/remove.hpp), which never
//     follows a symlink.
//   - Temps match one pattern (publish/temp.hpp: is_temp_name), so sweep_stale_temps can remove
//     what a killed writer left and nothing else.
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
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detail/ascii.hpp"  // printable: error::path() of a path with NUL shows \x00
#include "error.hpp"
#include "io.hpp"
#include "publish/durability.hpp"
#include "publish/remove.hpp"
#include "publish/temp.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Tag: publish_directory may replace an existing target directory.
struct replace_existing_t {
  explicit replace_existing_t() = default;
};
/// The replace_existing_t value.
inline constexpr replace_existing_t replace_existing{};

/// The marker file commit_directory writes last (the name Orbax uses).
inline constexpr std::string_view commit_marker_name = "commit_success.txt";

namespace detail {

inline constexpr unsigned rename_noreplace = 1u;  // RENAME_NOREPLACE
inline constexpr unsigned rename_exchange = 2u;   // RENAME_EXCHANGE

/// True when the errno means "this filesystem cannot do that", not a real failure.
inline bool unsupported(int e) noexcept {
  return e == ENOSYS || e == EINVAL || e == EOPNOTSUPP || e == ENOTSUP;
}

}  // namespace detail

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

  // publish replaces files: under an exchange (durable) an existing directory at the target is
  // refused before any temp is written, since the exchange would move the directory aside; a
  // plain rename refuses it atomically (EISDIR), so the other policies pay no lstat for it (one
  // syscall in six of a 4 KiB publish without syncs).
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
    if constexpr (Durability::sync_parent) {
      if (!once) refuse_directory(target);
    }
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
        if (errno == EISDIR) throw_is_directory(target);  // the kernel's refusal
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

HOLDFAST_NAMESPACE_END
