// holdfast/testing/fault_io.hpp — an Io policy that fails chosen system calls, for tests.
//
// Use `fault_io` wherever a component takes an Io policy, arm a `fault` on the process-wide
// `fault_plan`, and the k-th matching call fails with the chosen errno (EIO, ENOSPC, EINTR, …) or
// transfers fewer bytes than asked (a short read or write). Counting calls with the plan disarmed
// tells a test how many calls a protocol makes, so it can fail each one in turn.
//
// Guarantees:
//   - With no fault armed, every call is exactly posix_io's.
//   - A failed close still closes the descriptor (as Linux does), so tests do not leak.
//   - Counters are atomic: threads may call concurrently; forked children inherit the plan.
// Caveats:
//   - The plan is global to the process: one armed fault at a time.
#pragma once

#include <atomic>
#include <cstdint>

#include "../io.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace testing {

/// The kinds of call fault_io can fail; `any` counts every call.
enum class io_op : unsigned {
  any,
  open,
  close,
  read,
  write,
  pread,
  pwrite,
  fsync,
  fdatasync,
  fchmod,
  fstat,
  stat,
  lstat,
  ftruncate,
  flock,
  fcntl,
  rename,
  renameat2,
  link,
  linkat,
  unlink,
  mkdir,
  rmdir,
  opendir,
  readdir,
  closedir,
  mmap,
  munmap,
  socket,
  connect,
  getsockopt,
  send,
  recv,
  poll,
  getaddrinfo,
  inotify_init1,
  inotify_add_watch,
  madvise,
  lseek,
  openat,
  fstatat,
  unlinkat,
  fdopendir,
  fstatfs,
  count_
};

/// The name of an io_op, as used in holdfast::error::operation() where they coincide.
inline const char* to_string(io_op op) noexcept {
  static const char* const names[] = {"any",
                                      "open",
                                      "close",
                                      "read",
                                      "write",
                                      "pread",
                                      "pwrite",
                                      "fsync",
                                      "fdatasync",
                                      "fchmod",
                                      "fstat",
                                      "stat",
                                      "lstat",
                                      "ftruncate",
                                      "flock",
                                      "fcntl",
                                      "rename",
                                      "renameat2",
                                      "link",
                                      "linkat",
                                      "unlink",
                                      "mkdir",
                                      "rmdir",
                                      "opendir",
                                      "readdir",
                                      "closedir",
                                      "mmap",
                                      "munmap",
                                      "socket",
                                      "connect",
                                      "getsockopt",
                                      "send",
                                      "recv",
                                      "poll",
                                      "getaddrinfo",
                                      "inotify_init1",
                                      "inotify_add_watch",
                                      "madvise",
                                      "lseek",
                                      "openat",
                                      "fstatat",
                                      "unlinkat",
                                      "fdopendir",
                                      "fstatfs"};
  auto i = static_cast<unsigned>(op);
  return i < static_cast<unsigned>(io_op::count_) ? names[i] : "?";
}

/// One injected failure: calls nth .. nth+times-1 of `op` (1-based, counted since arm) fail.
struct fault {
  io_op op = io_op::any;
  std::uint64_t nth = 1;
  /// The errno to fail with; 0 asks for a short transfer instead (read, write, pread, pwrite,
  /// send, recv; other calls then fail with EIO).
  int errnum = EIO;
  /// With errnum == 0: the most bytes the call transfers.
  std::size_t short_bytes = 1;
  std::uint64_t times = 1;
};

/// The process-wide plan fault_io consults on every call.
class fault_plan {
 public:
  /// Arms `f` and resets every counter.
  static void arm(const fault& f) noexcept {
    reset_counts();
    s().op.store(static_cast<unsigned>(f.op));
    s().nth.store(f.nth);
    s().errnum.store(f.errnum);
    s().short_bytes.store(f.short_bytes);
    s().times.store(f.times);
    s().armed.store(true);
  }
  /// Stops injecting; counters keep counting.
  static void disarm() noexcept { s().armed.store(false); }
  /// Zeroes the call counters and the failure count.
  static void reset_counts() noexcept {
    for (auto& c : s().counts) c.store(0);
    s().failures.store(0);
  }
  /// Calls of `op` since the last arm or reset (io_op::any: all calls).
  static std::uint64_t calls(io_op op) noexcept {
    return s().counts[static_cast<unsigned>(op)].load();
  }
  /// Failures injected since the last arm or reset.
  static std::uint64_t failures() noexcept { return s().failures.load(); }
  /// The kind of the last call that was failed.
  static io_op last_failed() noexcept { return static_cast<io_op>(s().last.load()); }

  /// Counts a call of `op`; returns true when it must fail.
  static bool hit(io_op op) noexcept {
    auto any = s().counts[0].fetch_add(1) + 1;
    auto own = s().counts[static_cast<unsigned>(op)].fetch_add(1) + 1;
    if (!s().armed.load()) return false;
    auto target = static_cast<io_op>(s().op.load());
    if (target != io_op::any && target != op) return false;
    auto n = target == io_op::any ? any : own;
    if (n < s().nth.load() || n >= s().nth.load() + s().times.load()) return false;
    s().failures.fetch_add(1);
    s().last.store(static_cast<unsigned>(op));
    return true;
  }
  /// The errno of the armed fault (0 for a short transfer).
  static int errnum() noexcept { return s().errnum.load(); }
  /// The byte cap of a short transfer.
  static std::size_t short_bytes() noexcept { return s().short_bytes.load(); }

 private:
  struct state {
    std::atomic<bool> armed{false};
    std::atomic<unsigned> op{0};
    std::atomic<std::uint64_t> nth{1};
    std::atomic<int> errnum{EIO};
    std::atomic<std::size_t> short_bytes{1};
    std::atomic<std::uint64_t> times{1};
    std::atomic<std::uint64_t> failures{0};
    std::atomic<unsigned> last{0};
    std::atomic<std::uint64_t> counts[static_cast<unsigned>(io_op::count_)]{};
  };
  static state& s() noexcept {
    static state st;
    return st;
  }
};

/// posix_io with every call routed through fault_plan.
struct fault_io : posix_io {
 private:
  template <class R>
  static R fail(R value) noexcept {
    int e = fault_plan::errnum();
    errno = e != 0 ? e : EIO;
    return value;
  }
  // For transfers: a short transfer when errnum == 0, else the failure.
  static bool shorten(std::size_t& n) noexcept {
    if (fault_plan::errnum() != 0) return false;
    if (n > fault_plan::short_bytes()) n = fault_plan::short_bytes();
    return true;
  }

 public:
  static int open(const char* p, int f, mode_t m) noexcept {
    return fault_plan::hit(io_op::open) ? fail(-1) : posix_io::open(p, f, m);
  }
  static int close(int fd) noexcept {
    if (!fault_plan::hit(io_op::close)) return posix_io::close(fd);
    posix_io::close(fd);
    return fail(-1);
  }
  static ssize_t read(int fd, void* b, std::size_t n) noexcept {
    if (fault_plan::hit(io_op::read) && !shorten(n)) return fail(ssize_t{-1});
    return posix_io::read(fd, b, n);
  }
  static ssize_t write(int fd, const void* b, std::size_t n) noexcept {
    if (fault_plan::hit(io_op::write) && !shorten(n)) return fail(ssize_t{-1});
    return posix_io::write(fd, b, n);
  }
  static ssize_t pread(int fd, void* b, std::size_t n, off_t o) noexcept {
    if (fault_plan::hit(io_op::pread) && !shorten(n)) return fail(ssize_t{-1});
    return posix_io::pread(fd, b, n, o);
  }
  static ssize_t pwrite(int fd, const void* b, std::size_t n, off_t o) noexcept {
    if (fault_plan::hit(io_op::pwrite) && !shorten(n)) return fail(ssize_t{-1});
    return posix_io::pwrite(fd, b, n, o);
  }
  static ssize_t send(int fd, const void* b, std::size_t n, int f) noexcept {
    if (fault_plan::hit(io_op::send) && !shorten(n)) return fail(ssize_t{-1});
    return posix_io::send(fd, b, n, f);
  }
  static ssize_t recv(int fd, void* b, std::size_t n, int f) noexcept {
    if (fault_plan::hit(io_op::recv) && !shorten(n)) return fail(ssize_t{-1});
    return posix_io::recv(fd, b, n, f);
  }
  static off_t lseek(int fd, off_t off, int whence) noexcept {
    return fault_plan::hit(io_op::lseek) ? fail(off_t{-1}) : posix_io::lseek(fd, off, whence);
  }
  static int fsync(int fd) noexcept {
    return fault_plan::hit(io_op::fsync) ? fail(-1) : posix_io::fsync(fd);
  }
  static int fdatasync(int fd) noexcept {
    return fault_plan::hit(io_op::fdatasync) ? fail(-1) : posix_io::fdatasync(fd);
  }
  static int fchmod(int fd, mode_t m) noexcept {
    return fault_plan::hit(io_op::fchmod) ? fail(-1) : posix_io::fchmod(fd, m);
  }
  static int fstat(int fd, struct stat* st) noexcept {
    return fault_plan::hit(io_op::fstat) ? fail(-1) : posix_io::fstat(fd, st);
  }
  static int stat(const char* p, struct stat* st) noexcept {
    return fault_plan::hit(io_op::stat) ? fail(-1) : posix_io::stat(p, st);
  }
  static int lstat(const char* p, struct stat* st) noexcept {
    return fault_plan::hit(io_op::lstat) ? fail(-1) : posix_io::lstat(p, st);
  }
  static int ftruncate(int fd, off_t n) noexcept {
    return fault_plan::hit(io_op::ftruncate) ? fail(-1) : posix_io::ftruncate(fd, n);
  }
  static int flock(int fd, int op) noexcept {
    return fault_plan::hit(io_op::flock) ? fail(-1) : posix_io::flock(fd, op);
  }
  static int fcntl(int fd, int cmd, int arg) noexcept {
    return fault_plan::hit(io_op::fcntl) ? fail(-1) : posix_io::fcntl(fd, cmd, arg);
  }
  static int rename(const char* a, const char* b) noexcept {
    return fault_plan::hit(io_op::rename) ? fail(-1) : posix_io::rename(a, b);
  }
  static int renameat2(int od, const char* a, int nd, const char* b, unsigned f) noexcept {
    return fault_plan::hit(io_op::renameat2) ? fail(-1) : posix_io::renameat2(od, a, nd, b, f);
  }
  static int link(const char* a, const char* b) noexcept {
    return fault_plan::hit(io_op::link) ? fail(-1) : posix_io::link(a, b);
  }
  static int linkat(int od, const char* a, int nd, const char* b, int f) noexcept {
    return fault_plan::hit(io_op::linkat) ? fail(-1) : posix_io::linkat(od, a, nd, b, f);
  }
  static int unlink(const char* p) noexcept {
    return fault_plan::hit(io_op::unlink) ? fail(-1) : posix_io::unlink(p);
  }
  static int openat(int d, const char* p, int f, mode_t m) noexcept {
    return fault_plan::hit(io_op::openat) ? fail(-1) : posix_io::openat(d, p, f, m);
  }
  static int fstatfs(int fd, struct statfs* st) noexcept {
    return fault_plan::hit(io_op::fstatfs) ? fail(-1) : posix_io::fstatfs(fd, st);
  }
  static int fstatat(int d, const char* p, struct stat* st, int f) noexcept {
    return fault_plan::hit(io_op::fstatat) ? fail(-1) : posix_io::fstatat(d, p, st, f);
  }
  static int unlinkat(int d, const char* p, int f) noexcept {
    return fault_plan::hit(io_op::unlinkat) ? fail(-1) : posix_io::unlinkat(d, p, f);
  }
  static DIR* fdopendir(int fd) noexcept {
    return fault_plan::hit(io_op::fdopendir) ? fail<DIR*>(nullptr) : posix_io::fdopendir(fd);
  }
  static int mkdir(const char* p, mode_t m) noexcept {
    return fault_plan::hit(io_op::mkdir) ? fail(-1) : posix_io::mkdir(p, m);
  }
  static int rmdir(const char* p) noexcept {
    return fault_plan::hit(io_op::rmdir) ? fail(-1) : posix_io::rmdir(p);
  }
  static DIR* opendir(const char* p) noexcept {
    return fault_plan::hit(io_op::opendir) ? fail<DIR*>(nullptr) : posix_io::opendir(p);
  }
  static struct dirent* readdir(DIR* d) noexcept {
    return fault_plan::hit(io_op::readdir) ? fail<struct dirent*>(nullptr) : posix_io::readdir(d);
  }
  static int closedir(DIR* d) noexcept {
    if (!fault_plan::hit(io_op::closedir)) return posix_io::closedir(d);
    posix_io::closedir(d);
    return fail(-1);
  }
  static void* mmap(void* a, std::size_t n, int p, int f, int fd, off_t o) noexcept {
    return fault_plan::hit(io_op::mmap) ? fail(MAP_FAILED) : posix_io::mmap(a, n, p, f, fd, o);
  }
  static int munmap(void* a, std::size_t n) noexcept {
    return fault_plan::hit(io_op::munmap) ? fail(-1) : posix_io::munmap(a, n);
  }
  static int madvise(void* a, std::size_t n, int advice) noexcept {
    return fault_plan::hit(io_op::madvise) ? fail(-1) : posix_io::madvise(a, n, advice);
  }
  static int socket(int d, int t, int p) noexcept {
    return fault_plan::hit(io_op::socket) ? fail(-1) : posix_io::socket(d, t, p);
  }
  static int connect(int fd, const sockaddr* a, socklen_t n) noexcept {
    return fault_plan::hit(io_op::connect) ? fail(-1) : posix_io::connect(fd, a, n);
  }
  static int getsockopt(int fd, int l, int n, void* v, socklen_t* len) noexcept {
    return fault_plan::hit(io_op::getsockopt) ? fail(-1) : posix_io::getsockopt(fd, l, n, v, len);
  }
  static int poll(pollfd* f, nfds_t n, int t) noexcept {
    return fault_plan::hit(io_op::poll) ? fail(-1) : posix_io::poll(f, n, t);
  }
  static int getaddrinfo(const char* h, const char* p, const addrinfo* hints,
                         addrinfo** out) noexcept {
    return fault_plan::hit(io_op::getaddrinfo) ? fail(EAI_SYSTEM)
                                               : posix_io::getaddrinfo(h, p, hints, out);
  }
  static int inotify_init1(int f) noexcept {
    return fault_plan::hit(io_op::inotify_init1) ? fail(-1) : posix_io::inotify_init1(f);
  }
  static int inotify_add_watch(int fd, const char* p, std::uint32_t m) noexcept {
    return fault_plan::hit(io_op::inotify_add_watch) ? fail(-1)
                                                     : posix_io::inotify_add_watch(fd, p, m);
  }
};

}  // namespace testing
HOLDFAST_NAMESPACE_END
