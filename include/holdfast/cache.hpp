// holdfast/cache.hpp — an index-addressed cache file shared by processes, file-compatible with
// pfio's MultiprocessFileCache / FileCache / ReadOnlyFileCache.
//
// A cache has `length` slots. Slot i is written at most once (`put`) and read any number of times
// (`get`) by any process that has the cache: the one that created it, its forked children (e.g.
// data-loader workers) and unrelated processes that `attach` by path. The file holds an index of
// fixed-size entries (offset, length) followed by the items, appended back to back.
//
//   holdfast::multiprocess_file_cache cache(holdfast::create_cache, 50000);
//   if (!cache.get(i)) cache.put(i, decode(sample(i)));   // any process, any order
//   auto bytes = cache.get(i);                            // std::optional<std::string_view>
//
// Guarantees:
//   - Crash consistency: a put writes the item's bytes first, then the entry's offset, then its
//     length with a release store into the shared mapping of the index; readers acquire-load the
//     length. A reader (in any process) sees an empty slot or the complete item, never a torn one,
//     and a writer killed at any instruction leaves no entry pointing at unwritten bytes.
//   - Gets take no lock and make no system call with mmap_read (a view into a mapping made at
//     open), and exactly one pread with pread_read (which maps only the index), for every item
//     inside the file size this object last saw. The first get of an item past it makes one
//     fstat; with mmap_read, an item past the mapping (a smaller `reserve` than the writer's,
//     mmap refused with ENOMEM) is mapped then by a larger mapping (earlier views stay valid
//     until the object dies); where even that is refused, get_into falls back to pread and get
//     throws holdfast::error (ENOMEM), never corrupt_cache.
//   - Puts are serialized by flock on a descriptor each process opens itself: a forked child
//     notices the fork (a MADV_WIPEONFORK page, no syscall) and reopens, so it never shares the
//     parent's lock. On network filesystems (NFS, SMB/CIFS, FUSE, Lustre, GPFS, 9p, Ceph, ...:
//     is_network_filesystem of fstatfs's f_type) flock is emulated with POSIX record locks, which
//     need a descriptor open for writing: the lock descriptor is opened read-write there (and
//     after an EBADF from flock anywhere).
//   - `put` stores once: false when the slot is filled, the cache is frozen, or the size limit
//     (index + data) would be exceeded. ENOSPC freezes the cache and returns false, with no
//     exception and the lock released, so other processes go on.
//   - pfio_format files are byte-for-byte pfio's (little-endian `Qq` entries, (0, -1) = empty);
//     checked_format adds a header and a CRC32C per item, verified on every get and on preload.
//   - Bad input is reported, never obeyed: every get, get_into, entry, contains, filled and put
//     checks the entries it reads: a length below -1, or an item not inside [data offset, file
//     size) (the index end, and the size this object last saw, refreshed by one fstat before an
//     item past it is called corrupt), throws corrupt_cache naming the file and the slot. So no
//     get raises SIGBUS, returns index bytes, or allocates more than the file holds.
//   - Attach and preload validate every entry at open (the same checks, and with pfio_format no
//     two items overlapping: an entry pointing into another slot's item); preload also checks
//     every checksum. A pfio_format length that cannot be the file's is reported: an item
//     inside the reader's index (the length is too large), or the 16 bytes after the reader's
//     index reading as one more index entry while no item starts there (too small).
//     corrupt_cache names the file and the slot; nothing is written.
//   - Preload with cache_options::on_bad_slot = bad_slot_policy::treat_as_empty hides the bad
//     slots instead (they read as empty; dropped_slots() counts them); the file is not changed.
//   - Not yet visible, not corrupt: an entry whose item starts exactly at the end of the file (a
//     pfio writer writes the entry before the data: a put in flight, or a writer killed between
//     the two) reads as empty. A preloaded cache shows the items inside the file as it was at
//     open: items a writer appends later (one fstat shows the file grew) read as empty.
//   - The temp file is removed by the destructor of the object that created it, in the creating
//     process only (never by a forked child's copy).
// Caveats:
//   - pfio_format stores no length: the reader must be told it (as with pfio).
//   - Sharing a live file with pfio writers is unsafe for holdfast's lock-free readers: pfio
//     writes the index entry before the data, so a reader cannot tell a put in flight whose
//     bytes are partly written (reported corrupt) from a bad entry, and a pfio writer killed
//     between its entry and its data leaves an entry that the next put's item then fills with
//     another slot's bytes (found by the overlap check at the next attach or preload, not by a
//     get). Safe: preload of a preserved file no pfio process writes any more, and attach of a
//     file only holdfast writes.
//   - Items put after an attach or preload are checked on get against the index and the file
//     size, not against each other: with pfio_format an entry pointing into another item that
//     lies inside the file is only found by the next attach or preload (checked_format's CRC,
//     salted with the slot, catches it on every get).
//   - The too-small length check is a heuristic: when no item starts right after the index (the
//     first put's writer was killed before publishing its entry) and the orphaned bytes there
//     happen to read as an index entry, a right length is refused too.
//   - freeze() and the size limit act on one object. preserve() on a checked_format cache also
//     seals the file for every process; on a pfio_format cache other processes that keep putting
//     grow the preserved file (as in pfio).
//   - Do not fork while another thread of the process is inside `put`, or inside a get that
//     refreshes the file size (as with any mutex).
//   - With mmap_read this object's puts stop at its reserved address range
//     (cache_options::reserve, default: the size limit, else 64 GiB): a put past it returns false
//     like the size limit. Items other processes put past it are still read (mapped on demand).
//   - On a network filesystem flock is per process, not per descriptor: two objects attached to
//     the same file in one process do not exclude each other's puts, and closing any descriptor
//     of the file in the process drops the lock. Use one object per file per process there.
//   - sync_never (the default) survives a killed process, not a power cut; preserve() fsyncs.
//   - A pfio_format put costs one lseek to find the end of the file (the format has nowhere to
//     record it); checked_format keeps the end of data in its header.
//   - A moved-from cache may only be destroyed or assigned to.
#pragma once

#include <fcntl.h>       // O_RDWR, O_CREAT, O_EXCL
#include <sys/file.h>    // LOCK_EX, LOCK_UN
#include <sys/mman.h>    // PROT_*, MAP_SHARED, MADV_WIPEONFORK
#include <sys/statfs.h>  // fstatfs: network filesystems need a read-write lock descriptor
#include <unistd.h>      // sysconf(_SC_PAGESIZE)

#include <algorithm>  // sort: the overlap check at open
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>  // getenv: $TMPDIR for the default directory
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/crc32c.hpp"
#include "error.hpp"
#include "io.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define HOLDFAST_CACHE_COLD __attribute__((noinline, cold))
#else
#define HOLDFAST_CACHE_COLD
#endif

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Tags: how a cache object gets its file.

/// Tag: create a new temp cache file in a directory (removed when the creating object dies).
struct create_cache_t {
  explicit create_cache_t() = default;
};
/// Tag: open a live cache file created by another process, to put and get (exec'ed workers).
struct attach_cache_t {
  explicit attach_cache_t() = default;
};
/// Tag: open a preserved cache file read-only and frozen (read-only files and dirs work).
struct preload_cache_t {
  explicit preload_cache_t() = default;
};
/// Tag value for create_cache_t.
inline constexpr create_cache_t create_cache{};
/// Tag value for attach_cache_t.
inline constexpr attach_cache_t attach_cache{};
/// Tag value for preload_cache_t.
inline constexpr preload_cache_t preload_cache{};

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

// ---------------------------------------------------------------------------------------------
// Formats.

namespace detail {

inline constexpr bool host_is_little_endian() noexcept {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return false;
#else
  return true;
#endif
}

/// Converts between host order and little-endian (the same function both ways).
inline std::uint64_t le64(std::uint64_t v) noexcept {
  return host_is_little_endian() ? v : __builtin_bswap64(v);
}
inline std::uint32_t le32(std::uint32_t v) noexcept {
  return host_is_little_endian() ? v : __builtin_bswap32(v);
}

/// Stores / loads a little-endian integer at an unaligned byte address.
inline void put_le64(char* p, std::uint64_t v) noexcept {
  v = le64(v);
  std::memcpy(p, &v, 8);
}
inline void put_le32(char* p, std::uint32_t v) noexcept {
  v = le32(v);
  std::memcpy(p, &v, 4);
}
inline std::uint64_t get_le64(const char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return le64(v);
}
inline std::uint32_t get_le32(const char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return le32(v);
}

}  // namespace detail

/// pfio's file, byte for byte: no header; entry i at 16 * i is (uint64 offset, int64 length),
/// little-endian; (0, -1) is an empty slot; data from 16 * length on.
struct pfio_format {
  /// The format's name (for tools and messages).
  static constexpr const char* name = "pfio";
  /// Bytes before the index.
  static constexpr std::size_t header_size = 0;
  /// Bytes per index entry.
  static constexpr std::size_t entry_size = 16;
  /// Whether the file records its own length.
  static constexpr bool stores_length = false;
  /// Whether items carry a checksum.
  static constexpr bool checksummed = false;
  /// The header bytes for a new file (none).
  static std::string encode_header(std::uint64_t) { return {}; }
  /// The length a header declares (pfio stores none: 0).
  static std::uint64_t decode_header(const char*, const std::string&) { return 0; }
  /// The checksum of an item (pfio has none: 0).
  static std::uint32_t item_crc(std::uint64_t, const void*, std::size_t) noexcept { return 0; }
};

/// holdfast's checked file: a 48-byte header, 24-byte entries (offset, length, CRC32C, 0), data.
///   header: "HFCACHE\n", u32 version (1), u32 flags (0), u64 length, u32 CRC32C of bytes 0-23,
///           u32 state (bit 0: sealed by preserve), u64 end of data, u64 zero. State and end of
///           data change under the put lock and are not covered by the CRC; the end of data
///           saves writers an lseek per put.
///   entry:  u64 offset, i64 length (-1 = empty), u32 CRC32C(le64(slot) + data), u32 zero.
struct checked_format {
  /// The format's name (for tools and messages).
  static constexpr const char* name = "checked";
  /// Bytes before the index.
  static constexpr std::size_t header_size = 48;
  /// Bytes per index entry.
  static constexpr std::size_t entry_size = 24;
  /// Whether the file records its own length.
  static constexpr bool stores_length = true;
  /// Whether items carry a checksum.
  static constexpr bool checksummed = true;
  /// The first 8 bytes of every checked file.
  static constexpr char magic[8] = {'H', 'F', 'C', 'A', 'C', 'H', 'E', '\n'};
  /// The format version this header writes and reads.
  static constexpr std::uint32_t version = 1;
  /// Offset of the state word (bit 0: sealed) inside the header.
  static constexpr std::size_t state_offset = 28;
  /// The state bit preserve() sets: puts from every process return false.
  static constexpr std::uint32_t sealed = 1;
  /// Offset of the end-of-data word inside the header.
  static constexpr std::size_t end_offset = 32;

  /// The header bytes for a new file of `length` slots (no data yet).
  static std::string encode_header(std::uint64_t length) {
    std::string h(header_size, '\0');
    std::memcpy(&h[0], magic, 8);
    detail::put_le32(&h[8], version);
    detail::put_le32(&h[12], 0);
    detail::put_le64(&h[16], length);
    detail::put_le32(&h[24], detail::crc32c(h.data(), 24));
    detail::put_le64(&h[end_offset], header_size + length * entry_size);
    return h;
  }
  /// Checks the header at `p` (header_size bytes) and returns its length; throws corrupt_cache.
  static std::uint64_t decode_header(const char* p, const std::string& path) {
    if (std::memcmp(p, magic, 8) != 0) throw corrupt_cache(path, 0, "bad magic: not a cache file");
    if (detail::get_le32(p + 24) != detail::crc32c(p, 24))
      throw corrupt_cache(path, 0, "header checksum mismatch");
    auto v = detail::get_le32(p + 8);
    if (v != version) throw corrupt_cache(path, 0, "unsupported version " + std::to_string(v));
    if (detail::get_le32(p + 12) != 0) throw corrupt_cache(path, 0, "unknown header flags");
    return detail::get_le64(p + 16);
  }
  /// CRC32C of the slot number (8 bytes, little-endian) followed by the item's bytes, so an
  /// entry pointing at another slot's item is caught too.
  static std::uint32_t item_crc(std::uint64_t slot, const void* data, std::size_t n) noexcept {
    char s[8];
    detail::put_le64(s, slot);
    return detail::crc32c_extend(detail::crc32c(s, 8), data, n);
  }
};

// ---------------------------------------------------------------------------------------------
// Policy checks.

namespace detail {
template <class T>
using cache_read_maps_data = decltype(bool{T::maps_data});
template <class T>
using cache_lock_interprocess = decltype(bool{T::interprocess});
template <class T>
using cache_lock_lock = decltype(std::declval<T&>().template lock<posix_io>(
    std::declval<basic_fd<posix_io>&>(), std::declval<const std::string&>()));
template <class T>
using cache_lock_unlock =
    decltype(std::declval<T&>().template unlock<posix_io>(std::declval<basic_fd<posix_io>&>()));
template <class T>
using cache_sync_data =
    decltype(T::template after_data<posix_io>(std::declval<const basic_fd<posix_io>&>()));
template <class T>
using cache_sync_entry =
    decltype(T::template after_entry<posix_io>(std::declval<const basic_fd<posix_io>&>()));
template <class T>
using cache_format_sizes = decltype(std::size_t{T::header_size} + std::size_t{T::entry_size});
template <class T>
using cache_format_flags = decltype(bool{T::stores_length} && bool{T::checksummed});
template <class T>
using cache_format_encode = decltype(std::string{T::encode_header(std::uint64_t{})});
template <class T>
using cache_format_decode = decltype(std::uint64_t{
    T::decode_header(nullptr, std::declval<const std::string&>())});
template <class T>
using cache_format_crc = decltype(std::uint32_t{T::item_crc(std::uint64_t{}, nullptr, 0)});
}  // namespace detail

/// True when T is a cache Read policy (has `static constexpr bool maps_data`).
template <class T>
inline constexpr bool is_cache_read_policy_v =
    detail::detect<detail::cache_read_maps_data, T>::value;
/// True when T is a cache Lock policy (`interprocess`, `lock<Io>(fd, path)`, `unlock<Io>(fd)`).
template <class T>
inline constexpr bool is_cache_lock_policy_v =
    detail::detect<detail::cache_lock_interprocess, T>::value&& detail::detect<
        detail::cache_lock_lock, T>::value&& detail::detect<detail::cache_lock_unlock, T>::value;
/// True when T is a cache Sync policy (`after_data<Io>(fd)`, `after_entry<Io>(fd)`).
template <class T>
inline constexpr bool is_cache_sync_policy_v = detail::detect<detail::cache_sync_data, T>::value&&
    detail::detect<detail::cache_sync_entry, T>::value;
/// True when T is a cache Format policy (sizes, flags, header codec, item checksum).
template <class T>
inline constexpr bool is_cache_format_policy_v =
    detail::detect<detail::cache_format_sizes, T>::value&&
        detail::detect<detail::cache_format_flags, T>::value&&
            detail::detect<detail::cache_format_encode, T>::value&&
                detail::detect<detail::cache_format_decode, T>::value&&
                    detail::detect<detail::cache_format_crc, T>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_cache_read_policy_v.
template <class T>
concept cache_read_policy = is_cache_read_policy_v<T>;
/// C++20 spelling of is_cache_lock_policy_v.
template <class T>
concept cache_lock_policy = is_cache_lock_policy_v<T>;
/// C++20 spelling of is_cache_sync_policy_v.
template <class T>
concept cache_sync_policy = is_cache_sync_policy_v<T>;
/// C++20 spelling of is_cache_format_policy_v.
template <class T>
concept cache_format_policy = is_cache_format_policy_v<T>;
#endif

/// Checks the cache policies at compile time, naming the first missing member.
template <class Read, class Lock, class Sync, class Format>
constexpr bool check_cache_policies() {
  using namespace detail;
  static_assert(detect<cache_read_maps_data, Read>::value,
                "holdfast: the cache Read policy needs static constexpr bool maps_data "
                "(use mmap_read or pread_read)");
  static_assert(detect<cache_lock_interprocess, Lock>::value,
                "holdfast: the cache Lock policy needs static constexpr bool interprocess");
  static_assert(detect<cache_lock_lock, Lock>::value,
                "holdfast: the cache Lock policy needs template <class Io> void lock(basic_fd<Io>& "
                "lock_fd, const std::string& path)");
  static_assert(
      detect<cache_lock_unlock, Lock>::value,
      "holdfast: the cache Lock policy needs template <class Io> void unlock(basic_fd<Io>& "
      "lock_fd) noexcept");
  static_assert(detect<cache_sync_data, Sync>::value,
                "holdfast: the cache Sync policy needs template <class Io> static void "
                "after_data(const basic_fd<Io>&)");
  static_assert(detect<cache_sync_entry, Sync>::value,
                "holdfast: the cache Sync policy needs template <class Io> static void "
                "after_entry(const basic_fd<Io>&)");
  static_assert(detect<cache_format_sizes, Format>::value,
                "holdfast: the cache Format policy needs static constexpr std::size_t "
                "header_size and entry_size");
  static_assert(detect<cache_format_flags, Format>::value,
                "holdfast: the cache Format policy needs static constexpr bool stores_length and "
                "checksummed");
  static_assert(detect<cache_format_encode, Format>::value,
                "holdfast: the cache Format policy needs static std::string "
                "encode_header(uint64_t length)");
  static_assert(detect<cache_format_decode, Format>::value,
                "holdfast: the cache Format policy needs static uint64_t decode_header(const "
                "char*, const std::string& path)");
  static_assert(detect<cache_format_crc, Format>::value,
                "holdfast: the cache Format policy needs static uint32_t item_crc(uint64_t slot, "
                "const void*, size_t)");
  return true;
}

// ---------------------------------------------------------------------------------------------
// The cache.

/// What preload does with a slot whose entry or checksum is bad.
enum class bad_slot_policy {
  refuse,         ///< throw corrupt_cache naming the file and the first bad slot (the default)
  treat_as_empty  ///< read the slot as empty, count it in dropped_slots(); the file is unchanged
};

/// Options for creating, attaching to or preloading a cache.
struct cache_options {
  /// Directory for the temp file (create only); empty: $TMPDIR, else /tmp.
  std::string dir;
  /// Most bytes the file may hold, index included (0: no limit). A put past it freezes.
  std::uint64_t size_limit = 0;
  /// mmap_read: bytes of address space mapped at open, where this object's puts stop (0:
  /// size_limit, else 64 GiB). Items other processes put past it are mapped when first read.
  std::uint64_t reserve = 0;
  /// Preload only: what a bad entry or checksum does (attach always refuses).
  bad_slot_policy on_bad_slot = bad_slot_policy::refuse;
};

/// The owned bytes a pread_read get returns: allocated without zero-filling (the pread fills
/// them), move-only, viewable as std::string_view.
class cache_bytes {
 public:
  cache_bytes() noexcept = default;
  /// `n` uninitialized bytes.
  explicit cache_bytes(std::size_t n) : p_(n ? new char[n] : nullptr), n_(n) {}
  /// The bytes.
  char* data() noexcept { return p_.get(); }
  /// The bytes.
  const char* data() const noexcept { return p_.get(); }
  /// How many bytes.
  std::size_t size() const noexcept { return n_; }
  /// True for zero bytes.
  bool empty() const noexcept { return n_ == 0; }
  /// Iteration over the bytes.
  const char* begin() const noexcept { return p_.get(); }
  /// Iteration over the bytes.
  const char* end() const noexcept { return p_.get() + n_; }
  /// A view of the bytes.
  operator std::string_view() const noexcept { return {p_.get(), n_}; }
  /// A copy as std::string.
  std::string str() const { return std::string(p_.get(), n_); }
  /// Byte-wise equality with anything viewable as std::string_view.
  friend bool operator==(const cache_bytes& a, std::string_view b) noexcept {
    return std::string_view(a) == b;
  }
  friend bool operator==(std::string_view a, const cache_bytes& b) noexcept { return b == a; }
  friend bool operator!=(const cache_bytes& a, std::string_view b) noexcept { return !(a == b); }
  friend bool operator!=(std::string_view a, const cache_bytes& b) noexcept { return !(b == a); }

 private:
  std::unique_ptr<char[]> p_;
  std::size_t n_ = 0;
};

/// Where a filled slot's item lies in the file.
struct cache_entry {
  std::uint64_t offset;  ///< absolute file offset of the first byte
  std::uint64_t size;    ///< bytes
};

/// An index-addressed cache file; see the top of this header. Move-only.
template <class Read = mmap_read, class Lock = flock_lock, class Sync = sync_never,
          class Format = pfio_format, class Io = posix_io>
class basic_file_cache {
  static_assert(check_cache_policies<Read, Lock, Sync, Format>());
  static_assert(check_io_policy<Io>());
  static_assert(Format::header_size % 8 == 0 && Format::entry_size % 8 == 0 &&
                    Format::entry_size >= 16,
                "holdfast: entries must be 8-byte aligned and start with offset and length");

 public:
  using read_policy = Read;
  using lock_policy = Lock;
  using sync_policy = Sync;
  using format = Format;
  using io = Io;
  /// What get returns: a view into the mapping (mmap_read) or an owned buffer (pread_read).
  using value_type = std::conditional_t<Read::maps_data, std::string_view, cache_bytes>;

  /// Creates a temp cache file of `length` empty slots in `options.dir`.
  basic_file_cache(create_cache_t, std::uint64_t length, const cache_options& options = {})
      : s_(std::make_unique<state>()) {
    s_->length = length;
    s_->limit = options.size_limit;
    s_->writable = true;
    create_file(options.dir.empty() ? default_dir() : options.dir);
    map_file(options.reserve, options.size_limit);
  }

  /// Opens the live cache at `path` to put and get. `length` may be 0 for checked_format (it is
  /// read from the header) and must be given for pfio_format.
  basic_file_cache(attach_cache_t, const std::string& path, std::uint64_t length = 0,
                   const cache_options& options = {})
      : s_(std::make_unique<state>()) {
    s_->limit = options.size_limit;
    s_->writable = true;
    s_->fd = open_file<Io>(path, O_RDWR);
    s_->path = path;
    read_layout(length);
    map_file(options.reserve, options.size_limit);
    validate_all(bad_slot_policy::refuse);
    check_data_end();
  }

  /// Opens the preserved cache at `path` read-only and frozen, validating every entry (and, with
  /// checked_format, every checksum); throws corrupt_cache naming the file and the slot, or with
  /// `options.on_bad_slot == bad_slot_policy::treat_as_empty` hides the bad slots.
  basic_file_cache(preload_cache_t, const std::string& path, std::uint64_t length = 0,
                   const cache_options& options = {})
      : s_(std::make_unique<state>()) {
    s_->frozen = true;
    s_->fd = open_file<Io>(path, O_RDONLY);
    s_->path = path;
    read_layout(length);
    map_file(s_->known_size, 0);
    validate_all(options.on_bad_slot);
    check_data_end();
  }

  /// Same as the attach_cache constructor (for workers started by exec).
  static basic_file_cache attach(const std::string& path, std::uint64_t length = 0,
                                 const cache_options& options = {}) {
    return basic_file_cache(attach_cache, path, length, options);
  }
  /// Same as the preload_cache constructor.
  static basic_file_cache preload(const std::string& path, std::uint64_t length = 0,
                                  const cache_options& options = {}) {
    return basic_file_cache(preload_cache, path, length, options);
  }

  basic_file_cache(basic_file_cache&& o) noexcept
      : s_(std::move(o.s_)),
        map_(o.map_.load(std::memory_order_relaxed)),
        bound_(o.bound_.load(std::memory_order_relaxed)),
        length_(o.length_),
        index_end_(o.index_end_) {}
  basic_file_cache& operator=(basic_file_cache&& o) noexcept {
    if (this != &o) {
      s_ = std::move(o.s_);
      map_.store(o.map_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      bound_.store(o.bound_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      length_ = o.length_;
      index_end_ = o.index_end_;
    }
    return *this;
  }
  basic_file_cache(const basic_file_cache&) = delete;
  basic_file_cache& operator=(const basic_file_cache&) = delete;
  /// Unmaps and closes; the creating object, in the creating process, also removes the file.
  ~basic_file_cache() = default;

  /// The number of slots.
  std::uint64_t length() const noexcept { return s_->length; }
  /// The cache file's path.
  const std::string& path() const noexcept { return s_->path; }
  /// True when put always returns false (preloaded, preserved, size limit or ENOSPC reached).
  bool frozen() const noexcept { return s_->frozen.load(std::memory_order_relaxed); }
  /// Makes every later put of this object return false.
  void freeze() noexcept { s_->frozen.store(true, std::memory_order_relaxed); }
  /// True for the object that created the file (and will remove it), in the creating process.
  bool owns_file() const noexcept { return s_->owner && Io::getpid() == s_->creator_pid; }
  /// The descriptor reads, writes and the mapping use (for tests and diagnostics).
  int native_handle() const noexcept { return s_->fd.get(); }
  /// The descriptor puts flock in this process (flock_lock; -1 before the first put).
  int lock_handle() const noexcept { return s_->lock_fd.get(); }

  /// Stores `bytes` in slot `i` once. False when the slot is filled, the cache is frozen, the
  /// size limit would be exceeded or the disk is full (which freezes). Throws holdfast::error on
  /// other I/O failures (nothing is published then), for `i` out of range, and corrupt_cache
  /// when the slot's entry is bad (nothing is written).
  bool put(std::uint64_t i, std::string_view bytes) {
    check_slot(i, "put");
    state& s = *s_;
    if (frozen() || taken(i)) return false;
    lock_guard guard(s);
    if (sealed() || taken(i)) {
      if (sealed()) s.frozen = true;
      return false;
    }
    auto end = data_end();
    if (end < s.index_end) throw corrupt_cache(s.path, i, "end of data inside the index");
    auto need = end + bytes.size();
    if ((s.limit && need > s.limit) || (Read::maps_data && need > s.reserved)) {
      s.frozen = true;
      return false;
    }
    try {
      if (!bytes.empty()) pwrite_all(s.fd, bytes.data(), bytes.size(), to_off(end));
      Sync::after_data(s.fd);
    } catch (const error& e) {
      if (!is_disk_full(e.errnum())) throw;
      s.frozen = true;
      return false;
    }
    set_data_end(need);  // before the entry: a writer killed in between leaves only a gap
    publish(i, end, bytes);
    raise_bound(need);  // our own item: no fstat to read it back (inside the reservation)
    try {
      Sync::after_entry(s.fd);
    } catch (const error& e) {
      if (!is_disk_full(e.errnum())) throw;
      s.frozen = true;  // the item is stored and visible; only its durability is in doubt
    }
    return true;
  }
  /// put for a raw buffer.
  bool put(std::uint64_t i, const void* data, std::size_t n) {
    return put(i, std::string_view(static_cast<const char*>(data), n));
  }

  /// The item in slot `i`, or nothing when the slot is empty. With mmap_read a view valid while
  /// this object lives; with pread_read an owned copy (cache_bytes). Throws holdfast::error
  /// (ERANGE) for `i` out of range, corrupt_cache for a bad entry or checksum, and (mmap_read)
  /// holdfast::error (ENOMEM) for an item past what the process could map (use get_into).
  std::optional<value_type> get(std::uint64_t i) const {
    check_slot(i, "get");
    if constexpr (Read::maps_data) {
      const std::uint64_t bound = bound_.load(std::memory_order_acquire);
      const char* m = map();  // loaded after the bound: covers it
      std::int64_t len = load_length(m, i);
      if (len == -1) return std::nullopt;
      std::uint64_t off = load_offset(m, i);
      if (!fits(off, len, bound)) return get_slow(i, off, len);
      std::string_view v(m + to_size(off), static_cast<std::size_t>(len));
      verify(i, v.size(), v.data());
      return v;
    } else {
      auto e = load_entry(i);
      if (!e) return std::nullopt;
      cache_bytes out(to_size(e->size));  // no larger than the file: load_entry checked
      read_raw(i, *e, out.data());
      return out;
    }
  }

  /// Copies slot `i` into `out` (resized; std::string, std::vector<char> or another contiguous
  /// byte container with resize and data). False, `out` untouched, when the slot is empty.
  template <class Buffer>
  bool get_into(std::uint64_t i, Buffer& out) const {
    static_assert(sizeof(*std::declval<Buffer&>().data()) == 1,
                  "holdfast: get_into needs a container of bytes (char, unsigned char, std::byte)");
    check_slot(i, "get");
    if constexpr (Read::maps_data) {
      const std::uint64_t bound = bound_.load(std::memory_order_acquire);
      const char* m = map();  // loaded after the bound: covers it
      std::int64_t len = load_length(m, i);
      if (len == -1) return false;
      std::uint64_t off = load_offset(m, i);
      if (!fits(off, len, bound)) return get_into_slow(i, off, len, out);
      copy_out(i, m + to_size(off), static_cast<std::size_t>(len), out);
    } else {
      auto e = load_entry(i);
      if (!e) return false;
      read_into(i, *e, out);
    }
    return true;
  }

  /// Whether slot `i` is filled (and its entry good: a bad entry throws corrupt_cache).
  bool contains(std::uint64_t i) const {
    check_slot(i, "contains");
    bool unmapped = false;
    return load_entry(i, &unmapped).has_value();
  }
  /// Where slot `i`'s item lies, or nothing when empty (validated as get does, no checksum).
  std::optional<cache_entry> entry(std::uint64_t i) const {
    check_slot(i, "entry");
    bool unmapped = false;
    return load_entry(i, &unmapped);
  }
  /// The number of filled slots (scans the index, checking each entry as contains does).
  std::uint64_t filled() const {
    std::uint64_t n = 0;
    for (std::uint64_t i = 0; i < length_; ++i) n += contains(i);
    return n;
  }
  /// How many bad slots preload hid (bad_slot_policy::treat_as_empty); 0 otherwise.
  std::uint64_t dropped_slots() const noexcept { return s_->dropped; }
  /// The file's current size in bytes (index + data), as the size limit counts it.
  std::uint64_t size_bytes() const { return static_cast<std::uint64_t>(stat_fd(s_->fd).st_size); }
  /// Where item data starts: the header plus the index.
  std::uint64_t data_offset() const noexcept { return s_->index_end; }

  /// Hard-links the cache file to `name` (in the cache's directory unless it contains a '/'),
  /// fsyncs file and directory, and freezes this object (with checked_format, every process).
  /// False when `name` already exists; throws holdfast::error on other failures.
  bool preserve(const std::string& name) {
    state& s = *s_;
    std::string target = name.find('/') == std::string::npos ? dir_of(s.path) + "/" + name : name;
    if (s.writable) {
      lock_guard guard(s);
      if (!link_to(target)) return false;
      seal();
    } else if (!link_to(target)) {
      return false;
    }
    s.frozen = true;
    sync_file(s.fd);
    sync_directory<Io>(dir_of(target));
    return true;
  }

 private:
  struct state {
    basic_fd<Io> fd;
    std::string path;
    basic_fd<Io> lock_fd;   // flock_lock's own descriptor: never mapped, reopened after fork
    pid_t creator_pid = 0;  // the process whose object removes the file
    bool owner = false;
    bool writable = false;
    std::atomic<bool> frozen{false};  // read outside the lock by other threads
    std::uint64_t length = 0;
    std::uint64_t index_end = 0;  // header + index = where data starts
    std::uint64_t limit = 0;
    std::uint64_t reserved = 0;  // mmap_read: the mapping made at open, where our puts stop
    std::uint64_t dropped = 0;   // slots preload hid (bad_slot_policy::treat_as_empty)
    // Guarded by grow_mutex once the object is open (the miss path of a get):
    std::mutex grow_mutex;
    std::uint64_t known_size = 0;  // the file size last seen (preload: at open, then fstat)
    char* map = nullptr;           // the newest mapping (the handle caches it)
    std::size_t map_size = 0;      // its size
    std::vector<std::pair<char*, std::size_t>> retired;  // older mappings: views may point there
    Lock lock;

    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (map) Io::munmap(map, map_size);
      for (auto& m : retired) Io::munmap(m.first, m.second);
      fd.reset();
      if (owner && Io::getpid() == creator_pid) Io::unlink(path.c_str());
    }
  };

  struct lock_guard {
    explicit lock_guard(state& st) : s(st) { s.lock.template lock<Io>(s.lock_fd, s.path); }
    ~lock_guard() { s.lock.template unlock<Io>(s.lock_fd); }
    lock_guard(const lock_guard&) = delete;
    lock_guard& operator=(const lock_guard&) = delete;
    state& s;
  };

  static constexpr std::uint64_t default_reserve = std::uint64_t{64} << 30;
  static constexpr std::uint64_t max_map = std::numeric_limits<std::size_t>::max() / 2;

  static std::string default_dir() {
    const char* t = std::getenv("TMPDIR");
    return t && *t ? std::string(t) : std::string("/tmp");
  }
  static std::string dir_of(const std::string& path) {
    auto slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? std::string("/") : path.substr(0, slash);
  }
  static bool is_disk_full(int e) noexcept { return e == ENOSPC || e == EDQUOT; }
  static off_t to_off(std::uint64_t v) noexcept { return static_cast<off_t>(v); }
  static std::size_t to_size(std::uint64_t v) noexcept { return static_cast<std::size_t>(v); }
  static std::string str(std::uint64_t v) { return std::to_string(v); }
  static std::uint64_t page_size() noexcept {
    long ps = ::sysconf(_SC_PAGESIZE);
    return ps > 0 ? static_cast<std::uint64_t>(ps) : 4096;
  }

  // Any of our mappings holds the index (they all start at offset 0), and with mmap_read the
  // newest one covers every item inside bound_. Acquire: pairs with the release that published
  // a new mapping, so a thread reading through it sees the mmap that made it (a plain load on
  // x86-64, ldar on aarch64).
  char* map() const noexcept { return map_.load(std::memory_order_acquire); }
  char* entry_ptr(std::uint64_t i) const noexcept {
    return map() + Format::header_size + to_size(i) * Format::entry_size;
  }
  // mmap_read: where an item's bytes are (a zero-byte item's offset is never dereferenced).
  // Called after load_entry's acquire load of bound_: the mapping is at least as new.
  const char* data_ptr(const cache_entry& e) const noexcept {
    return map() + (e.size ? to_size(e.offset) : 0);
  }
  // Copies the fields every get reads into the handle (one indirection less per get).
  void cache_hot_fields(std::uint64_t bound) noexcept {
    map_.store(s_->map, std::memory_order_relaxed);
    bound_.store(bound, std::memory_order_relaxed);
    length_ = s_->length;
    index_end_ = s_->index_end;
  }
  // Raises the bound every get checks against (never lowers it). For mmap_read the caller
  // makes sure the newest mapping covers `v` first (the release orders the two).
  void raise_bound(std::uint64_t v) const noexcept {
    auto b = bound_.load(std::memory_order_relaxed);
    while (b < v && !bound_.compare_exchange_weak(b, v, std::memory_order_release,
                                                  std::memory_order_relaxed)) {
    }
  }
  static const char* entry_in(const char* m, std::uint64_t i) noexcept {
    return m + Format::header_size + to_size(i) * Format::entry_size;
  }
  static std::int64_t load_length(const char* m, std::uint64_t i) noexcept {
    auto p = reinterpret_cast<const std::uint64_t*>(entry_in(m, i) + 8);
    return static_cast<std::int64_t>(detail::le64(__atomic_load_n(p, __ATOMIC_ACQUIRE)));
  }
  static std::uint64_t load_offset(const char* m, std::uint64_t i) noexcept {
    auto p = reinterpret_cast<const std::uint64_t*>(entry_in(m, i));
    return detail::le64(__atomic_load_n(p, __ATOMIC_RELAXED));
  }
  std::int64_t load_length(std::uint64_t i) const noexcept { return load_length(map(), i); }
  std::uint64_t load_offset(std::uint64_t i) const noexcept { return load_offset(map(), i); }
  std::uint32_t load_crc(std::uint64_t i) const noexcept {
    auto p = reinterpret_cast<std::uint32_t*>(entry_ptr(i) + 16);
    return detail::le32(__atomic_load_n(p, __ATOMIC_RELAXED));
  }
  bool sealed() const noexcept {
    if constexpr (std::is_same_v<Format, checked_format>) {
      auto p = reinterpret_cast<std::uint32_t*>(map() + checked_format::state_offset);
      return (detail::le32(__atomic_load_n(p, __ATOMIC_ACQUIRE)) & checked_format::sealed) != 0;
    }
    return false;
  }
  void seal() noexcept {
    if constexpr (std::is_same_v<Format, checked_format>) {
      auto p = reinterpret_cast<std::uint32_t*>(map() + checked_format::state_offset);
      __atomic_fetch_or(p, detail::le32(checked_format::sealed), __ATOMIC_RELEASE);
    }
  }
  // put: whether slot i is taken (filled, or a pfio entry in flight); a bad length throws.
  bool taken(std::uint64_t i) const {
    auto len = load_length(i);
    if (len < -1) fail_entry(i, load_offset(i), len, "");
    return len != -1;
  }

  // Where the next item goes: the recorded end of data (checked_format), else the file size.
  std::uint64_t data_end() const {
    if constexpr (std::is_same_v<Format, checked_format>) {
      auto p = reinterpret_cast<std::uint64_t*>(map() + checked_format::end_offset);
      return detail::le64(__atomic_load_n(p, __ATOMIC_ACQUIRE));
    }
    // lseek, not fstat: half the cost. Nothing uses the file position (all I/O is positional).
    off_t end = Io::lseek(s_->fd.get(), 0, SEEK_END);
    if (end < 0) throw error(errno, "lseek", s_->path);
    return static_cast<std::uint64_t>(end);
  }
  void set_data_end(std::uint64_t end) noexcept {
    if constexpr (std::is_same_v<Format, checked_format>) {
      auto p = reinterpret_cast<std::uint64_t*>(map() + checked_format::end_offset);
      __atomic_store_n(p, detail::le64(end), __ATOMIC_RELEASE);
    } else {
      (void)end;
    }
  }

  // Data first (done by the caller), then the offset and checksum, then the length (release).
  void publish(std::uint64_t i, std::uint64_t offset, std::string_view bytes) noexcept {
    char* e = entry_ptr(i);
    __atomic_store_n(reinterpret_cast<std::uint64_t*>(e), detail::le64(offset), __ATOMIC_RELAXED);
    if constexpr (Format::checksummed) {
      auto crc = Format::item_crc(i, bytes.data(), bytes.size());
      __atomic_store_n(reinterpret_cast<std::uint32_t*>(e + 16), detail::le32(crc),
                       __ATOMIC_RELAXED);
    }
    __atomic_store_n(reinterpret_cast<std::uint64_t*>(e + 8),
                     detail::le64(static_cast<std::uint64_t>(bytes.size())), __ATOMIC_RELEASE);
  }

  // The checks of every get are inline; building their messages is out of line and cold.
  void check_slot(std::uint64_t i, const char* op) const {
    if (i >= length_) fail_range(i, op);
  }
  [[noreturn]] HOLDFAST_CACHE_COLD void fail_range(std::uint64_t i, const char* op) const {
    throw error(ERANGE, std::string("cache ") + op, s_->path,
                "slot " + str(i) + " out of range (length " + str(length_) + ")");
  }

  // The entry of slot i; nothing when empty or not yet visible. The fast path is a few compares
  // against values in memory: an item inside [index end, bound_), where bound_ is the file size
  // last seen (and, with mmap_read, mapped). Anything else takes the cold path, which refreshes
  // the size once before it calls the entry corrupt. `unmapped` (mmap_read): set when the item
  // is in the file but could not be mapped; without it, that throws (ENOMEM).
  std::optional<cache_entry> load_entry(std::uint64_t i, bool* unmapped = nullptr) const {
    const std::uint64_t bound = bound_.load(std::memory_order_acquire);
    std::int64_t len = load_length(i);
    if (len == -1) return std::nullopt;
    std::uint64_t off = load_offset(i);
    if (fits(off, len, bound)) return cache_entry{off, static_cast<std::uint64_t>(len)};
    if (len == 0) return cache_entry{off, 0};  // present, zero bytes: nothing is read
    return load_entry_slow(i, off, len, unmapped);
  }
  // The fast check: a non-empty item inside [index end, bound).
  bool fits(std::uint64_t off, std::int64_t len, std::uint64_t bound) const noexcept {
    auto n = static_cast<std::uint64_t>(len);
    return len > 0 && off >= index_end_ && off <= bound && n <= bound - off;
  }
  // mmap_read: checks and copies a mapped item into `out`.
  template <class Buffer>
  void copy_out(std::uint64_t i, const char* p, std::size_t n, Buffer& out) const {
    verify(i, n, p);
    out.resize(n);
    if (n) std::memcpy(out.data(), p, n);
  }
  // mmap_read get past the fast check: zero bytes, a refresh of the size, or an error.
  HOLDFAST_CACHE_COLD std::optional<value_type> get_slow(std::uint64_t i, std::uint64_t off,
                                                         std::int64_t len) const {
    auto e = load_entry_slow(i, off, len, nullptr);
    if (!e) return std::nullopt;
    std::string_view v(data_ptr(*e), to_size(e->size));
    verify(i, v.size(), v.data());
    return v;
  }
  // mmap_read get_into past the fast check: zero bytes, a refresh, or pread when unmapped.
  template <class Buffer>
  HOLDFAST_CACHE_COLD bool get_into_slow(std::uint64_t i, std::uint64_t off, std::int64_t len,
                                         Buffer& out) const {
    bool unmapped = false;
    auto e = load_entry_slow(i, off, len, &unmapped);
    if (!e) return false;
    if (unmapped)
      read_into(i, *e, out);
    else
      copy_out(i, data_ptr(*e), to_size(e->size), out);
    return true;
  }

  HOLDFAST_CACHE_COLD std::optional<cache_entry> load_entry_slow(std::uint64_t i, std::uint64_t off,
                                                                 std::int64_t len,
                                                                 bool* unmapped) const {
    if (len == 0) return cache_entry{off, 0};  // present, zero bytes: nothing is read
    if (len < -1 || off < index_end_) fail_entry(i, off, len, "");
    auto n = static_cast<std::uint64_t>(len);
    if (n > std::numeric_limits<std::uint64_t>::max() - off) fail_entry(i, off, len, "");
    const std::uint64_t end = off + n;
    state& s = *s_;
    std::lock_guard<std::mutex> g(s.grow_mutex);
    if (end <= bound_.load(std::memory_order_acquire)) return cache_entry{off, n};  // raced
    if (end > s.known_size) {  // the writer may just have grown the file: look once
      auto now = static_cast<std::uint64_t>(stat_fd(s.fd).st_size);
      if (now > s.known_size) s.known_size = now;
    }
    if (end > s.known_size) {
      // pfio writes the entry before the data: an item starting exactly at the end of the file
      // is a put in flight (or a writer killed in between). It has no bytes yet: not visible.
      if (off == s.known_size) return std::nullopt;
      fail_entry(i, off, len, " (" + str(s.known_size) + " bytes)");
    }
    if (!s.writable) return std::nullopt;  // preload: appended after the open, not yet visible
    if constexpr (Read::maps_data) {
      if (!map_through(s.known_size)) {
        if (unmapped) {
          *unmapped = true;
          return cache_entry{off, n};
        }
        throw error(ENOMEM, "mmap", s.path,
                    "slot " + str(i) + ": item [" + str(off) + ", +" + str(n) + ") lies past the " +
                        str(s.map_size) +
                        " bytes this process could map; get_into reads it with pread");
      }
      raise_bound(std::min<std::uint64_t>(s.known_size, s.map_size));
    } else {
      raise_bound(s.known_size);
    }
    return cache_entry{off, n};
  }

  // mmap_read, under grow_mutex: makes the newest mapping cover [0, need). A new, larger
  // mapping replaces it (twice the old size when the kernel allows, halved down to `need`
  // while it says ENOMEM); the old one stays until the object dies, as views may point there.
  // False when every size down to `need` was refused with ENOMEM.
  bool map_through(std::uint64_t need) const {
    state& s = *s_;
    if (need <= s.map_size) return true;
    if (need > max_map) return false;
    const auto ps = page_size();
    std::uint64_t floor = (need + ps - 1) / ps * ps;
    std::uint64_t want =
        std::min<std::uint64_t>(std::max<std::uint64_t>(floor, 2 * s.map_size), max_map);
    int prot = s.writable ? PROT_READ | PROT_WRITE : PROT_READ;
    s.retired.reserve(s.retired.size() + 1);  // so that keeping the old mapping cannot throw
    for (;;) {
      void* p = Io::mmap(nullptr, to_size(want), prot, MAP_SHARED, s.fd.get(), 0);
      if (p != MAP_FAILED) {
        s.retired.emplace_back(s.map, s.map_size);
        s.map = static_cast<char*>(p);
        s.map_size = to_size(want);
        map_.store(s.map, std::memory_order_release);
        return true;
      }
      if (errno != ENOMEM) throw error(errno, "mmap", s.path, "mapping the grown file");
      if (want == floor) break;
      want = std::max(floor, want / 2 / ps * ps);
    }
    return false;
  }

  [[noreturn]] HOLDFAST_CACHE_COLD void fail_entry(std::uint64_t i, std::uint64_t off,
                                                   std::int64_t len,
                                                   const std::string& size_note) const {
    const state& s = *s_;
    if (len < -1)
      throw corrupt_cache(s.path, i,
                          "length " + std::to_string(len) +
                              " (the only negative length is -1, "
                              "empty)");
    if (off < index_end_) {
      std::string why = "entry offset " + str(off) + " is inside the index (data starts at " +
                        str(index_end_) + ")";
      if (!Format::stores_length)
        why += ": a bad entry, or the length " + str(length_) + " is too large";
      throw corrupt_cache(s.path, i, why);
    }
    throw corrupt_cache(s.path, i,
                        "entry [" + str(off) + ", +" + std::to_string(len) +
                            ") points past the end of the file" + size_note);
  }

  void verify(std::uint64_t i, std::size_t n, const char* data) const {
    if constexpr (Format::checksummed) {
      if (Format::item_crc(i, data, n) != load_crc(i)) fail_checksum(i);
    } else {
      (void)i, (void)n, (void)data;
    }
  }
  [[noreturn]] HOLDFAST_CACHE_COLD void fail_checksum(std::uint64_t i) const {
    throw corrupt_cache(s_->path, i, "checksum mismatch");
  }

  // pread_read: exactly one pread of the item (more only if the kernel returns a short read).
  // The entry was checked against the file size first, so the buffer is never larger than it.
  template <class Buffer>
  void read_into(std::uint64_t i, const cache_entry& e, Buffer& out) const {
    out.resize(to_size(e.size));
    read_raw(i, e, reinterpret_cast<char*>(out.data()));
  }
  void read_raw(std::uint64_t i, const cache_entry& e, char* out) const {
    if (e.size) {
      auto got = pread_full(s_->fd, out, to_size(e.size), to_off(e.offset));
      if (got != e.size)
        throw corrupt_cache(s_->path, i, "entry points past the end of the file (it shrank)");
    }
    verify(i, to_size(e.size), out);
  }

  bool link_to(const std::string& target) {
    if (Io::link(s_->path.c_str(), target.c_str()) == 0) return true;
    if (errno == EEXIST) return false;
    throw error(errno, "link", target, "preserve " + s_->path);
  }

  void create_file(const std::string& dir) {
    state& s = *s_;
    s.index_end = Format::header_size + s.length * Format::entry_size;
    auto base = dir + "/holdfast-cache-" + std::to_string(Io::getpid()) + "-";
    auto seed =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(this));
    for (int attempt = 0;; ++attempt) {
      seed = seed * 6364136223846793005u + 1442695040888963407u;
      auto name = base + std::to_string(seed >> 24);
      int fd = Io::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0) {
        s.fd = basic_fd<Io>(fd, name);
        break;
      }
      if ((errno != EEXIST && errno != EINTR) || attempt > 100)
        throw error(errno, "open", name, "create cache file");
    }
    s.path = s.fd.path();
    s.owner = true;
    s.creator_pid = Io::getpid();
    write_empty_index();
    s.known_size = s.index_end;
  }

  // The header, then every entry written explicitly as empty: (0, -1) (an all-zero entry would
  // mean "present, zero bytes").
  void write_empty_index() {
    state& s = *s_;
    std::string head = Format::encode_header(s.length);
    if (!head.empty()) pwrite_all(s.fd, head.data(), head.size(), 0);
    std::string chunk(4096 * Format::entry_size, '\0');
    for (std::size_t k = 0; k < 4096; ++k)
      detail::put_le64(&chunk[k * Format::entry_size + 8], ~std::uint64_t{0});
    std::uint64_t done = 0;
    while (done < s.length) {
      std::uint64_t n = std::min<std::uint64_t>(4096, s.length - done);
      pwrite_all(s.fd, chunk.data(), to_size(n) * Format::entry_size,
                 to_off(Format::header_size + done * Format::entry_size));
      done += n;
    }
  }

  // Reads the header (checked_format) and checks the file is at least as long as its index.
  void read_layout(std::uint64_t length) {
    state& s = *s_;
    s.known_size = static_cast<std::uint64_t>(stat_fd(s.fd).st_size);
    if constexpr (Format::stores_length) {
      if (s.known_size < Format::header_size)
        throw corrupt_cache(s.path, 0,
                            "file is " + str(s.known_size) + " bytes, shorter than its header");
      char head[Format::header_size];
      if (pread_full(s.fd, head, sizeof head, 0) != sizeof head)
        throw corrupt_cache(s.path, 0, "header cut short");
      std::uint64_t stored = Format::decode_header(head, s.path);
      if (length != 0 && stored != length)
        throw corrupt_cache(s.path, 0,
                            "header says " + str(stored) + " slots, expected " + str(length));
      length = stored;
    } else if (length == 0) {
      throw error(EINVAL, "cache open", s.path, "pfio_format stores no length: pass it");
    }
    if (length >
        (std::numeric_limits<std::uint64_t>::max() - Format::header_size) / Format::entry_size / 2)
      throw corrupt_cache(s.path, 0, "length " + str(length) + " is impossible");
    s.length = length;
    s.index_end = Format::header_size + length * Format::entry_size;
    if (s.known_size < s.index_end) {
      auto slot = s.known_size < Format::header_size
                      ? 0
                      : (s.known_size - Format::header_size) / Format::entry_size;
      std::string why =
          "file is " + str(s.known_size) + " bytes, shorter than its index of " + str(s.index_end);
      if (!Format::stores_length) why += ": is the length " + str(length) + " right?";
      throw corrupt_cache(s.path, slot, why);
    }
  }

  // mmap_read: the whole file, up to the reservation (halved while the kernel refuses it);
  // pread_read: the index only. Writers map read-write (entries are stored through the map).
  void map_file(std::uint64_t reserve, std::uint64_t limit) {
    state& s = *s_;
    std::uint64_t want = s.index_end;
    if constexpr (Read::maps_data) {
      want = !s.writable ? s.known_size : reserve ? reserve : limit ? limit : default_reserve;
      want = std::min<std::uint64_t>(std::max(want, s.known_size), max_map);
    }
    if (want > 0) {
      int prot = s.writable ? PROT_READ | PROT_WRITE : PROT_READ;
      for (;;) {
        void* p = Io::mmap(nullptr, to_size(want), prot, MAP_SHARED, s.fd.get(), 0);
        if (p != MAP_FAILED) {
          s.map = static_cast<char*>(p);
          s.map_size = to_size(want);
          break;
        }
        if (errno != ENOMEM || !Read::maps_data || want / 2 < s.known_size || want / 2 == 0)
          throw error(errno, "mmap", s.path);
        want /= 2;
      }
    }
    s.reserved = s.map_size;
    // No item may end past the file size known now (refreshed on a miss) nor, with mmap_read,
    // past the mapping.
    cache_hot_fields(Read::maps_data ? std::min<std::uint64_t>(s.known_size, s.map_size)
                                     : s.known_size);
  }

  // checked_format: the recorded end of data lies between the index and the end of the file
  // (loaded before the fstat, so a concurrent put cannot make a good file look bad).
  void check_data_end() const {
    if constexpr (std::is_same_v<Format, checked_format>) {
      auto end = data_end();
      auto size = static_cast<std::uint64_t>(stat_fd(s_->fd).st_size);
      if (end < index_end_ || end > size)
        throw corrupt_cache(s_->path, 0,
                            "recorded end of data " + str(end) + " outside [" + str(index_end_) +
                                ", " + str(size) + "]");
    }
  }

  // An item found at open: [offset, end) of slot.
  struct span {
    std::uint64_t offset, end, slot;
  };

  // Attach and preload: every entry good (inside the file, and for preload every checksum
  // right), no two pfio_format items overlapping, the pfio_format length plausible. With
  // bad_slot_policy::treat_as_empty (preload), the bad slots are hidden instead of refused.
  void validate_all(bad_slot_policy policy) {
    state& s = *s_;
    const bool drop = policy == bad_slot_policy::treat_as_empty && !s.writable;
    std::vector<std::uint64_t> bad;
    std::vector<span> items;
    for (std::uint64_t i = 0; i < s.length; ++i) {
      try {
        bool unmapped = false;
        auto e = load_entry(i, &unmapped);
        if (!e) continue;
        if constexpr (Format::checksummed) {
          if (!s.writable) {  // attach: checked by every get instead (reading every item costs)
            if (Read::maps_data && !unmapped) {
              verify(i, to_size(e->size), data_ptr(*e));
            } else {
              std::string tmp;
              read_into(i, *e, tmp);
            }
          }
        } else if (e->size) {
          items.push_back(span{e->offset, e->offset + e->size, i});
        }
      } catch (const corrupt_cache&) {
        if (!drop) throw;
        bad.push_back(i);
      }
    }
    if constexpr (!Format::checksummed) {
      check_overlaps(items, drop ? &bad : nullptr);
      check_length(items);
    }
    if (!bad.empty()) hide(bad);
  }

  // pfio_format: no two items share a byte. An entry pointing into another slot's item is what
  // a pfio writer killed between its entry and its data leaves once the next put fills the gap.
  void check_overlaps(std::vector<span>& items, std::vector<std::uint64_t>* bad) const {
    std::sort(items.begin(), items.end(), [](const span& a, const span& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.slot < b.slot;
    });
    std::size_t owner = 0;  // the item reaching furthest so far
    for (std::size_t k = 1; k < items.size(); ++k) {
      const span& a = items[owner];
      const span& b = items[k];
      if (b.offset < a.end) {
        if (!bad)
          throw corrupt_cache(s_->path, b.slot,
                              "item [" + str(b.offset) + ", " + str(b.end) +
                                  ") overlaps the item of slot " + str(a.slot) + " [" +
                                  str(a.offset) + ", " + str(a.end) +
                                  "): one entry points into the other's bytes");
        bad->push_back(a.slot);
        bad->push_back(b.slot);
      }
      if (b.end > a.end) owner = k;
    }
  }

  // pfio_format: data starts at 16 * length. The length is too small when the 16 bytes right
  // after the reader's index read as one more index entry (empty, or pointing further on inside
  // the file) and no item starts there.
  void check_length(const std::vector<span>& items) const {
    const state& s = *s_;
    const std::uint64_t at = s.index_end;
    if (s.known_size < at + 16) return;
    for (const auto& it : items)
      if (it.offset == at) return;
    char e[16];
    if (pread_full(s.fd, e, 16, to_off(at)) != 16) return;
    auto off = detail::get_le64(e);
    auto len = static_cast<std::int64_t>(detail::get_le64(e + 8));
    bool empty = off == 0 && len == -1;
    bool entry = len > 0 && off >= at + 16 && off <= s.known_size &&
                 static_cast<std::uint64_t>(len) <= s.known_size - off;
    if (!empty && !entry) return;
    throw corrupt_cache(s.path, s.length,
                        "the length " + str(s.length) + " is too small: the 16 bytes at offset " +
                            str(at) +
                            ", where its data would start, read as another index entry (" +
                            str(off) + ", " + std::to_string(len) + ") and no item starts there");
  }

  // Preload with bad_slot_policy::treat_as_empty: a private copy-on-write mapping in which the
  // bad slots' entries read as empty (0, -1), so every get, contains and filled agree at no cost
  // per get. The file is not changed.
  void hide(std::vector<std::uint64_t>& bad) {
    state& s = *s_;
    std::sort(bad.begin(), bad.end());
    bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
    void* p = Io::mmap(nullptr, s.map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, s.fd.get(), 0);
    if (p == MAP_FAILED) throw error(errno, "mmap", s.path, "hiding bad slots");
    Io::munmap(s.map, s.map_size);  // nothing points into it yet
    s.map = static_cast<char*>(p);
    map_.store(s.map, std::memory_order_relaxed);
    for (auto i : bad) {
      char* e = entry_ptr(i);
      detail::put_le64(e, 0);
      detail::put_le64(e + 8, ~std::uint64_t{0});
    }
    s.dropped = bad.size();
  }

  std::unique_ptr<state> s_;
  // Hot fields, copied from the state: the newest mapping and the bound every get checks
  // (both only grow; a get that refreshes them runs under state::grow_mutex).
  mutable std::atomic<char*> map_{nullptr};
  mutable std::atomic<std::uint64_t> bound_{0};
  std::uint64_t length_ = 0;
  std::uint64_t index_end_ = 0;
};

/// Several processes (fork or attach): lock-free zero-copy gets, flock-serialized puts.
using multiprocess_file_cache = basic_file_cache<mmap_read, flock_lock>;
/// One process, any number of threads: zero-copy gets, mutex-serialized puts.
using file_cache = basic_file_cache<mmap_read, mutex_lock>;
/// Preloaded (preserved) files: read-only, no lock at all.
using readonly_file_cache = basic_file_cache<mmap_read, no_lock>;

HOLDFAST_NAMESPACE_END
