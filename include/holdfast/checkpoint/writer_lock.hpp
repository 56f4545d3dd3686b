// holdfast/checkpoint/writer_lock.hpp — one writer per checkpoint directory: a flock on
// <dir>/.writer.lock where flock is a real lock, else the lease <dir>/.writer.lease with its
// heartbeat thread; who holds it, and checkpoint_locked when another process does. Usable on
// its own: it needs a directory, not a checkpoint manager.
//
// Guarantees:
//   - flock is used where statfs names a local filesystem (ext2/3/4, xfs, btrfs, tmpfs,
//     overlayfs, f2fs, zfs, ramfs, ...: is_flock_trusted_filesystem), or where checkpoint_lock
//     forces it; elsewhere the lease, a file linked into place whole (link is atomic on NFS too)
//     holding pid, host, PID namespace, boot id and a nonce, its mtime the heartbeat (rewritten
//     6 times per lease_stale_after), stale after lease_stale_after, or at once when its pid is
//     gone (kill(pid, 0): ESRCH) and its host, PID namespace (/proc/self/ns/pid) and boot id
//     (/proc/sys/kernel/random/boot_id) are this process's. A holder in another PID namespace
//     on the same host (containers sharing a hostname: host-network pods), or one whose lease
//     does not name them (written by holdfast 0.1.0, or where /proc cannot be read), is
//     stale only by its heartbeat: a live writer never loses the lease to a pid check. A stale
//     lease is renamed aside and checked to be the one judged stale before it is removed, so two
//     writers never both take it over.
//   - A second writer waits up to the timeout, then throws holdfast::checkpoint_locked naming
//     the holder's pid and host (read from the lock file; {0, ""} when it cannot be read).
//     With an owner (checkpoint_options::owner: "task 1") the lock file records it, and a
//     writer of another owner fails at once, naming both (another task's directory is not
//     going to be released); the same owner, or a holder that recorded none, is waited for.
//   - release() (and destruction) stops the heartbeat, removes the lease only while it is ours,
//     and closes the flock's descriptor (the lock file stays: removing it would race).
//   - The heartbeat notices when another writer took the lease over; check() then throws
//     checkpoint_locked.
// Caveats:
//   - flock is trusted only where statfs names a local filesystem. Elsewhere (NFS, FUSE, SMB,
//     Lustre, ...) the lease relies on clocks agreeing within lease_stale_after, and a writer
//     paused longer than that loses the lease (its heartbeat notices; check() then throws).
//   - flock belongs to the open file description: a child forked while the lock is held shares
//     it (exec drops it, descriptors are O_CLOEXEC).
//   - The log hook may be called from the heartbeat thread.
#pragma once

#include <fcntl.h>     // O_RDONLY, O_DIRECTORY, O_CREAT: the lock files
#include <signal.h>    // kill(pid, 0): is a lease holder on this host alive
#include <sys/file.h>  // LOCK_EX, LOCK_NB
#include <sys/stat.h>  // struct stat: the lease's inode and heartbeat mtime
#include <unistd.h>    // gethostname, readlink: the writer lock's holder and its PID namespace

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "../error.hpp"
#include "../io.hpp"       // basic_fd, open_file, filesystem_type (statfs)
#include "../log.hpp"      // log_fn: where a takeover or a lost lease is reported
#include "../publish.hpp"  // create_temp, unlink_guard, temp_path_for: the lease linked into place
#include "../store.hpp"    // detail::store_join, store_lstat
#include "names.hpp"       // detail::checkpoint_number: the holder's pid

HOLDFAST_NAMESPACE_BEGIN

/// How the writer lock is taken.
enum class checkpoint_lock {
  automatic,  ///< flock where statfs names a local filesystem, else the lease
  flock,      ///< flock on <dir>/.writer.lock, and reader locks, whatever the filesystem
  lease       ///< the lease file <dir>/.writer.lease with a heartbeat; readers take no lock
};

/// Another process holds the checkpoint directory's writer lock (errno EBUSY).
class checkpoint_locked : public error {
 public:
  checkpoint_locked(std::string lock_path, long holder_pid, std::string holder_host,
                    const std::string& why, std::string holder_owner = {})
      : error(EBUSY, "checkpoint writer lock", std::move(lock_path),
              "held by " + describe(holder_pid, holder_host, holder_owner) + "; " + why),
        pid_(holder_pid),
        host_(std::move(holder_host)),
        owner_(std::move(holder_owner)) {}
  /// The holder's pid (0 when unknown).
  long holder_pid() const noexcept { return pid_; }
  /// The holder's host name ("" when unknown).
  const std::string& holder_host() const noexcept { return host_; }
  /// The holder's checkpoint_options::owner ("" when it recorded none).
  const std::string& holder_owner() const noexcept { return owner_; }

 private:
  static std::string describe(long pid, const std::string& host, const std::string& owner) {
    if (pid <= 0 && host.empty()) return "an unknown process";
    return (owner.empty() ? std::string() : owner + ", ") + "pid " + std::to_string(pid) +
           " on host '" + host + "'";
  }
  long pid_;
  std::string host_;
  std::string owner_;
};

/// True for a statfs f_type where flock is a real lock between processes of this machine:
/// ext2/3/4, xfs, btrfs, tmpfs, overlayfs, ramfs, f2fs, zfs, reiserfs, jfs, bcachefs, nilfs2.
constexpr bool is_flock_trusted_filesystem(std::uint64_t f_type) noexcept {
  switch (static_cast<std::uint32_t>(f_type)) {  // f_type is a signed long: compare 32 bits
    case 0xEF53u:                                // ext2, ext3, ext4
    case 0x58465342u:                            // xfs
    case 0x9123683Eu:                            // btrfs
    case 0x01021994u:                            // tmpfs
    case 0x794C7630u:                            // overlayfs
    case 0x858458F6u:                            // ramfs
    case 0xF2F52010u:                            // f2fs
    case 0x2FC12FC1u:                            // zfs
    case 0x52654973u:                            // reiserfs
    case 0x3153464Au:                            // jfs
    case 0xCA451A4Eu:                            // bcachefs
    case 0x3434u:                                // nilfs2
      return true;
    default:
      return false;
  }
}

namespace detail {

inline std::string checkpoint_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// Where a pid means the same process: a PID namespace ("pid:[4026531836]") of one boot (the
// boot id). kill(pid, 0) says something about a holder only where both are this process's.
struct checkpoint_pid_scope {
  std::string pidns;  // readlink /proc/self/ns/pid ("" when unknown)
  std::string boot;   // /proc/sys/kernel/random/boot_id ("" when unknown)
  bool known() const noexcept { return !pidns.empty() && !boot.empty(); }
  // Both known and equal: a pid of one names the same process in the other.
  bool same_as(const checkpoint_pid_scope& o) const noexcept {
    return known() && pidns == o.pidns && boot == o.boot;
  }
};

// This process's PID namespace and boot id (each "" where /proc cannot be read). Plain syscalls,
// as gethostname: these identify the process, they are not the checkpoint's I/O (the Io policy's
// fault counts stay those of the lock files).
inline checkpoint_pid_scope checkpoint_local_pid_scope() {
  checkpoint_pid_scope s;
  char buf[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  if (n > 0) s.pidns.assign(buf, static_cast<std::size_t>(n));
  int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char id[128] = {};
    ssize_t r;
    while ((r = ::read(fd, id, sizeof id - 1)) < 0 && errno == EINTR) {
    }
    if (r > 0) s.boot.assign(id, static_cast<std::size_t>(r));
    ::close(fd);
  }
  while (!s.boot.empty() && (s.boot.back() == '\n' || s.boot.back() == ' ')) s.boot.pop_back();
  if (s.pidns.find('\n') != std::string::npos || s.boot.find('\n') != std::string::npos) return {};
  return s;
}

// The lock files' content: who holds it.
inline std::string checkpoint_holder_text(long pid, const std::string& host,
                                          const std::string& nonce,
                                          const checkpoint_pid_scope& scope = {},
                                          const std::string& owner = {}) {
  std::string s = "holdfast-writer 1\npid " + std::to_string(pid) + "\nhost " + host + "\n";
  if (!scope.pidns.empty()) s += "pidns " + scope.pidns + "\n";
  if (!scope.boot.empty()) s += "boot " + scope.boot + "\n";
  if (!nonce.empty()) s += "nonce " + nonce + "\n";
  if (!owner.empty()) s += "owner " + printable(owner) + "\n";  // one line
  return s;
}

// The value of the last "<name> <value>" line of a lock file's content (nullopt: no such line).
inline std::optional<std::string_view> checkpoint_holder_field(std::string_view text,
                                                               std::string_view name) {
  std::optional<std::string_view> value;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == ' ')
      value = line.substr(name.size() + 1);
  }
  return value;
}

// The holder's checkpoint_options::owner from a lock file's content ("" when it names none).
inline std::string checkpoint_parse_owner(std::string_view text) {
  auto v = checkpoint_holder_field(text, "owner");
  return v ? printable(v->substr(0, 255)) : std::string();
}

// The holder's PID namespace and boot id from a lock file's content ("" for each one it does
// not name: a lease written before they were recorded).
inline checkpoint_pid_scope checkpoint_parse_pid_scope(std::string_view text) {
  checkpoint_pid_scope s;
  if (auto v = checkpoint_holder_field(text, "pidns")) s.pidns = std::string(v->substr(0, 127));
  if (auto v = checkpoint_holder_field(text, "boot")) s.boot = std::string(v->substr(0, 127));
  return s;
}

// {pid, host} from a lock file's content ({0, ""} for what cannot be read).
inline std::pair<long, std::string> checkpoint_parse_holder(std::string_view text) {
  long pid = 0;
  if (auto v = checkpoint_holder_field(text, "pid"))
    if (auto n = checkpoint_number(*v)) pid = static_cast<long>(*n);
  auto host = checkpoint_holder_field(text, "host");
  return {pid, host ? printable(host->substr(0, 255)) : std::string()};
}

// flock is a real lock for this file's filesystem (or `how` forces it).
template <class Io>
bool checkpoint_locks_trusted(checkpoint_lock how, int fd) noexcept {
  switch (how) {
    case checkpoint_lock::flock:
      return true;
    case checkpoint_lock::lease:
      return false;
    case checkpoint_lock::automatic:
      break;
  }
  return is_flock_trusted_filesystem(detail::filesystem_type<Io>(fd));
}

// The writer lock of one directory: the flock, or the lease and its heartbeat thread. Neither
// copied nor moved (the heartbeat holds `this`); released by release() or the destructor.
template <class Io>
class checkpoint_writer_lock {
 public:
  using io_type = Io;

  // `how`: flock, lease, or automatic (decided by acquire() from statfs of `d`); `timeout`: how
  // long acquire() waits for another writer; `stale`: a lease's heartbeat age that makes it
  // stale; `log`: where takeovers and a lost lease are reported (empty: log_to_stderr).
  checkpoint_writer_lock(std::string d, checkpoint_lock how, std::chrono::milliseconds timeout,
                         std::chrono::milliseconds stale, log_fn log, std::string owner = {})
      : dir(std::move(d)),
        how_(how),
        timeout_(timeout),
        stale_after(stale),
        log_(std::move(log)),
        owner_(printable(owner)),  // as the lock file records it (one line)
        use_flock(how != checkpoint_lock::lease) {}
  checkpoint_writer_lock(const checkpoint_writer_lock&) = delete;
  checkpoint_writer_lock& operator=(const checkpoint_writer_lock&) = delete;
  ~checkpoint_writer_lock() { release(); }

  // Takes the lock, waiting up to the timeout; throws checkpoint_locked when another holds it.
  void acquire() {
    if (how_ == checkpoint_lock::automatic) {
      auto fd = open_file<io_type>(dir, O_RDONLY | O_DIRECTORY);
      use_flock = is_flock_trusted_filesystem(detail::filesystem_type<io_type>(fd.get()));
    }
    host = detail::checkpoint_hostname();
    pid_scope = detail::checkpoint_local_pid_scope();
    if (use_flock)
      acquire_flock();
    else
      acquire_lease();
  }

  // True when the lock is (or would be, before acquire()) a flock, false for the lease.
  bool uses_flock() const noexcept { return use_flock; }

  std::string flock_path() const { return detail::store_join(dir, ".writer.lock"); }
  std::string lease_path() const { return detail::store_join(dir, ".writer.lease"); }

 private:
  void log(const std::string& line) const { detail::log_line(log_, line); }

  template <class Try>
  void wait_for_lock(const std::string& path, Try attempt) {
    using namespace std::chrono;
    const auto deadline = steady_clock::now() + timeout_;
    auto pause = milliseconds(1);
    for (;;) {
      if (attempt()) return;
      if (!owner_.empty()) {  // another owner's directory: its lock is not going to be released
        const std::string text = read_holder_text(path);
        const std::string theirs = detail::checkpoint_parse_owner(text);
        if (!theirs.empty() && theirs != owner_) {
          auto holder = detail::checkpoint_parse_holder(text);
          throw checkpoint_locked(path, holder.first, holder.second,
                                  owner_ + " opened the checkpoint directory of " + theirs +
                                      ": each task needs a directory of its own (such "
                                      "as one per task: <dir>/task-<n>), or open this one with "
                                      "holdfast::read_only to read it",
                                  theirs);
        }
      }
      if (steady_clock::now() >= deadline) {
        const std::string text = read_holder_text(path);
        auto holder = detail::checkpoint_parse_holder(text);
        throw checkpoint_locked(
            path, holder.first, holder.second,
            "waited " + std::to_string(timeout_.count()) +
                " ms; one process writes a checkpoint directory at a time (open readers with "
                "holdfast::read_only)",
            detail::checkpoint_parse_owner(text));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, milliseconds(100));
    }
  }

  std::pair<long, std::string> read_holder(const std::string& path) const {
    return detail::checkpoint_parse_holder(read_holder_text(path));
  }

  // The lock file's content ("" when it cannot be read).
  std::string read_holder_text(const std::string& path) const {
    try {
      auto fd = open_file_if_exists<io_type>(path, O_RDONLY | O_NOFOLLOW);
      return fd ? read_all(fd) : std::string();
    } catch (const error&) {
      return std::string();
    }
  }

  void acquire_flock() {
    const std::string path = flock_path();
    lock_fd = open_file<io_type>(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644);
    wait_for_lock(path, [&] {
      int r;
      while ((r = io_type::flock(lock_fd.get(), LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
      }
      if (r == 0) return true;
      if (errno != EWOULDBLOCK) throw error(errno, "flock", path);
      return false;
    });
    std::string text =
        detail::checkpoint_holder_text(io_type::getpid(), host, std::string(), pid_scope, owner_);
    if (io_type::ftruncate(lock_fd.get(), 0) != 0) throw error(errno, "ftruncate", path);
    pwrite_all(lock_fd, text.data(), text.size(), 0);
  }

  // The lease: a file linked into place whole (link is atomic on NFS too), holding pid, host
  // and a nonce; its mtime is the heartbeat. A stale one is renamed aside and checked to be the
  // one judged stale before it is removed.
  void acquire_lease() {
    const std::string path = lease_path();
    lease_text = detail::checkpoint_holder_text(io_type::getpid(), host, detail::temp_suffix(7),
                                                pid_scope, owner_);
    auto fd = detail::create_temp<io_type>(dir, "writer.lease");
    detail::unlink_guard<io_type> temp(fd.path());
    write_all(fd, lease_text.data(), lease_text.size());
    wait_for_lock(path, [&] {
      if (io_type::link(temp.path().c_str(), path.c_str()) == 0) return true;
      if (errno != EEXIST) throw error(errno, "link", path, "taking the writer lease");
      struct stat st {};
      if (!detail::store_lstat<io_type>(path, st)) return false;  // released: try again
      const std::string text = read_holder_text(path);
      auto holder = detail::checkpoint_parse_holder(text);
      std::string why = stale_reason(holder, detail::checkpoint_parse_pid_scope(text), st);
      if (!why.empty()) take_over(path, st, holder, why);
      return false;
    });
    lease_ino = stat_fd(fd).st_ino;
    lock_fd = std::move(fd);
    lease_held = true;
    heartbeat = std::thread([this] { beat(); });
  }

  // Why the lease is stale ("" when it is not): its pid is gone where that pid means the same
  // process here (same host, PID namespace and boot), else its heartbeat is too old.
  std::string stale_reason(const std::pair<long, std::string>& holder,
                           const detail::checkpoint_pid_scope& holder_scope,
                           const struct stat& st) const {
    if (holder.first > 0 && holder.second == host && holder_scope.same_as(pid_scope) &&
        holder.first != io_type::getpid() && ::kill(static_cast<pid_t>(holder.first), 0) != 0 &&
        errno == ESRCH)
      return "its process is gone";
    using namespace std::chrono;
    auto mtime = seconds(st.st_mtim.tv_sec) + nanoseconds(st.st_mtim.tv_nsec);
    auto age = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()) - mtime;
    if (age >= stale_after)
      return "no heartbeat for " + std::to_string(duration_cast<milliseconds>(age).count()) + " ms";
    return std::string();
  }

  void take_over(const std::string& path, const struct stat& judged,
                 const std::pair<long, std::string>& holder, const std::string& why) {
    std::string aside = detail::temp_path_for<io_type>(dir, "writer.lease.stale", 3);
    if (io_type::rename(path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return;  // another writer took it first
      throw error(errno, "rename", path, "taking over a stale writer lease");
    }
    struct stat moved {};
    bool same = detail::store_lstat<io_type>(aside, moved) && moved.st_ino == judged.st_ino &&
                moved.st_dev == judged.st_dev;
    if (!same) io_type::link(aside.c_str(), path.c_str());  // a fresh lease: put it back
    io_type::unlink(aside.c_str());
    if (same)
      log("checkpoint writer lease '" + path + "' of pid " + std::to_string(holder.first) +
          " on host '" + holder.second + "' taken over: " + why);
  }

  // The lease heartbeat: rewrites the lease (its mtime) 6 times per lease_stale_after, and
  // notices when another writer took it over.
  void beat() {
    using namespace std::chrono;
    auto interval = std::max(duration_cast<milliseconds>(stale_after) / 6, milliseconds(5));
    std::unique_lock<std::mutex> l(beat_mutex);
    while (!beat_stop) {
      beat_cv.wait_for(l, interval, [&] { return beat_stop; });
      if (beat_stop) return;
      try {
        pwrite_all(lock_fd, lease_text.data(), lease_text.size(), 0);
        datasync_file(lock_fd);  // a network filesystem sets the mtime when the write reaches it
      } catch (const error& e) {
        log(std::string("checkpoint writer lease heartbeat failed: ") + e.what());
      }
      if (!owns_lease()) {
        lease_lost.store(true);
        auto holder = read_holder(lease_path());
        log("checkpoint writer lease '" + lease_path() + "' lost to pid " +
            std::to_string(holder.first) + " on host '" + holder.second +
            "': this manager's saves fail from now on");
        return;
      }
    }
  }

  bool owns_lease() const {
    struct stat st {};
    try {
      return detail::store_lstat<io_type>(lease_path(), st) && st.st_ino == lease_ino;
    } catch (const error&) {
      return true;  // cannot tell: the next beat looks again
    }
  }

 public:
  // Throws checkpoint_locked when the lease was taken over by another writer.
  void check() {
    if (!lease_held) return;
    if (!lease_lost.load() && owns_lease()) return;
    lease_lost.store(true);
    auto holder = read_holder(lease_path());
    throw checkpoint_locked(lease_path(), holder.first, holder.second,
                            "this manager's lease was taken over (paused longer than "
                            "lease_stale_after?); it no longer writes");
  }

  // Releases the lock (idempotent).
  void release() noexcept {
    if (heartbeat.joinable()) {
      {
        std::lock_guard<std::mutex> l(beat_mutex);
        beat_stop = true;
      }
      beat_cv.notify_all();
      heartbeat.join();
    }
    if (lease_held && owns_lease()) io_type::unlink(lease_path().c_str());
    lock_fd.reset();  // flock: closing releases it; the file stays (removing it would race)
  }

 private:
  std::string dir;
  checkpoint_lock how_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds stale_after;
  log_fn log_;
  std::string owner_;  // checkpoint_options::owner: recorded, and another owner fails at once
  bool use_flock;
  std::string host;
  detail::checkpoint_pid_scope pid_scope;  // where kill(holder pid, 0) can be trusted
  basic_fd<io_type> lock_fd;
  bool lease_held = false;
  ino_t lease_ino = 0;
  std::string lease_text;
  std::atomic<bool> lease_lost{false};
  std::thread heartbeat;
  std::mutex beat_mutex;
  std::condition_variable beat_cv;
  bool beat_stop = false;
};

}  // namespace detail

HOLDFAST_NAMESPACE_END
