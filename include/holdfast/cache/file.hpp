// holdfast/cache/file.hpp — the cache file one basic_file_cache object holds (internal): its
// descriptors, mappings and sizes, and what is done to it at open: creating it with an empty
// index, reading and checking its layout, mapping it, growing the mapping, and the open-time
// checks of a pfio_format file (overlapping items, a wrong length) and the hiding of bad slots.
//
// Guarantees:
//   - A created file gets a fresh name (O_EXCL, retried on a collision), its header, and every
//     entry written explicitly as empty (0, -1); the object that created it, in the creating
//     process only, removes it when it dies (never a forked child's copy), and so does the end
//     of that process however it ends without the object's destructor (detail/temp_files.hpp:
//     exit(), holdfast's exit policies and hang restart).
//   - read_layout refuses, with corrupt_cache naming the file and the slot, a file shorter than
//     its header or index, a bad header, a stored length other than the one passed, and a length
//     whose index could not fit in 64 bits; a pfio_format file opened without a length is a
//     holdfast::error (EINVAL).
//   - The mappings all start at offset 0, so any of them holds the index; a mapping replaced by a
//     larger one stays mapped until the object dies (views handed out may point there).
//   - hide never changes the file: the bad slots read as empty through a private copy-on-write
//     mapping.
// Caveats:
//   - Everything here runs at open, or (map_through) under grow_mutex; nothing here is
//     thread-safe by itself.
#pragma once

#include <fcntl.h>     // O_RDWR, O_CREAT, O_EXCL, O_CLOEXEC
#include <sys/mman.h>  // PROT_*, MAP_SHARED, MAP_PRIVATE, MAP_FAILED
#include <unistd.h>    // sysconf(_SC_PAGESIZE)

#include <algorithm>  // sort: the overlap check; min, max: mapping sizes
#include <atomic>
#include <cerrno>
#include <chrono>  // steady_clock: the temp name's seed
#include <cstdint>
#include <cstdlib>  // getenv: $TMPDIR for the default directory
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../detail/temp_files.hpp"  // temp_file_add: the created file goes with its process
#include "../error.hpp"
#include "../io.hpp"
#include "format.hpp"  // detail::get_le64, put_le64: entries

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// An item found at open: [offset, end) of slot.
struct cache_span {
  std::uint64_t offset, end, slot;
};

/// The state one basic_file_cache object owns (behind a unique_ptr, so that the object moves
/// cheaply and its hot fields may point into it), and the open-time work done on it.
template <class Read, class Lock, class Format, class Io>
struct cache_file {
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

  cache_file() = default;
  cache_file(const cache_file&) = delete;
  cache_file& operator=(const cache_file&) = delete;
  ~cache_file() {
    if (map) Io::munmap(map, map_size);
    for (auto& m : retired) Io::munmap(m.first, m.second);
    fd.reset();
    if (owner && Io::getpid() == creator_pid) {
      Io::unlink(path.c_str());
      temp_file_forget(path);
    }
  }

  static constexpr std::uint64_t default_reserve = std::uint64_t{64} << 30;
  static constexpr std::uint64_t max_map = std::numeric_limits<std::size_t>::max() / 2;

  static std::string default_dir() {
    const char* t = std::getenv("TMPDIR");
    return t && *t ? std::string(t) : std::string("/tmp");
  }
  static off_t to_off(std::uint64_t v) noexcept { return static_cast<off_t>(v); }
  static std::size_t to_size(std::uint64_t v) noexcept { return static_cast<std::size_t>(v); }
  static std::string str(std::uint64_t v) { return std::to_string(v); }
  static std::uint64_t page_size() noexcept {
    long ps = ::sysconf(_SC_PAGESIZE);
    return ps > 0 ? static_cast<std::uint64_t>(ps) : 4096;
  }

  /// Creates a temp file of `length` empty slots in `dir` (length set by the caller).
  void create(const std::string& dir) {
    index_end = Format::header_size + length * Format::entry_size;
    auto base = dir + "/holdfast-cache-" + std::to_string(Io::getpid()) + "-";
    auto seed =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(this));
    for (int attempt = 0;; ++attempt) {
      seed = seed * 6364136223846793005u + 1442695040888963407u;
      auto name = base + std::to_string(seed >> 24);
      int got = Io::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (got >= 0) {
        fd = basic_fd<Io>(got, name);
        break;
      }
      if ((errno != EEXIST && errno != EINTR) || attempt > 100)
        throw error(errno, "open", name, "create cache file");
    }
    path = fd.path();
    owner = true;
    creator_pid = Io::getpid();
    temp_file_add(path);  // removed however this process ends (temp_files.hpp)
    write_empty_index();
    known_size = index_end;
  }

  // The header, then every entry written explicitly as empty: (0, -1) (an all-zero entry would
  // mean "present, zero bytes").
  void write_empty_index() {
    std::string head = Format::encode_header(length);
    if (!head.empty()) pwrite_all(fd, head.data(), head.size(), 0);
    std::string chunk(4096 * Format::entry_size, '\0');
    for (std::size_t k = 0; k < 4096; ++k)
      put_le64(&chunk[k * Format::entry_size + 8], ~std::uint64_t{0});
    std::uint64_t done = 0;
    while (done < length) {
      std::uint64_t n = std::min<std::uint64_t>(4096, length - done);
      pwrite_all(fd, chunk.data(), to_size(n) * Format::entry_size,
                 to_off(Format::header_size + done * Format::entry_size));
      done += n;
    }
  }

  // Reads the header (a format that stores its length) and checks the file is at least as long
  // as its index. `expected` is the length the caller passed (0: read it from the header).
  void read_layout(std::uint64_t expected) {
    known_size = static_cast<std::uint64_t>(stat_fd(fd).st_size);
    if constexpr (Format::stores_length) {
      if (known_size < Format::header_size)
        throw corrupt_cache(path, 0,
                            "file is " + str(known_size) + " bytes, shorter than its header");
      char head[Format::header_size];
      if (pread_full(fd, head, sizeof head, 0) != sizeof head)
        throw corrupt_cache(path, 0, "header cut short");
      std::uint64_t stored = Format::decode_header(head, path);
      if (expected != 0 && stored != expected)
        throw corrupt_cache(path, 0,
                            "header says " + str(stored) + " slots, expected " + str(expected));
      expected = stored;
    } else if (expected == 0) {
      throw error(EINVAL, "cache open", path, "pfio_format stores no length: pass it");
    }
    if (expected >
        (std::numeric_limits<std::uint64_t>::max() - Format::header_size) / Format::entry_size / 2)
      throw corrupt_cache(path, 0, "length " + str(expected) + " is impossible");
    length = expected;
    index_end = Format::header_size + length * Format::entry_size;
    if (known_size < index_end) {
      auto slot = known_size < Format::header_size
                      ? 0
                      : (known_size - Format::header_size) / Format::entry_size;
      std::string why =
          "file is " + str(known_size) + " bytes, shorter than its index of " + str(index_end);
      if (!Format::stores_length) why += ": is the length " + str(length) + " right?";
      throw corrupt_cache(path, slot, why);
    }
  }

  // mmap_read: the whole file, up to the reservation (halved while the kernel refuses it);
  // pread_read: the index only. Writers map read-write (entries are stored through the map).
  // Returns the bound no item may end past: the file size known now (refreshed on a miss) and,
  // with mmap_read, the mapping.
  std::uint64_t map_at_open(std::uint64_t reserve, std::uint64_t size_limit) {
    std::uint64_t want = index_end;
    if constexpr (Read::maps_data) {
      want = !writable ? known_size : reserve ? reserve : size_limit ? size_limit : default_reserve;
      want = std::min<std::uint64_t>(std::max(want, known_size), max_map);
    }
    if (want > 0) {
      int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
      for (;;) {
        void* p = Io::mmap(nullptr, to_size(want), prot, MAP_SHARED, fd.get(), 0);
        if (p != MAP_FAILED) {
          map = static_cast<char*>(p);
          map_size = to_size(want);
          break;
        }
        if (errno != ENOMEM || !Read::maps_data || want / 2 < known_size || want / 2 == 0)
          throw error(errno, "mmap", path);
        want /= 2;
      }
    }
    reserved = map_size;
    return Read::maps_data ? std::min<std::uint64_t>(known_size, map_size) : known_size;
  }

  // mmap_read, under grow_mutex: makes the newest mapping cover [0, need) and publishes it in
  // `newest` (release). A new, larger mapping replaces it (twice the old size when the kernel
  // allows, halved down to `need` while it says ENOMEM); the old one stays until the object
  // dies, as views may point there. False when every size down to `need` was refused (ENOMEM).
  bool map_through(std::uint64_t need, std::atomic<char*>& newest) {
    if (need <= map_size) return true;
    if (need > max_map) return false;
    const auto ps = page_size();
    std::uint64_t floor = (need + ps - 1) / ps * ps;
    std::uint64_t want =
        std::min<std::uint64_t>(std::max<std::uint64_t>(floor, 2 * map_size), max_map);
    int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    retired.reserve(retired.size() + 1);  // so that keeping the old mapping cannot throw
    for (;;) {
      void* p = Io::mmap(nullptr, to_size(want), prot, MAP_SHARED, fd.get(), 0);
      if (p != MAP_FAILED) {
        retired.emplace_back(map, map_size);
        map = static_cast<char*>(p);
        map_size = to_size(want);
        newest.store(map, std::memory_order_release);
        return true;
      }
      if (errno != ENOMEM) throw error(errno, "mmap", path, "mapping the grown file");
      if (want == floor) break;
      want = std::max(floor, want / 2 / ps * ps);
    }
    return false;
  }

  // pfio_format: no two items share a byte. An entry pointing into another slot's item is what
  // a pfio writer killed between its entry and its data leaves once the next put fills the gap.
  void check_overlaps(std::vector<cache_span>& items, std::vector<std::uint64_t>* bad) const {
    std::sort(items.begin(), items.end(), [](const cache_span& a, const cache_span& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.slot < b.slot;
    });
    std::size_t first = 0;  // the item reaching furthest so far
    for (std::size_t k = 1; k < items.size(); ++k) {
      const cache_span& a = items[first];
      const cache_span& b = items[k];
      if (b.offset < a.end) {
        if (!bad)
          throw corrupt_cache(path, b.slot,
                              "item [" + str(b.offset) + ", " + str(b.end) +
                                  ") overlaps the item of slot " + str(a.slot) + " [" +
                                  str(a.offset) + ", " + str(a.end) +
                                  "): one entry points into the other's bytes");
        bad->push_back(a.slot);
        bad->push_back(b.slot);
      }
      if (b.end > a.end) first = k;
    }
  }

  // pfio_format: data starts at 16 * length. The length is too small when the 16 bytes right
  // after the reader's index read as one more index entry (empty, or pointing further on inside
  // the file) and no item starts there.
  void check_length(const std::vector<cache_span>& items) const {
    const std::uint64_t at = index_end;
    if (known_size < at + 16) return;
    for (const auto& it : items)
      if (it.offset == at) return;
    char e[16];
    if (pread_full(fd, e, 16, to_off(at)) != 16) return;
    auto off = get_le64(e);
    auto len = static_cast<std::int64_t>(get_le64(e + 8));
    bool empty = off == 0 && len == -1;
    bool entry = len > 0 && off >= at + 16 && off <= known_size &&
                 static_cast<std::uint64_t>(len) <= known_size - off;
    if (!empty && !entry) return;
    throw corrupt_cache(path, length,
                        "the length " + str(length) + " is too small: the 16 bytes at offset " +
                            str(at) +
                            ", where its data would start, read as another index entry (" +
                            str(off) + ", " + std::to_string(len) + ") and no item starts there");
  }

  // Preload with bad_slot_policy::treat_as_empty: a private copy-on-write mapping in which the
  // bad slots' entries read as empty (0, -1), so every get, contains and filled agree at no cost
  // per get. The file is not changed. The caller publishes the new `map`.
  void hide(const std::vector<std::uint64_t>& bad) {  // sorted, each slot once
    void* p = Io::mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) throw error(errno, "mmap", path, "hiding bad slots");
    Io::munmap(map, map_size);  // nothing points into it yet
    map = static_cast<char*>(p);
    for (auto i : bad) {
      char* e = map + Format::header_size + to_size(i) * Format::entry_size;
      put_le64(e, 0);
      put_le64(e + 8, ~std::uint64_t{0});
    }
    dropped = bad.size();
  }
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
