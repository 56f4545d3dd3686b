// holdfast/checkpoint/reader_lock.hpp — readers and deleters side by side: a reader holds
// LOCK_SH (flock) on a checkpoint's directory while it loads it; retention and the sweep delete
// a checkpoint only when they get LOCK_EX|LOCK_NB on it (pointer.hpp's directory, sweep.hpp).
//
// Guarantees:
//   - checkpoint_read_locked runs `use` only on a checkpoint that is, while it runs, locked
//     LOCK_SH (where flock is trusted), still under its name (same inode: not renamed aside,
//     not replaced) and, in marker mode, committed. A checkpoint being deleted is resolved
//     again. So where flock is trusted, with a writer saving (retention on) and any number of
//     readers restoring, no restore sees a partial or vanishing checkpoint.
//   - The lock is released when `use` returns or throws (the descriptor closes).
// Caveats:
//   - Where flock is not trusted (NFS, FUSE, SMB, Lustre, ...; checkpoint_lock::lease) readers
//     take no lock: retention there may delete a checkpoint a reader is loading (the reader's
//     own error says so; it can retry).
//   - After 200 checkpoints deleted or replaced under it in a row, the reader gives up (EAGAIN).
#pragma once

#include <fcntl.h>     // O_RDONLY, O_DIRECTORY, O_NOFOLLOW: the checkpoint's directory
#include <sys/file.h>  // LOCK_SH, LOCK_NB
#include <sys/stat.h>  // struct stat: still the same directory under its name

#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <thread>  // sleep_for between attempts

#include "../error.hpp"
#include "../io.hpp"        // open_file_if_exists
#include "../store.hpp"     // directory_commit, detail::store_lstat
#include "names.hpp"        // checkpoint_info
#include "writer_lock.hpp"  // checkpoint_lock, detail::checkpoint_locks_trusted

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// Runs `use(info)` while holding LOCK_SH on the checkpoint `resolve()` names (re-resolving
// when it is being deleted or replaced); false when resolve() names none. `dir` names the
// checkpoint directory in errors; Publisher::is_committed tells marker mode's completeness.
template <class Io, class Publisher, class Resolve, class Use>
bool checkpoint_read_locked(const std::string& dir, directory_commit mode, checkpoint_lock how,
                            Resolve resolve, Use use) {
  using io_type = Io;
  using publisher_type = Publisher;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(attempt < 5 ? 100 : 2000));
    if (attempt >= 200)
      throw error(EAGAIN, "checkpoint restore", dir,
                  "the checkpoint was deleted or replaced under the reader 200 times");
    std::optional<checkpoint_info> c = resolve();
    if (!c) return false;
    auto fd = open_file_if_exists<io_type>(c->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!fd) continue;  // deleted since the pointer was read
    if (checkpoint_locks_trusted<io_type>(how, fd.get())) {
      int r;
      while ((r = io_type::flock(fd.get(), LOCK_SH | LOCK_NB)) != 0 && errno == EINTR) {
      }
      if (r != 0) {
        if (errno == EWOULDBLOCK) continue;  // being deleted
        throw error(errno, "flock", c->path);
      }
    }
    // Still the checkpoint under its name (not renamed aside, not replaced), still committed.
    struct stat held {};
    struct stat named {};
    if (io_type::fstat(fd.get(), &held) != 0) throw error(errno, "fstat", c->path);
    if (!detail::store_lstat<io_type>(c->path, named) || named.st_ino != held.st_ino ||
        named.st_dev != held.st_dev)
      continue;
    if (mode == directory_commit::marker && !publisher_type::is_committed(c->path)) continue;
    use(*c);
    return true;  // fd closes: the lock is released
  }
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
