// The file cache against the bare syscalls it is built on.
//
//   get of 64 B .. 64 KiB items in page cache:
//     mmap_read view (+ the copy any user makes) and mmap_read get_into  vs  memcpy from a bare
//     mmap of the file at a precomputed offset;
//     pread_read get_into / get                                          vs  one bare pread.
//   put without sync (flock, fstat, pwrite, entry store, unlock)         vs  a bare pwrite of the
//     data plus a bare pwrite of the 16-byte entry.
//   2-process concurrent put throughput (ns per put, both processes together) vs the same puts
//     made by one process.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <holdfast/cache.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"

namespace {

namespace hf = holdfast;

constexpr std::size_t kItems = 256;

// Keeps the compiler from dropping a copy nobody reads.
inline void clobber(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

hf::cache_options bench_options() {
  hf::cache_options o;
  const char* t = std::getenv("TMPDIR");
  o.dir = t && *t ? t : "/tmp";
  return o;
}

// One preserved pfio-format file of kItems items of `size` bytes, opened four ways.
struct get_fixture {
  std::size_t size;
  std::string path;
  std::unique_ptr<hf::multiprocess_file_cache> mm;
  std::unique_ptr<hf::basic_file_cache<hf::pread_read>> pr;
  std::unique_ptr<
      hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::checked_format>>
      checked;
  hf::unique_fd fd;
  char* map = nullptr;
  std::size_t map_size = 0;
  std::vector<std::uint64_t> offsets;
  std::string buf;

  explicit get_fixture(std::size_t n) : size(n), buf(n, '\0') {
    {
      hf::multiprocess_file_cache w(hf::create_cache, kItems, bench_options());
      hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::checked_format> c(
          hf::create_cache, kItems, bench_options());
      for (std::size_t i = 0; i < kItems; ++i) {
        std::string item(n, static_cast<char>('a' + i % 26));
        w.put(i, item);
        c.put(i, item);
      }
      path = w.path() + ".bench";
      w.preserve(path);
      c.preserve(path + ".checked");
    }
    mm = std::make_unique<hf::multiprocess_file_cache>(hf::preload_cache, path, kItems);
    pr = std::make_unique<hf::basic_file_cache<hf::pread_read>>(hf::preload_cache, path, kItems);
    checked = std::make_unique<std::remove_reference_t<decltype(*checked)>>(hf::preload_cache,
                                                                            path + ".checked");
    for (std::size_t i = 0; i < kItems; ++i) offsets.push_back(mm->entry(i)->offset);
    fd = hf::open_file(path, O_RDONLY);
    map_size = static_cast<std::size_t>(hf::stat_fd(fd).st_size);
    map = static_cast<char*>(::mmap(nullptr, map_size, PROT_READ, MAP_SHARED, fd.get(), 0));
  }
  ~get_fixture() {
    ::munmap(map, map_size);
    ::unlink(path.c_str());
    ::unlink((path + ".checked").c_str());
  }
};

get_fixture& fixture(std::size_t size) {
  static std::vector<std::unique_ptr<get_fixture>> all;
  for (auto& f : all)
    if (f->size == size) return *f;
  all.push_back(std::make_unique<get_fixture>(size));
  return *all.back();
}

void bare_mmap_copy(std::size_t size, std::size_t n) {
  auto& f = fixture(size);
  for (std::size_t i = 0; i < n; ++i) {
    std::memcpy(&f.buf[0], f.map + f.offsets[i % kItems], size);
    clobber(f.buf.data());
  }
}
void bare_pread(std::size_t size, std::size_t n) {
  auto& f = fixture(size);
  for (std::size_t i = 0; i < n; ++i) {
    (void)!::pread(f.fd.get(), &f.buf[0], size, static_cast<off_t>(f.offsets[i % kItems]));
    clobber(f.buf.data());
  }
}

void register_size(std::size_t size, const std::string& tag) {
  bench::registrar view{{"cache/get/" + tag + "/mmap_view+copy",
                         bench::timed([size](std::size_t n) {
                           auto& f = fixture(size);
                           for (std::size_t i = 0; i < n; ++i) {
                             auto v = f.mm->get(i % kItems);
                             std::memcpy(&f.buf[0], v->data(), v->size());
                             clobber(f.buf.data());
                           }
                         }),
                         "bare mmap memcpy " + tag,
                         bench::timed([size](std::size_t n) { bare_mmap_copy(size, n); })}};
  bench::registrar copy{{"cache/get/" + tag + "/mmap_get_into", bench::timed([size](std::size_t n) {
                           auto& f = fixture(size);
                           for (std::size_t i = 0; i < n; ++i) {
                             f.mm->get_into(i % kItems, f.buf);
                             clobber(f.buf.data());
                           }
                         }),
                         "bare mmap memcpy " + tag,
                         bench::timed([size](std::size_t n) { bare_mmap_copy(size, n); })}};
  bench::registrar pread_into{
      {"cache/get/" + tag + "/pread_get_into", bench::timed([size](std::size_t n) {
         auto& f = fixture(size);
         for (std::size_t i = 0; i < n; ++i) {
           f.pr->get_into(i % kItems, f.buf);
           clobber(f.buf.data());
         }
       }),
       "bare pread " + tag, bench::timed([size](std::size_t n) { bare_pread(size, n); })}};
  bench::registrar pread_owned{
      {"cache/get/" + tag + "/pread_get(owned)", bench::timed([size](std::size_t n) {
         auto& f = fixture(size);
         for (std::size_t i = 0; i < n; ++i) {
           auto v = f.pr->get(i % kItems);
           clobber(v->data());
         }
       }),
       "bare pread " + tag, bench::timed([size](std::size_t n) { bare_pread(size, n); })}};
  bench::registrar checked{{"cache/get/" + tag + "/checked_view(crc)+copy",
                            bench::timed([size](std::size_t n) {
                              auto& f = fixture(size);
                              for (std::size_t i = 0; i < n; ++i) {
                                auto v = f.checked->get(i % kItems);
                                std::memcpy(&f.buf[0], v->data(), v->size());
                                clobber(f.buf.data());
                              }
                            }),
                            "bare mmap memcpy " + tag,
                            bench::timed([size](std::size_t n) { bare_mmap_copy(size, n); })}};
}

// Registers every get size at static-initialization time.
const bool get_cases = [] {
  register_size(64, "64B");
  register_size(512, "512B");
  register_size(4096, "4KiB");
  register_size(65536, "64KiB");
  return true;
}();

// Puts of n items of `size` into a fresh cache (creation excluded from the time).
template <class Cache = hf::multiprocess_file_cache>
double cache_puts(std::size_t size, std::size_t n) {
  Cache c(hf::create_cache, n, bench_options());
  const std::string item(size, 'p');
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) c.put(i, item);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

// The same file shape written with bare pwrites: the data at the end, then the entry.
double bare_puts(std::size_t size, std::size_t n) {
  std::string path = bench_options().dir + "/holdfast-bench-bare-XXXXXX";
  int fd = ::mkstemp(&path[0]);
  std::string index(16 * n, '\0');
  for (std::size_t i = 0; i < n; ++i) std::memset(&index[16 * i + 8], 0xff, 8);
  (void)!::pwrite(fd, index.data(), index.size(), 0);
  const std::string item(size, 'p');
  auto t0 = std::chrono::steady_clock::now();
  std::uint64_t end = index.size();
  for (std::size_t i = 0; i < n; ++i) {
    (void)!::pwrite(fd, item.data(), size, static_cast<off_t>(end));
    std::uint64_t entry[2] = {end, size};
    (void)!::pwrite(fd, entry, 16, static_cast<off_t>(16 * i));
    end += size;
  }
  double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  ::unlink(path.c_str());
  return ns;
}

// Two forked processes putting into one cache (interleaved slots); the parent times both.
double two_process_puts(std::size_t size, std::size_t n) {
  hf::multiprocess_file_cache c(hf::create_cache, n, bench_options());
  const std::string item(size, 'p');
  auto t0 = std::chrono::steady_clock::now();
  pid_t kids[2];
  for (int k = 0; k < 2; ++k) {
    kids[k] = ::fork();
    if (kids[k] == 0) {
      for (std::size_t i = static_cast<std::size_t>(k); i < n; i += 2) c.put(i, item);
      ::_exit(0);
    }
  }
  for (pid_t p : kids) ::waitpid(p, nullptr, 0);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

bench::registrar put_512{
    {"cache/put/512B/no_sync", [](std::size_t n) { return cache_puts<>(512, n); },
     "bare pwrite data+entry 512B", [](std::size_t n) { return bare_puts(512, n); }}};
bench::registrar put_4k{
    {"cache/put/4KiB/no_sync", [](std::size_t n) { return cache_puts<>(4096, n); },
     "bare pwrite data+entry 4KiB", [](std::size_t n) { return bare_puts(4096, n); }}};
bench::registrar put_checked{
    {"cache/put/512B/checked_no_sync",
     [](std::size_t n) {
       return cache_puts<
           hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::checked_format>>(
           512, n);
     },
     "bare pwrite data+entry 512B", [](std::size_t n) { return bare_puts(512, n); }}};
bench::registrar put_file_cache{{"cache/put/512B/file_cache(mutex)",
                                 [](std::size_t n) { return cache_puts<hf::file_cache>(512, n); },
                                 "bare pwrite data+entry 512B",
                                 [](std::size_t n) { return bare_puts(512, n); }}};
bench::registrar put_2p{{"cache/put/512B/2_processes(throughput)",
                         [](std::size_t n) { return two_process_puts(512, n); },
                         "1 process puts 512B",
                         [](std::size_t n) { return cache_puts<>(512, n); }}};

}  // namespace
