// filesystem_kv::watch: one inotify descriptor that wakes poll() on a put, insert or erase below
// the prefix (from another thread or process, nested keys included), stays quiet when idle on a
// local filesystem, re-checks on network stores, and falls back to polling without inotify; an
// any_kv holding a filesystem_kv (make_kv("file://...")) keeps that watch.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/mman.h>  // a shared page: when the child began writing
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <holdfast/kv/any.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/url.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <new>  // placement new into the shared page
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/fs_kv_fixture.hpp"
#include "support/shm_temp_dir.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using holdfast::filesystem_kv;
using holdfast::kv_changes;
using holdfast::kv_namespace;
using holdfast::network_filesystem_kv;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using clock_type = std::chrono::steady_clock;

namespace {

using faulty_kv =
    holdfast::basic_filesystem_kv<holdfast::inotify_wait, holdfast::no_sync, fault_io>;

static_assert(holdfast::has_kv_watch_v<filesystem_kv>);
static_assert(holdfast::has_kv_watch_v<network_filesystem_kv>);
static_assert(holdfast::has_kv_watch_v<faulty_kv>);

using holdfast_test::fs_kv_fixture;
using fs_kv = fs_kv_fixture<>;  // most cases: `tmp` and a filesystem_kv `kv` on it

using holdfast_test::disarm_on_exit;

// poll() on the watch's descriptor until POLLIN or `timeout`; true when readable.
template <class W>
bool readable_within(const W& w, std::chrono::milliseconds timeout) {
  pollfd pfd{w.fd(), POLLIN, 0};
  const auto deadline = clock_type::now() + timeout;
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() < 0) left = 0ms;
    int n = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (n > 0) return (pfd.revents & POLLIN) != 0;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Takes until a take reports something or `timeout` passes (events can arrive in several reads).
template <class W>
kv_changes take_within(W& w, std::chrono::milliseconds timeout) {
  const auto deadline = clock_type::now() + timeout;
  for (;;) {
    auto c = w.take();
    if (!c.empty() || clock_type::now() >= deadline) return c;
    readable_within(w, 10ms);
  }
}

// Sleeps until the watch is due, but never more than 2 s (a due() of max fails the test, not
// hangs it).
template <class W>
void sleep_until_due(const W& w) {
  const auto cap = clock_type::now() + 2s;
  CHECK(w.due() < cap);
  std::this_thread::sleep_until(std::min(w.due(), cap));
}

std::size_t open_fds() {
  std::size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// The directories the idle test runs on: the test temp dir's filesystem and /dev/shm (tmpfs).
std::vector<std::string> local_roots(const holdfast_test::temp_dir& tmp,
                                     const holdfast_test::shm_temp_dir& shm) {
  return {tmp.path(), shm.path()};
}

bool trusted_here(const std::string& dir) {
  return holdfast::detail::fs_notifies_all(holdfast::detail::fs_type_of<holdfast::posix_io>(dir));
}

}  // namespace

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: the first take is a resync and buffered() says so") {
  auto w = kv.watch("run/ctl");
  CHECK(w.fd() >= 0);
  CHECK(w.buffered());
  CHECK(w.due() <= clock_type::now());
  auto c = w.take();
  CHECK(c.resync);
  CHECK(c.events.empty());
  CHECK_FALSE(w.buffered());
  CHECK(w.take().empty());
}

TEST_CASE_FIXTURE(fs_kv,
                  "filesystem watch: a put by another thread wakes poll, well before its timeout") {
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  std::atomic<clock_type::rep> start{0};  // when the put began (thread start-up not counted)
  std::thread writer([&] {
    start = clock_type::now().time_since_epoch().count();
    kv.put("run/ctl/r3/step", "42");
  });
  const bool woke = readable_within(w, 10s);
  const auto took = clock_type::now() - clock_type::time_point(clock_type::duration(start));
  writer.join();
  CHECK(woke);
  CHECK(took < 2s);  // the put woke it: a fifth of poll()'s 10 s timeout tells that apart
  CHECK(take_within(w, 1000ms).resync);
  CHECK(w.take().empty());
}

TEST_CASE("filesystem watch: through an any_kv (make_kv) the same descriptor wakes poll") {
  holdfast_test::temp_dir tmp("fsw");
  holdfast::any_kv kv = holdfast::make_kv("file://" + tmp.path(), kv_namespace("run", "0"));
  REQUIRE(kv.supports(holdfast::kv_op::watch));
  holdfast::any_kv_watch w = kv.watch("run/ctl");
  CHECK(w.fd() >= 0);
  CHECK(w.buffered());
  REQUIRE(w.take().resync);
  CHECK_FALSE(w.buffered());
  CHECK(w.due() == clock_type::time_point::max());  // a local filesystem: no re-check
  w.follow({"run/ctl/r0/claim"});                   // filesystem watches need no follow: ignored
  holdfast::any_kv_watch moved = std::move(w);      // the watch object moves
  CHECK_FALSE(readable_within(moved, 50ms));        // idle: quiet
  filesystem_kv other(tmp.path(), kv_namespace("run", "0"));  // another handle, same files
  std::thread writer([&] { other.insert("run/ctl/r0/claim", "c"); });
  const auto t0 = clock_type::now();
  const bool woke = readable_within(moved, 10s);
  writer.join();
  CHECK(woke);
  CHECK(clock_type::now() - t0 < 2s);  // woken, well before poll()'s 10 s timeout
  CHECK(take_within(moved, 1000ms).resync);
  CHECK(kv.try_get("run/ctl/r0/claim") == std::optional<std::string>("c"));
}

TEST_CASE_FIXTURE(fs_kv,
                  "filesystem watch: a put by a forked child wakes poll, well before its timeout") {
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  // When the child's insert began (fork and start-up not counted), in memory both share.
  void* shared = ::mmap(nullptr, sizeof(clock_type::rep), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  auto* start = new (shared) std::atomic<clock_type::rep>(0);
  holdfast_test::child writer([&] {
    filesystem_kv own(tmp.path(), kv_namespace("run", "0"));
    start->store(clock_type::now().time_since_epoch().count());
    CHILD_REQUIRE(own.insert("run/ctl/r3/claim", "host-a"));
  });
  const bool woke = readable_within(w, 10s);
  const auto took = clock_type::now() - clock_type::time_point(clock_type::duration(start->load()));
  auto r = writer.wait();
  ::munmap(shared, sizeof(clock_type::rep));
  CHECK(r.ok());
  CHECK(woke);
  CHECK(took < 2s);  // woken by the insert, not by poll()'s 10 s timeout
  CHECK(take_within(w, 1000ms).resync);
  CHECK(kv.try_get("run/ctl/r3/claim") == std::optional<std::string>("host-a"));
}

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: nested keys created after the watch started are seen") {
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  kv.put("run/ctl/r5/claim", "x");  // no "ctl/r5" before
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  kv.put("run/ctl/r5/sub/deeper/step", "y");
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  CHECK(kv.list("run/ctl/r5").size() == 2);
}

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: erase and erase_prefix are seen") {
  kv.put("run/ctl/error", "boom");
  kv.put("run/ctl/r1/step", "1");
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  REQUIRE(kv.erase("run/ctl/error"));
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  REQUIRE(kv.erase_prefix("run/ctl") == 1);
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
}

// kv_watch_events::writes (issue 32, item 11): the handler erases a round's keys only once
// nobody reads them, so its watches need not wake for the cleanup; each non-claimant woke for
// the last round's claim and step erased (2.5 wake-ups a round where 2 are news). inotify
// queues an event at the syscall, so "not readable" right after the erase is exact.
// Invariants: a writes-only watch never reports an erase (of a key in a parent directory, or of
// a key without '/' in the namespace directory), and reports every insert and put; an
// all-events watch beside it reports the erases.
namespace {
// A store whose watch(prefix, events) returns another type than watch(prefix): not taken for
// the optional overload (the caches would fail to hold it).
struct odd_events_kv {
  holdfast::filesystem_kv inner;
  auto watch(const std::string& prefix) const { return inner.watch(prefix); }
  int watch(const std::string&, holdfast::kv_watch_events) const { return 0; }
};
}  // namespace

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: a writes-only watch sleeps through erases") {
  static_assert(holdfast::has_kv_watch_events_v<holdfast::filesystem_kv>);
  static_assert(holdfast::has_kv_watch_events_v<holdfast::counting_kv<holdfast::filesystem_kv>>);
  static_assert(holdfast::has_kv_watch_v<odd_events_kv>);
  static_assert(!holdfast::has_kv_watch_events_v<odd_events_kv>);
  kv.put("run/ctl/r0/claim", "c");
  kv.put("run/ctl/r0/step", "s");
  kv.put("run/stop", "x");  // one '/': the file "stop" in "run%2F"
  kv.put("stop", "x");      // no '/': the file "stop" in the namespace directory
  auto writes = kv.watch("run/ctl", holdfast::kv_watch_events::writes);
  auto all = kv.watch("run/ctl");
  auto flat = kv.watch("run", holdfast::kv_watch_events::writes);
  auto root = kv.watch("", holdfast::kv_watch_events::writes);  // every key, "stop" too
  holdfast::any_kv any(kv);  // forwards the events to the held store
  auto via_any = any.watch("run/ctl", holdfast::kv_watch_events::writes);
  REQUIRE(via_any.take().resync);
  REQUIRE(writes.take().resync);
  REQUIRE(all.take().resync);
  REQUIRE(flat.take().resync);
  REQUIRE(root.take().resync);
  REQUIRE(kv.erase("run/ctl/r0/claim"));
  REQUIRE(kv.erase("run/ctl/r0/step"));
  REQUIRE(kv.erase("run/stop"));
  CHECK_FALSE(readable_within(writes, 0ms));
  CHECK_FALSE(readable_within(via_any, 0ms));
  CHECK(readable_within(all, 1000ms));
  CHECK(take_within(all, 1000ms).resync);
  // every watch keeps erases in the namespace directory's mask (a parent directory removed
  // must be seen): a key there erased is read, and filtered
  REQUIRE(kv.erase("stop"));
  CHECK(take_within(writes, 0ms).empty());
  CHECK(take_within(flat, 0ms).empty());  // (the namespace directory's event: filtered)
  CHECK(take_within(root, 0ms).empty());  // the namespace directory's erase event is no news
  kv.put("stop", "y");                    // a key without '/' written: news
  CHECK(take_within(root, 1000ms).resync);
  REQUIRE(kv.insert("run/ctl/r1/claim", "c1"));
  CHECK(readable_within(writes, 1000ms));
  CHECK(take_within(writes, 1000ms).resync);
  kv.put("run/ctl/r1/claim", "c2");  // replaced
  CHECK(readable_within(writes, 1000ms));
  CHECK(take_within(writes, 1000ms).resync);
  CHECK(take_within(flat, 1000ms).resync);  // the insert and the put
  CHECK_FALSE(readable_within(flat, 0ms));
  kv.put("run/stop", "y");  // a write in run%2F: news
  CHECK(readable_within(flat, 1000ms));
  CHECK(take_within(flat, 1000ms).resync);
}

TEST_CASE_FIXTURE(fs_kv,
                  "filesystem watch: keys outside the prefix and publish temps do not count") {
  // "run/ctlx" lives in run%2F/, which can hold keys below "run/ctl/" too ("run/ctl/error"):
  // made before the watch, as a job's first round makes it, so its appearing is not an event
  kv.put("run/ctlx", "0");
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  kv.put("run/ctlx", "1");            // a sibling name, not below "run/ctl/"
  kv.put("run/other/ctl/step", "2");  // elsewhere
  kv.put("run/ctl", "3");             // the prefix itself is not below it
  // The events did arrive (fd readable) but none of them is relevant.
  CHECK(readable_within(w, 1000ms));
  CHECK(w.take().empty());
  CHECK_FALSE(readable_within(w, 0ms));
}

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: writes to another prefix's directory never wake it") {
  // The agreement's shape: every worker watches ctl/, N acks are written under ack/r0/. Only
  // the ack directory's creation reaches the watch (the namespace directory's event); the acks
  // themselves, and their temps (made in .tmp), raise nothing it can see.
  kv.put("run/ctl/r0/claim", "c");
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  kv.put("run/ack/r0/0", "1");  // makes run%2Fack%2F: seen, not relevant
  CHECK(readable_within(w, 1000ms));
  CHECK(w.take().empty());
  for (int t = 1; t < 64; ++t) kv.put("run/ack/r0/" + std::to_string(t), "1");
  CHECK_FALSE(readable_within(w, 100ms));
  CHECK(kv.erase("run/ack/r0/5"));  // not the last: the directory stays
  CHECK_FALSE(readable_within(w, 100ms));
  // one write below the prefix: one wake-up, one event batch
  kv.put("run/ctl/r0/step", "s");
  CHECK(readable_within(w, 1000ms));
  CHECK(w.take().resync);
  CHECK_FALSE(readable_within(w, 100ms));
}

TEST_CASE_FIXTURE(
    fs_kv,
    "filesystem watch: an insert's new parent directory arrives holding the key: one event") {
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  REQUIRE(kv.insert("run/ctl/r0/claim", "c"));  // no run%2Fctl%2F before
  CHECK(readable_within(w, 1000ms));
  CHECK(w.take().resync);
  CHECK(kv.try_get("run/ctl/r0/claim") == std::optional<std::string>("c"));  // there already
  CHECK_FALSE(readable_within(w, 100ms));           // no second event for the key itself
  CHECK_FALSE(kv.insert("run/ctl/r0/claim", "d"));  // still insert-once
  CHECK(kv.insert("run/ctl/r0/step", "s"));         // into the watched directory
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  CHECK(kv.list("run/ctl") ==
        holdfast::kv_pairs{{"run/ctl/r0/claim", "c"}, {"run/ctl/r0/step", "s"}});
  CHECK(std::filesystem::is_empty(kv.directory() + "/.tmp"));  // no staging left behind
}

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: a parent directory removed and made again") {
  kv.put("run/ctl/r1/step", "1");
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  REQUIRE(kv.erase("run/ctl/r1/step"));
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  REQUIRE(::rmdir((kv.directory() + "/run%2Fctl%2F").c_str()) ==
          0);                      // erases keep it: gone by hand
  kv.put("run/ctl/r1/step", "2");  // made again, and watched again
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  while (readable_within(w, 50ms)) (void)w.take();
  kv.put("run/ctl/r1/step", "3");  // a write inside the new directory wakes it
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
}

TEST_CASE("filesystem watch: idle for 1 s on a local filesystem: no wake-up, due() is max") {
  holdfast_test::temp_dir tmp("fsw");
  holdfast_test::shm_temp_dir shm("fsw");
  for (const auto& root : local_roots(tmp, shm)) {
    CAPTURE(root);
    filesystem_kv kv(root, kv_namespace("run", "0"));
    REQUIRE(trusted_here(kv.directory()));  // ext4 / tmpfs here; the test means local disks
    auto w = kv.watch("run/ctl");
    REQUIRE(w.take().resync);
    CHECK(w.due() == clock_type::time_point::max());
    pollfd pfd{w.fd(), POLLIN, 0};
    CHECK(::poll(&pfd, 1, 1000) == 0);
    CHECK(w.take().empty());
    CHECK(w.due() == clock_type::time_point::max());
  }
}

TEST_CASE_FIXTURE(fs_kv_fixture<network_filesystem_kv>,
                  "filesystem watch: network_filesystem_kv keeps a finite due() and re-checks") {
  static_assert(network_filesystem_kv::watch_recheck == holdfast::poll_wait::max_interval);
  auto w = kv.watch("run/ctl");
  CHECK(w.fd() >= 0);  // local writers still wake it at once
  const auto before = clock_type::now();
  REQUIRE(w.take().resync);
  CHECK(w.due() != clock_type::time_point::max());
  CHECK(w.due() >= before + network_filesystem_kv::watch_recheck);
  CHECK(w.due() <= clock_type::now() + network_filesystem_kv::watch_recheck);
  CHECK(w.take().empty());  // not due yet
  sleep_until_due(w);
  CHECK(w.take().resync);  // the periodic re-check
  kv.put("run/ctl/step", "1");
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
}

TEST_CASE_FIXTURE(fs_kv, "filesystem watch: one descriptor for the watch's life") {
  const auto before = open_fds();
  {
    auto w = kv.watch("run/ctl");
    const auto with_watch = open_fds();
    CHECK(with_watch == before + 1);
    const int fd = w.fd();
    for (int i = 0; i < 200; ++i) {
      kv.put("run/ctl/r" + std::to_string(i % 7) + "/step", std::to_string(i));
      if (i % 3 == 0) kv.erase("run/ctl/r" + std::to_string(i % 5) + "/step");
      (void)w.take();
    }
    CHECK(w.fd() == fd);
    CHECK(open_fds() == with_watch);
    auto moved = std::move(w);
    CHECK(moved.fd() == fd);
    CHECK(open_fds() == with_watch);
  }
  CHECK(open_fds() == before);
}

TEST_CASE_FIXTURE(fs_kv_fixture<faulty_kv>,
                  "filesystem watch: without inotify it polls (fd -1, due at the poll interval)") {
  disarm_on_exit guard;
  const auto before = open_fds();
  fault_plan::arm(fault{io_op::inotify_init1, 1, EMFILE});
  auto w = kv.watch("run/ctl");
  fault_plan::disarm();
  CHECK(open_fds() == before);
  CHECK(w.fd() == -1);
  const auto t0 = clock_type::now();
  REQUIRE(w.take().resync);
  CHECK(w.due() >= t0 + faulty_kv::watch_poll_interval);
  CHECK(w.due() <= clock_type::now() + faulty_kv::watch_poll_interval);
  CHECK(w.take().empty());
  kv.put("run/ctl/step", "1");
  sleep_until_due(w);
  CHECK(w.take().resync);
  CHECK(w.fd() == -1);
}

TEST_CASE_FIXTURE(fs_kv_fixture<faulty_kv>,
                  "filesystem watch: no watch left (ENOSPC) polls, then watches once it can") {
  disarm_on_exit guard;
  fault_plan::arm(fault{io_op::inotify_add_watch, 1, ENOSPC, 1, 2});  // watch() and a take
  auto w = kv.watch("run/ctl");
  CHECK(w.fd() == -1);
  REQUIRE(w.take().resync);
  fault_plan::disarm();
  CHECK(fault_plan::failures() == 2);
  CHECK(w.fd() == -1);
  CHECK(w.due() != clock_type::time_point::max());
  sleep_until_due(w);
  CHECK(w.take().resync);  // due, and the watch is added now
  CHECK(w.fd() >= 0);
  kv.put("run/ctl/step", "1");
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
}

TEST_CASE_FIXTURE(
    fs_kv_fixture<faulty_kv>,
    "filesystem watch: an unknown filesystem type (fstatfs failing) keeps re-checking") {
  disarm_on_exit guard;
  fault_plan::arm(fault{io_op::fstatfs, 1, EIO});
  auto w = kv.watch("run/ctl");
  fault_plan::disarm();
  CHECK(w.fd() >= 0);
  const auto t0 = clock_type::now();
  REQUIRE(w.take().resync);
  CHECK(w.due() >= t0 + faulty_kv::watch_recheck);
  CHECK(w.due() <= clock_type::now() + faulty_kv::watch_recheck);
  CHECK(faulty_kv::watch_recheck == holdfast::inotify_wait::recheck);
}

TEST_CASE_FIXTURE(
    fs_kv, "filesystem watch: the namespace directory removed and recreated is watched again") {
  auto w = kv.watch("run/ctl");
  REQUIRE(w.take().resync);
  std::filesystem::remove_all(kv.directory());
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
  CHECK(w.fd() == -1);  // nothing to watch: polls
  CHECK(w.due() != clock_type::time_point::max());
  filesystem_kv again(tmp.path(), kv_namespace("run", "0"));  // recreates the directory
  sleep_until_due(w);
  CHECK(w.take().resync);
  REQUIRE(w.fd() >= 0);
  again.put("run/ctl/step", "1");
  CHECK(readable_within(w, 1000ms));
  CHECK(take_within(w, 1000ms).resync);
}
