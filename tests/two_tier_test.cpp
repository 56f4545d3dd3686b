// two_tier_checkpoints: saves land in the local tier, a background copier publishes them to the
// durable tier with their identity; retention per tier; a hung durable mount never blocks a
// local save; wait_for_durable reports what it did not copy; a new node (empty local tier)
// restores from the durable tier, also through the handler's restore agreement; each copy's
// time reaches the save-interval policy; a preemption save's copy goes before a superseded one;
// durable_step() follows a restore.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>  // getpriority: the copier's nice value
#include <sys/syscall.h>   // SYS_gettid
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <holdfast/checkpoint/save_policy.hpp>
#include <holdfast/checkpoint/two_tier.hpp>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "support/child.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using steps = std::vector<std::int64_t>;

namespace {

// Deterministic content of a step's checkpoint: a top file and one in a subdirectory.
std::string content(std::int64_t step) {
  return std::string(4096 + static_cast<std::size_t>(step % 7) * 100,
                     static_cast<char>('a' + step % 26)) +
         std::to_string(step);
}

void write_step(const std::string& dir, std::int64_t step) {
  std::ofstream(dir + "/data") << content(step);
  ::mkdir((dir + "/sub").c_str(), 0755);
  std::ofstream(dir + "/sub/more") << "more " << step;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Reads a step back; throws format_error (as an integrity check would) on other bytes.
void check_step(const std::string& dir, std::int64_t step) {
  if (slurp(dir + "/data") != content(step) ||
      slurp(dir + "/sub/more") != "more " + std::to_string(step))
    throw holdfast::format_error(dir, "not the bytes of step " + std::to_string(step));
}

struct log_sink {
  std::shared_ptr<std::mutex> m = std::make_shared<std::mutex>();
  std::shared_ptr<std::string> text = std::make_shared<std::string>();
  holdfast::log_fn fn() const {
    return [m = m, t = text](std::string_view line) {
      std::lock_guard<std::mutex> l(*m);
      *t += std::string(line) + "\n";
    };
  }
  std::string get() const {
    std::lock_guard<std::mutex> l(*m);
    return *text;
  }
};

holdfast::two_tier_options opts(std::size_t keep_local, std::size_t keep_durable,
                                const log_sink& log) {
  holdfast::two_tier_options o;
  o.local.max_to_keep = keep_local;
  o.durable.max_to_keep = keep_durable;
  o.local.log = o.durable.log = o.log = log.fn();
  return o;
}

template <class T>
T make(const std::string& local, const std::string& durable, holdfast::two_tier_options o) {
  T t(local, holdfast::directory_commit::rename, durable, holdfast::directory_commit::rename,
      std::move(o));
  t.set_writer(write_step);
  return t;
}

using tiers = holdfast::two_tier_checkpoints<>;

std::chrono::steady_clock::time_point in(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

// A durable mount whose fsync never answers while `stalled()` (a dead NFS server), counting the
// calls that entered the stall.
std::atomic<bool>& stalled() {
  static std::atomic<bool> s{false};
  return s;
}
std::atomic<int>& stuck_calls() {
  static std::atomic<int> n{0};
  return n;
}
struct stalling_io : holdfast::posix_io {
  static int fsync(int fd) noexcept {
    if (stalled().load()) {
      stuck_calls().fetch_add(1);
      while (stalled().load()) std::this_thread::sleep_for(1ms);
    }
    return holdfast::posix_io::fsync(fd);
  }
};
using stalling_store = holdfast::basic_store<holdfast::basic_local_filesystem<stalling_io>>;
using hung_tiers = holdfast::two_tier_checkpoints<holdfast::store, stalling_store>;

// The calling thread's nice value (Linux: per thread).
int thread_nice() {
  errno = 0;
  return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
}
// A durable mount that records the nice value of the thread that fsyncs its files.
std::atomic<int>& copy_nice() {
  static std::atomic<int> n{-100};
  return n;
}
struct nice_recording_io : holdfast::posix_io {
  static int fsync(int fd) noexcept {
    copy_nice().store(thread_nice());
    return holdfast::posix_io::fsync(fd);
  }
};
using nice_store = holdfast::basic_store<holdfast::basic_local_filesystem<nice_recording_io>>;

// A durable mount whose fsyncs take slow_fsync_ms() each (a slow shared filesystem).
std::atomic<int>& slow_fsync_ms() {
  static std::atomic<int> ms{0};
  return ms;
}
struct slow_io : holdfast::posix_io {
  static int fsync(int fd) noexcept {
    if (int ms = slow_fsync_ms().load(); ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return holdfast::posix_io::fsync(fd);
  }
};
using slow_store = holdfast::basic_store<holdfast::basic_local_filesystem<slow_io>>;

// A durable mount whose writes wait while write_gate() is shut, counting the writes that waited:
// a copy held inside its stream of the local files.
std::atomic<bool>& write_gate() {
  static std::atomic<bool> shut{false};
  return shut;
}
std::atomic<int>& gated_writes() {
  static std::atomic<int> n{0};
  return n;
}
struct gated_io : holdfast::posix_io {
  static ssize_t write(int fd, const void* buf, std::size_t n) noexcept {
    if (write_gate().load()) {
      gated_writes().fetch_add(1);
      while (write_gate().load()) std::this_thread::sleep_for(1ms);
    }
    return holdfast::posix_io::write(fd, buf, n);
  }
};
using gated_store = holdfast::basic_store<holdfast::basic_local_filesystem<gated_io>>;
using gated_tiers = holdfast::two_tier_checkpoints<holdfast::store, gated_store>;

// Waits until `cond()` or `limit`; returns cond().
template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  return cond();
}

// The entries of `dir` whose name starts with `prefix`.
std::vector<std::string> entries_starting(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& name : holdfast::detail::store_list_dir<holdfast::posix_io>(dir))
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("two tiers: a save lands locally and the copier publishes it durable with its identity") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  auto t = make<tiers>(d / "local", d / "durable", opts(2, 3, log));
  t.begin_history("launch-1");
  for (std::int64_t s = 1; s <= 3; ++s) t.save(s);
  CHECK(t.wait_for_durable(in(20s)) == steps{});
  CHECK(t.durable_step() == 3);

  holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                       holdfast::directory_commit::rename);
  holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                         holdfast::directory_commit::rename);
  // Step 2 may have been superseded before its copy started; 3, the newest, was copied.
  REQUIRE(!durable.all_steps().empty());
  CHECK(durable.all_steps().back() == 3);
  auto lm = local.metadata(3);
  auto dm = durable.metadata(3);
  REQUIRE(lm);
  REQUIRE(dm);
  CHECK(dm->identity() == holdfast::checkpoint_identity{3, "launch-1"});
  CHECK(dm->time == lm->time);
  durable.restore_step(3, [](const std::string& dir) { check_step(dir, 3); });

  // restore: the newest, from the local tier, through the reader.
  std::int64_t loaded = -1;
  t.set_reader([&](const std::string& dir, std::int64_t s) {
    check_step(dir, s);
    loaded = s;
  });
  CHECK(t.restore() == 3);
  CHECK(loaded == 3);
  CHECK(t.all_identities().back() == holdfast::checkpoint_identity{3, "launch-1"});
}

TEST_CASE("two tiers: retention runs per tier and keeps the newest durable step locally") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  auto t = make<tiers>(d / "local", d / "durable", opts(2, 3, log));
  for (std::int64_t s = 1; s <= 6; ++s) {
    t.save(s);
    REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  }
  holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                       holdfast::directory_commit::rename);
  holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                         holdfast::directory_commit::rename);
  CHECK(local.all_steps() == steps{5, 6});
  CHECK(durable.all_steps() == steps{4, 5, 6});
  CHECK(t.all_steps() == steps{4, 5, 6});  // the union
}

TEST_CASE("two tiers: a hung durable mount never blocks local saves and the wait reports it") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  auto o = opts(2, 3, log);
  o.durable_wait = 300ms;
  stuck_calls() = 0;
  {
    hung_tiers t(d / "local", holdfast::directory_commit::rename, d / "durable",
                 holdfast::directory_commit::rename, o);
    t.set_writer(write_step);
    stalled() = true;  // the mount dies
    t.save(1);
    for (int i = 0; i < 20000 && stuck_calls().load() == 0; ++i) std::this_thread::sleep_for(1ms);
    REQUIRE(stuck_calls().load() > 0);  // the copy of step 1 hangs in fsync

    // Local saves go on; each replaces the pending copy request.
    auto saves = std::async(std::launch::async, [&] {
      for (std::int64_t s = 2; s <= 4; ++s) t.save(s);
    });
    bool returned = saves.wait_for(30s) == std::future_status::ready;
    if (!returned) stalled() = false;  // let the test end
    REQUIRE(returned);
    saves.get();
    CHECK(t.all_steps() == steps{1, 3, 4});  // keep 2 + step 1, in flight (none durable yet)

    CHECK(t.wait_for_durable(in(100ms)) == steps{1, 4});  // 1 in flight, 4 pending
    const auto t0 = std::chrono::steady_clock::now();
    t.wait_until_finished();  // bounded by durable_wait
    CHECK(std::chrono::steady_clock::now() - t0 < 20s);
    CHECK(t.unfinished() == steps{1, 4});
    CHECK(log.get().find("step(s) 1, 4") != std::string::npos);

    stalled() = false;  // the mount comes back
    CHECK(t.wait_for_durable(in(20s)) == steps{});
    CHECK(t.durable_step() == 4);
  }
  holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                         holdfast::directory_commit::rename);
  CHECK(durable.all_steps() == steps{1, 4});  // 2 and 3 were superseded before they started
}

TEST_CASE(
    "two tiers: a new node restores from the durable tier and a corrupt local copy falls back") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  {
    auto t = make<tiers>(d / "local", d / "durable", opts(2, 3, log));
    for (std::int64_t s = 1; s <= 3; ++s) {
      t.save(s);
      REQUIRE(t.wait_for_durable(in(20s)) == steps{});
    }
  }
  SUBCASE("new node") {
    auto t = make<tiers>(d / "local-new", d / "durable", opts(2, 3, log));
    CHECK(t.all_steps() == steps{1, 2, 3});
    std::string from;
    t.set_reader([&](const std::string& dir, std::int64_t s) {
      check_step(dir, s);
      from = dir;
    });
    CHECK(t.restore() == 3);
    CHECK(from.rfind(d / "durable", 0) == 0);
    CHECK(log.get().find("the local tier has no step 3") != std::string::npos);
  }
  SUBCASE("a flipped byte in the local copy") {
    auto t = make<tiers>(d / "local", d / "durable", opts(2, 3, log));
    holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                         holdfast::directory_commit::rename);
    const std::string data = local.latest()->path + "/data";
    std::string bytes = slurp(data);
    bytes[10] = static_cast<char>(bytes[10] ^ 1);
    std::ofstream(data, std::ios::trunc) << bytes;
    std::string from;
    t.set_reader([&](const std::string& dir, std::int64_t s) {
      check_step(dir, s);
      from = dir;
    });
    CHECK(t.restore() == 3);
    CHECK(from.rfind(d / "durable", 0) == 0);
    CHECK(log.get().find("the local copy of step 3 did not load") != std::string::npos);
  }
}

TEST_CASE("two tiers: the hang bounds reach both copies and come back from a restore of either") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  const holdfast::hang_bounds b{20ms, 150ms, 40ms, 300};
  {
    auto t = make<tiers>(d / "local", d / "durable", opts(2, 3, log));
    t.set_hang_bounds(b);
    t.save(1);
    REQUIRE(t.wait_for_durable(in(20s)) == steps{});
    holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                         holdfast::directory_commit::rename);
    holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                           holdfast::directory_commit::rename);
    auto lm = local.metadata(1);
    auto dm = durable.metadata(1);
    REQUIRE(lm);
    REQUIRE(dm);
    CHECK(lm->hang == b);
    CHECK(dm->hang == b);  // the copier's save records the local copy's bounds

    CHECK(!t.restored_hang_bounds());  // nothing restored yet
    CHECK(t.restore() == 1);           // the local copy
    CHECK(t.restored_hang_bounds() == b);
  }
  // A new node: an empty local tier, the durable copy restored.
  auto t = make<tiers>(d / "local-new", d / "durable", opts(2, 3, log));
  CHECK(t.restore() == 1);
  CHECK(log.get().find("the local tier has no step 1") != std::string::npos);
  CHECK(t.restored_hang_bounds() == b);
}

namespace {
using fs_config = holdfast::termination_config<holdfast::signal_notice<SIGUSR2>, holdfast::no_exit>;
using tier_handler = holdfast::preemption_handler<fs_config, holdfast::filesystem_kv, tiers>;
}  // namespace

TEST_CASE(
    "two tiers: the restore agreement picks the newest step all hold and a new node reads it "
    "from the durable tier") {
  // Three tasks saved steps 1-4 in both tiers; tasks 0 and 1 also saved step 5. Task 2's node
  // is replaced: its local tier is empty. The agreement's step is 4, which task 2 restores from
  // its durable tier and the others from their local tier.
  holdfast_test::temp_dir d("tiers-agree");
  constexpr int n = 3;
  auto local = [&](int t) { return d / ("local-" + std::to_string(t)); };
  auto durable = [&](int t) { return d / ("durable-" + std::to_string(t)); };
  log_sink log;
  for (int t = 0; t < n; ++t) {
    auto c = make<tiers>(local(t), durable(t), opts(2, 5, log));
    for (std::int64_t s = 1; s <= (t < 2 ? 5 : 4); ++s) {
      c.save(s);
      REQUIRE(c.wait_for_durable(in(20s)) == steps{});
    }
  }
  std::vector<std::unique_ptr<holdfast_test::child>> kids;
  for (int t = 0; t < n; ++t)
    kids.push_back(std::make_unique<holdfast_test::child>([&, t] {
      const std::string here = t == 2 ? d / "local-2-new" : local(t);
      auto c = make<tiers>(here, durable(t), opts(2, 5, log_sink{}));
      std::string from;
      c.set_reader([&](const std::string& dir, std::int64_t s) {
        check_step(dir, s);
        from = dir;
      });
      holdfast::filesystem_kv kv(d / "kv", holdfast::kv_namespace("job", "0"));
      holdfast::handler_options o;
      o.ack_timeout = 20s;
      tier_handler h(fs_config(holdfast::signal_notice<SIGUSR2>(), holdfast::no_exit{}), kv,
                     {t, n, "run"}, std::move(c), o);
      CHILD_REQUIRE(h.restored_step() == 4);
      CHILD_REQUIRE(from.rfind(t == 2 ? durable(t) : local(t), 0) == 0);
    }));
  for (auto& k : kids) {
    auto r = k->wait(60s);
    CHECK(r.failures == "");
    CHECK(r.exit_code == 0);
  }
}

namespace {
using hung_handler = holdfast::preemption_handler<fs_config, holdfast::filesystem_kv, hung_tiers>;
}  // namespace

TEST_CASE("two tiers: the preemption save returns with its durable copy hung and reports it") {
  // One worker; the durable mount dies after the start. A notice: the handler saves the step
  // locally and waits for the copier only durable_wait (300 ms); run() returns stopped, the step
  // is in the local tier and unfinished() names it.
  holdfast_test::temp_dir d("tiers-preempt");
  holdfast_test::child c([&] {
    auto o = opts(2, 3, log_sink{});
    o.durable_wait = 300ms;
    hung_tiers t(d / "local", holdfast::directory_commit::rename, d / "durable",
                 holdfast::directory_commit::rename, o);
    t.set_writer(write_step);
    holdfast::filesystem_kv kv(d / "kv", holdfast::kv_namespace("job", "0"));
    holdfast::handler_options ho;
    ho.ack_timeout = 20s;
    hung_handler h(fs_config(holdfast::signal_notice<SIGUSR2>(), holdfast::no_exit{}), kv,
                   {0, 1, "run"}, std::move(t), ho);
    stalled() = true;
    holdfast::run_status st = holdfast::run_status::ran;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (int i = 0;
         st != holdfast::run_status::stopped && std::chrono::steady_clock::now() < deadline; ++i) {
      if (i == 5) ::kill(::getpid(), SIGUSR2);
      st = h.run([] { std::this_thread::sleep_for(1ms); });  // a training step
    }
    CHILD_REQUIRE(st == holdfast::run_status::stopped);
    auto& ck = h.checkpointer();
    CHILD_REQUIRE(!ck.unfinished().empty());
    CHILD_REQUIRE(ck.unfinished().back() == ck.local().latest_step());
    CHILD_REQUIRE(ck.local().latest_step() >= 5);
    CHILD_REQUIRE(stuck_calls().load() > 0);
  });  // its destruction leaves the hung copy to its thread after durable_wait
  auto r = c.wait(60s);
  CHECK(!r.timed_out);  // an unbounded wait for the hung copy never returns
  CHECK(r.failures == "");
  CHECK(r.exit_code == 0);
}

TEST_CASE("two tiers: copier_nice lowers the copier thread's priority, not the caller's") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  const int base = thread_nice();
  REQUIRE(base < 19);  // else there is nothing to lower
  auto o = opts(2, 2, log);
  o.copier_nice = 19;
  auto t = make<holdfast::two_tier_checkpoints<holdfast::store, nice_store>>(d / "local",
                                                                             d / "durable", o);
  t.save(1);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  CHECK(copy_nice().load() == 19);  // the durable copy's syncs ran at nice 19
  CHECK(thread_nice() == base);     // the training thread kept its own
  t.save(2);                        // a second copy, by the same thread
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  CHECK(copy_nice().load() == 19);
  CHECK(log.get().find("copier's nice") == std::string::npos);
}

TEST_CASE(
    "two tiers: a step is listed while one tier holds every file of it, and read from there") {
  // Invariant: every step all_steps() lists restores (from the tier whose files are all there).
  holdfast_test::temp_dir d("tiers-list");
  log_sink log;
  auto t = make<tiers>(d / "local", d / "durable", opts(3, 3, log));
  for (std::int64_t s = 1; s <= 3; ++s) {
    t.save(s);
    REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  }
  holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                       holdfast::directory_commit::rename);
  holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                         holdfast::directory_commit::rename);
  std::remove((local.checkpoints().back().path + "/sub/more").c_str());
  CHECK(t.all_steps() == steps{1, 2, 3});  // the durable copy of 3 is complete
  std::string from;
  t.set_reader([&](const std::string& dir, std::int64_t s) {
    check_step(dir, s);
    from = dir;
  });
  t.restore_step(3);
  CHECK(from.rfind(d / "durable", 0) == 0);
  CHECK(t.restore() == 3);
  CHECK(from.rfind(d / "durable", 0) == 0);

  std::remove((durable.checkpoints().back().path + "/data").c_str());  // gone in both tiers
  CHECK(t.all_steps() == steps{1, 2});
  CHECK(t.latest_step() == 2);
  for (std::int64_t s : t.all_steps()) CHECK_NOTHROW(t.restore_step(s));
  CHECK(t.restore() == 2);
  CHECK(from.rfind(d / "local", 0) == 0);
}

namespace {

// Flips one byte of `path` in place (the size stays).
void flip_byte(const std::string& path) {
  std::string bytes = slurp(path);
  REQUIRE(bytes.size() > 2);
  bytes[2] = static_cast<char>(bytes[2] ^ 1);
  std::ofstream(path, std::ios::trunc | std::ios::binary) << bytes;
}

// A reader that checks nothing: only an integrity check can tell a flipped byte.
struct recording_reader {
  std::shared_ptr<std::string> from = std::make_shared<std::string>();
  void operator()(const std::string& dir, std::int64_t) const { *from = dir; }
};

}  // namespace

// Invariant: a restore never loads a local copy whose bytes differ from what its durable copy
// of the same identity recorded; the local save sums nothing by default (local_sums off).
TEST_CASE("two tiers: a flipped local byte is caught by the durable copy's sums (local sums off)") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  auto t = make<tiers>(d / "local", d / "durable", opts(2, 3, log));
  t.begin_history("launch-1");
  for (std::int64_t s = 1; s <= 3; ++s) t.save(s);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                       holdfast::directory_commit::rename);
  CHECK(local.verify_step(3).status == holdfast::integrity_status::unverified);  // no local sums
  flip_byte(local.latest()->path + "/sub/more");
  recording_reader r;
  t.set_reader(r);
  CHECK(t.restore() == 3);
  CHECK(r.from->rfind(d / "durable", 0) == 0);
  CHECK(log.get().find("the local copy of step 3 did not load") != std::string::npos);
  CHECK(log.get().find("its durable copy's sums") != std::string::npos);
}

TEST_CASE("two tiers: a local copy not copied yet restores unverified, and says so") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  auto o = opts(2, 3, log);
  o.durable_wait = 300ms;
  stuck_calls() = 0;
  hung_tiers t(d / "local", holdfast::directory_commit::rename, d / "durable",
               holdfast::directory_commit::rename, o);
  t.set_writer(write_step);
  stalled() = true;  // the copier is behind: its copy of step 1 hangs in fsync
  t.save(1);
  for (int i = 0; i < 20000 && stuck_calls().load() == 0; ++i) std::this_thread::sleep_for(1ms);
  if (stuck_calls().load() == 0) stalled() = false;
  REQUIRE(stuck_calls().load() > 0);
  holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                       holdfast::directory_commit::rename);
  flip_byte(local.latest()->path + "/data");
  recording_reader r;
  t.set_reader(r);
  std::optional<std::int64_t> got;
  try {
    got = t.restore();
  } catch (...) {
    stalled() = false;
    throw;
  }
  stalled() = false;
  CHECK(got == 1);
  CHECK(r.from->rfind(d / "local", 0) == 0);
  CHECK(log.get().find("step 1 restores unverified") != std::string::npos);
  CHECK(t.wait_for_durable(in(20s)) == steps{});
}

TEST_CASE("two tiers: with local_sums on, the local copy is checked by its own sums") {
  holdfast_test::temp_dir d("tiers");
  log_sink log;
  auto o = opts(2, 3, log);
  o.local_sums = true;
  auto t = make<tiers>(d / "local", d / "durable", o);
  for (std::int64_t s = 1; s <= 3; ++s) t.save(s);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  holdfast::checkpoint_manager<> local(holdfast::read_only, d / "local",
                                       holdfast::directory_commit::rename);
  CHECK(local.verify_step(3).status == holdfast::integrity_status::ok);
  flip_byte(local.latest()->path + "/data");
  CHECK(local.verify_step(3).status == holdfast::integrity_status::crc_mismatch);
  recording_reader r;
  t.set_reader(r);
  CHECK(t.restore() == 3);
  CHECK(r.from->rfind(d / "durable", 0) == 0);
  CHECK(log.get().find("the local copy of step 3 did not load") != std::string::npos);
  CHECK(log.get().find("its durable copy's sums") == std::string::npos);  // its own
}

TEST_CASE("two tiers: each durable copy's time reaches the save-interval policy (record_copy)") {
  // C is 0 here (no save is recorded: Daly's interval is 0) and min_interval is 0, so the policy's
  // interval is the copies' cost alone: 0 until a copy is fed, then at least the slow mount's
  // fsync. The training thread asks the policy while the copier feeds it (ThreadSanitizer).
  holdfast_test::temp_dir d("tiers-policy");
  log_sink log;
  holdfast::save_interval_options po;
  po.min_interval = holdfast::save_seconds(0);
  po.mtbi_prior = 1h;
  slow_fsync_ms() = 40;
  auto t = make<holdfast::two_tier_checkpoints<holdfast::store, slow_store>>(
      d / "local", d / "durable", opts(2, 2, log));
  // [snippet two-tier-copy-costs]
  holdfast::save_interval_policy policy(po);  // the training loop's
  t.feed_copy_costs(policy);  // the copier calls policy.record_copy(took) after each copy
  // [/snippet two-tier-copy-costs]
  policy.start(std::chrono::steady_clock::now());
  CHECK(policy.interval(std::chrono::steady_clock::now()).count() == 0);
  t.save(1);  // C stays 0 (save_when_due would measure the local save)
  bool copied = eventually([&] {
    (void)policy.interval(std::chrono::steady_clock::now());  // read while the copier writes
    return policy.copy_cost().count() > 0;
  });
  slow_fsync_ms() = 0;
  REQUIRE(copied);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  const double copy = policy.copy_cost().count();
  CHECK(copy >= 0.04);  // at least one of the durable save's fsyncs
  const auto now = std::chrono::steady_clock::now();
  CHECK(policy.interval(now).count() == doctest::Approx(copy));  // never shorter than a copy
  CHECK(policy.interval(now).count() >= copy);
  CHECK(!policy.should_save(*policy.last_save() + std::chrono::milliseconds(30)));  // < a copy

  // on_copy: the step and the time of each copy, on the copier's thread; {} stops it.
  std::mutex m;
  std::vector<std::pair<std::int64_t, double>> seen;
  t.on_copy([&](std::int64_t step, std::chrono::duration<double> took) {
    std::lock_guard<std::mutex> l(m);
    seen.emplace_back(step, took.count());
  });
  t.save(2);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  t.on_copy({});
  t.save(3);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  std::lock_guard<std::mutex> l(m);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].first == 2);
  CHECK(seen[0].second > 0);
  CHECK(policy.copy_cost().count() == copy);  // steps 2 and 3 did not reach the policy
}

TEST_CASE("two tiers: a newer save's copy goes before a superseded one") {
  // Step 1 is copied (its time measured); step 2's copy is then held inside its stream of the
  // local files (the durable mount's writes wait at a gate) while newer saves come.
  holdfast_test::temp_dir d("tiers-supersede");
  log_sink log;
  write_gate() = false;
  gated_writes() = 0;
  gated_tiers t(d / "local", holdfast::directory_commit::rename, d / "durable",
                holdfast::directory_commit::rename, opts(4, 4, log));
  t.set_writer(write_step);
  t.save(1);
  REQUIRE(t.wait_for_durable(in(20s)) == steps{});
  write_gate() = true;
  t.save(2);
  const bool held = eventually([] { return gated_writes().load() > 0; });
  if (!held) write_gate() = false;
  REQUIRE(held);  // the copy of step 2 is in flight, inside its writer
  holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                         holdfast::directory_commit::rename);

  SUBCASE("a queued copy is replaced: the newest step's copy starts next") {
    t.save(3);
    t.save(4);                                           // replaces 3, not started
    CHECK(t.wait_for_durable(in(50ms)) == steps{2, 4});  // 2 in flight, 4 pending
    write_gate() = false;
    CHECK(t.wait_for_durable(in(20s)) == steps{});
    CHECK(durable.all_steps() == steps{1, 2, 4});  // no preemption: the copy in flight finishes
    CHECK(log.get().find("step 3 was replaced by step 4's before it started") != std::string::npos);
  }
  SUBCASE("a preemption save abandons the older copy in flight and its copy starts next") {
    t.set_durable_deadline(in(60s));  // the handler's, before its preemption save
    t.save(3);
    write_gate() = false;
    CHECK(t.wait_for_durable(in(20s)) == steps{});
    CHECK(durable.all_steps() == steps{1, 3});
    CHECK(t.durable_step() == 3);
    CHECK(log.get().find("durable copy of step 2 was abandoned") != std::string::npos);
    CHECK(log.get().find("failed") == std::string::npos);         // abandoned is not failed
    CHECK(entries_starting(d / "durable", ".staging-").empty());  // the durable save cleaned up
    CHECK(t.all_steps() == steps{1, 2, 3});                       // the local tier keeps step 2
    t.save(4);                                                    // the copier goes on as before
    CHECK(t.wait_for_durable(in(20s)) == steps{});
    CHECK(durable.all_steps() == steps{1, 3, 4});
  }
  SUBCASE("a preemption save whose copy would not end by the deadline lets the older one finish") {
    t.set_durable_deadline(std::chrono::steady_clock::now());  // no time left for a copy
    t.save(3);
    write_gate() = false;
    CHECK(t.wait_for_durable(in(20s)) == steps{});
    CHECK(durable.all_steps() == steps{1, 2, 3});
    CHECK(log.get().find("abandoned") == std::string::npos);
  }
  write_gate() = false;
}

TEST_CASE("two tiers: durable_step() follows a restore of an older step") {
  holdfast_test::temp_dir d("tiers-restore");
  log_sink log;
  {
    auto t = make<tiers>(d / "local", d / "durable", opts(5, 5, log));
    t.begin_history("launch-1");
    for (std::int64_t s = 1; s <= 4; ++s) {
      t.save(s);
      REQUIRE(t.wait_for_durable(in(20s)) == steps{});
    }
    REQUIRE(t.durable_step() == 4);
    t.restore_step(2);  // the restore agreement chose an older step
    CHECK(t.durable_step() == 2);
    t.begin_history("launch-2");
    t.save(3);  // the new line's step 3
    CHECK(t.wait_for_durable(in(20s)) == steps{});
    CHECK(t.durable_step() == 3);
    holdfast::checkpoint_manager<> durable(holdfast::read_only, d / "durable",
                                           holdfast::directory_commit::rename);
    REQUIRE(durable.latest());
    CHECK(durable.latest()->step == 3);  // the durable tier's latest, as durable_step() says
  }
  // A new node: at start, the durable tier's latest (saved last: 3 of launch-2, not 4), then
  // after its restore of step 1, step 1.
  auto fresh = make<tiers>(d / "local-new", d / "durable", opts(5, 5, log));
  CHECK(fresh.durable_step() == 3);
  fresh.restore_step(1);
  CHECK(fresh.durable_step() == 1);

  // No durable step at or below the restored one: none.
  holdfast_test::temp_dir e("tiers-restore-none");
  auto only_local = make<tiers>(e / "local", e / "durable", opts(5, 5, log));
  only_local.save(5);
  REQUIRE(only_local.wait_for_durable(in(20s)) == steps{});
  only_local.local().save(2);  // straight into the local tier: no durable copy of step 2
  only_local.restore_step(2);
  CHECK(!only_local.durable_step());
}
