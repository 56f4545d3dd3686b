// holdfast/cache/file_cache.hpp — basic_file_cache, the index-addressed cache file shared by
// processes, and its aliases multiprocess_file_cache, file_cache, readonly_file_cache.
//
// A cache has `length` slots. Slot i is written at most once (`put`) and read any number of times
// (`get`) by any process that has the cache: the one that created it, its forked children (e.g.
// data-loader workers) and unrelated processes that `attach` by path. The file holds an index of
// fixed-size entries (offset, length) followed by the items, appended back to back.
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
//     index reading as one more index entry while no item starts there (too small). A format
//     that records the end of data (checked_format) must record one inside [index end, file
//     size] and not behind any good item (a put sets the end before its entry, so only damage
//     puts it there, and the next put would overwrite that item). corrupt_cache names the
//     file and the slot; nothing is written.
//   - Preload with cache_options::on_bad_slot = bad_slot_policy::treat_as_empty hides the bad
//     slots instead (they read as empty; dropped_slots() counts them); the file is not changed.
//   - Not yet visible, not corrupt: an entry whose item starts exactly at the end of the file (a
//     pfio writer writes the entry before the data: a put in flight, or a writer killed between
//     the two) reads as empty. A preloaded cache shows the items inside the file as it was at
//     open: items a writer appends later (one fstat shows the file grew) read as empty.
//   - The temp file is removed by the destructor of the object that created it, in the creating
//     process only (never by a forked child's copy), and when that process ends without running
//     it: exit() or a return from main, holdfast's Exit policies (exit_with, wait_then_exit) and
//     hang_restart's _exit, or remove_temp_files() in an exit of your own (detail/temp_files.hpp).
//     Only SIGKILL or a crash leaves it: cache_options::dir can put it in a directory the job
//     removes.
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
//   - freeze() and the size limit act on one object. preserve() on a checked_format cache (any
//     format declaring `sealable`) also seals the file for every process; on a pfio_format cache
//     other processes that keep putting grow the preserved file (as in pfio).
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
//     record it); checked_format (any format declaring `records_data_end`) keeps the end of
//     data in its header.
//   - A moved-from cache may only be destroyed or assigned to.
#pragma once

#include <fcntl.h>     // O_RDWR, O_RDONLY
#include <sys/mman.h>  // MAP_FAILED
#include <unistd.h>    // lseek's SEEK_END

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>  // memcpy: get_into
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/path.hpp"  // parent_directory: the cache file's directory
#include "../error.hpp"
#include "../io.hpp"
#include "file.hpp"      // detail::cache_file: the state and the open-time work
#include "format.hpp"    // pfio_format (the default), detail::le64, le32
#include "options.hpp"   // tags, cache_options, cache_bytes, cache_entry
#include "policies.hpp"  // mmap_read, flock_lock, sync_never (the defaults)
#include "traits.hpp"    // check_cache_policies, the format's declared features

#if defined(__GNUC__) || defined(__clang__)
#define HOLDFAST_CACHE_COLD __attribute__((noinline, cold))
#else
#define HOLDFAST_CACHE_COLD
#endif

HOLDFAST_NAMESPACE_BEGIN

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
    s_->create(options.dir.empty() ? state::default_dir() : options.dir);
    map_file(options.reserve, options.size_limit);
  }

  /// Opens the live cache at `path` to put and get. `length` may be 0 for a format that stores
  /// it (checked_format: it is read from the header) and must be given for pfio_format.
  basic_file_cache(attach_cache_t, const std::string& path, std::uint64_t length = 0,
                   const cache_options& options = {})
      : s_(std::make_unique<state>()) {
    s_->limit = options.size_limit;
    s_->writable = true;
    s_->fd = open_file<Io>(path, O_RDWR);
    s_->path = path;
    s_->read_layout(length);
    map_file(options.reserve, options.size_limit);
    check_data_end(validate_all(bad_slot_policy::refuse));
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
    s_->read_layout(length);
    map_file(s_->known_size, 0);
    check_data_end(validate_all(options.on_bad_slot));
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
  /// fsyncs file and directory, and freezes this object (with a sealable format, as checked_format,
  /// every process). False when `name` already exists; throws holdfast::error on other failures.
  bool preserve(const std::string& name) {
    state& s = *s_;
    std::string target =
        name.find('/') == std::string::npos ? detail::parent_directory(s.path) + "/" + name : name;
    if (s.writable) {
      lock_guard guard(s);
      if (!link_to(target)) return false;
      seal();
    } else if (!link_to(target)) {
      return false;
    }
    s.frozen = true;
    sync_file(s.fd);
    sync_directory<Io>(detail::parent_directory(target));
    return true;
  }

 private:
  using state = detail::cache_file<Read, Lock, Format, Io>;

  struct lock_guard {
    explicit lock_guard(state& st) : s(st) { s.lock.template lock<Io>(s.lock_fd, s.path); }
    ~lock_guard() { s.lock.template unlock<Io>(s.lock_fd); }
    lock_guard(const lock_guard&) = delete;
    lock_guard& operator=(const lock_guard&) = delete;
    state& s;
  };

  static bool is_disk_full(int e) noexcept { return e == ENOSPC || e == EDQUOT; }
  static off_t to_off(std::uint64_t v) noexcept { return static_cast<off_t>(v); }
  static std::size_t to_size(std::uint64_t v) noexcept { return static_cast<std::size_t>(v); }
  static std::string str(std::uint64_t v) { return std::to_string(v); }

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
  // A sealable format's seal bit, in the header's state word (cache_format_sealable_v).
  bool sealed() const noexcept {
    if constexpr (cache_format_sealable_v<Format>) {
      auto p = reinterpret_cast<std::uint32_t*>(map() + Format::state_offset);
      return (detail::le32(__atomic_load_n(p, __ATOMIC_ACQUIRE)) & Format::sealed) != 0;
    }
    return false;
  }
  void seal() noexcept {
    if constexpr (cache_format_sealable_v<Format>) {
      auto p = reinterpret_cast<std::uint32_t*>(map() + Format::state_offset);
      __atomic_fetch_or(p, detail::le32(Format::sealed), __ATOMIC_RELEASE);
    }
  }
  // put: whether slot i is taken (filled, or a pfio entry in flight); a bad length throws.
  bool taken(std::uint64_t i) const {
    auto len = load_length(i);
    if (len < -1) fail_entry(i, load_offset(i), len, "");
    return len != -1;
  }

  // Where the next item goes: the end of data the header records (a format that declares
  // records_data_end, as checked_format), else the file size.
  std::uint64_t data_end() const {
    if constexpr (cache_format_records_data_end_v<Format>) {
      auto p = reinterpret_cast<std::uint64_t*>(map() + Format::end_offset);
      return detail::le64(__atomic_load_n(p, __ATOMIC_ACQUIRE));
    }
    // lseek, not fstat: half the cost. Nothing uses the file position (all I/O is positional).
    off_t end = Io::lseek(s_->fd.get(), 0, SEEK_END);
    if (end < 0) throw error(errno, "lseek", s_->path);
    return static_cast<std::uint64_t>(end);
  }
  void set_data_end(std::uint64_t end) noexcept {
    if constexpr (cache_format_records_data_end_v<Format>) {
      auto p = reinterpret_cast<std::uint64_t*>(map() + Format::end_offset);
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
      if (!s.map_through(s.known_size, map_)) {
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

  // Maps the file at open (see cache_file::map_at_open) and caches the hot fields.
  void map_file(std::uint64_t reserve, std::uint64_t limit) {
    cache_hot_fields(s_->map_at_open(reserve, limit));
  }

  // A format that records the end of data (checked_format): it lies between the index and the
  // end of the file (loaded before the fstat, so a concurrent put cannot make a good file look
  // bad).
  void check_data_end(const detail::cache_span& furthest) const {
    if constexpr (cache_format_records_data_end_v<Format>) {
      auto end = data_end();
      auto size = static_cast<std::uint64_t>(stat_fd(s_->fd).st_size);
      if (end < index_end_ || end > size)
        throw corrupt_cache(s_->path, 0,
                            "recorded end of data " + str(end) + " outside [" + str(index_end_) +
                                ", " + str(size) + "]");
      // A put sets the end before it writes its entry, so every entry seen earlier ends at or
      // before the end loaded now: one ending past it means the word was damaged, and the next
      // put would write over that item.
      if (end < furthest.end)
        throw corrupt_cache(s_->path, furthest.slot,
                            "recorded end of data " + str(end) + " is behind the item [" +
                                str(furthest.offset) + ", " + str(furthest.end) +
                                "): the next put would overwrite it");
    }
  }

  // Attach and preload: every entry good (inside the file, and for preload every checksum
  // right), no two pfio_format items overlapping, the pfio_format length plausible. With
  // bad_slot_policy::treat_as_empty (preload), the bad slots are hidden instead of refused.
  // Returns the good item that ends furthest (empty when there is none).
  detail::cache_span validate_all(bad_slot_policy policy) {
    state& s = *s_;
    const bool drop = policy == bad_slot_policy::treat_as_empty && !s.writable;
    std::vector<std::uint64_t> bad;
    std::vector<detail::cache_span> items;
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
        }
        if (e->size) items.push_back(detail::cache_span{e->offset, e->offset + e->size, i});
      } catch (const corrupt_cache&) {
        if (!drop) throw;
        bad.push_back(i);
      }
    }
    if constexpr (!Format::checksummed) {
      s.check_overlaps(items, drop ? &bad : nullptr);
      s.check_length(items);
    }
    std::sort(bad.begin(), bad.end());  // check_overlaps may name a slot twice
    bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
    detail::cache_span furthest{};  // the good item ending furthest, for check_data_end
    for (const auto& it : items)
      if (it.end > furthest.end && !std::binary_search(bad.begin(), bad.end(), it.slot))
        furthest = it;
    if (!bad.empty()) {
      s.hide(bad);
      map_.store(s.map, std::memory_order_relaxed);
    }
    return furthest;
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
