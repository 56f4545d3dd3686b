// holdfast/checkpoint/two_tier/copier.hpp — the copier's helpers for two_tier_checkpoints
// (two_tier.hpp): the stream that copies a local checkpoint's tree into the durable save's
// directory, the copier thread's own priority, the steps in a log line.
//
// Guarantees:
//   - two_tier_copy_tree copies regular files and directories only (anything else: EINVAL
//     naming it), never through a symlink, each file created with O_EXCL; it stops, throwing
//     two_tier_abandoned, only between files and between 1 MiB chunks, once `abandon` is set.
//     The files it writes are synced by the durable save that called it, with the rest.
//   - two_tier_lower_priority only ever lowers the calling thread's priority; a failure is
//     logged, never thrown.
#pragma once

#include <fcntl.h>         // O_CREAT, O_EXCL, O_NOFOLLOW: the copy's files
#include <sys/resource.h>  // setpriority: the copier's nice value (copier_nice)
#include <sys/stat.h>      // S_ISDIR, S_ISREG: what a checkpoint holds
#include <sys/syscall.h>   // SYS_gettid: the copier thread's own nice value
#include <unistd.h>        // syscall

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>  // strerror: a copier_nice that was not set
#include <string>
#include <vector>

#include "../../error.hpp"
#include "../../io.hpp"                // basic_fd, open_file_if_exists, read_full, write_all
#include "../../log.hpp"               // log_fn, log_line
#include "../../store/fs_helpers.hpp"  // store_list_dir, store_lstat, store_join
#include "../metadata.hpp"             // checkpoint_metadata_file_name

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// Thrown by two_tier_copy_tree when its copy was abandoned (a preemption save's copy goes first).
struct two_tier_abandoned {};

// Copies the tree `from` into the existing directory `to` (streaming), all but the top-level
// metadata file when `top`. In reads through InIo, out writes through OutIo. Throws
// two_tier_abandoned, before a file or a chunk, once `abandon` is set.
template <class InIo, class OutIo>
void two_tier_copy_tree(const std::string& from, const std::string& to, bool top,
                        std::vector<char>& buffer, const std::atomic<bool>& abandon) {
  for (const std::string& name : store_list_dir<InIo>(from)) {
    if (top && name == checkpoint_metadata_file_name) continue;
    if (abandon.load()) throw two_tier_abandoned{};
    const std::string src = store_join(from, name);
    const std::string dst = store_join(to, name);
    struct stat st {};
    if (!store_lstat<InIo>(src, st))
      throw error(ENOENT, "two-tier copy", src, "vanished from the local checkpoint");
    if (S_ISDIR(st.st_mode)) {
      if (OutIo::mkdir(dst.c_str(), 0755) != 0) throw error(errno, "mkdir", dst);
      two_tier_copy_tree<InIo, OutIo>(src, dst, false, buffer, abandon);
    } else if (S_ISREG(st.st_mode)) {
      auto in = open_file_if_exists<InIo>(src, O_RDONLY | O_NOFOLLOW);
      if (!in) throw error(ENOENT, "two-tier copy", src, "vanished from the local checkpoint");
      int fd = OutIo::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                           st.st_mode & 07777);
      if (fd < 0) throw error(errno, "open", dst);
      basic_fd<OutIo> out(fd, dst);
      for (;;) {
        if (abandon.load()) throw two_tier_abandoned{};
        std::size_t got = read_full(in, buffer.data(), buffer.size());
        if (got > 0) write_all(out, buffer.data(), got);
        if (got < buffer.size()) break;
      }
      out.close();  // synced by the durable save with the rest of the checkpoint
    } else {
      throw error(EINVAL, "two-tier copy", src, "not a regular file or a directory");
    }
  }
}

// Lowers the calling thread's priority to nice value `nice` (on Linux a nice value is per
// thread: the copier's own); a failure is logged, never thrown (the copy runs either way).
inline void two_tier_lower_priority(int nice, const log_fn& log) {
#if defined(__linux__)
  errno = 0;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && nice > now && ::setpriority(PRIO_PROCESS, tid, nice) == 0) return;
  if (errno == 0) return;  // already as low (a lower priority is never raised)
  log_line(log, "two-tier: the copier's nice value " + std::to_string(nice) +
                    " was not set: " + std::string(std::strerror(errno)));
#else
  (void)nice;
  (void)log;
#endif
}

// "3, 5" (steps in a log line).
inline std::string two_tier_steps_text(const std::vector<std::int64_t>& steps) {
  std::string s;
  for (std::int64_t st : steps) s += (s.empty() ? "" : ", ") + std::to_string(st);
  return s;
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
