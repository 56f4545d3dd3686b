// Waiting for published files: a file that appears later, timeouts at the deadline (checked at
// 1.5 x), the inotify fallback to polling (inotify failed through fault_io), one descriptor per
// read, custom intervals, and copy_to_local.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <holdfast/publish.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <holdfast/wait.hpp>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/child.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::disarm_on_exit;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// Where a waiter sleeps: inotify_wait in poll() on its descriptor, a polling wait (poll_wait,
// or inotify_wait fallen back to polling) in the sleep between its tries.
std::vector<long> in_poll() { return holdfast_test::poll_syscalls(); }
std::vector<long> in_sleep() { return {SYS_clock_nanosleep, SYS_nanosleep}; }
template <class W>
std::vector<long> asleep_in() {
  return std::is_same_v<W, holdfast::inotify_wait> ? in_poll() : in_sleep();
}

// A child that publishes `content` at `path` once the thread that made it (which goes on to
// wait for the file) is observed asleep in its wait (in one of `calls`). An observer thread here
// looks (/proc/self/task: a child may not read its parent's syscall under Yama) and tells the
// child through a pipe; the wait is under way first, observed, not assumed after a sleep.
class publish_later {
 public:
  publish_later(const std::string& path, const std::string& content, std::vector<long> calls,
                bool make_parent = false)
      : waiter_(holdfast_test::this_thread_id()), child_(start(path, content, make_parent)) {
    ::close(go_[0]);
    observer_ = std::thread([this, calls] {
      const bool asleep = holdfast_test::wait_asleep_in({waiter_}, calls, 10s);
      (void)!::write(go_[1], asleep ? "g" : "n", 1);
      ::close(go_[1]);
    });
  }
  publish_later(const publish_later&) = delete;
  publish_later& operator=(const publish_later&) = delete;
  ~publish_later() {
    if (observer_.joinable()) observer_.join();
  }
  holdfast_test::child_result wait(std::chrono::milliseconds timeout) {
    if (observer_.joinable()) observer_.join();
    return child_.wait(timeout);
  }

 private:
  holdfast_test::child start(const std::string& path, const std::string& content,
                             bool make_parent) {
    REQUIRE(::pipe2(go_, O_CLOEXEC) == 0);
    const int in = go_[0], out = go_[1];
    return holdfast_test::child([=] {
      ::close(out);
      pollfd p{in, POLLIN, 0};
      CHILD_REQUIRE(::poll(&p, 1, 20000) == 1);  // a deadline, beyond the observer's 10 s
      char c = 0;
      CHILD_REQUIRE(::read(in, &c, 1) == 1 && c == 'g');  // the waiter was seen asleep
      if (make_parent)
        CHILD_REQUIRE(::mkdir(holdfast::detail::split_path(path).first.c_str(), 0755) == 0);
      holdfast::basic_publisher<holdfast::no_sync>().publish(path, content);
    });
  }

  int go_[2] = {-1, -1};
  pid_t waiter_;
  holdfast_test::child child_;
  std::thread observer_;
};

// A polling policy with long intervals: await_file must use the derived policy's values.
struct slow_poll : holdfast::poll_wait {
  static constexpr std::chrono::milliseconds initial_interval{200};
  static constexpr std::chrono::milliseconds max_interval{200};
};

}  // namespace

TEST_CASE_TEMPLATE("await_file returns the content once the file is published", W,
                   holdfast::inotify_wait, holdfast::poll_wait) {
  holdfast_test::temp_dir dir("await");
  const std::string path = dir / "command.json";
  publish_later writer(path, "{\"epochs\":3}", asleep_in<W>());
  auto got = holdfast::await_file<W>(path, 10s);  // observed asleep in it before the publish
  REQUIRE(got);
  CHECK(*got == "{\"epochs\":3}");
  CHECK(writer.wait(5s).ok());
  // an existing file returns at once
  auto t0 = clock_type::now();
  CHECK(holdfast::await_file<W>(path, 10s) == std::string("{\"epochs\":3}"));
  CHECK(ms_since(t0) < 2000);  // at once: a fifth of the 10 s it would wait
  // an empty file is content, not absence
  holdfast::publisher().publish(dir / "empty", "");
  CHECK(holdfast::await_file<W>(dir / "empty", 10ms) == std::string());
}

// A timeout is checked at 1.5 x its value (the house rule on a loaded 2-core machine); 250 ms
// tells slow_poll's tries (0, 200, 400 ms) apart from a sleep cut at the deadline: a waiter that
// slept a whole interval past it would return at 400 ms, 1.6 x.
TEST_CASE_TEMPLATE("a timeout returns at the deadline, not an interval past it", W,
                   holdfast::inotify_wait, holdfast::poll_wait, slow_poll) {
  holdfast_test::temp_dir dir("timeout");
  for (auto timeout : {500ms, 250ms}) {
    CAPTURE(timeout.count());
    auto t0 = clock_type::now();
    auto got = holdfast::await_file<W>(dir / "never", timeout);
    double took = ms_since(t0);
    CHECK_FALSE(got);
    CHECK(took >= static_cast<double>(timeout.count()));
    CHECK(took < static_cast<double>(timeout.count()) * 1.5);
  }
  CHECK_FALSE(holdfast::await_file<W>(dir / "never", 0ms));
}

TEST_CASE("inotify_wait falls back to polling where inotify cannot be used") {
  holdfast_test::temp_dir dir("fallback");
  disarm_on_exit guard;
  using waiter = holdfast::inotify_wait;

  SUBCASE("inotify works: woken through poll on the inotify descriptor") {
    fault_plan::reset_counts();
    publish_later writer(dir / "a", "A", in_poll());
    CHECK(holdfast::await_file<waiter, fault_io>(dir / "a", 10s) == std::string("A"));
    CHECK(fault_plan::calls(io_op::inotify_init1) == 1);
    CHECK(fault_plan::calls(io_op::inotify_add_watch) == 1);
    CHECK(fault_plan::calls(io_op::poll) >= 1);
    CHECK(writer.wait(5s).ok());
  }
  SUBCASE("inotify_init1 fails (ENOSYS, EMFILE): polling finds the file") {
    for (int e : {ENOSYS, EMFILE}) {
      fault_plan::arm(fault{io_op::inotify_init1, 1, e});
      publish_later writer(dir / ("b" + std::to_string(e)), "B", in_sleep());
      CHECK(holdfast::await_file<waiter, fault_io>(dir / ("b" + std::to_string(e)), 10s) ==
            std::string("B"));
      CHECK(fault_plan::failures() == 1);
      CHECK(fault_plan::last_failed() == io_op::inotify_init1);
      CHECK(fault_plan::calls(io_op::poll) == 0);  // the polling loop, not the inotify loop
      CHECK(fault_plan::calls(io_op::open) > 1);   // re-tried at intervals
      CHECK(writer.wait(5s).ok());
    }
  }
  SUBCASE("inotify_add_watch fails (ENOSPC: watch limit): polling finds the file") {
    fault_plan::arm(fault{io_op::inotify_add_watch, 1, ENOSPC});
    publish_later writer(dir / "c", "C", in_sleep());
    CHECK(holdfast::await_file<waiter, fault_io>(dir / "c", 10s) == std::string("C"));
    CHECK(fault_plan::failures() == 1);
    CHECK(fault_plan::calls(io_op::poll) == 0);
    CHECK(writer.wait(5s).ok());
  }
  SUBCASE("the parent directory does not exist yet: polling until it and the file appear") {
    fault_plan::reset_counts();
    publish_later writer(dir / "later/d", "D", in_sleep(), true);
    CHECK(holdfast::await_file<waiter, fault_io>(dir / "later/d", 10s) == std::string("D"));
    CHECK(fault_plan::calls(io_op::poll) == 0);
    CHECK(writer.wait(5s).ok());
  }
  SUBCASE("the fallback still honours the deadline") {
    fault_plan::arm(fault{io_op::inotify_init1, 1, ENOSYS});
    auto t0 = clock_type::now();
    CHECK_FALSE(holdfast::await_file<waiter, fault_io>(dir / "never", 400ms));
    double took = ms_since(t0);
    CHECK(took >= 400);
    CHECK(took < 400 * 1.5);  // a timeout is checked at 1.5 x its value
  }
}

TEST_CASE("await_file reads through one descriptor and reports real errors") {
  holdfast_test::temp_dir dir("onefd");
  disarm_on_exit guard;
  const std::string big(300000, 'q');
  holdfast::publisher().publish(dir / "f", big);
  fault_plan::reset_counts();
  CHECK(holdfast::await_file<holdfast::poll_wait, fault_io>(dir / "f", 1s) == big);
  CHECK(fault_plan::calls(io_op::open) == 1);
  CHECK(fault_plan::calls(io_op::close) == 1);
  CHECK(fault_plan::calls(io_op::stat) == 0);
  CHECK(fault_plan::calls(io_op::read) >= 5);  // all through that one descriptor
  // a read error is an error, not "absent"
  fault_plan::arm(fault{io_op::read, 2, EIO});
  try {
    (void)holdfast::await_file<holdfast::poll_wait, fault_io>(dir / "f", 1s);
    FAIL("no error");
  } catch (const holdfast::error& e) {
    CHECK(e.operation() == "read");
    CHECK(e.errnum() == EIO);
  }
  fault_plan::disarm();
  // a path under a regular file can never appear: ENOTDIR, at once
  try {
    (void)holdfast::await_file(dir / "f/child", 5s);
    FAIL("no error");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ENOTDIR);
    CHECK(e.operation() == "open");
  }
}

TEST_CASE("derived wait policies use their own intervals") {
  holdfast_test::temp_dir dir("intervals");
  disarm_on_exit guard;
  fault_plan::reset_counts();
  CHECK_FALSE(holdfast::await_file<slow_poll, fault_io>(dir / "none", 500ms));
  auto slow_opens = fault_plan::calls(io_op::open);
  fault_plan::reset_counts();
  CHECK_FALSE(holdfast::await_file<holdfast::poll_wait, fault_io>(dir / "none", 500ms));
  auto fast_opens = fault_plan::calls(io_op::open);
  CHECK(slow_opens <= 4);  // 0, 200, 400, 500 ms
  CHECK(fast_opens > slow_opens);
}

TEST_CASE("copy_to_local: a private local copy, removed when dropped") {
  holdfast_test::temp_dir dir("local"), local("localdst");
  std::string content;
  for (int i = 0; i < 300000; ++i) content += static_cast<char>('a' + i % 26);  // > one chunk
  content += std::string(1 << 20, 'z');
  holdfast::publisher().publish(dir / "shard.bin", content);
  std::string kept;
  {
    auto copy = holdfast::copy_to_local(dir / "shard.bin", local.path());
    REQUIRE(copy);
    CHECK(copy.path().find(local.path() + "/") == 0);
    auto fd = holdfast::open_file(copy.path(), O_RDONLY);
    CHECK(holdfast::read_all(fd) == content);
    struct stat st {};
    REQUIRE(::stat(copy.path().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    // a forked child that drops its copy of the handle does not remove the file
    holdfast_test::child c([&] { copy.reset(); });
    CHECK(c.wait(5s).ok());
    CHECK(exists(copy.path()));
    kept = copy.path();
    auto moved = std::move(copy);
    CHECK_FALSE(copy);
    CHECK(moved.path() == kept);
  }
  CHECK_FALSE(exists(kept));
  {
    auto copy = holdfast::copy_to_local(dir / "shard.bin", local.path());
    kept = copy.release();
  }
  CHECK(exists(kept));
  ::unlink(kept.c_str());
  // the default directory is $TMPDIR or /tmp
  auto tmp = holdfast::copy_to_local(dir / "shard.bin");
  CHECK(exists(tmp.path()));
  CHECK_THROWS_AS(holdfast::copy_to_local(dir / "missing", local.path()), holdfast::error);
}

TEST_CASE("copy_to_local: a failure at any call leaves nothing behind") {
  holdfast_test::temp_dir dir("localfault"), local("localfaultdst");
  disarm_on_exit guard;
  holdfast::publisher().publish(dir / "src", std::string(3 << 20, 's'));
  fault_plan::reset_counts();
  { auto c = holdfast::copy_to_local<fault_io>(dir / "src", local.path()); }
  auto calls = fault_plan::calls(io_op::any);
  REQUIRE(calls > 5);
  for (std::uint64_t k = 1; k <= calls; ++k) {
    CAPTURE(k);
    fault_plan::arm(fault{io_op::any, k, EIO});
    bool threw = false;
    try {
      auto c = holdfast::copy_to_local<fault_io>(dir / "src", local.path());
    } catch (const holdfast::error& e) {
      threw = true;
      CHECK(e.operation() == holdfast::testing::to_string(fault_plan::last_failed()));
    }
    fault_plan::disarm();
    // the last call is the unlink of the dropped copy: the only one that cannot throw
    if (!threw) CHECK(fault_plan::last_failed() == io_op::unlink);
    auto left = holdfast::detail::list_directory<holdfast::posix_io>(local.path());
    if (threw) CHECK(left.empty());
    for (auto& n : left) ::unlink((local / n).c_str());  // only after a failed final unlink
  }
}

TEST_CASE("a kept file_waiter reuses one inotify descriptor across waits") {
  holdfast_test::temp_dir dir("waiter");
  disarm_on_exit guard;
  fault_plan::reset_counts();
  holdfast::basic_file_waiter<holdfast::inotify_wait, fault_io> waiter;
  for (int i = 0; i < 3; ++i) {
    const std::string path = dir / ("cycle" + std::to_string(i));
    publish_later writer(path, std::to_string(i), in_poll());
    CHECK(waiter.await(path, 10s) == std::to_string(i));
    CHECK(writer.wait(5s).ok());
  }
  CHECK_FALSE(waiter.await(dir / "never", 50ms));
  CHECK(fault_plan::calls(io_op::inotify_init1) == 1);
  CHECK(fault_plan::calls(io_op::inotify_add_watch) == 4);
  CHECK(fault_plan::calls(io_op::close) == 3);  // the files' descriptors, not the inotify one
  // a waiter whose inotify could not start polls, and tries inotify again next time
  holdfast::basic_file_waiter<holdfast::inotify_wait, fault_io> fallback;
  fault_plan::arm(fault{io_op::inotify_init1, 1, EMFILE});
  holdfast::publisher().publish(dir / "x", "x");
  CHECK(fallback.await(dir / "x", 1s) == std::string("x"));
  CHECK(fallback.await(dir / "x", 1s) == std::string("x"));
  CHECK(fault_plan::calls(io_op::inotify_init1) == 2);
  CHECK(fault_plan::failures() == 1);
}
