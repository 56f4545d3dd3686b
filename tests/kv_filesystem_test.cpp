// filesystem_kv beyond the shared contract: every system call of insert, put, get, list and
// erase failed in turn (fault_io) gives a holdfast::error and no half state; a writer SIGKILLed
// at random points never leaves a partial value or a visible temp.
#include <doctest/doctest.h>
#include <poll.h>  // readable: a watch's descriptor
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <holdfast/agreement/keys.hpp>  // agreement_key_name: the rounds' keys
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <random>
#include <string>
#include <thread>

#include "support/child.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/sanitizers.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using holdfast::kv_namespace;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::disarm_on_exit;

namespace {

using faulty_kv =
    holdfast::basic_filesystem_kv<holdfast::inotify_wait, holdfast::durable, fault_io>;

std::size_t temps_in(const std::string& dir) {
  std::size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind(".holdfast-tmp.", 0) == 0) ++n;
  return n;
}

// A failed publish leaves no temp. A successful one whose cleanup unlink failed may leave one
// (publish.hpp documents it; sweep_stale_temps removes it): sweep it for the next round.
void check_temps(const std::string& dir, bool threw) {
  if (threw) {
    CHECK(temps_in(dir) == 0);
  } else {
    CHECK(temps_in(dir) <= 1);
    CHECK(fault_plan::failures() <= 1);
    holdfast::sweep_stale_temps(dir, 0ms);
  }
}

// Calls `op` once unarmed to count its syscalls, then fails each one in turn with EIO and runs
// `check(threw)` after each attempt.
template <class Setup, class Op, class Check>
void fail_each_call(Setup setup, Op op, Check check) {
  disarm_on_exit guard;
  setup();
  fault_plan::arm(fault{io_op::any, std::uint64_t(1) << 62, EIO});  // counts, never fires
  op();
  const auto calls = fault_plan::calls(io_op::any);
  fault_plan::disarm();
  REQUIRE(calls > 0);
  for (std::uint64_t k = 1; k <= calls; ++k) {
    CAPTURE(k);
    setup();
    fault_plan::arm(fault{io_op::any, k, EIO});
    bool threw = false;
    try {
      op();
    } catch (const holdfast::error& e) {
      threw = true;
      CHECK(e.errnum() == EIO);
    }
    fault_plan::disarm();
    check(threw);
  }
}

}  // namespace

TEST_CASE("filesystem_kv: each failed syscall of insert and put leaves the old value or none") {
  holdfast_test::temp_dir dir("kvfault");
  faulty_kv kv(dir.path(), kv_namespace("run", 0));
  fail_each_call([&] { kv.erase_prefix(""); }, [&] { kv.insert("k/1", "new value"); },
                 [&](bool threw) {
                   auto v = kv.try_get("k/1");
                   if (threw)
                     CHECK_FALSE(v.has_value());
                   else
                     CHECK(v == std::optional<std::string>("new value"));
                   check_temps(kv.directory(), threw);
                 });
  fail_each_call([&] { kv.put("k/1", "old value"); }, [&] { kv.put("k/1", "new value"); },
                 [&](bool threw) {
                   auto v = kv.try_get("k/1");
                   REQUIRE(v.has_value());
                   if (threw)
                     CHECK((*v == "old value" || *v == "new value"));  // never a mix
                   else
                     CHECK(*v == "new value");
                   check_temps(kv.directory(), threw);
                 });
}

TEST_CASE("filesystem_kv: failed reads, scans and unlinks are errors naming the path") {
  holdfast_test::temp_dir dir("kvfault");
  faulty_kv kv(dir.path(), kv_namespace("run", 0));
  kv.put("a/1", "x");
  kv.put("a/2", "y");
  disarm_on_exit guard;
  struct one {
    io_op op;
    const char* name;
  };
  for (auto f : {one{io_op::open, "open"}, one{io_op::read, "read"}}) {
    fault_plan::arm(fault{f.op, 1, EIO});
    try {
      kv.try_get("a/1");
      FAIL("no error");
    } catch (const holdfast::error& e) {
      CHECK(e.operation() == f.name);
      CHECK(e.path() == kv.path_of("a/1"));
    }
  }
  fault_plan::arm(fault{io_op::opendir, 1, EIO});
  CHECK_THROWS_AS(kv.list("a"), holdfast::error);
  fault_plan::arm(fault{io_op::readdir, 1, EIO});
  CHECK_THROWS_AS(kv.list("a"), holdfast::error);
  fault_plan::arm(fault{io_op::unlink, 1, EACCES});
  try {
    kv.erase("a/1");
    FAIL("no error");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EACCES);
    CHECK(e.operation() == "unlink");
  }
  fault_plan::disarm();
  CHECK(kv.list("a").size() == 2);  // nothing was lost by the failed calls
  fault_plan::arm(fault{io_op::mkdir, 1, EACCES});
  try {
    faulty_kv other(dir.path(), kv_namespace("run2", 0));
    FAIL("no error");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EACCES);
    CHECK(e.operation() == "mkdir");
  }
}

TEST_CASE("filesystem_kv: creates its root with missing parents, and reports what it cannot") {
  holdfast_test::temp_dir dir("kvroot");
  holdfast::filesystem_kv kv(dir.path() + "/a/b/c", kv_namespace("run", 7));
  CHECK(kv.directory() == dir.path() + "/a/b/c/run/7");
  CHECK(kv.insert("k", "v"));
  const std::string file = dir.path() + "/file";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  try {
    holdfast::filesystem_kv bad(file + "/sub", kv_namespace("run", 7));
    FAIL("no error");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ENOTDIR);
    CHECK(e.operation() == "mkdir");
    CHECK(e.path() == file + "/sub");
  }
}

TEST_CASE("filesystem_kv: a writer SIGKILLed at random points leaves whole values only") {
  // Scaled down under sanitizers (slow fork + exec of the runtime).
  constexpr int kRuns = holdfast_test::sanitized ? 10 : 40;
  holdfast_test::temp_dir dir("kvkill");
  holdfast::filesystem_kv kv(dir.path(), kv_namespace("run", 0));
  const std::string a(64 * 1024, 'a'), b(64 * 1024, 'b');
  kv.put("big", a);
  std::mt19937 rng(42);
  for (int run = 0; run < kRuns; ++run) {
    holdfast_test::child writer([&] {
      holdfast::basic_filesystem_kv<holdfast::inotify_wait, holdfast::durable> mine(
          dir.path(), kv_namespace("run", 0));
      for (int i = 0;; ++i) {
        mine.put("big", i % 2 ? a : b);
        mine.erase("claim");
        mine.insert("claim", i % 2 ? a : b);
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    writer.kill(SIGKILL);
    auto r = writer.wait(5s);
    CHECK(r.term_signal == SIGKILL);
    auto v = kv.try_get("big");
    REQUIRE(v.has_value());
    CHECK((*v == a || *v == b));
    auto c = kv.try_get("claim");
    if (c) CHECK((*c == a || *c == b));
  }
  auto listed = kv.list("");
  for (auto& p : listed) CHECK((p.first == "big" || p.first == "claim"));
  const std::size_t left = temps_in(kv.directory());  // killed mid-publish: temps, never keys
  CHECK(holdfast::sweep_stale_temps(kv.directory(), 0ms) == left);
  CHECK(temps_in(kv.directory()) == 0);
}

// ---- issue 32, item 11: the agreement's cost on the filesystem store ------------------------

namespace {

// posix_io counting the directories made (a mkdir that succeeded).
struct mkdir_counting_io : holdfast::posix_io {
  static std::atomic<int>& made() {
    static std::atomic<int> n{0};
    return n;
  }
  static int mkdir(const char* path, mode_t mode) noexcept {
    const int r = holdfast::posix_io::mkdir(path, mode);
    if (r == 0) ++made();
    return r;
  }
};

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

// Each round's keys lived in directories of their own (ack/r<N>/, ctl/r<N>/): every round made
// two (the claim's staged in .tmp, the first ack's) and removed them, and a watch on ctl/ woke
// for the ack directory appearing and going. A key's directory is now its parent less the
// round: every round's keys share ctl/'s and ack/'s. Invariants, after the first round: a round
// makes no directory; the acks' puts and erases never wake a watch on the control keys.
TEST_CASE("filesystem_kv: a round after the first makes no directory, and acks never wake ctl/") {
  using counted_kv =
      holdfast::basic_filesystem_kv<holdfast::inotify_wait, holdfast::no_sync, mkdir_counting_io>;
  holdfast_test::temp_dir dir("kvfs");
  counted_kv kv(dir.path(), kv_namespace("rounds", 0));
  const std::string scope = "holdfast/rounds/";
  const int n = 4;
  auto key = [&](holdfast::agreement_key k, int round, int task = -1) {
    return holdfast::agreement_key_name(scope, k, static_cast<std::uint64_t>(round), task);
  };
  using holdfast::agreement_key;
  auto acks = [&](int r, bool put) {
    for (int t = 0; t < n; ++t) {
      if (put)
        kv.put(key(agreement_key::ack, r, t), "1000");
      else
        CHECK(kv.erase(key(agreement_key::ack, r, t)));
    }
  };
  auto control = [&](int r, agreement_key k) { CHECK(kv.insert(key(k, r), "x by 0/n")); };
  // round 0, as the protocol writes it: claim, acks, step, acks erased
  control(0, agreement_key::claim);
  acks(0, true);
  control(0, agreement_key::step);
  acks(0, false);
  auto w = kv.watch(holdfast::agreement_control_prefix(scope));
  w.take();  // the first take: a resync
  REQUIRE(w.fd() >= 0);
  CHECK_FALSE(readable(w.fd()));
  mkdir_counting_io::made() = 0;
  // round 1: the acks alone wake no watch on ctl/
  acks(1, true);
  CHECK_FALSE(readable(w.fd()));
  acks(1, false);
  CHECK_FALSE(readable(w.fd()));
  // its claim and step (and round 0's control keys erased) make no directory either
  control(1, agreement_key::claim);
  control(1, agreement_key::step);
  CHECK(kv.erase(key(agreement_key::claim, 0)));
  CHECK(kv.erase(key(agreement_key::step, 0)));
  CHECK(mkdir_counting_io::made().load() == 0);
  CHECK(readable(w.fd()));  // the control keys do wake it
  // what the store holds is round 1's control keys, nothing else
  CHECK(kv.list("holdfast/rounds") ==
        holdfast::kv_pairs{{key(agreement_key::claim, 1), "x by 0/n"},
                           {key(agreement_key::step, 1), "x by 0/n"}});
}
