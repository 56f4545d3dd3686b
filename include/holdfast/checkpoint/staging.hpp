// holdfast/checkpoint/staging.hpp — staged saves: a writer hands the state to holdfast as byte
// ranges, which are copied into a staging area allocated once and reused; a background thread
// then writes the staged bytes into the checkpoint's files (checkpoint_manager, manager/saving.hpp,
// commits them with the save protocol). The caller is blocked for one memory copy.
//
//   mgr.set_writer([&](holdfast::checkpoint_stage& stage, std::int64_t step) {
//     stage.write("weights.bin", weights.data(), weights.size() * sizeof(float));
//     stage.write("state.json", json.data(), json.size());
//   });
//   mgr.save(step);  // returns once the bytes are copied; wait_until_finished() for the commit
//
// Guarantees:
//   - checkpoint_stage::write copies the bytes before it returns: what the caller changes after
//     write() (or after save() returned) is not in the checkpoint. append() gives staged space
//     for the writer to fill (a device copy's target) before the writer returns.
//   - Each file is the concatenation of the ranges written to its name, in order. Names are one
//     path component (no '/', not "." or "..", not the metadata file's name, no NUL, valid
//     UTF-8); a bad name throws holdfast::error (EINVAL) naming it, and the save leaves no trace.
//   - The staging area (basic_staging_area) is anonymous memory (mmap, MAP_PRIVATE), aligned to
//     2 MiB and advised MADV_HUGEPAGE (the kernel may give huge pages), reserved and faulted in
//     before it is used (MADV_POPULATE_WRITE, or a write per page on kernels without it), so a
//     save's copy takes no page faults. It is reused by every save: after a save that needed more
//     (or less than half of it) it is replaced, once that save's files are written (on the
//     background thread), by one region of that save's size, so it holds at most about 1x the
//     state (plus less than 2 MiB of rounding, and
//     the size of the larger of 16 MiB and one range while a save outgrows it). reserve(n) sizes
//     it ahead (the manager's restore does, from the restored checkpoint's size: the first save
//     after a relaunch costs no more than the later ones).
//   - detail::checkpoint_write_stage writes each staged file with O_CREAT|O_EXCL in 8 MiB
//     writes, summing its CRC32C over the staged bytes as it writes (never reading a file back)
//     and, where the save syncs files, starting each file's writeback as it goes
//     (Io::start_writeback, a hint): the syncs after wait for less.
// Caveats:
//   - One save at a time uses the area: the manager waits for the staged save in flight before
//     the next save stages (manager/saving.hpp).
//   - Memory the kernel cannot give at reserve() throws holdfast::error (ENOMEM, from mmap)
//     before anything is staged.
#pragma once

#include <fcntl.h>     // O_CREAT, O_EXCL, O_NOFOLLOW: the staged files
#include <sys/mman.h>  // mmap, MADV_HUGEPAGE, MADV_POPULATE_WRITE

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>  // memcpy
#include <string>
#include <string_view>
#include <type_traits>  // is_invocable: a staged writer
#include <utility>
#include <vector>

#include "../detail/crc32c.hpp"
#include "../detail/detect.hpp"  // detect: whether the Io has start_writeback (io.hpp)
#include "../error.hpp"
#include "../io.hpp"
#include "../store/fs_helpers.hpp"  // store_join
#include "integrity.hpp"            // checkpoint_file_sums, checkpoint_json_name
#include "metadata.hpp"             // checkpoint_metadata_file_name

HOLDFAST_NAMESPACE_BEGIN

/// Anonymous memory that staged saves copy the state into, allocated once and reused (see the
/// header comment). Move-only; not thread-safe (the manager's one save at a time uses it).
template <class Io = posix_io>
class basic_staging_area {
 public:
  basic_staging_area() = default;
  basic_staging_area(basic_staging_area&& o) noexcept
      : regions_(std::exchange(o.regions_, {})),
        current_(std::exchange(o.current_, 0)),
        offset_(std::exchange(o.offset_, 0)),
        used_(std::exchange(o.used_, 0)) {}
  basic_staging_area& operator=(basic_staging_area&& o) noexcept {
    if (this != &o) {
      release();
      regions_ = std::exchange(o.regions_, {});
      current_ = std::exchange(o.current_, 0);
      offset_ = std::exchange(o.offset_, 0);
      used_ = std::exchange(o.used_, 0);
    }
    return *this;
  }
  basic_staging_area(const basic_staging_area&) = delete;
  basic_staging_area& operator=(const basic_staging_area&) = delete;
  ~basic_staging_area() { release(); }

  /// Bytes mapped (every region).
  std::size_t capacity() const noexcept {
    std::size_t c = 0;
    for (const auto& r : regions_) c += r.size;
    return c;
  }
  /// Bytes handed out since the last begin().
  std::size_t used() const noexcept { return used_; }

  /// Makes the area one region of at least `bytes`, faulted in, unless it already is one that
  /// size or larger (at most twice): what a save of `bytes` needs, ahead of the save.
  void reserve(std::size_t bytes) {
    if (bytes == 0) return;
    if (regions_.size() == 1 && regions_[0].size >= bytes && regions_[0].size / 2 <= bytes) return;
    release();
    regions_.push_back(map(bytes));
  }

  /// Starts a save: everything handed out before is free again.
  void begin() noexcept { current_ = offset_ = used_ = 0; }

  /// Ends a save whose staged bytes are no longer needed: when it did not fit one region (or
  /// used less than half of it), the area becomes one region of its size, faulted in now (the
  /// manager calls it on the background thread, after the staged files are written, so the
  /// next save's copy does not pay for it). Frees everything handed out.
  void settle() {
    const std::size_t n = used_;
    begin();
    if (n > 0) reserve(n);
  }

  /// `n` bytes of staging memory, valid until the next begin(); a save that outgrows the area
  /// gets a region of its own for the rest (the larger of n and 16 MiB).
  unsigned char* allocate(std::size_t n) {
    if (n == 0) n = 1;
    const std::size_t need = round_up(n, alignment);
    while (current_ < regions_.size() && regions_[current_].size - offset_ < need) {
      ++current_;
      offset_ = 0;
    }
    if (current_ == regions_.size()) regions_.push_back(map(std::max(need, overflow_region)));
    unsigned char* p = regions_[current_].data + offset_;
    offset_ += need;
    used_ += need;
    return p;
  }

  /// Ranges are handed out aligned to this many bytes.
  static constexpr std::size_t alignment = 64;
  /// What a save that outgrows the area maps at least, at a time.
  static constexpr std::size_t overflow_region = std::size_t{16} << 20;

 private:
  struct region {
    unsigned char* data = nullptr;  // 2 MiB aligned
    std::size_t size = 0;
    void* mapped = nullptr;  // what munmap takes
    std::size_t mapped_size = 0;
  };
  static constexpr std::size_t huge_page = std::size_t{2} << 20;

  static std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

  static region map(std::size_t bytes) {
    region r;
    r.size = round_up(bytes, huge_page);
    r.mapped_size = r.size + huge_page;  // room to align the start to a huge page
    r.mapped = Io::mmap(nullptr, r.mapped_size, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r.mapped == MAP_FAILED)
      throw error(errno, "mmap", "checkpoint staging area",
                  std::to_string(r.size) + " bytes of anonymous memory");
    auto base = reinterpret_cast<std::uintptr_t>(r.mapped);
    r.data = reinterpret_cast<unsigned char*>(round_up(base, huge_page));
#if defined(MADV_HUGEPAGE)
    Io::madvise(r.data, r.size, MADV_HUGEPAGE);  // a hint: without huge pages it still works
#endif
    populate(r);
    return r;
  }

  // Faults the region in now, so that a save's copy takes no page faults.
  static void populate(const region& r) {
#if defined(__linux__)
    constexpr int populate_write = 23;  // MADV_POPULATE_WRITE (Linux 5.14); older kernels: EINVAL
    if (Io::madvise(r.data, r.size, populate_write) == 0) return;
#endif
    for (std::size_t i = 0; i < r.size; i += 4096) r.data[i] = 0;
  }

  void release() noexcept {
    for (const auto& r : regions_) Io::munmap(r.mapped, r.mapped_size);
    regions_.clear();
    current_ = offset_ = used_ = 0;
  }

  std::vector<region> regions_;
  std::size_t current_ = 0, offset_ = 0;  // where the next allocate() looks
  std::size_t used_ = 0;                  // this save's bytes
};

/// The staging area of the default syscall policy.
using staging_area = basic_staging_area<>;

/// What a staged writer fills: the checkpoint's files, each the ranges written to its name, in
/// order, copied into the staging area as they are given (see the header comment).
class checkpoint_stage {
 public:
  /// One staged range of a file.
  struct range {
    const unsigned char* data;
    std::size_t size;
  };
  /// One staged file.
  struct file {
    std::string name;
    std::vector<range> ranges;
    std::uint64_t size = 0;
  };

  /// Copies `size` bytes at `data` to the end of the file `name` (created by its first write).
  /// Throws holdfast::error (EINVAL) for a bad name.
  void write(std::string_view name, const void* data, std::size_t size) {
    unsigned char* p = append(name, size);
    if (size > 0) std::memcpy(p, data, size);
  }

  /// `size` bytes of staging memory at the end of the file `name`, for the writer to fill
  /// before it returns (e.g. the target of a device-to-host copy).
  unsigned char* append(std::string_view name, std::size_t size) {
    file& f = find(name);
    unsigned char* p = alloc_(area_, size);
    if (size > 0) f.ranges.push_back(range{p, size});
    f.size += size;
    bytes_ += size;
    return p;
  }

  /// Bytes staged so far.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// The staged files, in the order of their first write.
  const std::vector<file>& files() const noexcept { return files_; }

  /// A stage over `area` (manager/saving.hpp makes one per save).
  template <class Io>
  explicit checkpoint_stage(basic_staging_area<Io>& area)
      : area_(&area), alloc_([](void* a, std::size_t n) {
          return static_cast<basic_staging_area<Io>*>(a)->allocate(n);
        }) {}

 private:
  file& find(std::string_view name) {
    if (!files_.empty() && files_.back().name == name) return files_.back();
    for (auto& f : files_)
      if (f.name == name) return f;
    check_name(name);
    files_.push_back(file{std::string(name), {}, 0});
    return files_.back();
  }

  static void check_name(std::string_view name) {
    const char* why = nullptr;
    if (name.empty())
      why = "a staged file's name is empty";
    else if (name == "." || name == "..")
      why = "a staged file's name is one path component";
    else if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos)
      why = "a staged file's name is one path component (no '/' or NUL)";
    else if (name == detail::checkpoint_metadata_file_name)
      why = "the metadata file is holdfast's";
    else if (!detail::checkpoint_json_name(std::string(name)))
      why = "a staged file's name is valid UTF-8";
    if (why) throw error(EINVAL, "checkpoint stage", std::string(name), why);
  }

  void* area_;
  unsigned char* (*alloc_)(void*, std::size_t);
  std::vector<file> files_;
  std::uint64_t bytes_ = 0;
};

namespace detail {

// True for a writer called as f(stage, step) or f(stage): a staged writer.
template <class F>
inline constexpr bool checkpoint_stages_v =
    std::is_invocable_v<F&, checkpoint_stage&, std::int64_t> ||
    std::is_invocable_v<F&, checkpoint_stage&>;

// Calls a staged writer as f(stage, step) or f(stage).
template <class F>
void checkpoint_call_stager(F& f, checkpoint_stage& stage, std::int64_t step) {
  if constexpr (std::is_invocable_v<F&, checkpoint_stage&, std::int64_t>)
    f(stage, step);
  else
    f(stage);
}

// Bytes written at a time from the staging area.
inline constexpr std::size_t checkpoint_stage_chunk = std::size_t{8} << 20;

// Writes the staged files into `dir` (each O_CREAT|O_EXCL), summing each file's CRC32C as it is
// written when `sums` (no read back), starting each file's writeback as it goes when
// `writeback`. Returns each file's size and CRC32C (zero when not summed).
template <class Io>
checkpoint_file_sums checkpoint_write_stage(const checkpoint_stage& stage, const std::string& dir,
                                            bool sums, bool writeback) {
  checkpoint_file_sums out;
  out.reserve(stage.files().size());
  for (const auto& f : stage.files()) {
    auto fd =
        open_file<Io>(store_join(dir, f.name), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
    checkpoint_file_sum s;
    for (const auto& r : f.ranges) {
      for (std::size_t at = 0; at < r.size; at += checkpoint_stage_chunk) {
        const std::size_t n = std::min(checkpoint_stage_chunk, r.size - at);
        if (sums) s.crc32c = crc32c_extend(s.crc32c, r.data + at, n);
        write_all(fd, r.data + at, n);
        if constexpr (detect<io_start_writeback, Io>::value)
          if (writeback) Io::start_writeback(fd.get());  // a hint: its failure changes nothing
      }
    }
    s.size = f.size;
    fd.close();
    out.emplace_back(f.name, s);
  }
  return out;
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
