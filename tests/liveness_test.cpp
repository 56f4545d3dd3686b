// liveness_monitor (handler/liveness.hpp) over a real etcd on loopback: worker processes (fork),
// each with a monitor on its own client (lease TTL 2 s), in a ring. Invariants: a worker frozen
// with SIGSTOP, or killed with SIGKILL, is named by its predecessor, and by nobody else, within
// 2 x TTL + 1 s of the signal; a worker that finished (finish(): "done") is named by nobody; a
// successor that starts late is no verdict before it starts, and is watched once it has; where
// the store leases no liveness key the monitor starts nothing.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: a worker never outlives the test
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <holdfast/detail/http.hpp>  // the gateway: a lease revoked from outside
#include <holdfast/handler.hpp>      // the handler's exit and its unwinding (the last cases)
#include <holdfast/handler/liveness.hpp>
#include <holdfast/kv.hpp>
#include <holdfast/kv/any.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/kv/url.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/elapsed.hpp"
#include "support/etcd_server.hpp"
#include "support/handler_harness.hpp"  // flag_notice

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

constexpr auto ttl = 2s;
// The acceptance bound: 2 x TTL + 1 s from the signal to the verdict.
constexpr long long bound_ms = 2 * 2000 + 1000;

// An etcd at `url` (the shared server by default): plain options (an observer), or with the
// run's liveness keys under a lease of `ttl`.
holdfast::etcd_options shared_options(const std::string& url = holdfast_test::shared_etcd().url()) {
  holdfast::etcd_options o;
  o.endpoints = {url};
  return o;
}
holdfast::etcd_options leased_options(const std::string& run,
                                      const std::string& url = holdfast_test::shared_etcd().url()) {
  holdfast::etcd_options o = shared_options(url);
  o.lease_ttl = ttl;
  o.leased_prefix = holdfast::liveness_leased_prefix(run);
  return o;
}
// Lets the shared etcd answer again at scope exit, whatever the test did to it.
struct thaw_at_exit {
  ~thaw_at_exit() { holdfast_test::shared_etcd().thaw(); }
};

// One line a worker reports: "seen <task>" (its successor's key was seen alive) or
// "frozen <task> <named> <silent ms>" (its on_frozen fired).
struct report {
  std::string kind;
  int task = -1;
  int named = -1;
  long long silent_ms = -1;
};

// The workers of one ring: each a forked process with a monitor over its own etcd client,
// reporting through one pipe and told to finish through a pipe of its own.
class ring {
 public:
  explicit ring(int num_tasks)
      : num_tasks_(num_tasks),
        run_("live-" + std::to_string(++serial())),
        url_(holdfast_test::shared_etcd().url()) {  // started here: never in a worker
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    reports_ = p[0];
    report_w_ = p[1];
    kids_.resize(static_cast<std::size_t>(num_tasks));
    control_.resize(static_cast<std::size_t>(num_tasks), -1);
  }
  ring(const ring&) = delete;
  ring& operator=(const ring&) = delete;
  ~ring() {
    for (auto& k : kids_)
      if (k) k->kill(SIGCONT);  // a stopped worker ends too (the child's destructor kills it)
    for (int fd : control_)
      if (fd >= 0) ::close(fd);
    ::close(reports_);
    ::close(report_w_);
  }

  // Starts worker `task`.
  void start(int task) {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    const int report_fd = report_w_;
    const std::string run = run_, url = url_;
    const int n = num_tasks_;
    kids_[idx(task)] = std::make_unique<holdfast_test::child>([=] {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(p[1]);
      holdfast::etcd_kv kv(leased_options(run, url), {run, "0"});
      auto say = [report_fd](const std::string& line) {
        const std::string l = line + "\n";
        (void)!::write(report_fd, l.data(), l.size());  // one write: lines never interleave
      };
      holdfast::liveness_monitor<holdfast::etcd_kv> mon(
          kv, "holdfast/" + run + "/", task, n, [&](int frozen, std::chrono::milliseconds silent) {
            say("frozen " + std::to_string(task) + " " + std::to_string(frozen) + " " +
                std::to_string(silent.count()));
          });
      CHILD_REQUIRE(mon.active());
      CHILD_REQUIRE(mon.successor() == (task + 1) % n);
      if (mon.wait_successor_seen(60s)) say("seen " + std::to_string(task));
      char c = 0;
      while (::read(p[0], &c, 1) < 0 && errno == EINTR) {
      }
      if (c == 'f') mon.finish();  // else (the pipe closed): end without "done"
    });
    ::close(p[0]);
    control_[idx(task)] = p[1];
  }

  // Tells worker `task` to finish cleanly (finish(), then exit 0).
  void finish(int task) { REQUIRE(::write(control_[idx(task)], "f", 1) == 1); }
  holdfast_test::child& kid(int task) { return *kids_[idx(task)]; }

  // SIGSTOP, returning once the worker is stopped.
  void stop(int task) {
    kid(task).kill(SIGSTOP);
    int status = 0;
    REQUIRE(::waitpid(kid(task).pid(), &status, WUNTRACED) == kid(task).pid());
    REQUIRE(WIFSTOPPED(status));
  }

  // The next report, or nullopt at `deadline`.
  std::optional<report> next(clk::time_point deadline) {
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::istringstream in(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
        report r;
        in >> r.kind >> r.task;
        if (r.kind == "frozen") in >> r.named >> r.silent_ms;
        return r;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now());
      pollfd p{reports_, POLLIN, 0};  // at the deadline: one look at what is there already
      const int ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
      if (ready <= 0 && left.count() <= 0) return std::nullopt;
      if (ready <= 0) continue;
      char buf[512];
      const ssize_t got = ::read(reports_, buf, sizeof buf);
      if (got > 0) buffer_.append(buf, static_cast<std::size_t>(got));
    }
  }

  // Waits until every worker in `tasks` reported "seen"; fails on a verdict meanwhile.
  void await_seen(std::vector<int> tasks) {
    const auto deadline = clk::now() + 30s;
    while (!tasks.empty()) {
      auto r = next(deadline);
      REQUIRE_MESSAGE(r, "workers never saw their successors alive");
      REQUIRE_MESSAGE(r->kind == "seen",
                      "a verdict before any stall: task " << r->task << " named " << r->named);
      for (auto it = tasks.begin(); it != tasks.end(); ++it)
        if (*it == r->task) {
          tasks.erase(it);
          break;
        }
    }
  }

  const std::string& run() const { return run_; }

 private:
  static int& serial() {
    static int n = 0;
    return n;
  }
  static std::size_t idx(int task) { return static_cast<std::size_t>(task); }

  int num_tasks_;
  std::string run_, url_;
  int reports_ = -1, report_w_ = -1;
  std::string buffer_;
  std::vector<std::unique_ptr<holdfast_test::child>> kids_;
  std::vector<int> control_;
};

}  // namespace

// Three repetitions, a different worker frozen in each: its predecessor, and only it, names it
// within 2 x TTL + 1 s of the SIGSTOP, with a silence of at least the TTL.
TEST_CASE("liveness: a SIGSTOPped worker is named by its predecessor within 2 x TTL + 1 s") {
  for (int rep = 0; rep < 3; ++rep) {
    CAPTURE(rep);
    ring r(3);
    for (int t = 0; t < 3; ++t) r.start(t);
    r.await_seen({0, 1, 2});
    const int victim = rep % 3, predecessor = (victim + 2) % 3;
    const auto t0 = clk::now();
    r.stop(victim);
    auto verdict = r.next(t0 + std::chrono::milliseconds(bound_ms));
    const long long elapsed = holdfast_test::ms_since(t0);
    REQUIRE_MESSAGE(verdict, "no verdict within " << bound_ms << " ms of the SIGSTOP");
    CHECK(verdict->kind == "frozen");
    CHECK(verdict->task == predecessor);
    CHECK(verdict->named == victim);
    CHECK(verdict->silent_ms >= 2000);
    CHECK(elapsed <= bound_ms);
    MESSAGE("rep " << rep << ": task " << victim << " named after " << elapsed << " ms");
    r.kid(victim).kill(SIGCONT);  // thawed: its lease is gone, it finishes like the others
    for (int t = 0; t < 3; ++t) r.finish(t);
    for (int t = 0; t < 3; ++t) {
      auto res = r.kid(t).wait(20s);
      INFO("task " << t << ": " << res.failures);
      CHECK(res.ok());
    }
    CHECK_FALSE(r.next(clk::now()));  // no second verdict, about anyone
  }
}

// A ring of four (0 -> 1 -> 2 -> 3 -> 0, each watching the next): task 1 (watched by 0)
// finishes cleanly at the moment task 3 (watched by 2) is SIGKILLed. Both keys expire a TTL
// later, so the same wait tells the two apart: 2 names 3 within the bound, nobody names 1.
TEST_CASE("liveness: a clean finish is no verdict, a SIGKILL is one") {
  ring r(4);
  for (int t = 0; t < 4; ++t) r.start(t);
  r.await_seen({0, 1, 2, 3});
  // Every change of task 1's key, from now on (the first take: a snapshot, "alive ...").
  holdfast::etcd_kv observer(shared_options(), {r.run(), "0"});
  const std::string key1 = holdfast::liveness_key("holdfast/" + r.run() + "/", 1);
  auto w = observer.watch("holdfast/" + r.run() + "/live/1");
  const auto t0 = clk::now();
  r.finish(1);
  r.kid(3).kill(SIGKILL);
  auto v = r.next(t0 + std::chrono::milliseconds(bound_ms));
  const long long elapsed = holdfast_test::ms_since(t0);
  REQUIRE_MESSAGE(v, "no verdict within " << bound_ms << " ms of the SIGKILL");
  CHECK(v->kind == "frozen");
  CHECK(v->task == 2);
  CHECK(v->named == 3);
  CHECK(elapsed <= bound_ms);
  CHECK(r.kid(1).wait(20s).ok());  // finished cleanly
  // Task 1's key said "done", then its lease's expiry deleted it: wait for that, then a TTL
  // more, and nobody has named task 1.
  bool done = false, deleted = false;
  for (const auto deadline = clk::now() + 20s; !deleted && clk::now() < deadline;) {
    pollfd p{w.fd(), POLLIN, 0};
    ::poll(&p, 1, 200);
    for (const auto& e : w.take().events) {
      if (e.key != key1) continue;
      done = done || e.value == std::optional<std::string>("done");
      deleted = done && !e.value;
    }
  }
  CHECK(done);
  REQUIRE_MESSAGE(deleted, "task 1's key never expired");
  auto late = r.next(clk::now() + 2s);
  CHECK_MESSAGE(!late, "a verdict after a clean finish: task "
                           << (late ? late->task : -1) << " named " << (late ? late->named : -1));
  for (int t : {0, 2}) {
    r.finish(t);
    CHECK(r.kid(t).wait(20s).ok());
  }
}

// Tasks 0 and 1 start; task 2 (1's successor) starts 2 x TTL + 1 s later: no verdict before it
// starts, and once it runs, its SIGKILL is named by task 1 within the bound.
TEST_CASE("liveness: a successor that starts late is no verdict until it has started") {
  ring r(3);
  r.start(0);
  r.start(1);
  r.await_seen({0});  // 0 sees 1; 1 watches a key that does not exist yet
  auto early = r.next(clk::now() + std::chrono::milliseconds(bound_ms));
  CHECK_MESSAGE(!early, "a verdict before the successor started: task "
                            << (early ? early->task : -1) << " named "
                            << (early ? early->named : -1));
  r.start(2);
  r.await_seen({1, 2});
  const auto t0 = clk::now();
  r.kid(2).kill(SIGKILL);
  auto v = r.next(t0 + std::chrono::milliseconds(bound_ms));
  REQUIRE_MESSAGE(v, "no verdict within " << bound_ms << " ms of the SIGKILL");
  CHECK(v->kind == "frozen");
  CHECK(v->task == 1);
  CHECK(v->named == 2);
  CHECK(holdfast_test::ms_since(t0) <= bound_ms);
  r.finish(0);
  r.finish(1);
  CHECK(r.kid(0).wait(20s).ok());
  CHECK(r.kid(1).wait(20s).ok());
}

// Where no liveness key is leased the monitor is not started: it writes nothing and watches
// nothing; an any_kv made from a URL with the lease is available.
TEST_CASE("liveness: available only where the store leases the liveness keys") {
  using holdfast::liveness_monitor;
  const std::string scope = "holdfast/avail/";
  holdfast::in_process_kv mem({"avail", "0"});
  CHECK_FALSE(liveness_monitor<holdfast::in_process_kv>::available(mem, scope, 0));
  {
    liveness_monitor<holdfast::in_process_kv> m(mem, scope, 0, 2, nullptr);
    CHECK_FALSE(m.active());
  }
  CHECK(mem.list("").empty());  // not even "done"

  holdfast::etcd_options o = shared_options();
  holdfast::etcd_kv plain(o, {"avail", "0"});
  CHECK_FALSE(liveness_monitor<holdfast::etcd_kv>::available(plain, scope, 0));
  o.lease_ttl = 5s;
  o.leased_prefix = "live";  // relative to the namespace: not the handler's keys
  holdfast::etcd_kv elsewhere(o, {"avail", "0"});
  CHECK_FALSE(liveness_monitor<holdfast::etcd_kv>::available(elsewhere, scope, 0));
  o.leased_prefix = holdfast::liveness_leased_prefix("avail");
  holdfast::etcd_kv leased(o, {"avail", "0"});
  CHECK(liveness_monitor<holdfast::etcd_kv>::available(leased, scope, 1));
  CHECK(leased.leases(holdfast::liveness_key(scope, 1)));
  CHECK_FALSE(leased.leases("holdfast/avail/ctl/r0/step"));  // a decision: never leased

  const std::string url =
      "etcd://127.0.0.1:" + std::to_string(holdfast_test::shared_etcd().port()) +
      "?lease_ttl=5&leased_prefix=holdfast/avail/live";
  holdfast::any_kv any = holdfast::make_kv(url, {"avail", "1"});
  CHECK(liveness_monitor<holdfast::any_kv>::available(any, scope, 0));
  CHECK_FALSE(liveness_monitor<holdfast::any_kv>::available(
      holdfast::make_kv("etcd://127.0.0.1:" + std::to_string(holdfast_test::shared_etcd().port()),
                        {"avail", "1"}),
      scope, 0));
  {
    liveness_monitor<holdfast::any_kv> m(any, scope, 0, 1, nullptr);  // one task: no successor
    CHECK(m.active());
    CHECK(m.ttl() == 5s);
  }
  CHECK(any.try_get(holdfast::liveness_key(scope, 0)) == std::optional<std::string>("done"));

  CHECK_THROWS_AS(liveness_monitor<holdfast::in_process_kv>(mem, "no-slash", 0, 2, nullptr),
                  holdfast::error);
  CHECK_THROWS_AS(liveness_monitor<holdfast::in_process_kv>(mem, scope, 2, 2, nullptr),
                  holdfast::error);
}

namespace {

// Revokes lease `id` from outside the client that holds it (etcd's gateway, as etcdctl lease
// revoke does): etcd deletes the keys attached to it at once.
void revoke_from_outside(std::int64_t id) {
  namespace hd = holdfast::detail;
  const auto r = hd::http_call(
      hd::parse_http_url(holdfast_test::shared_etcd().url()),
      hd::http_request{"POST", "/v3/lease/revoke", {}, "{\"ID\":\"" + std::to_string(id) + "\"}"},
      hd::http_timeouts{1000ms, 5000ms});
  REQUIRE_MESSAGE(r.status == 200, r.body);
}

// Waits up to `timeout` until `done()` (a bounded look every 20 ms); its last answer.
template <class Done>
bool wait_until(Done done, std::chrono::milliseconds timeout) {
  const auto deadline = clk::now() + timeout;
  while (!done() && clk::now() < deadline) std::this_thread::sleep_for(20ms);
  return done();
}

}  // namespace

// A live worker whose lease etcd no longer holds (revoked from outside: etcd deletes its key at
// once) gets a new lease and its key back within a keep-alive period (a leased key it erased
// stays erased), and its predecessor, whose grace (TTL / 2) the key is back within, names nobody.
// Both monitors run in this process, each on a client and lease of its own.
TEST_CASE("liveness: a lease etcd lost is granted again, the key put back, and nobody named") {
  const std::string run = "regrant-" + std::to_string(clk::now().time_since_epoch().count());
  const std::string scope = "holdfast/" + run + "/";
  holdfast::etcd_kv observer(shared_options(), {run, "0"});
  std::vector<holdfast::etcd_kv> kvs{holdfast::etcd_kv(leased_options(run), {run, "0"}),
                                     holdfast::etcd_kv(leased_options(run), {run, "0"})};
  std::mutex mu;
  std::condition_variable named;
  int verdicts = 0;
  std::vector<std::unique_ptr<holdfast::liveness_monitor<holdfast::etcd_kv>>> monitors;
  for (int t = 0; t < 2; ++t)
    monitors.push_back(std::make_unique<holdfast::liveness_monitor<holdfast::etcd_kv>>(
        kvs[static_cast<std::size_t>(t)], scope, t, 2, [&](int, std::chrono::milliseconds) {
          std::lock_guard<std::mutex> lock(mu);
          ++verdicts;
          named.notify_all();
        }));
  for (auto& m : monitors) REQUIRE(m->wait_successor_seen(10s));
  const std::string key1 = holdfast::liveness_key(scope, 1);
  const auto alive = observer.try_get(key1);
  REQUIRE(alive);
  // A leased key written and erased again is not put back with the others.
  const std::string erased = scope + "live/1/erased";
  kvs[1].put(erased, "x");
  CHECK(kvs[1].erase(erased));
  auto w = observer.watch(scope + "live/1");
  (void)w.take();  // the snapshot
  const std::int64_t old = kvs[1].lease_id();
  const auto t0 = clk::now();
  revoke_from_outside(old);
  // The key: deleted, then put back with the value it had (a bounded wait on the watch).
  bool deleted = false, back = false;
  for (const auto deadline = t0 + 10s; !back && clk::now() < deadline;) {
    pollfd p{w.fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    for (const auto& e : w.take().events) {
      if (e.key != key1) continue;
      deleted = deleted || !e.value;
      back = deleted && e.value == alive;
    }
  }
  const long long took = holdfast_test::ms_since(t0);
  CHECK(deleted);
  REQUIRE_MESSAGE(back, "the key never came back");
  MESSAGE("lease revoked -> key back after " << took << " ms");
  CHECK(took < 2000 / 2);  // within the grace: a keep-alive period (667 ms) and the re-put
  CHECK(kvs[1].lease_id() != old);
  CHECK(kvs[1].lease_alive());
  CHECK(kvs[0].lease_id() != old);  // the other worker's lease was never touched
  CHECK_FALSE(observer.try_get(erased).has_value());
  std::unique_lock<std::mutex> lock(mu);
  CHECK_FALSE(named.wait_for(lock, 1500ms, [&] { return verdicts > 0; }));
}

// A client cut off from etcd (the server frozen) past its TTL: lease_alive() turns false once a
// TTL has passed since the last renewal was sent; once etcd answers again (it expired the lease
// meanwhile) a new lease is granted, lease_alive() is true again and the liveness key is back.
TEST_CASE("liveness: lease_alive() is false while the lease may be gone, true once granted again") {
  const std::string run = "cutoff-" + std::to_string(clk::now().time_since_epoch().count());
  const std::string scope = "holdfast/" + run + "/";
  holdfast::etcd_kv observer(shared_options(), {run, "0"});
  holdfast::etcd_kv kv(leased_options(run), {run, "0"});
  holdfast::liveness_monitor<holdfast::etcd_kv> mon(kv, scope, 0, 1, nullptr);  // no successor
  const std::string key = holdfast::liveness_key(scope, 0);
  REQUIRE(wait_until([&] { return observer.try_get(key).has_value(); }, 10s));
  const std::int64_t old = kv.lease_id();
  CHECK(kv.lease_alive());
  bool was_false = false;
  {
    holdfast_test::shared_etcd().freeze();
    thaw_at_exit thaw;
    const auto t0 = clk::now();
    was_false = wait_until([&] { return !kv.lease_alive(); }, ttl + 1500ms);
    MESSAGE("cut off -> lease_alive() false after " << holdfast_test::ms_since(t0) << " ms");
  }
  CHECK(was_false);
  CHECK(wait_until([&] { return kv.lease_alive(); }, 10s));
  CHECK(kv.lease_id() != old);  // granted again: etcd expired the old one while frozen
  CHECK(wait_until([&] { return observer.try_get(key).value_or("").rfind("alive", 0) == 0; }, 5s));
}

// finish_by(deadline) with etcd frozen (a store that accepts connections and never answers):
// it returns by its deadline (plus scheduling), the "done" it could not write given up (the key
// is left to its lease, as a process's that exits is; etcd may still apply the request it was
// sent once it answers again). A finish() after it joins the thread, which may still be inside
// a store call (closing its watch), and tries "done" once more: within the store's own timeouts
// (the call in flight, then the write: 2 x request_timeout), never a hang.
TEST_CASE("liveness: finish_by ends by its deadline whatever etcd does") {
  const std::string run = "finish-by-" + std::to_string(clk::now().time_since_epoch().count());
  const std::string scope = "holdfast/" + run + "/";
  holdfast::etcd_kv observer(shared_options(), {run, "0"});
  holdfast::etcd_options o = leased_options(run);
  o.request_timeout = 1s;  // what bounds the finish() after a given-up finish_by
  holdfast::etcd_kv kv(o, {run, "0"});
  const std::string key = holdfast::liveness_key(scope, 0);
  {
    // task 0 of 2: its thread watches a successor that never starts (a watch held on etcd)
    holdfast::liveness_monitor<holdfast::etcd_kv> mon(kv, scope, 0, 2, nullptr);
    REQUIRE(wait_until([&] { return observer.try_get(key).has_value(); }, 10s));
    holdfast_test::shared_etcd().freeze();
    thaw_at_exit thaw;
    const auto t0 = clk::now();
    mon.finish_by(t0 + 750ms);
    const long long took = holdfast_test::ms_since(t0);
    MESSAGE("finish_by(750 ms) with etcd frozen returned after " << took << " ms");
    CHECK(took < 1250);
    const auto t1 = clk::now();
    mon.finish();  // joins the thread, then writes "done" (which fails: etcd still frozen)
    const long long later = holdfast_test::ms_since(t1);
    MESSAGE("the finish() after it returned after " << later << " ms");
    CHECK(later < 2 * 1000 + 1000);
    const auto t2 = clk::now();
    mon.finish();  // idempotent: the thread is gone
    CHECK(holdfast_test::ms_since(t2) < 100);
  }
}

namespace {

// An Exit policy that returns (as no_exit) after noting when it ran, and lets etcd answer again.
struct noting_exit {
  static constexpr bool returns = true;
  std::shared_ptr<std::atomic<long long>> at = std::make_shared<std::atomic<long long>>(0);
  void operator()(const holdfast::exit_context&) const {
    at->store(clk::now().time_since_epoch().count());
    holdfast_test::shared_etcd().thaw();
  }
};
// A Checkpointer whose save freezes etcd (noting when it returned), or fails with ENOSPC.
struct etcd_freezing_checkpoints {
  std::shared_ptr<std::atomic<long long>> saved_at = std::make_shared<std::atomic<long long>>(0);
  bool fail = false;
  void save(std::int64_t) {
    if (fail) throw holdfast::error(ENOSPC, "write", "ckpt/state", "the disk is full");
    holdfast_test::shared_etcd().freeze();
    saved_at->store(clk::now().time_since_epoch().count());
  }
  std::optional<std::int64_t> restore() { return std::nullopt; }
};
using exit_config = holdfast::termination_config<holdfast_test::flag_notice, noting_exit>;
using leased_handler =
    holdfast::preemption_handler<exit_config, holdfast::etcd_kv, etcd_freezing_checkpoints>;

}  // namespace

// The exit after a preemption save: etcd stops answering right after the save (the notice's
// machine going away); the Exit policy still runs within 1 s of the save's end (the liveness
// key's "done" is given 500 ms, not the store's timeouts).
TEST_CASE("liveness: the handler's exit after a save is at most 1 s late, whatever etcd does") {
  const std::string run = "exit-" + std::to_string(clk::now().time_since_epoch().count());
  thaw_at_exit thaw;
  holdfast::etcd_kv kv(leased_options(run), {run, "0"});
  std::atomic<bool> flag{false};
  noting_exit ex;
  etcd_freezing_checkpoints ck;
  holdfast::handler_options ho;
  ho.agree_on_restore = false;
  leased_handler h(
      exit_config(holdfast_test::flag_notice(holdfast_test::flag_poll{&flag}, 1ms), ex), kv,
      {0, 1, run}, ck, ho);
  holdfast::run_status st = holdfast::run_status::ran;
  for (int i = 0; i < 20000 && st != holdfast::run_status::stopped; ++i) {
    if (i == 5) flag = true;
    st = h.run([] { std::this_thread::sleep_for(1ms); });
  }
  REQUIRE(st == holdfast::run_status::stopped);
  REQUIRE(ck.saved_at->load() != 0);
  REQUIRE(ex.at->load() != 0);
  const auto late = std::chrono::nanoseconds(ex.at->load() - ck.saved_at->load());
  MESSAGE("save -> Exit policy with etcd frozen: "
          << std::chrono::duration_cast<std::chrono::milliseconds>(late).count() << " ms");
  CHECK(late < 1s);
}

// A handler destroyed by a failure's unwinding (its preemption save threw ENOSPC) is no clean
// exit: its liveness key is left "alive" to its lease, never marked "done".
TEST_CASE("liveness: a handler unwound by a failed save writes no done") {
  const std::string run = "unwound-" + std::to_string(clk::now().time_since_epoch().count());
  const std::string key = holdfast::liveness_key("holdfast/" + run + "/", 0);
  holdfast::etcd_options plain;
  plain.endpoints = {holdfast_test::shared_etcd().url()};
  holdfast::etcd_kv observer(plain, {run, "0"});
  holdfast::etcd_kv kv(leased_options(run), {run, "0"});
  std::atomic<bool> flag{false};
  etcd_freezing_checkpoints ck;
  ck.fail = true;
  holdfast::handler_options ho;
  ho.agree_on_restore = false;
  std::string what;
  try {
    leased_handler h(exit_config(holdfast_test::flag_notice(holdfast_test::flag_poll{&flag}, 1ms),
                                 noting_exit{}),
                     kv, {0, 1, run}, ck, ho);
    REQUIRE(wait_until([&] { return observer.try_get(key).has_value(); }, 10s));
    for (int i = 0; i < 20000; ++i) {
      if (i == 5) flag = true;
      h.run([] { std::this_thread::sleep_for(1ms); });
    }
  } catch (const holdfast::error& e) {
    what = e.what();
  }
  CHECK(what.find("the disk is full") != std::string::npos);
  const auto v = observer.try_get(key);
  REQUIRE(v);
  CHECK(v->rfind("alive", 0) == 0);
  // The same when the caller caught the failure itself and says so (Python's `with Handler`
  // does): shutdown(true) writes no "done"; a plain shutdown() does.
  for (const bool failed : {true, false}) {
    CAPTURE(failed);
    const std::string r2 = run + (failed ? "-caught" : "-clean");
    const std::string k2 = holdfast::liveness_key("holdfast/" + r2 + "/", 0);
    holdfast::etcd_kv observer2(plain, {r2, "0"});
    holdfast::etcd_kv kv2(leased_options(r2), {r2, "0"});
    leased_handler h(exit_config(holdfast_test::flag_notice(holdfast_test::flag_poll{&flag}, 1ms),
                                 noting_exit{}),
                     kv2, {0, 1, r2}, etcd_freezing_checkpoints{}, ho);
    REQUIRE(wait_until([&] { return observer2.try_get(k2).has_value(); }, 10s));
    h.shutdown(failed);
    CHECK((observer2.try_get(k2).value_or("") == "done") == !failed);
  }
}
