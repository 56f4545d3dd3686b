// The kv_store contract: one suite, instantiated for every backend (in-process, filesystem,
// etcd against a real server), plus the cross-process half for the backends that have one.
// Also: key validation, namespaces, the compile-time checks and counting_kv.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <holdfast/kv.hpp>
#include <holdfast/kv/any.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/kv/incarnation.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>  // is_same_v: the etcd waiter
#include <vector>

#include "support/c10d_like_kv.hpp"
#include "support/child.hpp"
#include "support/elapsed.hpp"
#include "support/etcd_server.hpp"
#include "support/expect_error.hpp"
#include "support/key_wait_kv.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

using namespace std::chrono_literals;
using holdfast::kv_namespace;
using holdfast::kv_pairs;
using clk = std::chrono::steady_clock;
using holdfast_test::error_from;
using holdfast_test::ms_since;

namespace {

// ---- one fixture per backend: make(ns) returns a store over the same backing ----------------

struct in_process_backend {
  holdfast::in_process_kv base{kv_namespace("unused", 0)};
  holdfast::in_process_kv make(const kv_namespace& ns) { return base.with_namespace(ns); }
};

template <class Kv>
struct filesystem_backend_t {
  holdfast_test::temp_dir dir{"kv"};
  Kv make(const kv_namespace& ns) { return Kv(dir.path() + "/store", ns); }
};
using filesystem_backend = filesystem_backend_t<holdfast::filesystem_kv>;
using network_filesystem_backend = filesystem_backend_t<holdfast::network_filesystem_kv>;

struct etcd_backend {
  holdfast_test::etcd_server server;
  holdfast::etcd_kv make(const kv_namespace& ns) {
    holdfast::etcd_options o;
    o.endpoints = {server.url()};
    return holdfast::etcd_kv(o, ns);
  }
};

const kv_namespace ns0("run", 0);

// Waits (up to 10 s) until the get on thread `tid` of process `pid` (0: this one) is in its wait,
// so an insert made next is one it wakes on: the thread is observed asleep in its wait (poll(),
// a condition variable's futex, or a re-check's timed sleep), and over etcd (when `waiter` is the
// etcd_kv that waits) the get's watch is open (its range answered before; a thread asleep in poll()
// could still be waiting for the range).
template <class Kv>
bool get_waits(const Kv* waiter, pid_t tid, pid_t pid = 0) {
  if constexpr (std::is_same_v<Kv, holdfast::etcd_kv>) {
    const auto end = clk::now() + 10s;
    while (waiter && waiter->stats().watch_opens == 0 && clk::now() < end)
      std::this_thread::sleep_for(1ms);
    if (waiter && waiter->stats().watch_opens == 0) return false;
  }
  return holdfast_test::wait_asleep_in({tid}, holdfast_test::wait_syscalls(), 10s, pid);
}

}  // namespace

// Short names in test-case names ("...<filesystem_kv>"), so ctest lists read well.
TYPE_TO_STRING_AS("in_process_kv", in_process_backend);
TYPE_TO_STRING_AS("filesystem_kv", filesystem_backend);
TYPE_TO_STRING_AS("network_filesystem_kv", network_filesystem_backend);
TYPE_TO_STRING_AS("etcd_kv", etcd_backend);

// ---- the contract suite --------------------------------------------------------------------

TEST_CASE_TEMPLATE_DEFINE("kv contract: insert once, put overwrites, try_get", B, kv_insert) {
  B backend;
  auto kv = backend.make(ns0);
  CHECK_FALSE(kv.try_get("a/b").has_value());
  CHECK(kv.insert("a/b", "one"));
  CHECK_FALSE(kv.insert("a/b", "two"));  // duplicate insert: false, value unchanged
  CHECK(kv.try_get("a/b") == std::optional<std::string>("one"));
  kv.put("a/b", "three");
  CHECK(kv.try_get("a/b") == std::optional<std::string>("three"));
  kv.put("fresh", "");  // put creates; empty values are values
  CHECK(kv.try_get("fresh") == std::optional<std::string>(""));
  const std::string binary("\0\x01\xff\n\"\\{}", 9);
  CHECK(kv.insert("bin", binary));
  CHECK(kv.try_get("bin") == std::optional<std::string>(binary));
  const std::string odd_key = "sp ace/%25/ünï/-_.x";  // bytes a filesystem or URL must escape
  CHECK(kv.insert(odd_key, "v"));
  CHECK(kv.try_get(odd_key) == std::optional<std::string>("v"));
  CHECK(kv.get("a/b", 0ms) == std::optional<std::string>("three"));  // existing: no wait
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: a blocked get wakes when another thread inserts", B,
                          kv_get_wakes) {
  B backend;
  auto waiter = backend.make(ns0);
  auto writer = backend.make(ns0);
  std::atomic<pid_t> tid{0};
  std::optional<std::string> got;
  long long waited_ms = -1;
  std::thread t([&] {
    auto t0 = clk::now();
    tid = holdfast_test::this_thread_id();
    got = waiter.get("barrier/ready", 10s);
    waited_ms = ms_since(t0);
  });
  while (tid.load() == 0) std::this_thread::yield();
  // the get is observed blocked before the insert (the thing under test is the wake-up)
  const bool blocked = get_waits(&waiter, tid.load());
  CHECK(writer.insert("barrier/ready", "go"));
  t.join();
  CHECK(blocked);
  CHECK(got == std::optional<std::string>("go"));
  CHECK(waited_ms < 5000);  // and woke on the insert, long before its 10 s timeout
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: get times out at the deadline (checked at 1.5 x)", B,
                          kv_get_timeout) {
  B backend;
  auto kv = backend.make(ns0);
  for (auto timeout : {500ms}) {  // a timeout is checked at 1.5 x its value (the house rule)
    auto t0 = clk::now();
    auto got = kv.get("never/inserted", timeout);
    auto elapsed = ms_since(t0);
    CHECK_FALSE(got.has_value());
    CHECK(elapsed >= timeout.count() - 5);  // clocks may round a few ms early, never much
    CHECK(elapsed < timeout.count() * 3 / 2);
  }
  auto t0 = clk::now();
  CHECK_FALSE(kv.get("never/inserted", 0ms).has_value());  // zero timeout = try_get
  CHECK(ms_since(t0) < 2000);  // at once: not the 500 ms timeout above, nor any wait
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: erase, then insert again", B, kv_erase) {
  B backend;
  auto kv = backend.make(ns0);
  CHECK(kv.insert("claim", "worker-1"));
  CHECK(kv.erase("claim"));
  CHECK_FALSE(kv.try_get("claim").has_value());
  CHECK_FALSE(kv.erase("claim"));  // already gone
  CHECK(kv.insert("claim", "worker-2"));
  CHECK(kv.try_get("claim") == std::optional<std::string>("worker-2"));
  CHECK_FALSE(kv.insert("claim", "worker-3"));
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: list by nested, empty and non-matching prefixes", B,
                          kv_list) {
  B backend;
  auto kv = backend.make(ns0);
  for (auto k : {"a/b/d", "a/b/c", "a/e", "a", "ab/x", "a/b/c/deep", "z"}) kv.put(k, k + 1);
  const kv_pairs ab = {{"a/b/c", "/b/c"}, {"a/b/c/deep", "/b/c/deep"}, {"a/b/d", "/b/d"}};
  CHECK(kv.list("a/b") == ab);
  CHECK(kv.list("a/b/") == ab);  // a trailing slash means the same directory
  CHECK(kv.list("a/b/c") == kv_pairs{{"a/b/c/deep", "/b/c/deep"}});
  kv_pairs a = ab;
  a.emplace_back("a/e", "/e");
  CHECK(kv.list("a") == a);  // not "a" itself, not "ab/x"
  auto all = kv.list("");
  REQUIRE(all.size() == 7);
  CHECK(std::is_sorted(all.begin(), all.end()));
  CHECK(all.front().first == "a");
  CHECK(all.back() == std::make_pair(std::string("z"), std::string("")));
  CHECK(kv.list("nothing/here").empty());
  CHECK(kv.list("a/b/c/deep").empty());
  CHECK(kv.list("a/bb").empty());
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: erase_prefix removes a directory and nothing else", B,
                          kv_erase_prefix) {
  B backend;
  auto kv = backend.make(ns0);
  for (auto k : {"acks/0", "acks/1", "acks/2/x", "acks", "acks2/0", "other"}) kv.put(k, "v");
  CHECK(kv.erase_prefix("acks") == 3);
  CHECK(kv.list("acks").empty());
  CHECK(kv.try_get("acks").has_value());
  CHECK(kv.try_get("acks2/0").has_value());
  CHECK(kv.erase_prefix("acks") == 0);
  CHECK(kv.insert("acks/0", "again"));  // re-insert after a recursive delete
  CHECK(kv.erase_prefix("") == 4);      // the whole namespace
  CHECK(kv.list("").empty());
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: invalid keys are rejected with the key named", B,
                          kv_invalid_keys) {
  B backend;
  auto kv = backend.make(ns0);
  const std::string bad[] = {
      "", "/a", "a/", "a//b", "..", "a/../b", "a/./b", ".", std::string("a\0b", 3)};
  for (const auto& key : bad) {
    CAPTURE(key);
    auto e = error_from([&] { kv.insert(key, "v"); });
    CHECK(e.errnum() == EINVAL);
    CHECK(std::string(e.what()).find("invalid key") != std::string::npos);
    if (!key.empty() && key.find('\0') == std::string::npos)
      CHECK(std::string(e.what()).find("'" + key + "'") != std::string::npos);
    CHECK(error_from([&] { kv.put(key, "v"); }).errnum() == EINVAL);
    CHECK(error_from([&] { kv.try_get(key); }).errnum() == EINVAL);
    CHECK(error_from([&] { kv.get(key, 10ms); }).errnum() == EINVAL);
    CHECK(error_from([&] { kv.erase(key); }).errnum() == EINVAL);
  }
  CHECK(std::string(error_from([&] { kv.insert(std::string("a\0b", 3), "v"); }).what())
            .find("a\\x00b") != std::string::npos);
  const std::string bad_prefixes[] = {"/", "//", "a//", "../x", std::string("\0", 1)};
  for (const auto& prefix : bad_prefixes) {
    CAPTURE(prefix);
    CHECK(error_from([&] { kv.list(prefix); }).errnum() == EINVAL);
    CHECK(error_from([&] { kv.erase_prefix(prefix); }).errnum() == EINVAL);
  }
  CHECK(kv.list("").empty());  // nothing was written by the rejected calls
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: namespaces are isolated", B, kv_namespaces) {
  B backend;
  auto first = backend.make(kv_namespace("job", 0));
  auto restarted = backend.make(kv_namespace("job", 1));
  auto other_job = backend.make(kv_namespace("job2", 0));
  CHECK(first.insert("claim", "incarnation 0"));
  CHECK_FALSE(restarted.try_get("claim").has_value());  // a restart never sees the old keys
  CHECK(restarted.insert("claim", "incarnation 1"));
  CHECK(other_job.insert("claim", "job2"));
  CHECK(first.try_get("claim") == std::optional<std::string>("incarnation 0"));
  CHECK(restarted.get("claim", 100ms) == std::optional<std::string>("incarnation 1"));
  CHECK(first.list("") == kv_pairs{{"claim", "incarnation 0"}});
  CHECK(restarted.erase_prefix("") == 1);
  CHECK(first.try_get("claim").has_value());
  CHECK(other_job.try_get("claim") == std::optional<std::string>("job2"));
  auto same = backend.make(kv_namespace("job", 0));  // a second handle on one namespace shares it
  CHECK(same.try_get("claim") == std::optional<std::string>("incarnation 0"));
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: concurrent inserts of one key, exactly one wins", B,
                          kv_insert_race) {
  B backend;
  constexpr int kThreads = 4;
  std::atomic<int> wins{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      auto kv = backend.make(ns0);
      while (!go) std::this_thread::yield();
      for (int round = 0; round < 10; ++round)
        if (kv.insert("race/" + std::to_string(round), std::to_string(i))) ++wins;
    });
  go = true;
  for (auto& t : threads) t.join();
  CHECK(wins == 10);
  auto kv = backend.make(ns0);
  CHECK(kv.list("race").size() == 10);
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: take_incarnation hands each launch a new number", B,
                          kv_incarnation) {
  // Invariant: no two takers ever hold the same number, concurrent or later (a relaunch), and
  // numbers only grow; through any_kv as through the concrete store.
  B backend;
  const kv_namespace ns = holdfast::incarnation_namespace("run-7");
  constexpr int kThreads = 4;
  std::vector<std::uint64_t> got(kThreads);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      auto kv = backend.make(ns);
      while (!go) std::this_thread::yield();
      got[static_cast<std::size_t>(i)] =
          holdfast::take_incarnation(kv, "taker-" + std::to_string(i));
    });
  go = true;
  for (auto& t : threads) t.join();
  std::sort(got.begin(), got.end());
  CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
  holdfast::any_kv later(backend.make(ns));  // a relaunch, with empty memory
  const std::uint64_t next = holdfast::take_incarnation(later, "relaunch");
  CHECK(next > got.back());
  auto kv = backend.make(ns);
  CHECK(kv.try_get("launch/" + std::to_string(next)) == std::optional<std::string>("relaunch"));
  auto other = backend.make(holdfast::incarnation_namespace("run-8"));  // its own counter
  CHECK(holdfast::take_incarnation(other, "x") == 0);
}

TEST_CASE_TEMPLATE_DEFINE("kv contract: counting_kv counts every call by kind", B, kv_counting) {
  B backend;
  holdfast::counting_kv<decltype(backend.make(ns0))> kv(backend.make(ns0));
  CHECK(kv.insert("k", "v"));
  CHECK_FALSE(kv.insert("k", "v"));
  kv.put("k", "w");
  kv.try_get("k");
  kv.get("k", 10ms);
  kv.list("");
  kv.erase("k");
  kv.erase_prefix("");
  CHECK_THROWS_AS(kv.try_get("bad//key"), holdfast::error);
  auto c = kv.counts();
  CHECK(c.insert == 2);
  CHECK(c.put == 1);
  CHECK(c.try_get == 2);
  CHECK(c.get == 1);
  CHECK(c.list == 1);
  CHECK(c.erase == 1);
  CHECK(c.erase_prefix == 1);
  CHECK(c.failed == 1);
  CHECK(c.total() == 9);
  CHECK(c[holdfast::kv_op::insert] == 2);
  CHECK(kv.count(holdfast::kv_op::try_get) == 2);
  CHECK(c.to_string() ==
        "insert=2 put=1 try_get=2 get=1 list=1 erase=1 erase_prefix=1 get_many=0 failed=1 "
        "total=9");
  auto copy = kv;  // copies share the counters
  copy.put("k2", "v");
  CHECK(kv.counts().put == 2);
  kv.reset_counts();
  CHECK(kv.counts() == holdfast::kv_counts{});
}

// ---- across processes (filesystem and etcd) ----------------------------------------------

namespace {
// A pipe the parent uses as a start line: children block reading it until it is closed.
struct start_line {
  int fds[2] = {-1, -1};
  start_line() { REQUIRE(::pipe2(fds, O_CLOEXEC) == 0); }
  ~start_line() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  void wait_in_child() {
    ::close(fds[1]);
    char c;
    while (::read(fds[0], &c, 1) < 0 && errno == EINTR) {
    }
  }
  void release() {
    ::close(fds[1]);
    fds[1] = -1;
  }
  // The child says "about to block"; the parent waits for that with a deadline.
  void signal_from_child() { (void)!::write(fds[1], "r", 1); }
  bool wait_signal(std::chrono::milliseconds timeout) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    char c;
    return ::read(fds[0], &c, 1) == 1;
  }
};
}  // namespace

TEST_CASE_TEMPLATE_DEFINE(
    "kv across processes: a get blocked in a child wakes on the parent's insert", B,
    kv_fork_get_wakes) {
  B backend;
  auto kv = backend.make(ns0);
  start_line ready;
  holdfast_test::child c([&] {
    auto mine = backend.make(ns0);
    auto t0 = clk::now();
    ready.signal_from_child();
    auto got = mine.get("handoff/cmd", 10s);
    CHILD_REQUIRE(got == std::optional<std::string>("from parent"));
    CHILD_REQUIRE(ms_since(t0) < 5000);
  });
  REQUIRE(ready.wait_signal(5s));
  // the child's get is observed blocked (a single-threaded child: its thread id is its pid); its
  // etcd client's watch count is the child's, so over etcd a wait for the range's reply counts
  // too: the insert is then read by the range, which the thread-level tests above rule out
  CHECK(get_waits<decltype(kv)>(nullptr, c.pid(), c.pid()));
  CHECK(kv.insert("handoff/cmd", "from parent"));
  auto r = c.wait(15s);
  CHECK_MESSAGE(r.ok(), r.failures);
}

TEST_CASE_TEMPLATE_DEFINE("kv across processes: the parent's get wakes on a child's insert", B,
                          kv_fork_parent_wakes) {
  B backend;
  auto kv = backend.make(ns0);
  start_line go;
  holdfast_test::child c([&] {
    go.wait_in_child();  // released once the parent's get is observed blocked
    CHILD_REQUIRE(backend.make(ns0).insert("ready/1", "child"));
  });
  std::atomic<pid_t> tid{0};
  std::optional<std::string> got;
  long long waited_ms = -1;
  std::thread getter([&] {
    auto t0 = clk::now();
    tid = holdfast_test::this_thread_id();
    got = kv.get("ready/1", 10s);
    waited_ms = ms_since(t0);
  });
  while (tid.load() == 0) std::this_thread::yield();
  CHECK(get_waits(&kv, tid.load()));  // the wake-up is under test
  go.release();
  getter.join();
  CHECK(got == std::optional<std::string>("child"));
  CHECK(waited_ms < 5000);
  auto r = c.wait(10s);
  CHECK_MESSAGE(r.ok(), r.failures);
}

TEST_CASE_TEMPLATE_DEFINE("kv across processes: racing inserts of one key, exactly one wins", B,
                          kv_fork_insert_race) {
  B backend;
  constexpr int kChildren = 4, kRounds = 10;
  start_line go;
  std::vector<holdfast_test::child> children;
  for (int i = 0; i < kChildren; ++i)
    children.emplace_back([&, i] {
      go.wait_in_child();
      auto kv = backend.make(ns0);
      int wins = 0;
      for (int round = 0; round < kRounds; ++round)
        if (kv.insert("race/" + std::to_string(round), std::to_string(i))) ++wins;
      ::_exit(wins);  // the parent adds the exit codes
    });
  go.release();
  int total = 0;
  for (auto& c : children) {
    auto r = c.wait(20s);
    CHECK(r.failures.empty());
    CHECK(r.term_signal == 0);
    total += r.exit_code;
  }
  CHECK(total == kRounds);
  auto all = backend.make(ns0).list("race");
  CHECK(all.size() == static_cast<std::size_t>(kRounds));
  for (auto& kv : all) CHECK((kv.second >= "0" && kv.second <= "3"));
}

// Every backend, and those with a cross-process half (the same lists for each suite).
using every_backend =
    std::tuple<in_process_backend, filesystem_backend, network_filesystem_backend, etcd_backend>;
using cross_process_backends =
    std::tuple<filesystem_backend, network_filesystem_backend, etcd_backend>;

TEST_CASE_TEMPLATE_APPLY(kv_fork_get_wakes, cross_process_backends);
TEST_CASE_TEMPLATE_APPLY(kv_fork_parent_wakes, cross_process_backends);
TEST_CASE_TEMPLATE_APPLY(kv_fork_insert_race, cross_process_backends);

TEST_CASE_TEMPLATE_APPLY(kv_insert, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_get_wakes, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_get_timeout, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_erase, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_list, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_erase_prefix, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_invalid_keys, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_namespaces, every_backend);
TEST_CASE_TEMPLATE_APPLY(kv_insert_race, every_backend);
TEST_CASE_TEMPLATE_INVOKE(kv_incarnation, in_process_backend, filesystem_backend, etcd_backend);
TEST_CASE_TEMPLATE_APPLY(kv_counting, every_backend);

// ---- backend-independent parts ---------------------------------------------------------------

namespace {
struct missing_erase {
  bool insert(const std::string&, const std::string&) { return true; }
  void put(const std::string&, const std::string&) {}
  std::optional<std::string> try_get(const std::string&) { return {}; }
  std::optional<std::string> get(const std::string&, std::chrono::milliseconds) { return {}; }
  kv_pairs list(const std::string&) { return {}; }
  std::size_t erase_prefix(const std::string&) { return 0; }
};
struct wrong_get {  // get without a timeout
  bool insert(const std::string&, const std::string&) { return true; }
  void put(const std::string&, const std::string&) {}
  std::optional<std::string> try_get(const std::string&) { return {}; }
  std::optional<std::string> get(const std::string&) { return {}; }
  kv_pairs list(const std::string&) { return {}; }
  bool erase(const std::string&) { return true; }
  std::size_t erase_prefix(const std::string&) { return 0; }
};
}  // namespace

TEST_CASE("kv_store trait and concept accept the backends and reject incomplete types") {
  static_assert(holdfast::is_kv_store_v<holdfast::in_process_kv>);
  static_assert(holdfast::check_kv_store<holdfast::in_process_kv>());
  static_assert(holdfast::check_kv_store<holdfast::etcd_kv>());
  static_assert(holdfast::check_kv_store<holdfast::filesystem_kv>());
  static_assert(holdfast::check_kv_store<holdfast::network_filesystem_kv>());
  static_assert(holdfast::is_kv_store_v<holdfast::counting_kv<holdfast::in_process_kv>>);
  static_assert(!holdfast::is_kv_store_v<missing_erase>);
  static_assert(!holdfast::is_kv_store_v<wrong_get>);
  static_assert(!holdfast::is_kv_store_v<int>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  static_assert(holdfast::kv_store<holdfast::in_process_kv>);
  static_assert(!holdfast::kv_store<missing_erase>);
#endif
  CHECK(holdfast::is_kv_store_v<holdfast::in_process_kv>);
  CHECK_FALSE(holdfast::is_kv_store_v<missing_erase>);
}

TEST_CASE("key validation: what is accepted and what each rejection says") {
  for (auto k : {"a", "a/b", "a/b/c", "...", "a/.b", ".hidden", "a..b", "x y", "\xff"})
    CHECK_MESSAGE(holdfast::is_valid_key(k), k);
  auto why = [](const std::string& key) {
    try {
      holdfast::validate_key(key, "kv insert");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EINVAL);
      CHECK(e.operation() == "kv insert");
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(why("").find("empty key") != std::string::npos);
  CHECK(why("a//b").find("empty path segment") != std::string::npos);
  CHECK(why("a//b").find("'a//b'") != std::string::npos);
  CHECK(why("/a").find("empty path segment") != std::string::npos);
  CHECK(why("a/").find("empty path segment") != std::string::npos);
  CHECK(why("a/../b").find("'..' segment") != std::string::npos);
  CHECK(why("./b").find("'.' segment") != std::string::npos);
  CHECK(why(std::string("k\0", 2)).find("NUL") != std::string::npos);
  CHECK(holdfast::normalize_prefix("") == "");
  CHECK(holdfast::normalize_prefix("a/b/") == "a/b");
  CHECK_THROWS_AS(holdfast::normalize_prefix("a//"), holdfast::error);
}

TEST_CASE("kv_namespace: one segment per part, path() joins them") {
  kv_namespace ns("run-7", 3);
  CHECK(ns.run_id() == "run-7");
  CHECK(ns.incarnation() == "3");
  CHECK(ns.path() == "run-7/3");
  CHECK(ns == kv_namespace("run-7", "3"));
  CHECK(ns != kv_namespace("run-7", 4));
  for (auto bad : {"", "a/b", "..", "."}) {
    CAPTURE(bad);
    CHECK(error_from([&] { kv_namespace(bad, 0); }).errnum() == EINVAL);
    CHECK(error_from([&] { kv_namespace("run", bad); }).errnum() == EINVAL);
  }
  CHECK(std::string(error_from([] { kv_namespace("a/b", 0); }).what()).find("run id") !=
        std::string::npos);
}

TEST_CASE("kv_counts names every kind") {
  CHECK(std::string(holdfast::kv_op_name(holdfast::kv_op::erase_prefix)) == "erase_prefix");
  CHECK(std::string(holdfast::kv_op_name(holdfast::kv_op::watch)) == "watch");
  CHECK(std::string(holdfast::kv_op_name(holdfast::kv_op::get_many)) == "get_many");
  CHECK(holdfast::kv_op_count == 9);
  holdfast::kv_counts c;
  c.get = 3;
  c.list = 1;
  c.put = 2;
  CHECK(c.reads() == 4);
  CHECK(c.writes() == 2);
  CHECK(c.total() == 6);
  // constructed in place; inner() reaches the wrapped store without counting
  holdfast::counting_kv<holdfast::in_process_kv> counted(std::in_place, kv_namespace("a", 0));
  counted.inner().put("k", "v");
  CHECK(counted.get("k", 0ms) == std::optional<std::string>("v"));
  CHECK(counted.counts().total() == 1);
}

TEST_CASE(
    "filesystem_kv names: a directory per parent prefix, escaped names, foreign files ignored") {
  using holdfast::detail::fs_escape;
  using holdfast::detail::fs_unescape;
  CHECK(fs_escape("acks/3") == "acks%2F3");
  CHECK(fs_escape(".hidden/x.y") == "%2Ehidden%2Fx.y");
  CHECK(fs_escape("a b%") == "a%20b%25");
  std::string all;
  for (int c = 1; c < 256; ++c) all += static_cast<char>(c);
  CHECK(fs_unescape(fs_escape(all)) == std::optional<std::string>(all));
  CHECK(fs_escape(all).find('/') == std::string::npos);
  CHECK_FALSE(fs_unescape("a%2").has_value());
  CHECK_FALSE(fs_unescape("a%zz").has_value());
  CHECK_FALSE(fs_unescape("a%2f").has_value());  // not canonical (lower-case hex)
  CHECK_FALSE(fs_unescape("a%41").has_value());  // not canonical ('A' is kept plain)

  holdfast_test::temp_dir dir("kvfs");
  holdfast::filesystem_kv kv(dir.path(), kv_namespace("run", 0));
  const std::string d = kv.directory();
  CHECK(kv.path_of("acks/3") == d + "/acks%2F/3");
  // a key's directory is its parent less the parent's last segment (issue 32, item 11)
  CHECK(kv.path_of("a/.b/c d") == d + "/a%2F/%2Eb%2Fc%20d");
  CHECK(kv.path_of("h/run/ack/r0/3") == d + "/h%2Frun%2Fack%2F/r0%2F3");
  CHECK(kv.path_of("stop") == d + "/stop");
  CHECK(kv.path_of(".x") == d + "/%2Ex");
  kv.put("acks/3", "x");
  kv.put("stop", "s");
  CHECK(::access((d + "/acks%2F/3").c_str(), F_OK) == 0);
  // a stray file, a temp left by a killed writer, non-canonical names, and a flat name with an
  // escaped '/' (no key lives there) are not keys
  for (auto name : {"/README", "/.holdfast-tmp.123.abc.4", "/acks%2f5", "/acks%2F6",
                    "/acks%2F/.holdfast-tmp.1.2.7", "/acks%2F/8%2f9"}) {
    int fd = ::open((d + name).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  CHECK(kv.list("acks") == kv_pairs{{"acks/3", "x"}});
  CHECK(kv.list("").size() == 3);  // README decodes to the key "README"
  CHECK(kv.erase_prefix("acks") == 1);
  CHECK(::access((d + "/acks%2F/3").c_str(), F_OK) != 0);
  // the names are 255 bytes each at most: a long file name (a key's last two segments
  // together), or a long directory prefix
  auto e = error_from([&] { kv.put(std::string(300, 'k'), "v"); });
  CHECK(e.errnum() == ENAMETOOLONG);
  CHECK(std::string(e.what()).find("file name") != std::string::npos);
  e = error_from(
      [&] { kv.put("jobs/" + std::string(200, 'a') + "/" + std::string(60, 'b'), "v"); });
  CHECK(e.errnum() == ENAMETOOLONG);  // 200 + 3 + 60 bytes in one name
  CHECK(std::string(e.what()).find("file name") != std::string::npos);
  e = error_from([&] { kv.put(std::string(300, 'k') + "/v", "v"); });
  CHECK(e.errnum() == ENAMETOOLONG);
  CHECK(std::string(e.what()).find("directory prefix") != std::string::npos);
  CHECK(kv.try_get(std::string(200, 'p') + "/" + std::string(200, 'k')) == std::nullopt);
}

namespace {
// inotify_wait with a 10 s re-check: a wake-up within 2 s is inotify's, not the re-check's.
struct slow_recheck_wait : holdfast::inotify_wait {
  static constexpr std::chrono::milliseconds recheck{10000};
};
}  // namespace

TEST_CASE(
    "filesystem_kv parents: made by the first write, kept by erases, removed by a prefix "
    "erase that empties them") {
  holdfast_test::temp_dir dir("kvfs");
  holdfast::filesystem_kv kv(dir.path(), kv_namespace("run", 0));
  const std::string parent = kv.directory() + "/ack%2F";  // every round's acks
  auto exists = [](const std::string& p) { return ::access(p.c_str(), F_OK) == 0; };
  CHECK_FALSE(exists(parent));
  CHECK(kv.insert("ack/r0/1", "a"));
  CHECK(kv.insert("ack/r0/2", "b"));
  CHECK(exists(parent));
  CHECK(kv.erase("ack/r0/1"));
  CHECK(kv.erase("ack/r0/2"));
  CHECK(exists(parent));              // kept for the next round's keys (issue 32, item 11)
  CHECK_FALSE(kv.erase("ack/r0/2"));  // nothing there: false, no error
  // a directory removed behind a writer's back is made again
  kv.put("ack/r0/3", "c");
  CHECK(kv.erase("ack/r0/3"));
  REQUIRE(::rmdir(parent.c_str()) == 0);
  CHECK_FALSE(kv.erase("ack/r0/3"));  // no directory: false, no error
  kv.put("ack/r0/3", "d");
  CHECK(kv.get("ack/r0/3", 0ms) == std::optional<std::string>("d"));
  CHECK(kv.erase_prefix("ack") == 1);
  CHECK_FALSE(exists(parent));
  // a get waiting in a parent that does not exist yet still wakes on the insert: through
  // inotify, told apart from a re-check by one 10 s away (not the default 500 ms)
  holdfast::basic_filesystem_kv<slow_recheck_wait> waiter(dir.path(), kv_namespace("run", 0));
  const pid_t me = holdfast_test::this_thread_id();
  std::atomic<bool> inserted{false};
  std::chrono::steady_clock::time_point at{};
  std::thread writer([&] {
    // once the get is observed blocked (the wake-up is under test)
    if (holdfast_test::wait_asleep_in({me}, holdfast_test::poll_syscalls(), 10s)) {
      at = std::chrono::steady_clock::now();
      inserted = kv.insert("ack/r1/0", "e");
    }
  });
  CHECK(waiter.get("ack/r1/0", 5000ms) == std::optional<std::string>("e"));
  const auto woke = std::chrono::steady_clock::now();
  writer.join();
  CHECK(inserted);
  CHECK(woke - at < 2000ms);  // inotify, not the 10 s re-check: a fifth of it tells them apart
}

TEST_CASE("filesystem_kv parents: durable keys make durable directories") {
  using fault_plan = holdfast::testing::fault_plan;
  using io_op = holdfast::testing::io_op;
  holdfast_test::temp_dir dir("kvfs");
  holdfast::basic_filesystem_kv<holdfast::inotify_wait, holdfast::durable,
                                holdfast::testing::fault_io>
      kv(dir.path(), kv_namespace("run", 0));
  fault_plan::reset_counts();
  CHECK(kv.insert("ack/r0/1", "a"));  // a new directory: the namespace directory is synced too
  const auto first = fault_plan::calls(io_op::fsync);
  fault_plan::reset_counts();
  CHECK(kv.insert("ack/r0/2", "b"));  // the directory exists: the file and its directory
  const auto second = fault_plan::calls(io_op::fsync);
  CHECK(second >= 2);
  CHECK(first > second);  // the staged directory's tree, and the namespace directory
  fault_plan::reset_counts();
  kv.put("bck/r1/1", "c");  // a put makes its new directory with mkdir, then syncs the namespace
  CHECK(fault_plan::calls(io_op::fsync) == second + 1);
  CHECK(kv.list("ack") == kv_pairs{{"ack/r0/1", "a"}, {"ack/r0/2", "b"}});
  CHECK(kv.list("bck") == kv_pairs{{"bck/r1/1", "c"}});
}

TEST_CASE("filesystem_kv parents: racing first inserts into a new parent, one key each, all land") {
  // Several processes insert different keys into one parent that does not exist yet: each
  // stages the directory with its key; one rename wins, the others insert into its directory.
  holdfast_test::temp_dir dir("kvfs");
  const kv_namespace ns("run", 0);
  for (int round = 0; round < 20; ++round) {
    const std::string parent = "new" + std::to_string(round);
    std::vector<holdfast_test::child> kids;
    for (int t = 0; t < 4; ++t)
      kids.emplace_back([&, t] {
        holdfast::filesystem_kv kv(dir.path(), ns);
        std::_Exit(kv.insert(parent + "/" + std::to_string(t), "v") ? 0 : 1);
      });
    for (auto& k : kids) CHECK(k.wait(std::chrono::seconds(30)).ok());
    holdfast::filesystem_kv kv(dir.path(), ns);
    CHECK(kv.list(parent).size() == 4);
  }
  holdfast::filesystem_kv kv(dir.path(), ns);
  CHECK(kv.sweep_stale_temps(0ms) == 0);  // nothing was left in .tmp
}

TEST_CASE("filesystem_kv parents: racing inserts, puts and erases in one parent lose nothing") {
  holdfast_test::temp_dir dir("kvfs");
  holdfast::filesystem_kv kv(dir.path(), kv_namespace("run", 0));
  // One thread keeps emptying the parent (each erase may remove the directory) while another
  // inserts fresh keys into it: every insert lands, none fails with ENOENT.
  // Invariant: keys erased + keys left == keys inserted.
  std::atomic<bool> done{false};
  std::atomic<std::size_t> erased{0};
  std::thread eraser([&] {
    while (!done.load()) erased += kv.erase_prefix("p");
  });
  for (int i = 0; i < 2000; ++i) REQUIRE(kv.insert("p/" + std::to_string(i), "v"));
  // Puts look the directory up (lstat) before writing, so an erase can remove it in between:
  // the write that then fails with ENOENT makes it and writes again.
  const std::size_t erased_before_puts = erased.load();
  for (int i = 2000; i < 4000; ++i) REQUIRE_NOTHROW(kv.put("p/" + std::to_string(i), "v"));
  done.store(true);
  eraser.join();
  CHECK(erased_before_puts > 0);              // the race did happen, with the inserts
  CHECK(erased.load() > erased_before_puts);  // and with the puts
  CHECK(erased.load() + kv.list("p").size() == 4000);
}

TEST_CASE("filesystem_kv sweep_stale_temps: the namespace directory and every parent") {
  holdfast_test::temp_dir dir("kvfs");
  holdfast::filesystem_kv kv(dir.path(), kv_namespace("run", 0));
  kv.put("a/1", "x");
  kv.put("b/c/2", "y");
  for (auto name :
       {"/.holdfast-tmp.1.0123456789abcdef.stop", "/a%2F/.holdfast-tmp.2.0123456789abcdef.1",
        "/b%2F/.holdfast-tmp.3.0123456789abcdef.2"}) {
    int fd = ::open((kv.directory() + name).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  // an insert's staging directory, left by a writer killed before its rename
  const std::string staging = kv.directory() + "/.tmp/.holdfast-tmp.4.0123456789abcdef.parent";
  REQUIRE(::mkdir(staging.c_str(), 0755) == 0);
  { std::ofstream(staging + "/3") << "v"; }
  CHECK(kv.sweep_stale_temps(std::chrono::hours(1)) == 0);  // fresh: kept
  CHECK(kv.sweep_stale_temps(0ms) == 4);
  CHECK(::access(staging.c_str(), F_OK) != 0);
  CHECK(kv.list("").size() == 2);
}

// ---- optional operations: kv_supports, get_many, a watch that follows one key ---------------

TEST_CASE("kv_supports: the compile-time traits, or the store's own supports()") {
  using holdfast::kv_op;
  using holdfast::kv_supports;
  holdfast::in_process_kv mem(ns0);
  CHECK(kv_supports(mem, kv_op::list));
  CHECK(kv_supports(mem, kv_op::erase_prefix));
  CHECK_FALSE(kv_supports(mem, kv_op::watch));
  CHECK_FALSE(kv_supports(mem, kv_op::get_many));
  holdfast_test::c10d_like_kv small{holdfast::in_process_kv(ns0)};
  CHECK(kv_supports(small, kv_op::get));
  CHECK(kv_supports(small, kv_op::erase));
  CHECK_FALSE(kv_supports(small, kv_op::list));
  // a store that answers at run time is asked; counting_kv asks the store it wraps
  holdfast_test::key_wait_kv batched(holdfast::in_process_kv(ns0), true);
  holdfast_test::key_wait_kv single(holdfast::in_process_kv(ns0), false);
  static_assert(holdfast::has_kv_get_many_v<holdfast_test::key_wait_kv>);
  CHECK(kv_supports(batched, kv_op::get_many));
  CHECK_FALSE(kv_supports(single, kv_op::get_many));
  CHECK(kv_supports(single, kv_op::watch));
  holdfast::counting_kv<holdfast_test::key_wait_kv> counted(single);
  CHECK_FALSE(kv_supports(counted, kv_op::get_many));
  CHECK(kv_supports(counted, kv_op::watch));
  CHECK_FALSE(kv_supports(holdfast::counting_kv<holdfast::in_process_kv>(mem), kv_op::watch));
  static_assert(holdfast::has_kv_get_many_v<holdfast::counting_kv<holdfast_test::key_wait_kv>>);
  static_assert(!holdfast::has_kv_get_many_v<holdfast::counting_kv<holdfast::in_process_kv>>);
  static_assert(!holdfast::has_kv_watch_v<holdfast::counting_kv<holdfast::in_process_kv>>);
}

TEST_CASE("get_many: the store's own where it has one, single gets elsewhere") {
  using counted = holdfast::counting_kv<holdfast_test::key_wait_kv>;
  for (bool batched : {true, false}) {
    CAPTURE(batched);
    counted kv(holdfast_test::key_wait_kv(holdfast::in_process_kv(ns0), batched));
    kv.put("a/0", "x");
    const std::vector<std::string> keys = {"a/0", "a/1", "a/2"};
    // a timeout of 0: what is there now, in order
    auto now = holdfast::get_many(kv, keys, 0ms);
    CHECK(now == std::vector<std::optional<std::string>>{"x", std::nullopt, std::nullopt});
    // the missing keys come from another thread while the call waits
    const pid_t me = holdfast_test::this_thread_id();
    bool blocked = false;
    std::thread writer([kv, me, &blocked]() mutable {
      // once the call is observed blocked (the wake-up is under test)
      blocked = holdfast_test::wait_asleep_in({me}, holdfast_test::wait_syscalls(), 10s);
      kv.put("a/2", "z");
      kv.put("a/1", "y");
    });
    const auto t0 = clk::now();
    auto all = holdfast::get_many(kv, keys, 10s);
    writer.join();
    CHECK(blocked);
    CHECK(all == std::vector<std::optional<std::string>>{"x", "y", "z"});
    CHECK(ms_since(t0) < 5000);  // woke on the writes, not at the timeout
    // a key that never comes: nullopt at the timeout
    const auto t1 = clk::now();
    auto partial = holdfast::get_many(kv, {"a/0", "never"}, 200ms);
    CHECK(partial == std::vector<std::optional<std::string>>{"x", std::nullopt});
    CHECK(ms_since(t1) >= 190);
    const holdfast::kv_counts c = kv.counts();
    if (batched) {
      CHECK(c.get_many == 3);  // one call each: the store's own
      CHECK(c.get + c.try_get == 0);
    } else {
      CHECK(c.get_many == 0);  // the fallback: single reads
      CHECK(c.get + c.try_get == 3 + 3 + 2);
    }
  }
  // a store without any get_many member: the fallback
  holdfast::in_process_kv mem(ns0);
  mem.put("k", "v");
  CHECK(holdfast::get_many(mem, {"k", "missing"}, 10ms) ==
        std::vector<std::optional<std::string>>{"v", std::nullopt});
}

TEST_CASE("a watch that follows named keys: wakes once one exists, take() asks for a re-read") {
  holdfast_test::key_wait_kv kv{holdfast::in_process_kv(ns0)};
  auto w = kv.watch("ctl");
  static_assert(holdfast::has_kv_watch_v<holdfast_test::key_wait_kv>);
  static_assert(holdfast::has_kv_watch_follow_v<holdfast_test::key_wait_kv::watcher>);
  static_assert(!holdfast::has_kv_watch_follow_v<holdfast::filesystem_kv::watcher>);
  CHECK(w.buffered());
  CHECK(w.take().resync);  // the first take
  CHECK(w.take().empty());
  w.follow({"ctl/claim"});
  auto readable = [&](int ms) {
    pollfd p{w.fd(), POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  };
  kv.put("ctl/other", "1");  // not followed: quiet
  CHECK_FALSE(readable(50));
  const pid_t me = holdfast_test::this_thread_id();
  bool blocked = false;
  std::thread writer([kv, me, &blocked]() mutable {
    // once the reader is observed asleep in poll() (the wake-up is under test)
    blocked = holdfast_test::wait_asleep_in_poll({me}, 10s);
    kv.insert("ctl/claim", "c");
  });
  CHECK(readable(10000));
  writer.join();
  CHECK(blocked);
  CHECK(w.take().resync);
  CHECK_FALSE(readable(0));  // one wake-up per follow
  w.follow({"ctl/claim"});   // exists already: at once
  CHECK(readable(0));
  CHECK(w.take().resync);
  // Several keys: a write of any of them wakes it (the handler's idle watcher follows the claim,
  // the next periodic decision and the hang verdict at once).
  w.follow({"ctl/final", "ctl/save/1", "ctl/hang"});
  CHECK_FALSE(readable(50));
  kv.insert("ctl/save/1", "s");
  CHECK(readable(10000));
  CHECK(w.take().resync);
  CHECK_FALSE(readable(0));
  w.follow({"ctl/final", "ctl/save/1"});  // one of them exists already: at once
  CHECK(readable(0));
}
