// Cache file formats: CRC32C vectors, pfio golden bytes, interoperability with a pfio-format
// reader/writer (tests/pfio_compat.py, a format-level reimplementation: pfio itself cannot be
// installed here), the checked_format header, malformed files, corruption caught on get, and
// the syscall counts of the read paths.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <holdfast/cache.hpp>
#include <holdfast/detail/crc32c.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <string>
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
