// Cache file formats: CRC32C vectors, pfio golden bytes, interoperability with a pfio-format
// reader/writer (tests/pfio_compat.py, a format-level reimplementation: pfio itself cannot be
// installed here), the checked_format header, malformed files, corruption caught on get, the
// syscall counts of the read paths, and user-written formats with and without the header
// features the format traits declare (records_data_end, sealable).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <holdfast/cache.hpp>
#include <holdfast/detail/crc32c.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/temp_dir.hpp"

namespace hf = holdfast;
using hf::testing::fault;
using hf::testing::fault_io;
using hf::testing::fault_plan;
using hf::testing::io_op;

namespace {

std::string slurp(const std::string& path) {
  auto fd = hf::open_file(path, O_RDONLY);
  return hf::read_all(fd);
}
void spit(const std::string& path, const std::string& bytes) {
  ::chmod(path.c_str(), 0600);
  auto fd = hf::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  hf::write_all(fd, bytes.data(), bytes.size());
  fd.close();
}
std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  hf::detail::put_le64(&s[0], v);
  return s;
}

// The same bytes as item() in tests/pfio_compat.py.
std::string item_for_pfio(std::uint64_t i) {
  std::size_t size = (i * 37) % 300;
  std::string s(size, '\0');
  for (std::size_t k = 0; k < size; ++k) s[k] = static_cast<char>((i * 131 + k * 7 + 97) & 0xFF);
  return s;
}

// Runs tests/pfio_compat.py with `args`; returns its exit code (-1 if it did not exit).
int run_pfio_compat(const std::vector<std::string>& args) {
  std::string script = std::string(HOLDFAST_SOURCE_DIR) + "/tests/pfio_compat.py";
  holdfast_test::child c([&] {
    std::vector<char*> argv;
    std::string py = "python3";
    argv.push_back(py.data());
    argv.push_back(script.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("python3", argv.data());
    const bool exec_failed = true;  // execvp returns only on failure
    CHILD_REQUIRE(!exec_failed);
  });
  auto r = c.wait(std::chrono::seconds(60));
  INFO(r.failures);
  CHECK_FALSE(r.timed_out);
  return r.exit_code;
}

using pfio_mp =
    hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::pfio_format>;
using pfio_pread =
    hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never, hf::pfio_format>;
using checked_mp =
    hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::checked_format>;
using checked_pread =
    hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never, hf::checked_format>;

hf::cache_options in(const holdfast_test::temp_dir& dir) {
  hf::cache_options o;
  o.dir = dir.path();
  return o;
}

}  // namespace

TEST_CASE("crc32c matches the standard check values") {
  using hf::detail::crc32c;
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  std::string inc(32, '\0'), dec(32, '\0');
  for (int k = 0; k < 32; ++k) {
    inc[static_cast<std::size_t>(k)] = static_cast<char>(k);
    dec[static_cast<std::size_t>(k)] = static_cast<char>(31 - k);
  }
  CHECK(crc32c(inc.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c(dec.data(), 32) == 0x113FDB5Cu);
  // piecewise == whole, and the software path == the dispatched one, for every split
  std::string big(1000, '\0');
  for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<char>(k * 7 + 3);
  const auto whole = crc32c(big.data(), big.size());
  CHECK(whole == ~hf::detail::crc32c_software(
                     ~0u, reinterpret_cast<const unsigned char*>(big.data()), big.size()));
  for (std::size_t cut : {0u, 1u, 7u, 8u, 9u, 333u, 999u, 1000u})
    CHECK(hf::detail::crc32c_extend(crc32c(big.data(), cut), big.data() + cut, 1000 - cut) ==
          whole);
  // the three-stream hardware loop (3 KiB and more) against the software loop, at and around
  // its block boundaries and at unaligned starts
  std::string data(70000, '\0');
  std::uint32_t x = 12345;
  for (auto& ch : data) {
    x = x * 1103515245u + 12345u;
    ch = static_cast<char>(x >> 16);
  }
  for (std::size_t n : {3071u, 3072u, 3073u, 3080u, 6143u, 6144u, 6145u, 9999u, 65536u, 69990u})
    for (std::size_t off : {0u, 1u, 3u, 8u}) {
      CAPTURE(n);
      CAPTURE(off);
      auto p = reinterpret_cast<const unsigned char*>(data.data()) + off;
      CHECK(crc32c(p, n) == ~hf::detail::crc32c_software(~0u, p, n));
      CHECK(hf::detail::crc32c_extend(crc32c(p, n / 3), p + n / 3, n - n / 3) == crc32c(p, n));
    }
}

TEST_CASE("pfio_format golden bytes: explicit (0, -1) empties, little-endian Qq entries") {
  holdfast_test::temp_dir dir("cache");
  pfio_mp c(hf::create_cache, 3, in(dir));
  CHECK(c.put(1, "ab"));
  CHECK(c.put(0, ""));
  REQUIRE(c.preserve("golden"));
  const unsigned char expected[] = {// slot 0: offset 50, length 0 (present, zero bytes)
                                    0x32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    // slot 1: offset 48, length 2
                                    0x30, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0,
                                    // slot 2: empty = (0, -1)
                                    0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff,
                                    // data
                                    'a', 'b'};
  CHECK(slurp(dir / "golden") ==
        std::string(reinterpret_cast<const char*>(expected), sizeof expected));
}

TEST_CASE("checked_format header: magic, version, flags, length, header CRC, state, end") {
  holdfast_test::temp_dir dir("cache");
  checked_mp c(hf::create_cache, 2, in(dir));
  CHECK(c.put(1, "xyz"));
  auto bytes = slurp(c.path());
  REQUIRE(bytes.size() == 48 + 2 * 24 + 3);
  CHECK(bytes.substr(0, 8) == std::string("HFCACHE\n"));
  CHECK(hf::detail::get_le32(&bytes[8]) == 1);   // version
  CHECK(hf::detail::get_le32(&bytes[12]) == 0);  // flags
  CHECK(hf::detail::get_le64(&bytes[16]) == 2);  // length
  CHECK(hf::detail::get_le32(&bytes[24]) == hf::detail::crc32c(bytes.data(), 24));
  CHECK(hf::detail::get_le32(&bytes[28]) == 0);                      // state: not sealed
  CHECK(hf::detail::get_le64(&bytes[32]) == 99);                     // end of data
  CHECK(hf::detail::get_le64(&bytes[40]) == 0);                      // reserved
  CHECK(bytes.substr(48, 16) == le64(0) + le64(~std::uint64_t{0}));  // slot 0 empty
  CHECK(hf::detail::get_le64(&bytes[72]) == 96);                     // slot 1 offset
  CHECK(hf::detail::get_le64(&bytes[80]) == 3);                      // slot 1 length
  CHECK(hf::detail::get_le32(&bytes[88]) == hf::checked_format::item_crc(1, "xyz", 3));
  CHECK(hf::detail::get_le32(&bytes[92]) == 0);
  CHECK(bytes.substr(96) == "xyz");
  REQUIRE(c.preserve("sealed"));
  CHECK(hf::detail::get_le32(&slurp(dir / "sealed")[28]) == 1);  // sealed for every process
  auto other = checked_mp::attach(c.path());
  CHECK_FALSE(other.put(0, "late"));  // another object sees the seal
  CHECK(other.frozen());
}

TEST_CASE("pfio interop: a holdfast pfio_format file reads back in the pfio-format reader") {
  holdfast_test::temp_dir dir("cache");
  const std::uint64_t n = 200;
  {
    pfio_mp c(hf::create_cache, n, in(dir));
    for (std::uint64_t k = 0; k < n; ++k) {
      auto i = (k * 73) % n;  // scrambled order: offsets are not in slot order
      REQUIRE(c.put(i, item_for_pfio(i)));
    }
    REQUIRE(c.preserve("full.cache"));
    pfio_mp d(hf::create_cache, n, in(dir));
    for (std::uint64_t i = 0; i < n; ++i)
      if (i % 3 != 0) REQUIRE(d.put(i, item_for_pfio(i)));
    REQUIRE(d.preserve("partial.cache"));
  }
  ::chmod((dir / "full.cache").c_str(), 0400);
  CHECK(run_pfio_compat({"check", dir / "full.cache", "200", "0", "readonly"}) == 0);
  CHECK(run_pfio_compat({"check", dir / "full.cache", "200", "0", "multiprocess"}) == 0);
  CHECK(run_pfio_compat({"check", dir / "partial.cache", "200", "3", "multiprocess"}) == 0);
  // as pfio's ReadOnlyFileCache does, the reader refuses a file with empty slots
  CHECK(run_pfio_compat({"check", dir / "partial.cache", "200", "3", "readonly"}) == 3);
  // and the reader is not blind: a wrong expectation fails
  CHECK(run_pfio_compat({"check", dir / "partial.cache", "200", "0", "multiprocess"}) == 1);
}

TEST_CASE("pfio interop: a file written as pfio writes it preloads in holdfast") {
  holdfast_test::temp_dir dir("cache");
  REQUIRE(run_pfio_compat({"write", dir / "py.cache", "150", "4"}) == 0);
  ::chmod((dir / "py.cache").c_str(), 0400);
  ::chmod(dir.path().c_str(), 0500);  // read-only file in a read-only directory
  auto check = [&](const auto& c) {
    CHECK(c.filled() == 150 - 38);
    for (std::uint64_t i = 0; i < 150; ++i) {
      auto v = c.get(i);
      if (i % 4 == 0) {
        CHECK_FALSE(v.has_value());
      } else {
        REQUIRE(v.has_value());
        CHECK(std::string(v->data(), v->size()) == item_for_pfio(i));
      }
    }
  };
  check(hf::readonly_file_cache::preload(dir / "py.cache", 150));
  check(pfio_pread::preload(dir / "py.cache", 150));
  check(pfio_mp(hf::preload_cache, dir / "py.cache", 150));
  ::chmod(dir.path().c_str(), 0700);
}

namespace {

// A small valid file of each format: 4 slots, slots 0-2 filled with 10, 20, 30 bytes.
template <class Cache>
std::string valid_file(const holdfast_test::temp_dir& dir) {
  Cache c(hf::create_cache, 4, in(dir));
  for (std::uint64_t i = 0; i < 3; ++i)
    REQUIRE(c.put(i, std::string(10 * (i + 1), static_cast<char>('a' + i))));
  return slurp(c.path());
}

struct malformed {
  const char* what;
  std::size_t slot;
  std::string bytes;
  std::uint64_t length = 4;
};

void set_entry(std::string& f, std::size_t at, std::uint64_t off, std::int64_t len) {
  hf::detail::put_le64(&f[at], off);
  hf::detail::put_le64(&f[at + 8], static_cast<std::uint64_t>(len));
}

template <class Cache>
void expect_corrupt(const holdfast_test::temp_dir& dir, const malformed& m) {
  INFO(std::string(m.what));
  std::string path = dir / "bad.cache";
  spit(path, m.bytes);
  ::chmod(path.c_str(), 0400);
  try {
    Cache c(hf::preload_cache, path, m.length);
    FAIL("preload accepted a malformed file");
  } catch (const hf::corrupt_cache& e) {
    INFO(std::string(e.what()));
    CHECK(e.slot() == m.slot);
    CHECK(e.path() == path);
    CHECK(e.errnum() == EBADMSG);
    CHECK(std::string(e.what()).find("slot " + std::to_string(m.slot)) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("malformed pfio_format files: a table of truncations and bad entries") {
  holdfast_test::temp_dir dir("cache");
  const std::string good = valid_file<pfio_mp>(dir);  // index 64 bytes, data 64..124
  REQUIRE(good.size() == 64 + 60);
  std::vector<malformed> table;
  table.push_back({"shorter than its index (cut inside slot 3)", 3, good.substr(0, 63)});
  table.push_back({"shorter than its index (cut inside slot 1)", 1, good.substr(0, 20)});
  table.push_back({"empty file", 0, std::string()});
  table.push_back({"last item cut short", 2, good.substr(0, good.size() - 1)});
  {
    auto f = good;
    set_entry(f, 16, 100, 100);
    table.push_back({"entry past the end", 1, f});
  }
  {
    auto f = good;
    set_entry(f, 0, ~std::uint64_t{0} - 4, 16);
    table.push_back({"offset + length overflows", 0, f});
  }
  {
    auto f = good;
    set_entry(f, 48, 5, 8);
    table.push_back({"entry inside the index", 3, f});
  }
  {
    auto f = good;
    set_entry(f, 32, 64, -2);
    table.push_back({"negative length", 2, f});
  }
  {
    auto f = good;
    table.push_back({"told a longer length than the file holds", 7, f, 8});
  }
  for (const auto& m : table) {
    expect_corrupt<pfio_mp>(dir, m);
    expect_corrupt<pfio_pread>(dir, m);
  }
  // the good file preloads
  spit(dir / "good.cache", good);
  CHECK(pfio_mp::preload(dir / "good.cache", 4).filled() == 3);
}

TEST_CASE("malformed checked_format files: header, index, checksums") {
  holdfast_test::temp_dir dir("cache");
  const std::string good = valid_file<checked_mp>(dir);  // header 48, index 96, data 144..204
  REQUIRE(good.size() == 144 + 60);
  auto rehead = [](std::string f) {  // keep the header CRC right after an edit
    hf::detail::put_le32(&f[24], hf::detail::crc32c(f.data(), 24));
    return f;
  };
  std::vector<malformed> table;
  table.push_back({"shorter than its header", 0, good.substr(0, 20)});
  table.push_back({"shorter than its index", 2, good.substr(0, 48 + 24 * 2 + 5)});
  table.push_back({"last item cut short", 2, good.substr(0, good.size() - 3)});
  {
    auto f = good;
    f[0] = 'X';
    table.push_back({"bad magic", 0, f});
  }
  {
    auto f = good;
    f[17] ^= 1;
    table.push_back({"header checksum", 0, f});
  }
  {
    auto f = good;
    hf::detail::put_le32(&f[8], 2);
    table.push_back({"unknown version", 0, rehead(f)});
  }
  {
    auto f = good;
    hf::detail::put_le32(&f[12], 4);
    table.push_back({"unknown flags", 0, rehead(f)});
  }
  {
    auto f = good;
    hf::detail::put_le64(&f[16], 1u << 30);
    table.push_back({"length larger than the file (slot 6 is the first past it)", 6, rehead(f), 0});
  }
  {
    auto f = good;
    table.push_back({"length differs from the caller's", 0, f, 5});
  }
  {
    auto f = good;
    f[144 + 10 + 3] ^= 0x40;  // a byte of slot 1's item
    table.push_back({"item checksum", 1, f});
  }
  {
    auto f = good;
    f[48 + 24 * 2 + 16] ^= 1;  // slot 2's stored CRC
    table.push_back({"entry checksum field", 2, f});
  }
  {
    auto f = good;  // slot 1 points at slot 0's item, with slot 0's CRC: the slot salt catches it
    std::memcpy(&f[48 + 24], &f[48], 24);
    table.push_back({"entry pointing at another slot's item", 1, f});
  }
  {
    auto f = good;
    set_entry(f, 48 + 24 * 3, 150, 1000);
    table.push_back({"entry past the end", 3, f});
  }
  {
    auto f = good;
    hf::detail::put_le64(&f[32], good.size() + 1);
    table.push_back({"recorded end of data past the file", 0, f});
  }
  {
    auto f = good;
    hf::detail::put_le64(&f[32], 100);
    table.push_back({"recorded end of data inside the index", 0, f});
  }
  for (const auto& m : table) {
    expect_corrupt<checked_mp>(dir, m);
    expect_corrupt<checked_pread>(dir, m);
  }
  spit(dir / "good.cache", good);
  CHECK(checked_pread::preload(dir / "good.cache").filled() == 3);
}

TEST_CASE_TEMPLATE("checked_format: corruption of a live cache is caught on get", Cache, checked_mp,
                   checked_pread) {
  holdfast_test::temp_dir dir("cache");
  Cache c(hf::create_cache, 3, in(dir));
  REQUIRE(c.put(1, std::string(4096, 'q')));
  auto e = c.entry(1);
  REQUIRE(e.has_value());
  {
    auto fd = hf::open_file(c.path(), O_RDWR);
    char flip = 'Q';
    hf::pwrite_all(fd, &flip, 1, static_cast<off_t>(e->offset + 4000));
  }
  try {
    (void)c.get(1);
    FAIL("corruption not detected");
  } catch (const hf::corrupt_cache& err) {
    CHECK(err.slot() == 1);
    CHECK(err.path() == c.path());
  }
  std::string buf;
  CHECK_THROWS_AS(c.get_into(1, buf), hf::corrupt_cache);
}

TEST_CASE("read paths: mmap_read get makes no syscall, pread_read exactly one pread") {
  holdfast_test::temp_dir dir("cache");
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  using mm = hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::pfio_format,
                                  fault_io>;
  using pr = hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never,
                                  hf::checked_format, fault_io>;
  mm a(hf::create_cache, 4, in(dir));
  pr b(hf::create_cache, 4, in(dir));
  REQUIRE(a.put(0, std::string(5000, 'a')));
  REQUIRE(b.put(0, std::string(5000, 'b')));
  REQUIRE(b.put(1, ""));
  fault_plan::reset_counts();
  auto va = a.get(0);
  CHECK(fault_plan::calls(io_op::any) == 0);
  auto vb = b.get(0);
  CHECK(fault_plan::calls(io_op::pread) == 1);
  CHECK(fault_plan::calls(io_op::any) == 1);
  std::string buf;
  CHECK(b.get_into(0, buf));
  CHECK(fault_plan::calls(io_op::any) == 2);
  CHECK(b.get(1).has_value());  // zero bytes: no pread at all
  CHECK_FALSE(b.get(2).has_value());
  CHECK(fault_plan::calls(io_op::any) == 2);
  CHECK(*va == std::string(5000, 'a'));
  CHECK(*vb == std::string(5000, 'b'));
  CHECK(buf == *vb);
  // a put is: flock, lseek, one pwrite, unlock (the entry goes through the mapping)
  fault_plan::reset_counts();
  REQUIRE(a.put(1, "xyz"));
  CHECK(fault_plan::calls(io_op::flock) == 2);
  CHECK(fault_plan::calls(io_op::pwrite) == 1);
  CHECK(fault_plan::calls(io_op::lseek) == 1);
  CHECK(fault_plan::calls(io_op::any) == 4);
  // checked_format records the end of data in its header: no lseek
  fault_plan::reset_counts();
  REQUIRE(b.put(2, "xyz"));
  CHECK(fault_plan::calls(io_op::lseek) == 0);
  CHECK(fault_plan::calls(io_op::any) == 3);
}

namespace {
// Bytes of this process's mappings of `path` (from /proc/self/maps).
std::uint64_t mapped_bytes(const std::string& path) {
  auto fd = hf::open_file("/proc/self/maps", O_RDONLY);
  auto maps = hf::read_all(fd);
  std::uint64_t total = 0;
  std::size_t pos = 0;
  while (pos < maps.size()) {
    auto eol = maps.find('\n', pos);
    if (eol == std::string::npos) eol = maps.size();
    auto line = maps.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.size() < path.size() || line.compare(line.size() - path.size(), path.size(), path))
      continue;
    auto dash = line.find('-');
    auto lo = std::stoull(line.substr(0, dash), nullptr, 16);
    auto hi = std::stoull(line.substr(dash + 1, line.find(' ') - dash - 1), nullptr, 16);
    total += hi - lo;
  }
  return total;
}
}  // namespace

TEST_CASE("mappings: pread_read maps only the index, mmap_read reserves once and never remaps") {
  holdfast_test::temp_dir dir("cache");
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  using mm = hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::pfio_format,
                                  fault_io>;
  using pr = hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never,
                                  hf::checked_format, fault_io>;
  hf::cache_options o = in(dir);
  o.reserve = std::uint64_t{1} << 30;
  fault_plan::reset_counts();
  mm a(hf::create_cache, 1000, o);
  pr b(hf::create_cache, 1000, in(dir));
  CHECK(fault_plan::calls(io_op::mmap) == 2);
  CHECK(mapped_bytes(b.path()) == (b.data_offset() + 4095) / 4096 * 4096);  // the index only
  CHECK(mapped_bytes(a.path()) == o.reserve);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    REQUIRE(a.put(i, std::string(3000, 'a')));  // ~3 MB: far past the first pages
    REQUIRE(b.put(i, std::string(3000, 'b')));
  }
  // growth never remaps: the only new mappings are flock_lock's fork-detection pages
  CHECK(fault_plan::calls(io_op::mmap) == 4);
  CHECK(fault_plan::calls(io_op::madvise) == 2);
  CHECK(fault_plan::calls(io_op::munmap) == 0);
  CHECK(mapped_bytes(b.path()) == (b.data_offset() + 4095) / 4096 * 4096);
  CHECK(mapped_bytes(a.path()) == o.reserve);
  CHECK(*a.get(999) == std::string(3000, 'a'));
  CHECK(*b.get(999) == std::string(3000, 'b'));
  // a put past the reservation is refused like the size limit
  hf::cache_options small = in(dir);
  small.reserve = 64 * 1024;
  mm c(hf::create_cache, 10, small);
  CHECK(c.put(0, std::string(60000, 'c')));
  CHECK_FALSE(c.put(1, std::string(6000, 'c')));
  CHECK(c.frozen());
}

TEST_CASE("a failed create throws the first error and leaves no temp file behind") {
  holdfast_test::temp_dir dir("cache");
  using cache_t = hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never,
                                       hf::checked_format, fault_io>;
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  fault_plan::reset_counts();
  { cache_t probe(hf::create_cache, 5000, in(dir)); }
  const auto calls = fault_plan::calls(io_op::any);
  REQUIRE(calls >= 4);  // open, pwrite(s), mmap, ...
  int failed_creates = 0;
  for (std::uint64_t k = 1; k <= calls + 1; ++k) {
    CAPTURE(k);
    fault_plan::arm(fault{io_op::any, k, ENOSPC});
    std::optional<cache_t> c;
    try {
      c.emplace(hf::create_cache, 5000, in(dir));
    } catch (const hf::error& e) {
      CHECK(e.errnum() == ENOSPC);
      ++failed_creates;
    }
    fault_plan::disarm();
    if (c) CHECK(c->put(0, "ok"));  // the fault landed past creation: a working cache
    c.reset();
    CHECK(std::filesystem::is_empty(dir.path()));  // removed on every path
  }
  CHECK(failed_creates >= 3);  // open, the header/index pwrites and mmap each fail creation
}

// ---------------------------------------------------------------------------------------------
// Bad input from other writers (pfio, killed processes, wrong lengths): reported, never obeyed.

namespace {

// Overwrites slot `slot`'s 16-byte pfio entry in an existing file (nothing else changes).
void poke_entry(const std::string& path, std::uint64_t slot, std::uint64_t off, std::int64_t len) {
  std::string e(16, '\0');
  set_entry(e, 0, off, len);
  auto fd = hf::open_file(path, O_RDWR);
  hf::pwrite_all(fd, e.data(), 16, static_cast<off_t>(16 * slot));
}

// Runs `fn` in a forked child; true when it returned normally (no signal, no failure).
template <class F>
bool in_child(F&& fn) {
  holdfast_test::child c(std::forward<F>(fn));
  auto r = c.wait(std::chrono::seconds(30));
  INFO(r.failures);
  CHECK(r.term_signal == 0);  // SIGBUS here: an entry was read past the end of the file
  return r.ok();
}

// In a child: `fn` must throw corrupt_cache naming `path` and `slot`.
template <class F>
void child_require_corrupt(F&& fn, const std::string& path, std::uint64_t slot) {
  bool thrown = false;
  try {
    fn();
  } catch (const hf::corrupt_cache& e) {
    thrown = true;
    CHILD_REQUIRE(e.path() == path);
    CHILD_REQUIRE(e.slot() == slot);
    CHILD_REQUIRE(e.errnum() == EBADMSG);
  }
  CHILD_REQUIRE(thrown);
}

}  // namespace

TEST_CASE_TEMPLATE(
    "attach validates every entry: past the end (no SIGBUS), into the index, into "
    "another item, negative lengths",
    Cache, pfio_mp, pfio_pread) {
  holdfast_test::temp_dir dir("cache");
  const std::string good = valid_file<pfio_mp>(dir);  // index 64, items [64,74) [74,94) [94,124)
  struct bad {
    const char* what;
    std::uint64_t slot, off;
    std::int64_t len;
  };
  const bad table[] = {
      {"past the end of the file, inside the mapping", 1, 124 + 3 * 4096, 100},
      {"straddling the end of the file", 2, 120, 50},
      {"into the index", 1, 40, 10},
      {"into another slot's item", 2, 64 + 5, 10},
      {"length below -1", 0, 64, -3},
  };
  const std::string path = dir / "live.cache";
  for (const auto& b : table) {
    INFO(std::string(b.what));
    spit(path, good);
    poke_entry(path, b.slot, b.off, b.len);
    const std::string before = slurp(path);
    CHECK(in_child(
        [&] { child_require_corrupt([&] { Cache a(hf::attach_cache, path, 4); }, path, b.slot); }));
    CHECK(slurp(path) == before);  // nothing written
  }
  // A live file that goes bad after the attach: each get checks the entry against the file
  // size it knows (refreshed once on a miss), so the bad entry is reported, not followed.
  spit(path, good);
  Cache live(hf::attach_cache, path, 4);
  for (const auto& b : table) {
    INFO(std::string(b.what));
    if (std::string(b.what) == "into another slot's item") continue;  // checked at open only
    poke_entry(path, b.slot, b.off, b.len);
    CHECK(in_child([&] {
      std::string buf;  // get_into first: it copies the bytes (was: SIGBUS past the end)
      child_require_corrupt([&] { (void)live.get_into(b.slot, buf); }, path, b.slot);
      child_require_corrupt([&] { (void)live.get(b.slot); }, path, b.slot);
      child_require_corrupt([&] { (void)live.contains(b.slot); }, path, b.slot);
    }));
    spit(path, good);
  }
  // An entry past the end becomes good when the file grows to hold its item (a writer appended
  // it): the miss refreshes the size once and the item reads.
  poke_entry(path, 3, 124, 6);
  {
    auto fd = hf::open_file(path, O_RDWR);
    hf::pwrite_all(fd, "grown!", 6, 124);
  }
  auto v = live.get(3);
  REQUIRE(v.has_value());
  CHECK(std::string(v->data(), v->size()) == "grown!");
}

TEST_CASE("a reader with a smaller reserve than the writer maps the items past it") {
  holdfast_test::temp_dir dir("cache");
  pfio_mp writer(hf::create_cache, 64, in(dir));  // reserves 64 GiB of address space
  hf::cache_options small = in(dir);
  small.reserve = 64 * 1024;
  pfio_mp reader(hf::attach_cache, writer.path(), 64, small);
  REQUIRE(writer.put(0, "first"));
  auto first = reader.get(0);
  REQUIRE(first.has_value());
  const std::string big(8192, 'b');
  for (std::uint64_t i = 1; i < 40; ++i) REQUIRE(writer.put(i, big + std::to_string(i)));
  REQUIRE(writer.size_bytes() > 4 * small.reserve);
  for (std::uint64_t i = 1; i < 40; ++i) {
    auto v = reader.get(i);  // was: corrupt_cache "past the end of the file (65536 bytes)"
    REQUIRE(v.has_value());
    CHECK((*v == big + std::to_string(i)));
  }
  CHECK(*first == "first");  // a view from before the new mapping stays valid
  CHECK(reader.filled() == 40);
  CHECK_FALSE(reader.put(50, "x"));  // this object's own puts still stop at its reservation
}

TEST_CASE("threads of one reader refresh the size and grow the mapping while a writer appends") {
  holdfast_test::temp_dir dir("cache");
  const std::uint64_t n = 300;
  pfio_mp writer(hf::create_cache, n, in(dir));
  hf::cache_options small = in(dir);
  small.reserve = 16 * 1024;
  pfio_mp reader(hf::attach_cache, writer.path(), n, small);
  auto item = [](std::uint64_t i) { return std::string(1000 + i * 37 % 3000, char('a' + i % 26)); };
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::atomic<std::uint64_t> seen{0};
  auto check = [&](std::uint64_t i, bool view, std::string& buf) {
    try {
      if (view) {
        if (auto v = reader.get(i)) bad += *v != item(i), ++seen;
      } else if (reader.get_into(i, buf)) {
        bad += buf != item(i), ++seen;
      }
    } catch (...) {
      ++bad;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::string buf;
      for (auto k = static_cast<std::uint64_t>(t); !done.load(); ++k) check(k * 7 % n, k % 2, buf);
      for (std::uint64_t i = 0; i < n; ++i) check(i, (i + static_cast<std::uint64_t>(t)) % 2, buf);
    });
  for (std::uint64_t i = 0; i < n; ++i) REQUIRE(writer.put(i, item(i)));
  done = true;
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  CHECK(seen.load() >= 4 * n);
  for (std::uint64_t i = 0; i < n; ++i) CHECK((*reader.get(i) == item(i)));
}

TEST_CASE("mmap refused with ENOMEM (ulimit -v): get_into reads with pread, get says ENOMEM") {
  holdfast_test::temp_dir dir("cache");
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  using mm = hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::pfio_format,
                                  fault_io>;
  pfio_mp writer(hf::create_cache, 16, in(dir));
  hf::cache_options small = in(dir);
  small.reserve = 64 * 1024;
  mm reader(hf::attach_cache, writer.path(), 16, small);
  const std::string big(100000, 'z');
  REQUIRE(writer.put(3, big));  // past the reader's mapping
  fault_plan::arm(fault{io_op::mmap, 1, ENOMEM, 1, 1000});
  std::string buf;
  CHECK(reader.get_into(3, buf));
  CHECK((buf == big));
  CHECK(reader.contains(3));
  CHECK(reader.entry(3).has_value());
  CHECK(fault_plan::calls(io_op::pread) == 1);
  try {
    (void)reader.get(3);
    FAIL("get returned a view of an unmapped item");
  } catch (const hf::corrupt_cache& e) {
    FAIL("a valid item reported corrupt: " << std::string(e.what()));
  } catch (const hf::error& e) {
    CHECK(e.errnum() == ENOMEM);
    CHECK(e.path() == writer.path());
    CHECK(std::string(e.what()).find("get_into") != std::string::npos);
  }
  fault_plan::disarm();  // the kernel relents: the next get maps it
  auto v = reader.get(3);
  REQUIRE(v.has_value());
  CHECK((*v == big));
}

TEST_CASE(
    "preload of a pfio file another process is still filling: later items are not yet "
    "visible") {
  holdfast_test::temp_dir dir("cache");
  const std::string path = dir / "filling.cache";
  REQUIRE(run_pfio_compat({"write", path, "150", "4"}) == 0);  // slots 0, 4, 8, ... empty
  pfio_mp mm(hf::preload_cache, path, 150);
  pfio_pread pr(hf::preload_cache, path, 150);
  CHECK(mm.filled() == 112);
  // a pfio writer appends slot 4 after the open
  REQUIRE(run_pfio_compat({"put", path, "150", "4"}) == 0);
  auto not_visible = [](const auto& c, std::uint64_t i) {
    CHECK_FALSE(c.get(i).has_value());  // was: corrupt_cache (past the end of the file)
    std::string buf = "untouched";
    CHECK_FALSE(c.get_into(i, buf));
    CHECK(buf == "untouched");
    CHECK_FALSE(c.contains(i));
    CHECK_FALSE(c.entry(i).has_value());
  };
  not_visible(mm, 4);
  not_visible(pr, 4);
  CHECK(mm.filled() == 112);
  CHECK(pr.filled() == 112);
  CHECK(std::string(*mm.get(5)) == item_for_pfio(5));
  // a put in flight (entry written, data not yet): preload opens, the slot reads empty
  REQUIRE(run_pfio_compat({"put", path, "150", "12", "entry-only"}) == 0);
  pfio_mp later(hf::preload_cache, path, 150);
  CHECK(std::string(*later.get(4)) == item_for_pfio(4));
  not_visible(later, 12);
  CHECK(later.filled() == 113);
  CHECK(pfio_pread::preload(path, 150).filled() == 113);
}

TEST_CASE(
    "a pfio writer killed between its entry and its data: the next put's item is found "
    "overlapping, never returned as the other slot's") {
  holdfast_test::temp_dir dir("cache");
  const std::string path = dir / "killed.cache";
  REQUIRE(run_pfio_compat({"write", path, "150", "4"}) == 0);
  REQUIRE(run_pfio_compat({"put", path, "150", "12", "entry-only"}) == 0);  // killed here
  REQUIRE(run_pfio_compat({"put", path, "150", "8"}) == 0);  // its item lands where 12 points
  ::chmod(path.c_str(), 0400);
  auto refused = [&](auto open) {
    try {
      open();
      FAIL("a file with overlapping items was accepted");
    } catch (const hf::corrupt_cache& e) {
      INFO(std::string(e.what()));
      CHECK(e.path() == path);
      CHECK((e.slot() == 8 || e.slot() == 12));
      CHECK(std::string(e.what()).find("overlaps") != std::string::npos);
    }
  };
  refused([&] { pfio_mp c(hf::preload_cache, path, 150); });  // was: get(12) = item 8's bytes
  refused([&] { pfio_pread c(hf::preload_cache, path, 150); });
  ::chmod(path.c_str(), 0600);
  refused([&] { pfio_mp c(hf::attach_cache, path, 150); });
  // treated as empty on request: both slots dropped, the rest reads
  hf::cache_options drop;
  drop.on_bad_slot = hf::bad_slot_policy::treat_as_empty;
  auto c = pfio_mp::preload(path, 150, drop);
  CHECK(c.dropped_slots() == 2);
  CHECK_FALSE(c.get(8).has_value());
  CHECK_FALSE(c.get(12).has_value());
  CHECK(c.filled() == 112);
  CHECK(std::string(*c.get(9)) == item_for_pfio(9));
}

TEST_CASE("a live pfio put in flight reads as empty, then as its item once the data lands") {
  holdfast_test::temp_dir dir("cache");
  const std::string path = dir / "live.cache";
  REQUIRE(run_pfio_compat({"write", path, "150", "4"}) == 0);
  REQUIRE(run_pfio_compat({"put", path, "150", "8", "entry-only"}) == 0);
  pfio_mp c(hf::attach_cache, path, 150);
  CHECK_FALSE(c.get(8).has_value());
  CHECK_FALSE(c.put(8, "mine"));  // the slot is taken by the pfio put
  auto e = hf::detail::get_le64(slurp(path).substr(16 * 8, 8).data());
  {
    auto fd = hf::open_file(path, O_RDWR);  // the pfio writer finishes its put
    auto data = item_for_pfio(8);
    hf::pwrite_all(fd, data.data(), data.size(), static_cast<off_t>(e));
  }
  REQUIRE(c.get(8).has_value());
  CHECK(std::string(*c.get(8)) == item_for_pfio(8));
}

namespace {
// A get_into buffer that records what it was asked to hold (and refuses to hold much).
struct probe_buffer {
  std::size_t asked = 0;
  std::string bytes;
  void resize(std::size_t n) {
    asked = std::max(asked, n);
    if (n > (std::size_t{1} << 20)) throw std::length_error("probe_buffer: asked for too much");
    bytes.resize(n);
  }
  char* data() { return &bytes[0]; }
};
}  // namespace

TEST_CASE("pread_read checks an entry's length against the file before allocating") {
  holdfast_test::temp_dir dir("cache");
  pfio_pread c(hf::create_cache, 4, in(dir));
  REQUIRE(c.put(0, "abc"));
  const std::string path = c.path();
  pfio_pread live(hf::attach_cache, path, 4);
  poke_entry(path, 1, c.data_offset(), std::int64_t{1} << 62);
  poke_entry(path, 2, c.data_offset(), std::int64_t{3} << 30);  // 3 GiB in a 67-byte file
  for (std::uint64_t slot : {1u, 2u}) {
    CAPTURE(slot);
    try {
      (void)live.get(slot);  // was: std::bad_alloc for 2^62
      FAIL("no error");
    } catch (const hf::corrupt_cache& e) {
      CHECK(e.slot() == slot);
      CHECK(std::string(e.what()).find("past the end of the file") != std::string::npos);
    }
    probe_buffer buf;
    CHECK_THROWS_AS(live.get_into(slot, buf), hf::corrupt_cache);
    CHECK(buf.asked == 0);  // was: resized to the entry's length before the short read
  }
}

TEST_CASE_TEMPLATE("a length below -1 is corrupt for every operation, and nothing is written",
                   Cache, pfio_mp, pfio_pread, checked_mp, checked_pread) {
  holdfast_test::temp_dir dir("cache");
  Cache c(hf::create_cache, 4, in(dir));
  REQUIRE(c.put(0, "a"));
  {
    std::string e(8, '\0');
    hf::detail::put_le64(&e[0], static_cast<std::uint64_t>(std::int64_t{-7}));
    auto fd = hf::open_file(c.path(), O_RDWR);
    hf::pwrite_all(
        fd, e.data(), 8,
        static_cast<off_t>(Cache::format::header_size + 2 * Cache::format::entry_size + 8));
  }
  const auto size = c.size_bytes();
  auto corrupt_at_2 = [&](auto op) {
    try {
      op();
      FAIL("a length of -7 was accepted");
    } catch (const hf::corrupt_cache& e) {
      CHECK(e.slot() == 2);
      CHECK(e.path() == c.path());
      CHECK(std::string(e.what()).find("-7") != std::string::npos);
    }
  };
  corrupt_at_2([&] { (void)c.contains(2); });  // was: true
  corrupt_at_2([&] { (void)c.filled(); });     // was: 2
  corrupt_at_2([&] { (void)c.put(2, "x"); });  // was: false
  corrupt_at_2([&] { (void)c.get(2); });
  corrupt_at_2([&] { (void)c.entry(2); });
  corrupt_at_2([&] {
    std::string buf;
    (void)c.get_into(2, buf);
  });
  corrupt_at_2([&] { Cache a(hf::attach_cache, c.path(), 4); });
  CHECK(c.size_bytes() == size);  // nothing written
  CHECK(c.contains(0));           // the other slots go on
  CHECK(c.put(1, "b"));
}

TEST_CASE("a wrong pfio length is reported: too small (more index after it), too large") {
  holdfast_test::temp_dir dir("cache");
  const std::string path = dir / "py.cache";
  REQUIRE(run_pfio_compat({"write", path, "150", "4"}) == 0);  // slot 149 filled, 148 empty
  const std::uint64_t any = ~std::uint64_t{0};
  auto refused = [&](auto open, std::uint64_t slot, const char* why) {
    try {
      open();
      FAIL("a wrong length was accepted");
    } catch (const hf::corrupt_cache& e) {
      INFO(std::string(e.what()));
      CHECK(e.path() == path);
      if (slot != any) CHECK(e.slot() == slot);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  for (std::uint64_t n : {100u, 148u, 149u}) {  // the next 16 bytes: empty or filled entries
    CAPTURE(n);
    refused([&] { pfio_mp c(hf::preload_cache, path, n); }, n, "too small");  // was: accepted
    refused([&] { pfio_pread c(hf::preload_cache, path, n); }, n, "too small");
    refused([&] { pfio_mp c(hf::attach_cache, path, n); }, n, "too small");
  }
  // the first item (at 16 * 150) lies inside a longer index: its slot is named
  refused([&] { pfio_mp c(hf::preload_cache, path, 151); }, any, "too large");
  refused([&] { pfio_pread c(hf::attach_cache, path, 160); }, any, "too large");
  CHECK(pfio_mp::preload(path, 150).filled() == 112);  // the right length
  // a fresh holdfast file of 50 empty slots told 40: slot 40's (0, -1) follows the index
  pfio_mp fresh(hf::create_cache, 50, in(dir));
  CHECK_THROWS_AS(pfio_mp::attach(fresh.path(), 40), hf::corrupt_cache);
  CHECK(pfio_mp::attach(fresh.path(), 50).filled() == 0);
}

TEST_CASE_TEMPLATE("preload can treat bad slots as empty and count them", Cache, checked_mp,
                   checked_pread, pfio_mp, pfio_pread) {
  holdfast_test::temp_dir dir("cache");
  std::string f = valid_file<Cache>(dir);  // slots 0-2 filled with 10, 20, 30 bytes
  const std::uint64_t index = Cache::format::header_size + 4 * Cache::format::entry_size;
  std::uint64_t first_bad = 2;
  if (Cache::format::checksummed) {
    f[index + 10 + 3] ^= 0x40;  // a byte of slot 1's item: its checksum fails
    first_bad = 1;
  }
  set_entry(f, Cache::format::header_size + 2 * Cache::format::entry_size, f.size() - 5, 30);
  const std::string path = dir / "bad.cache";
  spit(path, f);
  ::chmod(path.c_str(), 0400);
  try {
    Cache c(hf::preload_cache, path, 4);
    FAIL("refused by default");
  } catch (const hf::corrupt_cache& e) {
    CHECK(e.slot() == first_bad);
  }
  hf::cache_options o;
  o.on_bad_slot = hf::bad_slot_policy::treat_as_empty;
  Cache c(hf::preload_cache, path, 4, o);
  const std::uint64_t dropped = Cache::format::checksummed ? 2 : 1;
  CHECK(c.dropped_slots() == dropped);
  CHECK(c.filled() == 3 - dropped);
  CHECK(std::string(c.get(0)->data(), c.get(0)->size()) == std::string(10, 'a'));
  for (std::uint64_t i = first_bad; i < 4; ++i) {
    CAPTURE(i);
    CHECK_FALSE(c.get(i).has_value());
    CHECK_FALSE(c.contains(i));
    CHECK_FALSE(c.entry(i).has_value());
    std::string buf = "untouched";
    CHECK_FALSE(c.get_into(i, buf));
    CHECK(buf == "untouched");
  }
  CHECK(slurp(path) == f);  // the file is not changed
  CHECK(Cache::preload(dir / "bad.cache", 4, o).dropped_slots() == dropped);
  CHECK(Cache::preload(dir / "bad.cache", 4, o).frozen());
  // a good file drops nothing
  CHECK(Cache::preload(path, 4, o).length() == 4);
  spit(dir / "good.cache", valid_file<Cache>(dir));
  CHECK(Cache::preload(dir / "good.cache", 4, o).dropped_slots() == 0);
}

// ---------------------------------------------------------------------------------------------
// Formats a user writes: the header features basic_file_cache offers (cache/traits.hpp) are
// opted into by declaring them, and a format that declares them gets what checked_format gets.

namespace {

// A user-written format that declares both header features, laid out unlike checked_format:
//   header (40 bytes): "USERFMT\x01", u64 end of data (at 8), u64 length, u32 ~length (a check),
//                      u32 zero, u32 state (seal bit 0x4, at 32), u32 zero.
//   entry (32 bytes):  u64 offset, i64 length (-1 = empty), u32 checksum, 12 bytes zero.
struct sealed_user_format {
  static constexpr std::size_t header_size = 40;
  static constexpr std::size_t entry_size = 32;
  static constexpr bool stores_length = true;
  static constexpr bool checksummed = true;
  static constexpr bool records_data_end = true;
  static constexpr std::size_t end_offset = 8;
  static constexpr bool sealable = true;
  static constexpr std::size_t state_offset = 32;
  static constexpr std::uint32_t sealed = 0x4;
  static constexpr char magic[8] = {'U', 'S', 'E', 'R', 'F', 'M', 'T', '\x01'};

  static std::string encode_header(std::uint64_t length) {
    std::string h(header_size, '\0');
    std::memcpy(&h[0], magic, 8);
    hf::detail::put_le64(&h[end_offset], header_size + length * entry_size);
    hf::detail::put_le64(&h[16], length);
    hf::detail::put_le32(&h[24], static_cast<std::uint32_t>(~length));
    return h;
  }
  static std::uint64_t decode_header(const char* p, const std::string& path) {
    if (std::memcmp(p, magic, 8) != 0) throw hf::corrupt_cache(path, 0, "bad magic");
    auto length = hf::detail::get_le64(p + 16);
    if (hf::detail::get_le32(p + 24) != static_cast<std::uint32_t>(~length))
      throw hf::corrupt_cache(path, 0, "header check mismatch");
    return length;
  }
  static std::uint32_t item_crc(std::uint64_t slot, const void* data, std::size_t n) noexcept {
    return hf::detail::crc32c(data, n) ^ static_cast<std::uint32_t>(slot * 2654435761u);
  }
};

// A user-written format with a header (its own magic and the length) that declares neither
// feature: not even `= false`, so the traits must count the missing members as false.
struct plain_user_format {
  static constexpr std::size_t header_size = 16;
  static constexpr std::size_t entry_size = 16;
  static constexpr bool stores_length = true;
  static constexpr bool checksummed = false;
  static std::string encode_header(std::uint64_t length) {
    std::string h(header_size, '\0');
    std::memcpy(&h[0], "PLAINFMT", 8);
    hf::detail::put_le64(&h[8], length);
    return h;
  }
  static std::uint64_t decode_header(const char* p, const std::string& path) {
    if (std::memcmp(p, "PLAINFMT", 8) != 0) throw hf::corrupt_cache(path, 0, "bad magic");
    return hf::detail::get_le64(p + 8);
  }
  static std::uint32_t item_crc(std::uint64_t, const void*, std::size_t) noexcept { return 0; }
};

template <class Format, class Read = hf::mmap_read, class Io = hf::posix_io>
using cache_of = hf::basic_file_cache<Read, hf::flock_lock, hf::sync_never, Format, Io>;
using user_mp = cache_of<sealed_user_format>;
using user_pread = cache_of<sealed_user_format, hf::pread_read>;
using user_counted = cache_of<sealed_user_format, hf::mmap_read, fault_io>;
using plain_counted = cache_of<plain_user_format, hf::mmap_read, fault_io>;
using pfio_counted = cache_of<hf::pfio_format, hf::mmap_read, fault_io>;

// The recorded end of data in a sealed_user_format file's header.
std::uint64_t recorded_end(const std::string& path) {
  return hf::detail::get_le64(slurp(path).data() + sealed_user_format::end_offset);
}
std::uint32_t state_word(const std::string& path) {
  return hf::detail::get_le32(slurp(path).data() + sealed_user_format::state_offset);
}

}  // namespace

TEST_CASE("a user format declaring records_data_end: puts append at the recorded end, no lseek") {
  holdfast_test::temp_dir dir("cache");
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  user_counted c(hf::create_cache, 4, in(dir));
  const std::uint64_t data = 40 + 4 * 32;
  REQUIRE(c.data_offset() == data);
  CHECK(recorded_end(c.path()) == data);  // written by the format's encode_header
  fault_plan::reset_counts();
  REQUIRE(c.put(2, "abc"));
  CHECK(fault_plan::calls(io_op::lseek) == 0);  // the header says where the data ends
  CHECK(recorded_end(c.path()) == data + 3);
  REQUIRE(c.put(0, std::string(100, 'z')));
  CHECK(recorded_end(c.path()) == data + 103);
  REQUIRE(c.put(1, ""));  // zero bytes: the end stays
  CHECK(recorded_end(c.path()) == data + 103);
  CHECK(fault_plan::calls(io_op::lseek) == 0);
  CHECK(c.entry(2)->offset == data);
  CHECK(c.entry(0)->offset == data + 3);
  CHECK(c.entry(1)->offset == data + 103);
  CHECK(c.size_bytes() == data + 103);
  // The recorded end, not the file's end, decides: bytes past it (a writer killed after its
  // data, before it moved the end) are reused by the next put.
  {
    auto fd = hf::open_file(c.path(), O_RDWR);
    hf::pwrite_all(fd, "orphan", 6, static_cast<off_t>(data + 103));
  }
  REQUIRE(c.put(3, "new"));
  CHECK(c.entry(3)->offset == data + 103);
  CHECK(recorded_end(c.path()) == data + 106);
  CHECK(*c.get(3) == "new");
  CHECK(*c.get(2) == "abc");
  // another object, attached by path (length from the header), appends after them
  user_mp c8(hf::create_cache, 8, in(dir));
  REQUIRE(c8.put(0, "0123456789"));
  auto other = user_mp::attach(c8.path());
  CHECK(other.length() == 8);
  REQUIRE(other.put(5, "abcd"));
  CHECK(other.entry(5)->offset == c8.data_offset() + 10);
  CHECK(recorded_end(c8.path()) == c8.data_offset() + 14);
  REQUIRE(c8.put(6, "x"));  // and the creator after the other's item
  CHECK(c8.entry(6)->offset == c8.data_offset() + 14);
  CHECK(*other.get(6) == "x");
}

TEST_CASE("a user format declaring sealable: preserve seals the file for every process") {
  holdfast_test::temp_dir dir("cache");
  user_mp c(hf::create_cache, 8, in(dir));
  auto other = user_mp::attach(c.path());  // attached while live: not frozen itself
  user_pread other_pread(hf::attach_cache, c.path());
  REQUIRE(c.put(0, "first"));
  REQUIRE(other.put(1, "second"));
  REQUIRE(other_pread.put(2, "third"));
  CHECK(state_word(c.path()) == 0);
  const std::string before = slurp(c.path());
  REQUIRE(c.preserve("kept"));
  CHECK(c.frozen());
  const std::string kept = dir / "kept";
  // the format's own bit, in the format's own word, and nothing else in the header changed
  CHECK(state_word(kept) == sealed_user_format::sealed);
  std::string after = slurp(kept);
  REQUIRE(after.size() == before.size());
  hf::detail::put_le32(&after[sealed_user_format::state_offset], 0);
  CHECK(after == before);
  // a forked child sees the seal through the object it inherited and through its own attach
  CHECK(in_child([&] {
    CHILD_REQUIRE(!other.frozen());  // nothing told this object: the header does
    CHILD_REQUIRE(!other.put(3, "child"));
    CHILD_REQUIRE(other.frozen());
    auto mine = user_mp::attach(kept);
    CHILD_REQUIRE(!mine.put(4, "child"));
    CHILD_REQUIRE(mine.frozen());
    CHILD_REQUIRE(mine.filled() == 3);
    CHILD_REQUIRE(*mine.get(1) == "second");
    CHILD_REQUIRE(user_pread::preload(kept).filled() == 3);
  }));
  // and so do the objects attached before the seal, in this process
  CHECK_FALSE(other.put(5, "late"));
  CHECK(other.frozen());
  CHECK_FALSE(other_pread.put(6, "late"));
  CHECK(other_pread.frozen());
  CHECK_FALSE(user_mp::attach(c.path()).put(7, "late"));
  CHECK(slurp(kept).size() == before.size());  // nothing appended by anyone
  CHECK(c.filled() == 3);
  CHECK(recorded_end(kept) == c.size_bytes());
}

TEST_CASE_TEMPLATE("a user format declaring neither feature behaves as pfio_format: lseek, no seal",
                   Cache, plain_counted, pfio_counted) {
  holdfast_test::temp_dir dir("cache");
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  static_assert(!hf::cache_format_records_data_end_v<typename Cache::format>);
  static_assert(!hf::cache_format_sealable_v<typename Cache::format>);
  Cache c(hf::create_cache, 8, in(dir));
  const std::string header = slurp(c.path()).substr(0, Cache::format::header_size);
  Cache other(hf::attach_cache, c.path(), 8);
  fault_plan::reset_counts();
  REQUIRE(c.put(0, "abc"));
  CHECK(fault_plan::calls(io_op::lseek) == 1);  // the end of the file is asked each put
  REQUIRE(other.put(1, "de"));
  CHECK(fault_plan::calls(io_op::lseek) == 2);
  // bytes past the last item (a writer killed after its data) are skipped, not reused
  const auto end = c.size_bytes();
  {
    auto fd = hf::open_file(c.path(), O_RDWR);
    hf::pwrite_all(fd, "orphan", 6, static_cast<off_t>(end));
  }
  REQUIRE(c.put(2, "f"));
  CHECK(c.entry(2)->offset == end + 6);
  // preserve freezes the preserving object only; the header has nothing to seal
  REQUIRE(c.preserve("kept"));
  const std::string kept = dir / "kept";
  CHECK(c.frozen());
  CHECK_FALSE(c.put(3, "x"));
  CHECK(slurp(kept).substr(0, Cache::format::header_size) == header);
  const auto preserved = c.size_bytes();
  CHECK(in_child([&] {
    CHILD_REQUIRE(other.put(4, "child"));
    Cache mine(hf::attach_cache, kept, 8);
    CHILD_REQUIRE(mine.put(5, "child"));
    CHILD_REQUIRE(!mine.frozen());
  }));
  CHECK(other.put(6, "parent"));
  CHECK_FALSE(other.frozen());
  CHECK(slurp(kept).size() > preserved);  // the preserved file grew, as in pfio
  CHECK(Cache::preload(kept, 8).filled() == 6);
}

namespace {

// Collapses each run of digits to '#' and the path to <path>: two formats' messages compare
// equal when only their offsets differ.
std::string shape(std::string what, const std::string& path) {
  for (auto at = what.find(path); at != std::string::npos; at = what.find(path))
    what.replace(at, path.size(), "<path>");
  std::string out;
  for (char ch : what)
    if (!(ch >= '0' && ch <= '9'))
      out += ch;
    else if (out.empty() || out.back() != '#')
      out += '#';
  return out;
}

// A damaged copy of a small file: 4 slots, slots 0-2 filled with 10, 20, 30 bytes (valid_file).
struct damage {
  const char* what;
  long attach_slot;   // the slot attach reports corrupt; -1: attach opens it
  long preload_slot;  // the same for preload
  // edits the file's bytes; `data` is the data offset, `end_at` the end word's offset
  void (*edit)(std::string& f, std::uint64_t data, std::size_t end_at);
};

const damage damages[] = {
    {"cut inside the last item", 2, 2,
     [](std::string& f, std::uint64_t data, std::size_t) { f.resize(data + 57); }},
    {"cut where the last item starts (its entry and end written, its data lost)", 0, 0,
     [](std::string& f, std::uint64_t data, std::size_t) { f.resize(data + 30); }},
    {"cut to the index", 1, 1,
     [](std::string& f, std::uint64_t data, std::size_t) { f.resize(data); }},
    {"cut inside the index", 3, 3,
     [](std::string& f, std::uint64_t data, std::size_t) { f.resize(data - 5); }},
    {"cut inside the header", 0, 0,
     [](std::string& f, std::uint64_t, std::size_t) { f.resize(20); }},
    {"recorded end past the file", 0, 0,
     [](std::string& f, std::uint64_t, std::size_t at) {
       hf::detail::put_le64(&f[at], f.size() + 1);
     }},
    {"recorded end inside the index", 0, 0,
     [](std::string& f, std::uint64_t data, std::size_t at) {
       hf::detail::put_le64(&f[at], data - 8);
     }},
    {"recorded end 0", 0, 0,
     [](std::string& f, std::uint64_t, std::size_t at) { hf::detail::put_le64(&f[at], 0); }},
    {"a writer killed after its data and the end, before its entry", -1, -1,
     [](std::string& f, std::uint64_t, std::size_t at) {
       f += "orphan!";
       hf::detail::put_le64(&f[at], f.size());
     }},
    // Refused, naming the item ending furthest: a put there would overwrite slots 1 and 2.
    {"recorded end behind the last item (inside the data)", 2, 2,
     [](std::string& f, std::uint64_t data, std::size_t at) {
       hf::detail::put_le64(&f[at], data + 15);
     }},
};

// What opening a damaged file does, as text: for each of preload, preload treating bad slots as
// empty, and attach (then a put and a get of every slot), "corrupt slot N: <message>" or what
// the open cache shows.
template <class Format>
std::string reopen(const holdfast_test::temp_dir& dir, const damage& d) {
  using mp = cache_of<Format>;
  std::string f = valid_file<mp>(dir);
  const std::uint64_t data = Format::header_size + 4 * Format::entry_size;
  d.edit(f, data, Format::end_offset);
  const std::string path = dir / "damaged.cache";
  std::string out;
  auto attempt = [&](const char* mode, auto open_and_use) {
    spit(path, f);
    out += std::string(mode) + ": ";
    try {
      out += open_and_use();
    } catch (const hf::corrupt_cache& e) {
      out += "corrupt slot " + std::to_string(e.slot()) + ": " + shape(e.what(), path);
    }
    out += "\n";
  };
  attempt("preload", [&] {
    auto c = mp::preload(path);
    return "filled " + std::to_string(c.filled());
  });
  attempt("preload treat_as_empty", [&] {
    hf::cache_options o;
    o.on_bad_slot = hf::bad_slot_policy::treat_as_empty;
    auto c = cache_of<Format, hf::pread_read>::preload(path, 0, o);
    return "filled " + std::to_string(c.filled()) + ", dropped " +
           std::to_string(c.dropped_slots());
  });
  attempt("attach", [&] {
    auto c = mp::attach(path);
    std::string r = "filled " + std::to_string(c.filled());
    r += ", put " + std::to_string(c.put(3, "late"));
    if (auto e = c.entry(3)) r += " at data+" + std::to_string(e->offset - data);
    r += "; get";
    for (std::uint64_t i = 0; i < 4; ++i) {
      try {
        auto v = c.get(i);
        r += v ? " " + std::string(*v).substr(0, 4) : " empty";
      } catch (const hf::corrupt_cache& e) {
        r += " corrupt(" + std::to_string(e.slot()) + ")";
      }
    }
    return r;
  });
  return out;
}

long first_slot(const std::string& outcome, const std::string& mode) {
  auto at = outcome.find(mode + ": corrupt slot ");
  if (at == std::string::npos) return -1;
  return std::stol(outcome.substr(at + mode.size() + 15));
}

}  // namespace

TEST_CASE(
    "a user format with a recorded end: damaged files are refused or opened as checked_format's") {
  for (const auto& d : damages) {
    INFO(std::string(d.what));
    holdfast_test::temp_dir a("cache"), b("cache");
    const std::string user = reopen<sealed_user_format>(a, d);
    const std::string checked = reopen<hf::checked_format>(b, d);
    INFO("user format:\n" << user);
    INFO("checked_format:\n" << checked);
    CHECK(first_slot(user, "attach") == d.attach_slot);
    CHECK(first_slot(user, "preload") == d.preload_slot);
    CHECK(user == checked);  // the same outcome, slot and message (offsets aside), every way
  }
}

namespace {

// What every format needs, and nothing else.
struct bare {
  static constexpr std::size_t header_size = 16;
  static constexpr std::size_t entry_size = 16;
  static constexpr bool stores_length = false;
  static constexpr bool checksummed = false;
  static std::string encode_header(std::uint64_t) { return std::string(16, '\0'); }
  static std::uint64_t decode_header(const char*, const std::string&) { return 0; }
  static std::uint32_t item_crc(std::uint64_t, const void*, std::size_t) noexcept { return 0; }
};
struct declared_false : bare {
  static constexpr bool records_data_end = false;
  static constexpr bool sealable = false;
};
struct sealable_without_state_offset : bare {
  static constexpr bool sealable = true;
  [[maybe_unused]] static constexpr std::uint32_t sealed = 1;  // the bit, without its word
};
struct sealable_without_bit : bare {
  static constexpr bool sealable = true;
  static constexpr std::size_t state_offset = 8;
};
struct end_without_offset : bare {
  static constexpr bool records_data_end = true;
};
struct offsets_without_features : bare {  // words that nothing declares are ignored
  static constexpr std::size_t end_offset = 8;
  static constexpr std::size_t state_offset = 0;
  static constexpr std::uint32_t sealed = 1;
};
struct misaligned_state : bare {  // a format: check_cache_policies refuses it (compile time)
  static constexpr bool sealable = true;
  static constexpr std::size_t state_offset = 6;
  static constexpr std::uint32_t sealed = 1;
};

}  // namespace

TEST_CASE("the format traits: declared features, missing ones count as false, refusals") {
  static_assert(hf::cache_format_records_data_end_v<hf::checked_format>);
  static_assert(hf::cache_format_sealable_v<hf::checked_format>);
  static_assert(!hf::cache_format_records_data_end_v<hf::pfio_format>);
  static_assert(!hf::cache_format_sealable_v<hf::pfio_format>);
  static_assert(hf::cache_format_records_data_end_v<sealed_user_format>);
  static_assert(hf::cache_format_sealable_v<sealed_user_format>);
  static_assert(hf::is_cache_format_policy_v<sealed_user_format>);
  static_assert(hf::check_cache_policies<hf::mmap_read, hf::flock_lock, hf::sync_never,
                                         sealed_user_format>());

  // missing or false: neither feature, and still a format
  for (bool declared :
       {hf::cache_format_records_data_end_v<bare>, hf::cache_format_sealable_v<bare>,
        hf::cache_format_records_data_end_v<plain_user_format>,
        hf::cache_format_sealable_v<plain_user_format>,
        hf::cache_format_records_data_end_v<declared_false>,
        hf::cache_format_sealable_v<declared_false>,
        hf::cache_format_records_data_end_v<offsets_without_features>,
        hf::cache_format_sealable_v<offsets_without_features>})
    CHECK_FALSE(declared);
  static_assert(hf::is_cache_format_policy_v<bare>);
  static_assert(hf::is_cache_format_policy_v<plain_user_format>);
  static_assert(hf::is_cache_format_policy_v<declared_false>);
  static_assert(hf::is_cache_format_policy_v<offsets_without_features>);
  static_assert(hf::check_cache_policies<hf::mmap_read, hf::flock_lock, hf::sync_never,
                                         offsets_without_features>());

  // a feature declared without its word is not a format
  static_assert(hf::cache_format_sealable_v<sealable_without_state_offset>);
  static_assert(!hf::is_cache_format_policy_v<sealable_without_state_offset>);
  static_assert(!hf::is_cache_format_policy_v<sealable_without_bit>);
  static_assert(hf::cache_format_records_data_end_v<end_without_offset>);
  static_assert(!hf::is_cache_format_policy_v<end_without_offset>);

  // the trait checks what is declared; where the word lies is check_cache_policies' static_assert
  static_assert(hf::cache_format_sealable_v<misaligned_state>);
  static_assert(hf::is_cache_format_policy_v<misaligned_state>);

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  static_assert(hf::cache_format_policy<sealed_user_format>);
  static_assert(hf::cache_format_policy<plain_user_format>);
  static_assert(hf::cache_format_policy<declared_false>);
  static_assert(!hf::cache_format_policy<sealable_without_state_offset>);
  static_assert(!hf::cache_format_policy<sealable_without_bit>);
  static_assert(!hf::cache_format_policy<end_without_offset>);
#endif
}
