// holdfast/io.hpp — the POSIX layer: syscalls as a policy, an owning descriptor, full transfers.
//
// Guarantees:
//   - `posix_io` is the only place holdfast makes file, directory, memory-mapping, lock, socket
//     and inotify system calls. Its static functions mirror the syscalls exactly (return -1 and
//     set errno), so a test policy can fail any call (see holdfast/testing/fault_io.hpp).
//   - Every descriptor holdfast opens has O_CLOEXEC.
//   - write_all/pwrite_all/read_full/pread_full finish short transfers and retry EINTR; fsync
//     and fdatasync retry EINTR; every other failure throws holdfast::error naming the operation
//     and the path.
//   - basic_fd is move-only and closes on destruction; close() reports the close error.
// Caveats:
//   - close() is never retried on EINTR: on Linux the descriptor is gone either way.
//   - Signals, threads and clocks are not part of the policy.
#pragma once

#include <dirent.h>       // opendir, readdir: directory scans
#include <fcntl.h>        // open flags, fcntl
#include <netdb.h>        // getaddrinfo: the HTTP client's name lookup
#include <poll.h>         // poll: socket and inotify timeouts
#include <sys/file.h>     // flock
#include <sys/inotify.h>  // inotify_init1: await_file's fast path
#include <sys/mman.h>     // mmap: the cache's read path
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>  // SYS_renameat2: older glibc has no wrapper
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>

#include "detail/detect.hpp"  // detail::detect: the policy traits
#include "error.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The default Io policy: each static function is the bare system call.
struct posix_io {
  // files
  static int open(const char* path, int flags, mode_t mode) noexcept {
    return ::open(path, flags, mode);
  }
  static int close(int fd) noexcept { return ::close(fd); }
  static ssize_t read(int fd, void* buf, std::size_t n) noexcept { return ::read(fd, buf, n); }
  static ssize_t write(int fd, const void* buf, std::size_t n) noexcept {
    return ::write(fd, buf, n);
  }
  static ssize_t pread(int fd, void* buf, std::size_t n, off_t off) noexcept {
    return ::pread(fd, buf, n, off);
  }
  static ssize_t pwrite(int fd, const void* buf, std::size_t n, off_t off) noexcept {
    return ::pwrite(fd, buf, n, off);
  }
  static off_t lseek(int fd, off_t off, int whence) noexcept { return ::lseek(fd, off, whence); }
  static int fsync(int fd) noexcept { return ::fsync(fd); }
  static int fdatasync(int fd) noexcept { return ::fdatasync(fd); }
  /// Starts writing `fd`'s dirty pages back without waiting for them (a hint, not a sync:
  /// sync_file_range SYNC_FILE_RANGE_WRITE on Linux, nothing elsewhere).
  static int start_writeback(int fd) noexcept {
#if defined(__linux__)
    return ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
    (void)fd;
    return 0;
#endif
  }
  static int fchmod(int fd, mode_t mode) noexcept { return ::fchmod(fd, mode); }
  static int fstat(int fd, struct stat* st) noexcept { return ::fstat(fd, st); }
  // the filesystem's type (f_type): network filesystems lock and notify differently
  static int fstatfs(int fd, struct statfs* st) noexcept { return ::fstatfs(fd, st); }
  static int stat(const char* path, struct stat* st) noexcept { return ::stat(path, st); }
  static int lstat(const char* path, struct stat* st) noexcept { return ::lstat(path, st); }
  static int ftruncate(int fd, off_t size) noexcept { return ::ftruncate(fd, size); }
  static int flock(int fd, int op) noexcept { return ::flock(fd, op); }
  static int fcntl(int fd, int cmd, int arg) noexcept { return ::fcntl(fd, cmd, arg); }
  // names
  static int rename(const char* from, const char* to) noexcept { return ::rename(from, to); }
  static int renameat2(int olddir, const char* from, int newdir, const char* to,
                       unsigned flags) noexcept {
    return static_cast<int>(::syscall(SYS_renameat2, olddir, from, newdir, to, flags));
  }
  static int link(const char* from, const char* to) noexcept { return ::link(from, to); }
  static int linkat(int olddir, const char* from, int newdir, const char* to, int flags) noexcept {
    return ::linkat(olddir, from, newdir, to, flags);
  }
  static int unlink(const char* path) noexcept { return ::unlink(path); }
  // names relative to a directory descriptor (tree removal that never follows a symlink)
  static int openat(int dir, const char* path, int flags, mode_t mode) noexcept {
    return ::openat(dir, path, flags, mode);
  }
  static int fstatat(int dir, const char* path, struct stat* st, int flags) noexcept {
    return ::fstatat(dir, path, st, flags);
  }
  static int unlinkat(int dir, const char* path, int flags) noexcept {
    return ::unlinkat(dir, path, flags);
  }
  static DIR* fdopendir(int fd) noexcept { return ::fdopendir(fd); }
  static int mkdir(const char* path, mode_t mode) noexcept { return ::mkdir(path, mode); }
  static int rmdir(const char* path) noexcept { return ::rmdir(path); }
  static DIR* opendir(const char* path) noexcept { return ::opendir(path); }
  static struct dirent* readdir(DIR* dir) noexcept { return ::readdir(dir); }
  static int closedir(DIR* dir) noexcept { return ::closedir(dir); }
  // memory maps
  static void* mmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) noexcept {
    return ::mmap(addr, len, prot, flags, fd, off);
  }
  static int munmap(void* addr, std::size_t len) noexcept { return ::munmap(addr, len); }
  static int madvise(void* addr, std::size_t len, int advice) noexcept {
    return ::madvise(addr, len, advice);
  }
  // sockets, polling, inotify
  static int socket(int domain, int type, int protocol) noexcept {
    return ::socket(domain, type, protocol);
  }
  static int connect(int fd, const sockaddr* addr, socklen_t len) noexcept {
    return ::connect(fd, addr, len);
  }
  static int getsockopt(int fd, int level, int name, void* val, socklen_t* len) noexcept {
    return ::getsockopt(fd, level, name, val, len);
  }
  static ssize_t send(int fd, const void* buf, std::size_t n, int flags) noexcept {
    return ::send(fd, buf, n, flags);
  }
  static ssize_t recv(int fd, void* buf, std::size_t n, int flags) noexcept {
    return ::recv(fd, buf, n, flags);
  }
  static int poll(pollfd* fds, nfds_t n, int timeout_ms) noexcept {
    return ::poll(fds, n, timeout_ms);
  }
  static int getaddrinfo(const char* host, const char* port, const addrinfo* hints,
                         addrinfo** out) noexcept {
    return ::getaddrinfo(host, port, hints, out);
  }
  static void freeaddrinfo(addrinfo* ai) noexcept { ::freeaddrinfo(ai); }
  static int inotify_init1(int flags) noexcept { return ::inotify_init1(flags); }
  static int inotify_add_watch(int fd, const char* path, std::uint32_t mask) noexcept {
    return ::inotify_add_watch(fd, path, mask);
  }
  // process
  static pid_t getpid() noexcept { return ::getpid(); }
};

namespace detail {
template <class T>
using io_open = decltype(T::open("", 0, mode_t{}));
template <class T>
using io_close = decltype(T::close(0));
template <class T>
using io_read = decltype(T::read(0, nullptr, std::size_t{}));
template <class T>
using io_write = decltype(T::write(0, nullptr, std::size_t{}));
template <class T>
using io_pread = decltype(T::pread(0, nullptr, std::size_t{}, off_t{}));
template <class T>
using io_pwrite = decltype(T::pwrite(0, nullptr, std::size_t{}, off_t{}));
template <class T>
using io_fsync = decltype(T::fsync(0));
template <class T>
using io_rename = decltype(T::rename("", ""));
template <class T>
using io_unlink = decltype(T::unlink(""));
template <class T>
using io_getpid = decltype(T::getpid());
template <class T>
using io_fstatfs = decltype(T::fstatfs(0, static_cast<struct statfs*>(nullptr)));
template <class T>
using io_start_writeback = decltype(T::start_writeback(0));

/// The statfs f_type of `fd` (Io::fstatfs where the policy has it, else ::fstatfs); 0 when
/// fstatfs fails. Network filesystems lock and notify differently from local ones (tests
/// pretend to be on NFS through a fault Io).
template <class Io>
std::uint64_t filesystem_type(int fd) noexcept {
  struct statfs st {};
  int r;
  if constexpr (detect<io_fstatfs, Io>::value)
    r = Io::fstatfs(fd, &st);
  else
    r = ::fstatfs(fd, &st);
  return r == 0 ? static_cast<std::uint64_t>(st.f_type) : 0;
}
}  // namespace detail

/// True when T provides the core of the Io policy (the file calls); see posix_io for the set.
template <class T>
inline constexpr bool is_io_policy_v = detail::detect<detail::io_open, T>::value&& detail::detect<
    detail::io_close, T>::value&& detail::detect<detail::io_read, T>::value&&
    detail::detect<detail::io_write, T>::value&& detail::detect<detail::io_pread, T>::value&&
        detail::detect<detail::io_pwrite, T>::value&& detail::detect<detail::io_fsync, T>::value&&
            detail::detect<detail::io_rename, T>::value&& detail::detect<
                detail::io_unlink, T>::value&& detail::detect<detail::io_getpid, T>::value;

/// Checks an Io policy at compile time, naming the first missing member. Derive a custom policy
/// from posix_io and override what it needs to change.
template <class Io>
constexpr bool check_io_policy() {
  using namespace detail;
  static_assert(detect<io_open, Io>::value,
                "holdfast: the Io policy needs static int open(const char*, int, mode_t)");
  static_assert(detect<io_close, Io>::value, "holdfast: the Io policy needs static int close(int)");
  static_assert(detect<io_read, Io>::value,
                "holdfast: the Io policy needs static ssize_t read(int, void*, size_t)");
  static_assert(detect<io_write, Io>::value,
                "holdfast: the Io policy needs static ssize_t write(int, const void*, size_t)");
  static_assert(detect<io_pread, Io>::value,
                "holdfast: the Io policy needs static ssize_t pread(int, void*, size_t, off_t)");
  static_assert(
      detect<io_pwrite, Io>::value,
      "holdfast: the Io policy needs static ssize_t pwrite(int, const void*, size_t, off_t)");
  static_assert(detect<io_fsync, Io>::value, "holdfast: the Io policy needs static int fsync(int)");
  static_assert(detect<io_rename, Io>::value,
                "holdfast: the Io policy needs static int rename(const char*, const char*)");
  static_assert(detect<io_unlink, Io>::value,
                "holdfast: the Io policy needs static int unlink(const char*)");
  static_assert(detect<io_getpid, Io>::value,
                "holdfast: the Io policy needs static pid_t getpid()");
  return true;
}

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_io_policy_v.
template <class T>
concept io_policy = is_io_policy_v<T>;
#endif

/// An owning, move-only file descriptor that remembers the path it was opened with.
template <class Io = posix_io>
class basic_fd {
  static_assert(check_io_policy<Io>());

 public:
  basic_fd() noexcept = default;
  /// Takes ownership of `fd`; `path` is used in error messages.
  basic_fd(int fd, std::string path) noexcept : fd_(fd), path_(std::move(path)) {}
  basic_fd(basic_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  basic_fd& operator=(basic_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  basic_fd(const basic_fd&) = delete;
  basic_fd& operator=(const basic_fd&) = delete;
  ~basic_fd() { reset(); }

  /// The raw descriptor, or -1.
  int get() const noexcept { return fd_; }
  /// The path given at open, for messages.
  const std::string& path() const noexcept { return path_; }
  /// True when a descriptor is held.
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes, ignoring the result (for cleanup paths that already report an earlier error).
  void reset() noexcept {
    if (fd_ >= 0) Io::close(std::exchange(fd_, -1));
  }
  /// Closes and throws holdfast::error("close", path) on failure (e.g. a deferred EIO on NFS).
  void close() {
    if (fd_ < 0) return;
    if (Io::close(std::exchange(fd_, -1)) != 0) throw error(errno, "close", path_);
  }

 private:
  int fd_ = -1;
  std::string path_;
};

/// The descriptor type for the default policy.
using unique_fd = basic_fd<posix_io>;

/// Opens `path` (O_CLOEXEC is always added; EINTR retried); throws holdfast::error("open", path).
template <class Io = posix_io>
basic_fd<Io> open_file(const std::string& path, int flags, mode_t mode = 0666) {
  for (;;) {
    int fd = Io::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0) return basic_fd<Io>(fd, path);
    if (errno != EINTR) throw error(errno, "open", path);
  }
}

/// As open_file, but returns an empty descriptor instead of throwing when `path` does not exist.
template <class Io = posix_io>
basic_fd<Io> open_file_if_exists(const std::string& path, int flags, mode_t mode = 0666) {
  for (;;) {
    int fd = Io::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0) return basic_fd<Io>(fd, path);
    if (errno == ENOENT) return basic_fd<Io>();
    if (errno != EINTR) throw error(errno, "open", path);
  }
}

/// Writes all `n` bytes at the file offset, finishing short writes and retrying EINTR.
template <class Io>
void write_all(const basic_fd<Io>& fd, const void* data, std::size_t n) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = Io::write(fd.get(), p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error(errno, "write", fd.path());
    }
    if (w == 0) throw error(EIO, "write", fd.path(), "wrote 0 bytes");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

/// Writes all `n` bytes at `offset`, finishing short writes and retrying EINTR.
template <class Io>
void pwrite_all(const basic_fd<Io>& fd, const void* data, std::size_t n, off_t offset) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = Io::pwrite(fd.get(), p, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error(errno, "pwrite", fd.path());
    }
    if (w == 0) throw error(EIO, "pwrite", fd.path(), "wrote 0 bytes");
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<off_t>(w);
  }
}

/// Reads until `n` bytes or end of file; returns the count. Retries EINTR and short reads.
template <class Io>
std::size_t read_full(const basic_fd<Io>& fd, void* data, std::size_t n) {
  auto p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = Io::read(fd.get(), p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw error(errno, "read", fd.path());
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

/// Reads until `n` bytes or end of file from `offset`; returns the count.
template <class Io>
std::size_t pread_full(const basic_fd<Io>& fd, void* data, std::size_t n, off_t offset) {
  auto p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = Io::pread(fd.get(), p + got, n - got, offset + static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw error(errno, "pread", fd.path());
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

/// Reads from the current offset to end of file.
template <class Io>
std::string read_all(const basic_fd<Io>& fd) {
  std::string out;
  std::size_t used = 0;
  for (;;) {
    out.resize(used + 65536);
    std::size_t got = read_full(fd, &out[used], 65536);
    used += got;
    if (got < 65536) break;
  }
  out.resize(used);
  return out;
}

/// fstat, throwing holdfast::error("fstat", path).
template <class Io>
struct stat stat_fd(const basic_fd<Io>& fd) {
  struct stat st {};
  if (Io::fstat(fd.get(), &st) != 0) throw error(errno, "fstat", fd.path());
  return st;
}

/// fsync, retrying EINTR; throws holdfast::error("fsync", path).
template <class Io>
void sync_file(const basic_fd<Io>& fd) {
  while (Io::fsync(fd.get()) != 0) {
    if (errno != EINTR) throw error(errno, "fsync", fd.path());
  }
}

/// fdatasync, retrying EINTR; throws holdfast::error("fdatasync", path).
template <class Io>
void datasync_file(const basic_fd<Io>& fd) {
  while (Io::fdatasync(fd.get()) != 0) {
    if (errno != EINTR) throw error(errno, "fdatasync", fd.path());
  }
}

/// Makes a directory's entries durable: open O_RDONLY|O_DIRECTORY, fsync, checked close.
/// Throws holdfast::error("fsync", dir); callers that accept EINVAL (network and FUSE
/// filesystems) catch it by errno, as the publishing Durability policies document.
template <class Io = posix_io>
void sync_directory(const std::string& dir) {
  auto fd = open_file<Io>(dir.empty() ? std::string(".") : dir, O_RDONLY | O_DIRECTORY);
  sync_file(fd);
  fd.close();
}

HOLDFAST_NAMESPACE_END
