// Publishing and waiting: publish of 4 KiB and 1 MiB under each Durability against the same
// protocol written with bare syscalls, and await_file's wake-up latency (publish -> return),
// inotify against polling.
//
// The files live in $TMPDIR (default /tmp): a real disk, so the syncs cost what they cost.
#include <fcntl.h>
#include <stdlib.h>  // mkdtemp
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <holdfast/publish.hpp>
#include <holdfast/wait.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"

namespace {

struct scratch_dir {
  std::string path;
  scratch_dir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/holdfast-bench-publish-XXXXXX";
    if (::mkdtemp(&tmpl[0])) path = tmpl;
  }
  ~scratch_dir() {
    try {
      holdfast::detail::remove_tree<holdfast::posix_io>(path);
    } catch (...) {
    }
  }
};

scratch_dir& scratch() {
  static scratch_dir d;
  return d;
}

const std::string& payload(std::size_t n) {
  static const std::string small(4096, 's'), large(1 << 20, 'L');
  return n == small.size() ? small : large;
}

// The bare protocol: temp, full write, fchmod, file sync, close, rename, directory sync. No
// error handling, no cleanup, no rollback backup: the floor holdfast is measured against.
enum class bare_sync { none, data, full };
void bare_publish(const std::string& dir, const std::string& target, const std::string& bytes,
                  bare_sync sync, bool dir_sync) {
  // A unique temp per publish, as any correct hand-written version needs (concurrent publishers
  // must not share one); a fixed name would also let the kernel reuse a cached dentry.
  static unsigned long counter = 0;
  std::string temp =
      dir + "/.bare-tmp." + std::to_string(::getpid()) + "." + std::to_string(++counter);
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w <= 0) break;
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  (void)::fchmod(fd, 0644);
  if (sync == bare_sync::full) (void)::fsync(fd);
  if (sync == bare_sync::data) (void)::fdatasync(fd);
  (void)::close(fd);
  (void)::rename(temp.c_str(), target.c_str());
  if (dir_sync) {
    int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    (void)::fsync(d);
    (void)::close(d);
  }
}

template <class D>
bench::measure publish_case(std::size_t size) {
  return bench::timed([size](std::size_t n) {
    const holdfast::basic_publisher<D> pub;
    const std::string target = scratch().path + "/target";
    for (std::size_t i = 0; i < n; ++i) pub.publish(target, payload(size));
  });
}

bench::measure bare_case(std::size_t size, bare_sync sync, bool dir_sync) {
  return bench::timed([=](std::size_t n) {
    const std::string target = scratch().path + "/bare-target";
    for (std::size_t i = 0; i < n; ++i)
      bare_publish(scratch().path, target, payload(size), sync, dir_sync);
  });
}

bench::config sync_cfg() {
  bench::config c;
  c.repetitions = 11;
  c.min_rep_ms = 50;
  return c;
}

bench::registrar r1{{"publish/4KiB/durable", publish_case<holdfast::durable>(4096),
                     "bare 4KiB write+fsync+rename+dirsync", bare_case(4096, bare_sync::full, true),
                     sync_cfg()}};
bench::registrar r2{{"publish/1MiB/durable", publish_case<holdfast::durable>(1 << 20),
                     "bare 1MiB write+fsync+rename+dirsync",
                     bare_case(1 << 20, bare_sync::full, true), sync_cfg()}};
bench::registrar r3{{"publish/4KiB/data_only", publish_case<holdfast::data_only>(4096),
                     "bare 4KiB write+fdatasync+rename", bare_case(4096, bare_sync::data, false),
                     sync_cfg()}};
bench::registrar r4{{"publish/1MiB/data_only", publish_case<holdfast::data_only>(1 << 20),
                     "bare 1MiB write+fdatasync+rename", bare_case(1 << 20, bare_sync::data, false),
                     sync_cfg()}};
bench::registrar r5{{"publish/4KiB/no_sync", publish_case<holdfast::no_sync>(4096),
                     "bare 4KiB write+rename", bare_case(4096, bare_sync::none, false)}};
bench::registrar r6{{"publish/1MiB/no_sync", publish_case<holdfast::no_sync>(1 << 20),
                     "bare 1MiB write+rename", bare_case(1 << 20, bare_sync::none, false)}};

// Wake-up latency: a waiter is blocked in `wait(target)`; the clock starts just before the
// publish and stops when the wait returns. Per operation, nanoseconds from publish to return.
template <class WaitFn>
double wake_latency(std::size_t n, const std::string& name, WaitFn wait) {
  const std::string target = scratch().path + "/" + name;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ::unlink(target.c_str());
    std::chrono::steady_clock::time_point returned;
    std::thread waiter([&] {
      auto got = wait(target);
      returned = std::chrono::steady_clock::now();
      (void)got;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // let it block
    auto published = std::chrono::steady_clock::now();
    holdfast::basic_publisher<holdfast::no_sync>().publish(target, "ready");
    waiter.join();
    total += std::chrono::duration<double, std::nano>(returned - published).count();
  }
  return total;
}

template <class Wait>
double one_shot_latency(std::size_t n) {
  return wake_latency(n, "one-shot", [](const std::string& t) {
    return holdfast::await_file<Wait>(t, std::chrono::seconds(5));
  });
}

double kept_waiter_latency(std::size_t n) {
  static holdfast::file_waiter waiter;  // one inotify descriptor for every wait
  return wake_latency(
      n, "kept", [](const std::string& t) { return waiter.await(t, std::chrono::seconds(5)); });
}

// The same wake-up written with bare inotify: watch, poll, open, read.
double bare_inotify_latency(std::size_t n) {
  const std::string dir = scratch().path;
  const std::string target = dir + "/awaited-bare";
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ::unlink(target.c_str());
    std::chrono::steady_clock::time_point returned;
    std::thread waiter([&] {
      int in = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
      ::inotify_add_watch(in, dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE);
      for (;;) {
        int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
          char buf[64];
          (void)!::read(fd, buf, sizeof buf);
          ::close(fd);
          break;
        }
        pollfd p{in, POLLIN, 0};
        ::poll(&p, 1, 500);
        char ev[4096];
        while (::read(in, ev, sizeof ev) > 0) {
        }
      }
      returned = std::chrono::steady_clock::now();
      ::close(in);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    auto published = std::chrono::steady_clock::now();
    holdfast::basic_publisher<holdfast::no_sync>().publish(target, "ready");
    waiter.join();
    total += std::chrono::duration<double, std::nano>(returned - published).count();
  }
  return total;
}

bench::config latency_cfg() {
  bench::config c;
  c.iterations = 1;
  c.repetitions = 41;
  c.warmup = 2;
  return c;
}

bench::registrar w1{{"publish/wake-up/file_waiter (inotify, kept)", kept_waiter_latency,
                     "await_file<poll_wait>", one_shot_latency<holdfast::poll_wait>,
                     latency_cfg()}};
bench::registrar w2{{"publish/wake-up/file_waiter (inotify, kept) vs bare", kept_waiter_latency,
                     "bare inotify+poll+open+read", bare_inotify_latency, latency_cfg()}};
bench::registrar w3{{"publish/wake-up/await_file<inotify_wait>",
                     one_shot_latency<holdfast::inotify_wait>, "await_file<poll_wait>",
                     one_shot_latency<holdfast::poll_wait>, latency_cfg()}};

}  // namespace
