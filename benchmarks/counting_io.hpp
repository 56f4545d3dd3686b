// benchmarks/counting_io.hpp — an Io policy (io.hpp) that counts, per thread, what a store costs
// the filesystem: files created (an open or openat with O_CREAT that succeeded), directories
// created (a mkdir that succeeded) and inotify wake-ups (a read of an inotify descriptor that
// returned events: one per take() that found something). Everything else is posix_io.
//
// Guarantees:
//   - Counts are per thread (the handler's watcher thread is one worker's), read with
//     counting_io::snapshot(), thread-safely; counting_io::reset() zeroes them.
// Caveats:
//   - Only the syscalls that go through the Io policy are seen. A kv get that waits reads its
//     own inotify descriptor through the Io policy too (await_file<Wait, Io>), so its wake-ups
//     count as well.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <holdfast/io.hpp>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace bench {

/// What one thread made the filesystem do.
struct fs_counts {
  std::uint64_t files = 0;    ///< files created (O_CREAT)
  std::uint64_t dirs = 0;     ///< directories created (mkdir)
  std::uint64_t wakeups = 0;  ///< inotify reads that returned events
};

/// posix_io, counting per thread (see the top of this file).
struct counting_io : holdfast::posix_io {
  static int open(const char* path, int flags, mode_t mode) noexcept {
    const int fd = holdfast::posix_io::open(path, flags, mode);
    if (fd >= 0 && (flags & O_CREAT)) bump(&fs_counts::files);
    return fd;
  }
  static int openat(int dir, const char* path, int flags, mode_t mode) noexcept {
    const int fd = holdfast::posix_io::openat(dir, path, flags, mode);
    if (fd >= 0 && (flags & O_CREAT)) bump(&fs_counts::files);
    return fd;
  }
  static int mkdir(const char* path, mode_t mode) noexcept {
    const int r = holdfast::posix_io::mkdir(path, mode);
    if (r == 0) bump(&fs_counts::dirs);
    return r;
  }
  static int inotify_init1(int flags) noexcept {
    const int fd = holdfast::posix_io::inotify_init1(flags);
    if (fd >= 0) {
      std::lock_guard<std::mutex> lock(state().mutex);
      state().inotify.push_back(fd);
    }
    return fd;
  }
  static int close(int fd) noexcept {
    {
      std::lock_guard<std::mutex> lock(state().mutex);
      auto& v = state().inotify;
      v.erase(std::remove(v.begin(), v.end(), fd), v.end());
    }
    return holdfast::posix_io::close(fd);
  }
  static ssize_t read(int fd, void* buf, std::size_t n) noexcept {
    const ssize_t r = holdfast::posix_io::read(fd, buf, n);
    if (r > 0) {
      std::lock_guard<std::mutex> lock(state().mutex);
      auto& v = state().inotify;
      if (std::find(v.begin(), v.end(), fd) != v.end())
        ++state().counts[std::this_thread::get_id()].wakeups;
    }
    return r;
  }

  /// Every thread's counts so far.
  static std::map<std::thread::id, fs_counts> snapshot() {
    std::lock_guard<std::mutex> lock(state().mutex);
    return state().counts;
  }
  /// Zeroes every count.
  static void reset() {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().counts.clear();
  }

 private:
  struct shared {
    std::mutex mutex;
    std::vector<int> inotify;  // open inotify descriptors
    std::map<std::thread::id, fs_counts> counts;
  };
  static shared& state() {
    static shared s;
    return s;
  }
  static void bump(std::uint64_t fs_counts::*field) noexcept {
    std::lock_guard<std::mutex> lock(state().mutex);
    ++(state().counts[std::this_thread::get_id()].*field);
  }
};

}  // namespace bench
