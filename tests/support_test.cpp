// The test support itself: kill_io reaches every file call of the Io policy, an etcd started by a
// test does not outlive the test process (CTest's TIMEOUT ends a test with SIGTERM, then SIGKILL;
// a crash ends it with SIGKILL), and thread_state sees which thread sleeps in poll() and which
// threads run since a baseline of ids.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/etcd_server.hpp"
#include "support/kill_io.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

using holdfast_test::kill_io;

TEST_CASE("kill_io counts openat, unlinkat and flock, so a kill can land on them") {
  holdfast_test::temp_dir dir("killio");
  const std::string f = dir / "f";
  kill_io::arm(0);
  int fd = kill_io::openat(AT_FDCWD, f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  CHECK(kill_io::calls() == 1);
  CHECK(kill_io::flock(fd, LOCK_EX) == 0);
  CHECK(kill_io::calls() == 2);
  CHECK(kill_io::unlinkat(AT_FDCWD, f.c_str(), 0) == 0);
  CHECK(kill_io::calls() == 3);
  ::close(fd);

  // The armed kill lands on each of them (a real SIGKILL in a forked child).
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    int pre = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(pre >= 0);
    holdfast_test::child c([&] {
      kill_io::arm(1);
      if (which == 0) (void)kill_io::openat(AT_FDCWD, f.c_str(), O_RDONLY | O_CLOEXEC, 0);
      if (which == 1) (void)kill_io::unlinkat(AT_FDCWD, f.c_str(), 0);
      if (which == 2) (void)kill_io::flock(pre, LOCK_EX);
      CHILD_REQUIRE(false);  // not reached: call 1 kills
    });
    auto r = c.wait(std::chrono::seconds(30));
    CHECK(r.term_signal == SIGKILL);
    CHECK(r.failures.empty());
    CHECK(std::filesystem::exists(f));  // the unlinkat never ran
    ::close(pre);
  }
}

namespace {

// A symlink's target under /proc ("" when unreadable).
std::string proc_link(const std::string& p) {
  std::error_code ec;
  auto t = std::filesystem::read_symlink(p, ec);
  return ec ? std::string() : t.string();
}

// The value after `flag` in a process's command line ("" when absent).
std::string cmdline_arg(pid_t pid, const std::string& flag) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string arg;
  bool next = false;
  while (std::getline(in, arg, '\0')) {
    if (next) return arg;
    next = arg == flag;
  }
  return "";
}

// Removes `dir` when it is a holdfast scratch directory (the parent cleans up what the killed
// child could not).
void remove_scratch(const std::filesystem::path& dir) {
  if (dir.filename().string().rfind("holdfast-", 0) != 0) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace

TEST_CASE("an etcd started by a test process dies with it when that process is SIGKILLed") {
  // The invariant: no etcd outlives the test process that started it. A child test process
  // starts an etcd on its main thread, reports its pid, and is killed by SIGKILL (what CTest's
  // TIMEOUT ends with); the etcd must be gone within a bound far above its exit time.
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  holdfast_test::child c([&] {
    ::close(p[0]);
    holdfast_test::etcd_server server;
    pid_t pid = server.pid();
    CHILD_REQUIRE(::write(p[1], &pid, sizeof pid) == static_cast<ssize_t>(sizeof pid));
    for (;;) ::pause();  // killed here
  });
  ::close(p[1]);
  pid_t etcd = 0;
  ssize_t n;
  do n = ::read(p[0], &etcd, sizeof etcd);
  while (n < 0 && errno == EINTR);
  ::close(p[0]);
  REQUIRE(n == static_cast<ssize_t>(sizeof etcd));
  REQUIRE(etcd > 0);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, etcd, 0));
  REQUIRE(pidfd >= 0);
  // Where the killed child's etcd keeps its data and log, to remove them afterwards.
  const std::filesystem::path data = cmdline_arg(etcd, "--data-dir");
  const std::filesystem::path log = proc_link("/proc/" + std::to_string(etcd) + "/fd/1");

  c.kill(SIGKILL);
  auto r = c.wait(std::chrono::seconds(30));
  CHECK(r.term_signal == SIGKILL);

  pollfd pfd{pidfd, POLLIN, 0};
  do n = ::poll(&pfd, 1, 10000);  // etcd dies within milliseconds of its parent
  while (n < 0 && errno == EINTR);
  CHECK_MESSAGE(n == 1, "etcd " << etcd << " outlived the test process that started it");
  if (n != 1) {  // do not leak it ourselves
    ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    pfd.revents = 0;
    ::poll(&pfd, 1, 10000);
  }
  ::close(pidfd);
  if (!data.empty()) remove_scratch(data.parent_path());
  if (!log.empty()) remove_scratch(log.parent_path());
}

TEST_CASE("thread_state counts the threads started since a set of ids, each count waited for") {
  using std::chrono::milliseconds;
  const auto before = holdfast_test::thread_ids();
  std::atomic<bool> stop{false};
  std::vector<std::thread> started;
  for (int i = 0; i < 2; ++i)
    started.emplace_back([&] {
      while (!stop.load()) std::this_thread::sleep_for(milliseconds(1));
    });
  CHECK(holdfast_test::settled_new_threads(before, 2).size() == 2);
  // a count that never comes: what the last look saw, after the deadline
  CHECK(holdfast_test::settled_new_threads(before, 3, milliseconds(50)).size() == 2);
  CHECK(holdfast_test::settled_new_threads(before, 0, milliseconds(50)).size() == 2);
  const auto with_both = holdfast_test::thread_ids();
  stop.store(true);
  for (auto& t : started) t.join();
  CHECK(holdfast_test::settled_new_threads(before, 0).size() == 0);
  // threads of a baseline that go (however late the kernel releases them) are never new
  CHECK(holdfast_test::new_threads(with_both).size() == 0);
}

TEST_CASE("thread_state tells a thread asleep in poll() from one asleep elsewhere") {
  // Each thread names itself (a diff of /proc/self/task would also see a sanitizer's own
  // background thread, which ThreadSanitizer starts with the first thread the test makes).
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  std::atomic<bool> stop{false};
  std::atomic<pid_t> poller{0}, sleeper{0};
  std::thread in_poll([&] {
    poller.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    pollfd pfd{p[0], POLLIN, 0};
    ::poll(&pfd, 1, 30000);  // until the write below
  });
  std::thread in_nanosleep([&] {
    sleeper.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((poller.load() == 0 || sleeper.load() == 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(poller.load() != 0);
  REQUIRE(sleeper.load() != 0);
  CHECK(holdfast_test::wait_asleep_in_poll({poller.load()}, std::chrono::seconds(10)));
  CHECK_FALSE(holdfast_test::asleep_in_poll(sleeper.load()));
  CHECK_FALSE(holdfast_test::wait_asleep_in_poll({sleeper.load()}, std::chrono::milliseconds(200)));
  char c = 1;
  CHECK(::write(p[1], &c, 1) == 1);
  in_poll.join();
  stop.store(true);
  in_nanosleep.join();
  ::close(p[0]);
  ::close(p[1]);
}
