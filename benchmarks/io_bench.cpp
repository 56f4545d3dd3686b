// POSIX layer: the full-transfer loops against the bare syscalls they wrap.
#include <holdfast/io.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "bench.hpp"

namespace {

struct scratch_file {
  std::string path;
  holdfast::unique_fd fd;
  explicit scratch_file(std::size_t size) {
    char tmpl[] = "/tmp/holdfast-bench-io-XXXXXX";
    int raw = ::mkstemp(tmpl);
    path = tmpl;
    fd = holdfast::unique_fd(raw, path);
    std::vector<char> data(size, 'x');
    holdfast::pwrite_all(fd, data.data(), data.size(), 0);
  }
  ~scratch_file() { ::unlink(path.c_str()); }
};

constexpr std::size_t kItem = 4096;
scratch_file& file() {
  static scratch_file f(1 << 20);
  return f;
}

bench::registrar pread_case{
    {"io/pread_full/4KiB", bench::timed([](std::size_t n) {
       char buf[kItem];
       for (std::size_t i = 0; i < n; ++i)
         holdfast::pread_full(file().fd, buf, kItem, static_cast<off_t>((i % 256) * kItem));
     }),
     "bare pread 4KiB", bench::timed([](std::size_t n) {
       char buf[kItem];
       for (std::size_t i = 0; i < n; ++i)
         (void)!::pread(file().fd.get(), buf, kItem, static_cast<off_t>((i % 256) * kItem));
     })}};

bench::registrar pwrite_case{
    {"io/pwrite_all/4KiB", bench::timed([](std::size_t n) {
       static const std::vector<char> buf(kItem, 'y');
       for (std::size_t i = 0; i < n; ++i)
         holdfast::pwrite_all(file().fd, buf.data(), kItem, static_cast<off_t>((i % 256) * kItem));
     }),
     "bare pwrite 4KiB", bench::timed([](std::size_t n) {
       static const std::vector<char> buf(kItem, 'y');
       for (std::size_t i = 0; i < n; ++i)
         (void)!::pwrite(file().fd.get(), buf.data(), kItem, static_cast<off_t>((i % 256) * kItem));
     })}};

}  // namespace
