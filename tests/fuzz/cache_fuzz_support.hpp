// tests/fuzz/cache_fuzz_support.hpp — what cache_preload_fuzz and cache_attach_fuzz share: the
// options byte pair, a scratch file on /dev/shm (else $TMPDIR or /tmp) holding the fuzzed cache
// file, the optional repair of checked_format's checksums (so the fuzzer gets past them), and a
// reader that gets every slot every way and checks that the ways agree.
//
// Input: byte 0 bits 0-1 choose the policies (mmap_read or pread_read x pfio_format or
// checked_format), bit 2 a preload with bad_slot_policy::treat_as_empty, bit 3 repairs the
// checked header (magic, version, flags, CRC), bit 4 every in-bounds item's CRC, bits 5-6 the
// mmap reserve of an attach; byte 1 the length passed (pfio: 1 + byte % 32 slots; checked: 0,
// "read it from the header", when even, else 1 + byte % 32); the rest is the cache file.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <holdfast/cache.hpp>

#include "fuzz_support.hpp"

namespace hf_fuzz {

/// The options in the first two bytes of a cache input.
struct cache_case {
  bool pread = false;
  bool checked = false;
  bool treat_as_empty = false;
  bool fix_header = false;
  bool fix_items = false;
  std::uint64_t reserve = 0;
  std::uint64_t length = 0;
  std::string file;

  cache_case(const std::uint8_t* data, std::size_t size) {
    pread = (data[0] & 1) != 0;
    checked = (data[0] & 2) != 0;
    treat_as_empty = (data[0] & 4) != 0;
    fix_header = (data[0] & 8) != 0;
    fix_items = (data[0] & 16) != 0;
    static constexpr std::uint64_t reserves[] = {4096, 65536, 1 << 20, 0};
    reserve = reserves[(data[0] >> 5) & 3];
    length = checked && data[1] % 2 == 0 ? 0 : 1 + std::uint64_t{data[1]} % 32;
    file.assign(reinterpret_cast<const char*>(data + 2), size - 2);
    if (checked) repair();
  }

 private:
  void repair() {
    namespace d = holdfast::detail;
    using F = holdfast::checked_format;
    if (fix_header && file.size() >= F::header_size) {
      std::memcpy(&file[0], F::magic, 8);
      d::put_le32(&file[8], F::version);
      d::put_le32(&file[12], 0);
      d::put_le32(&file[24], d::crc32c(file.data(), 24));
    }
    if (!fix_items || file.size() < F::header_size) return;
    const std::uint64_t slots = (file.size() - F::header_size) / F::entry_size;
    for (std::uint64_t i = 0; i < slots && i < 64; ++i) {
      char* e = &file[F::header_size + i * F::entry_size];
      const std::uint64_t off = d::get_le64(e);
      const auto len = static_cast<std::int64_t>(d::get_le64(e + 8));
      if (len < 0 || off > file.size() || static_cast<std::uint64_t>(len) > file.size() - off)
        continue;
      d::put_le32(e + 16, F::item_crc(i, file.data() + off, static_cast<std::size_t>(len)));
    }
  }
};

/// A file of this process for the fuzzed cache, removed at exit.
class scratch_file {
 public:
  explicit scratch_file(const char* name) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp && *tmp ? tmp : "/tmp";
    path_ = dir + "/holdfast-fuzz-" + name + "-" + std::to_string(getpid());
  }
  scratch_file(const scratch_file&) = delete;
  scratch_file& operator=(const scratch_file&) = delete;
  ~scratch_file() { unlink(path_.c_str()); }

  const std::string& path() const noexcept { return path_; }
  /// Replaces the file's content with `bytes` (mode 0600).
  void write(std::string_view bytes) const {
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    check(fd >= 0, "cannot create the scratch file");
    while (!bytes.empty()) {
      ssize_t n = ::write(fd, bytes.data(), bytes.size());
      check(n > 0, "cannot write the scratch file");
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    close(fd);
  }

 private:
  std::string path_;
};

/// Reads every slot of `cache` with get, get_into, entry and contains, and checks they agree and
/// that every item lies inside [data_offset, file_size). `may_throw`: whether a get may report a
/// corrupt item (attach does not check checksums at open); otherwise any throw is a finding.
template <class Cache>
void read_every_slot(const Cache& cache, std::uint64_t file_size, bool may_throw) {
  const std::uint64_t n = cache.length();
  std::uint64_t filled = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    try {
      auto e = cache.entry(i);
      auto v = cache.get(i);
      std::string copy;
      const bool got = cache.get_into(i, copy);
      check(cache.contains(i) == v.has_value(), "contains() disagrees with get()");
      check(e.has_value() == v.has_value(), "entry() disagrees with get()");
      check(got == v.has_value(), "get_into() disagrees with get()");
      if (!v) continue;
      ++filled;
      const std::string_view bytes(v->data(), v->size());
      check(bytes.size() == e->size, "get() size differs from entry() size");
      check(copy == bytes, "get_into() copied other bytes than get() returned");
      if (e->size != 0)
        check(e->offset >= cache.data_offset() && e->offset <= file_size &&
                  e->size <= file_size - e->offset,
              "an item outside [data offset, file size) was returned");
    } catch (const holdfast::error& x) {
      if (!may_throw)
        fail("a get threw after the open validated every slot: " + std::string(x.what()));
    }
  }
  if (!may_throw) check(cache.filled() == filled, "filled() disagrees with the slots read");
  try {
    (void)cache.get(n);
    fail("get(length()) did not throw");
  } catch (const holdfast::error& x) {
    check(x.errnum() == ERANGE, "get(length()) threw another errno than ERANGE");
  }
}

}  // namespace hf_fuzz
