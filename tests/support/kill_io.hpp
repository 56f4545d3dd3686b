// tests/support/kill_io.hpp — an Io policy that SIGKILLs its own process at the k-th file call.
//
// Crash tests run a protocol in a forked child with `kill_io::arm(k)`: the child dies by a real
// SIGKILL just before its k-th system call (open, write, fsync, rename, unlink, ...), so every
// point of the protocol can be hit, not only the ones a timer happens to land on. Every file call
// of the Io policy counts, the *at forms and flock included (the tree removal and the cache lock
// go through openat, unlinkat and flock); only memory mapping and sockets do not. With no kill
// armed it only counts calls (`kill_io::calls()`), which tells the test how many points exist.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <holdfast/io.hpp>

namespace holdfast_test {

/// posix_io, counting every file call and killing the process at the armed one.
struct kill_io : holdfast::posix_io {
  /// Dies by SIGKILL just before call number `k` (1-based, counted from now); 0 disarms.
  static void arm(std::uint64_t k) noexcept {
    count().store(0);
    target().store(k);
  }
  /// Calls made since the last arm.
  static std::uint64_t calls() noexcept { return count().load(); }

  static int open(const char* p, int f, mode_t m) noexcept {
    tick();
    return posix_io::open(p, f, m);
  }
  static int close(int fd) noexcept {
    tick();
    return posix_io::close(fd);
  }
  static ssize_t read(int fd, void* b, std::size_t n) noexcept {
    tick();
    return posix_io::read(fd, b, n);
  }
  static ssize_t write(int fd, const void* b, std::size_t n) noexcept {
    tick();
    // Half of a large write first, so a kill can also land between two halves of one file.
    return posix_io::write(fd, b, n > 4096 ? n / 2 : n);
  }
  static int fsync(int fd) noexcept {
    tick();
    return posix_io::fsync(fd);
  }
  static int fdatasync(int fd) noexcept {
    tick();
    return posix_io::fdatasync(fd);
  }
  static int fchmod(int fd, mode_t m) noexcept {
    tick();
    return posix_io::fchmod(fd, m);
  }
  static int fstat(int fd, struct stat* st) noexcept {
    tick();
    return posix_io::fstat(fd, st);
  }
  static int stat(const char* p, struct stat* st) noexcept {
    tick();
    return posix_io::stat(p, st);
  }
  static int lstat(const char* p, struct stat* st) noexcept {
    tick();
    return posix_io::lstat(p, st);
  }
  static int rename(const char* a, const char* b) noexcept {
    tick();
    return posix_io::rename(a, b);
  }
  static int renameat2(int od, const char* a, int nd, const char* b, unsigned f) noexcept {
    tick();
    return posix_io::renameat2(od, a, nd, b, f);
  }
  static int link(const char* a, const char* b) noexcept {
    tick();
    return posix_io::link(a, b);
  }
  static int unlink(const char* p) noexcept {
    tick();
    return posix_io::unlink(p);
  }
  static int openat(int d, const char* p, int f, mode_t m) noexcept {
    tick();
    return posix_io::openat(d, p, f, m);
  }
  static int fstatat(int d, const char* p, struct stat* st, int f) noexcept {
    tick();
    return posix_io::fstatat(d, p, st, f);
  }
  static int unlinkat(int d, const char* p, int f) noexcept {
    tick();
    return posix_io::unlinkat(d, p, f);
  }
  static int linkat(int od, const char* a, int nd, const char* b, int f) noexcept {
    tick();
    return posix_io::linkat(od, a, nd, b, f);
  }
  static int flock(int fd, int op) noexcept {
    tick();
    return posix_io::flock(fd, op);
  }
  static int fcntl(int fd, int cmd, int arg) noexcept {
    tick();
    return posix_io::fcntl(fd, cmd, arg);
  }
  static int ftruncate(int fd, off_t size) noexcept {
    tick();
    return posix_io::ftruncate(fd, size);
  }
  static ssize_t pread(int fd, void* b, std::size_t n, off_t off) noexcept {
    tick();
    return posix_io::pread(fd, b, n, off);
  }
  static ssize_t pwrite(int fd, const void* b, std::size_t n, off_t off) noexcept {
    tick();
    return posix_io::pwrite(fd, b, n, off);
  }
  static DIR* fdopendir(int fd) noexcept {
    tick();
    return posix_io::fdopendir(fd);
  }
  static int closedir(DIR* d) noexcept {
    tick();
    return posix_io::closedir(d);
  }
  static int mkdir(const char* p, mode_t m) noexcept {
    tick();
    return posix_io::mkdir(p, m);
  }
  static int rmdir(const char* p) noexcept {
    tick();
    return posix_io::rmdir(p);
  }
  static DIR* opendir(const char* p) noexcept {
    tick();
    return posix_io::opendir(p);
  }
  static struct dirent* readdir(DIR* d) noexcept {
    tick();
    return posix_io::readdir(d);
  }

 private:
  static std::atomic<std::uint64_t>& count() noexcept {
    static std::atomic<std::uint64_t> c{0};
    return c;
  }
  static std::atomic<std::uint64_t>& target() noexcept {
    static std::atomic<std::uint64_t> t{0};
    return t;
  }
  static void tick() noexcept {
    auto n = count().fetch_add(1) + 1;
    if (n == target().load()) ::raise(SIGKILL);
  }
};

}  // namespace holdfast_test
