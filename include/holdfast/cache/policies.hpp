// holdfast/cache/policies.hpp — the cache's Read, Lock and Sync policies: how gets reach the
// bytes (mmap_read, pread_read), how puts are serialized (flock_lock, mutex_lock, no_lock), and
// what a put makes durable (sync_never, sync_each_put).
//
// Guarantees:
//   - flock_lock serializes puts across processes: a mutex within the process, then flock on a
//     descriptor the process opened itself. A forked child notices the fork without a system
//     call (a MADV_WIPEONFORK page; getpid on kernels without it) and reopens, so it never
//     shares its parent's lock. The lock descriptor is never mapped: closing it releases the lock.
//   - On a network filesystem (is_network_filesystem of fstatfs's f_type), or after an EBADF from
//     flock, the lock descriptor is opened read-write, as POSIX record locks (flock's emulation
//     there) need.
//   - A failed LOCK_UN closes the lock descriptor (which releases the lock); the next lock
//     reopens it.
//   - sync_each_put fdatasyncs before an entry is published and after: even a power cut never
//     leaves an entry pointing at unwritten bytes. sync_never survives a killed process only.
// Caveats:
//   - On a network filesystem flock is per process, not per descriptor: two objects on one file
//     in one process do not exclude each other there.
//   - mutex_lock and no_lock serialize nothing across processes (interprocess = false).
#pragma once

#include <fcntl.h>     // O_RDONLY, O_RDWR, O_CLOEXEC: the lock descriptor
#include <sys/file.h>  // LOCK_EX, LOCK_UN
#include <sys/mman.h>  // PROT_*, MAP_PRIVATE, MADV_WIPEONFORK: the fork-detecting page
#include <unistd.h>    // sysconf(_SC_PAGESIZE)

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "../error.hpp"
#include "../io.hpp"  // basic_fd, open_file, datasync_file, detail::filesystem_type

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Read policies.

/// Read policy: map the whole file once; get returns a zero-copy std::string_view.
struct mmap_read {
  /// get returns a view into the mapping.
  static constexpr bool maps_data = true;
};
/// Read policy: map only the index; get does one pread into an owned buffer (cache_bytes).
struct pread_read {
  /// get returns an owned copy read with pread.
  static constexpr bool maps_data = false;
};

// ---------------------------------------------------------------------------------------------
// Filesystems.

/// True for a statfs `f_type` of a network or cluster filesystem: NFS, SMB/CIFS/SMB2, FUSE,
/// Lustre, GPFS, 9p, Ceph, AFS, OCFS2, GFS2, BeeGFS, PanFS, OrangeFS, Coda. There, flock is
/// emulated with POSIX record locks, which need a descriptor open for writing.
constexpr bool is_network_filesystem(std::uint64_t f_type) noexcept {
  switch (static_cast<std::uint32_t>(f_type)) {  // f_type is a signed long: compare 32 bits
    case 0x6969u:                                // NFS
    case 0x517Bu:                                // SMB
    case 0xFF534D42u:                            // CIFS
    case 0xFE534D42u:                            // SMB2
    case 0x65735546u:                            // FUSE (sshfs, s3fs, gcsfuse, ...)
    case 0x0BD00BD0u:                            // Lustre
    case 0x47504653u:                            // GPFS
    case 0x01021997u:                            // 9p
    case 0x00C36400u:                            // Ceph
    case 0x5346414Fu:                            // AFS
    case 0x7461636Fu:                            // OCFS2
    case 0x01161970u:                            // GFS2
    case 0x19830326u:                            // BeeGFS
    case 0xAAD7AAEAu:                            // PanFS
    case 0x20030528u:                            // OrangeFS / PVFS2
    case 0x73757245u:                            // Coda
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Lock policies: how puts are serialized.

/// Lock policy for several processes: a process-local mutex plus flock(LOCK_EX) on a lock
/// descriptor the process opened itself. flock belongs to the open file description, which a
/// forked child shares with its parent, so a child reopens the descriptor first. The fork is
/// noticed without a system call: a private page marked MADV_WIPEONFORK reads as zero in a child
/// (kernels without it: getpid on every lock). The lock descriptor is never mapped, so closing it
/// always releases the lock. It is opened read-only, except on a network filesystem
/// (is_network_filesystem), where flock is emulated with POSIX record locks that need a
/// read-write descriptor (an EBADF from flock on a read-only descriptor also reopens it so).
struct flock_lock {
  /// Serializes puts across processes.
  static constexpr bool interprocess = true;

  flock_lock() = default;
  flock_lock(const flock_lock&) = delete;
  flock_lock& operator=(const flock_lock&) = delete;
  ~flock_lock() {
    if (page_) unmap_(const_cast<unsigned char*>(page_), page_size_);
  }

  /// Takes the lock, (re)opening `lock_fd` on `path` when it is closed or this is a forked
  /// child; throws holdfast::error("open" or "flock", path).
  template <class Io>
  void lock(basic_fd<Io>& lock_fd, const std::string& path) {
    mutex_.lock();
    try {
      if (forked<Io>()) lock_fd.reset();  // our copy of the parent's description
      if (!lock_fd) open_lock<Io>(lock_fd, path);
      while (Io::flock(lock_fd.get(), LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        if (errno != EBADF || read_write_) throw error(errno, "flock", path);
        reopen_read_write<Io>(lock_fd, path);  // a network filesystem statfs did not name
      }
    } catch (...) {
      mutex_.unlock();
      throw;
    }
  }
  /// Releases the lock. Should LOCK_UN fail, the lock descriptor is closed (which releases the
  /// lock) and the next lock reopens it.
  template <class Io>
  void unlock(basic_fd<Io>& lock_fd) noexcept {
    if (Io::flock(lock_fd.get(), LOCK_UN) != 0) lock_fd.reset();
    mutex_.unlock();
  }

 private:
  template <class Io>
  void open_lock(basic_fd<Io>& lock_fd, const std::string& path) {
    lock_fd = open_file<Io>(path, O_RDONLY);
    read_write_ = false;
    if (is_network_filesystem(detail::filesystem_type<Io>(lock_fd.get())))
      reopen_read_write<Io>(lock_fd, path);
  }
  template <class Io>
  void reopen_read_write(basic_fd<Io>& lock_fd, const std::string& path) {
    lock_fd.reset();
    int fd;
    while ((fd = Io::open(path.c_str(), O_RDWR | O_CLOEXEC, 0)) < 0)
      if (errno != EINTR)
        throw error(errno, "open", path,
                    "flock on a network filesystem is a POSIX record lock: it needs a "
                    "read-write descriptor");
    lock_fd = basic_fd<Io>(fd, path);
    read_write_ = true;
  }

  // True the first time it is asked in a process forked since the previous call.
  template <class Io>
  bool forked() noexcept {
    if (!armed_) arm<Io>();
    if (page_) {
      if (*page_ != 0) return false;
      *page_ = 1;
      return true;
    }
    pid_t now = Io::getpid();
    if (now == pid_) return false;
    pid_ = now;
    return true;
  }
  template <class Io>
  void arm() noexcept {
    armed_ = true;
    pid_ = Io::getpid();
    long ps = ::sysconf(_SC_PAGESIZE);
    page_size_ = ps > 0 ? static_cast<std::size_t>(ps) : 4096;
#ifdef MADV_WIPEONFORK
    void* p =
        Io::mmap(nullptr, page_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    if (Io::madvise(p, page_size_, MADV_WIPEONFORK) != 0) {
      Io::munmap(p, page_size_);
      return;
    }
    page_ = static_cast<volatile unsigned char*>(p);
    *page_ = 1;
    unmap_ = &Io::munmap;
#endif
  }

  std::mutex mutex_;
  bool read_write_ = false;  // the lock descriptor is open O_RDWR
  bool armed_ = false;
  pid_t pid_ = 0;
  volatile unsigned char* page_ = nullptr;  // 1 in the process that armed it, 0 after a fork
  std::size_t page_size_ = 0;
  int (*unmap_)(void*, std::size_t) noexcept = nullptr;
};

/// Lock policy for one process with several threads: a mutex only.
struct mutex_lock {
  /// Serializes puts within one process only.
  static constexpr bool interprocess = false;
  /// Takes the mutex.
  template <class Io>
  void lock(basic_fd<Io>&, const std::string&) {
    mutex_.lock();
  }
  /// Releases the mutex.
  template <class Io>
  void unlock(basic_fd<Io>&) noexcept {
    mutex_.unlock();
  }

 private:
  std::mutex mutex_;
};

/// Lock policy that costs nothing (as spdlog's null_mutex): one thread puts, or nobody
/// (preloaded files).
struct no_lock {
  /// Serializes puts within one process only.
  static constexpr bool interprocess = false;
  /// Does nothing.
  template <class Io>
  void lock(basic_fd<Io>&, const std::string&) noexcept {}
  /// Does nothing.
  template <class Io>
  void unlock(basic_fd<Io>&) noexcept {}
};

// ---------------------------------------------------------------------------------------------
// Sync policies: what a put makes durable.

/// Sync policy: no fsync; a put survives the death of any process, not a power cut.
struct sync_never {
  /// Called after the item's bytes are written, before its entry is published.
  template <class Io>
  static void after_data(const basic_fd<Io>&) noexcept {}
  /// Called after the entry is published.
  template <class Io>
  static void after_entry(const basic_fd<Io>&) noexcept {}
};

/// Sync policy: fdatasync the bytes before publishing the entry and again after it, so even a
/// power cut never leaves an entry pointing at unwritten bytes.
struct sync_each_put {
  /// fdatasync before the entry is published.
  template <class Io>
  static void after_data(const basic_fd<Io>& fd) {
    datasync_file(fd);
  }
  /// fdatasync after the entry is published.
  template <class Io>
  static void after_entry(const basic_fd<Io>& fd) {
    datasync_file(fd);
  }
};

HOLDFAST_NAMESPACE_END
