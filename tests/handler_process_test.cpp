// preemption_handler with 4 forked worker processes, real SIGTERM notices (signal_notice) and
// real exits, over filesystem_kv and over etcd_kv (a real etcd on loopback): TF's
// failure-handling cases — one notice, skew, simultaneous notices, grace, exit codes 42/143/
// custom, save override, step errors, restart with exact total work, a SIGKILLed worker — and a
// forked share of the randomized trials (handler_stress_test has the rest); and, over etcd with
// a lease, a worker frozen past its peer's lease TTL that still follows the recorded step. The
// workers and the parent's side live in support/process_job.hpp. The parent process starts no
// thread (fork + TSAN).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>  // chmod: a store directory this worker cannot write

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>  // std::remove
#include <filesystem>
#include <holdfast/agreement.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/etcd_client.hpp"
#include "support/http_server.hpp"  // refused_url, blackhole: an etcd out of reach at the start
#include "support/process_job.hpp"
#include "support/watch_follow.hpp"

using namespace std::chrono_literals;
using holdfast_test::check_agreed_exit;
using holdfast_test::describe;
using holdfast_test::etcd_backend;
using holdfast_test::exit_kind;
using holdfast_test::filesystem_backend;
using holdfast_test::job;
using holdfast_test::run_job;
using holdfast_test::scenario;

TEST_CASE_TEMPLATE_DEFINE("processes", Backend, processes_suite) {
  Backend be;
  INFO(std::string(Backend::name));

  SUBCASE("no notice: never saves") {
    job j;
    scenario sc;
    sc.max_steps = 150;
    sc.step_us = {200, 200, 200, 200};
    auto r = run_job(be, j, sc, {});
    INFO(describe(r));
    for (int t = 0; t < 4; ++t) {
      CHECK(r.exits[static_cast<std::size_t>(t)].ok());
      CHECK(r.saves(t).empty());
      CHECK(r.last(t) == "finished 150 150");
    }
  }

  SUBCASE("one notice: saves once at the agreed step, every process exits 42") {
    job j;
    scenario sc;
    auto r = run_job(be, j, sc, {2});
    check_agreed_exit(r, 42);
    auto kv = be.make_observer_kv(j.ns(sc));
    auto claim =
        holdfast::parse_agreement_value(kv.try_get("holdfast/run/ctl/r0/claim").value_or(""));
    REQUIRE(claim);
    CHECK(claim->what == holdfast::agreement_value::kind::claim);
    CHECK(claim->writer == 2);
    auto step = holdfast_test::recorded_step(kv);
    REQUIRE(step);
    CHECK(step->what == holdfast::agreement_value::kind::step);
    CHECK(step->step == *r.first_saves().begin());
  }

  SUBCASE("skewed workers: notice to the slowest, then to the fastest: same step") {
    for (int target : {0, 3}) {
      job j;
      scenario sc;
      sc.step_us = {2000, 1200, 800, 500};  // the slow one catches up to the fast one's step
      sc.ready_at = 3;
      auto r = run_job(be, j, sc, {target});
      check_agreed_exit(r, 42);
    }
  }

  SUBCASE("simultaneous notices on 2 and on all workers: one claim, one step, one exit each") {
    for (auto noticed : {std::vector<int>{1, 3}, std::vector<int>{0, 1, 2, 3}}) {
      job j;
      scenario sc;
      auto r = run_job(be, j, sc, noticed);
      check_agreed_exit(r, 42);
      auto kv = be.make_observer_kv(j.ns(sc));
      auto claim =
          holdfast::parse_agreement_value(kv.try_get("holdfast/run/ctl/r0/claim").value_or(""));
      REQUIRE(claim);
      CHECK(std::count(noticed.begin(), noticed.end(), claim->writer) == 1);
      CHECK(kv.list("holdfast/run/ctl/r0").size() == 2);  // claim and step: no more
      CHECK(kv.list("holdfast/run/ack/r0").size() <= 4);  // erased unless the exit came first
    }
  }

  SUBCASE("steps coupled by a barrier through the store: one notice, one step, no timeout") {
    job j;
    scenario sc;
    sc.coupled = true;
    sc.step_us = {500, 500, 500, 500};
    auto r = run_job(be, j, sc, {1});
    check_agreed_exit(r, 42);
  }

  SUBCASE("grace path: exactly two saves, exit before the grace period ends") {
    job j;
    scenario sc;
    sc.exit = exit_kind::grace42;
    sc.grace = 1000ms;
    sc.step_us = {20000, 20000, 20000, 20000};
    auto r = run_job(be, j, sc, {1});
    check_agreed_exit(r, 42, 2);
    // The noticed worker exits before its grace period ends; the margin (a quarter of the
    // grace period, the house rule for a grace deadline on a loaded 2-core machine) covers a
    // scheduling stall between the final claim and the exit that no reserve computed from
    // measured step and save times can foresee, and still tells a worker that keeps training
    // past its grace apart. The others exit with it (the parent's clock adds the signal's
    // delivery).
    for (int t = 0; t < 4; ++t) REQUIRE(r.last(t).rfind("exit ", 0) == 0);
    CHECK(std::stol(r.last(1).substr(5)) < 1000 + 1000 / 4);
    CHECK(std::stol(r.last(1).substr(5)) > 500);  // it did train through the grace period
    CHECK(r.notice_to_exit_ms < 1000 + 1000 / 4 + 50);
  }

  SUBCASE("exit codes 143 (kubernetes preset) and 77 (a callable) reach the parent") {
    for (auto kind : {exit_kind::kubernetes143, exit_kind::custom77}) {
      job j;
      scenario sc;
      sc.exit = kind;
      auto r = run_job(be, j, sc, {0});
      check_agreed_exit(r, kind == exit_kind::custom77 ? 77 : 143);
    }
  }

  SUBCASE("save override: no default save") {
    job j;
    scenario sc;
    sc.save_override = true;
    auto r = run_job(be, j, sc, {3});
    INFO(describe(r));
    std::set<std::string> overrides;
    for (int t = 0; t < 4; ++t) {
      CHECK(r.exits[static_cast<std::size_t>(t)].exit_code == 42);
      CHECK(r.saves(t).empty());
      CHECK(r.last(t).rfind("override ", 0) == 0);
      overrides.insert(r.last(t));
      holdfast::checkpoint_manager<> m(j.ckpt(t), holdfast::directory_commit::rename);
      CHECK(m.checkpoints().empty());
    }
    CHECK(overrides.size() == 1);
  }

  SUBCASE("step error: raised on every worker") {
    job j;
    scenario sc;
    sc.throw_task = 1;
    sc.throw_at = 30;
    auto r = run_job(be, j, sc, {});
    INFO(describe(r));
    for (int t = 0; t < 4; ++t) {
      if (t == 1) {
        CHECK(r.exits[1].exit_code == 5);
        CHECK(r.last(1) == "own nan loss");
      } else {
        CHECK(r.exits[static_cast<std::size_t>(t)].exit_code == 3);
        CHECK(r.last(t) == "peer 1 std::runtime_error nan loss");
      }
    }
  }

  SUBCASE("restart: restores and resumes; total work = workers x steps") {
    job j;
    scenario sc;
    auto first = run_job(be, j, sc, {0});
    check_agreed_exit(first, 42);
    const std::int64_t saved = *first.first_saves().begin();
    scenario again;
    again.incarnation = "1";
    again.max_steps = saved + 40;
    again.step_us = {200, 200, 200, 200};
    auto second = run_job(be, j, again, {});
    INFO(describe(second));
    std::int64_t total = 0;
    for (int t = 0; t < 4; ++t) {
      CHECK(second.exits[static_cast<std::size_t>(t)].ok());
      auto& log = second.logs[static_cast<std::size_t>(t)];
      REQUIRE(log.size() >= 3);  // [restored (1st)] ... [restored (2nd)] ... [finished]
      CHECK(std::count(log.begin(), log.end(),
                       "restored " + std::to_string(saved) + " " + std::to_string(saved)) == 1);
      CHECK(second.last(t) ==
            "finished " + std::to_string(saved + 40) + " " + std::to_string(saved + 40));
      total += saved + 40;
    }
    CHECK(total == 4 * (saved + 40));
  }

  SUBCASE("dead worker: SIGKILL without notice gives agreement_timeout within the deadline") {
    job j;
    scenario sc;
    sc.ack_timeout = 600ms;
    auto r = run_job(be, j, sc, {0}, 2);
    INFO(describe(r));
    CHECK(r.exits[2].term_signal == SIGKILL);
    for (int t : {0, 1, 3}) {
      CHECK(r.exits[static_cast<std::size_t>(t)].exit_code == 4);
      auto last = r.last(t);
      REQUIRE(last.rfind("timeout 2, ", 0) == 0);
      // at its ack_timeout, not later: a timeout is checked at 1.5 x its value
      CHECK(std::stol(last.substr(11)) < 600 * 1.5);
    }
    CHECK(r.notice_to_exit_ms < 3000);
    auto kv = be.make_observer_kv(j.ns(sc));
    auto outcome = holdfast_test::recorded_step(kv);  // the timeout every survivor raised
    REQUIRE(outcome);
    CHECK(outcome->what == holdfast::agreement_value::kind::timeout);
    CHECK(outcome->tasks == std::vector<int>{2});
  }

  SUBCASE("randomized trials (the forked share): random notices, subsets, skews") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 4; ++trial) {
      job j;
      scenario sc;
      for (int t = 0; t < 4; ++t) sc.step_us.push_back(300 + static_cast<int>(rng() % 900));
      sc.ready_at = 1 + static_cast<std::int64_t>(rng() % 20);
      std::vector<int> noticed;
      for (int t = 0; t < 4; ++t)
        if (rng() % 2) noticed.push_back(t);
      if (noticed.empty()) noticed.push_back(static_cast<int>(rng() % 4));
      auto r = run_job(be, j, sc, noticed);
      check_agreed_exit(r, 42);
    }
  }
}

TEST_CASE_TEMPLATE_INVOKE(processes_suite, filesystem_backend, etcd_backend);

// ---- issue 32, item 2: a lease must not delete a recorded outcome
// --------------------------------

namespace lease_case {

using namespace std::chrono_literals;

// The claimant's store: etcd_kv whose insert of `gated` (the round's outcome key) first waits for
// the file `gate`, so the parent can freeze a peer after its ack and before the outcome exists.
struct gated_outcome_kv {
  holdfast::etcd_kv inner;
  std::string gated, gate;
  bool insert(const std::string& key, std::string_view value) {
    if (key == gated && !holdfast::await_file(gate, std::chrono::seconds(20)))
      throw std::runtime_error("the gate never opened");
    return inner.insert(key, value);
  }
  void put(const std::string& key, std::string_view value) { inner.put(key, value); }
  std::optional<std::string> try_get(const std::string& key) const { return inner.try_get(key); }
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds t) const {
    return inner.get(key, t);
  }
  holdfast::kv_pairs list(const std::string& prefix) const { return inner.list(prefix); }
  bool erase(const std::string& key) { return inner.erase(key); }
};

// Saves by logging "save <step>"; restores nothing.
struct logged_saves {
  std::string log;
  void save(std::int64_t step) { holdfast_test::append_line(log, "save " + std::to_string(step)); }
  std::optional<std::int64_t> restore() { return std::nullopt; }
};

// One worker: a handler (SIGTERM notice, exit 42 after its save) over `kv`, 1 ms steps; touches
// `ready` after 5 steps. A failure is logged and ends the process with 4 (agreement_timeout),
// 6 (agreement_unreachable) or 7 (anything else).
template <class Kv>
[[noreturn]] void worker(Kv kv, int task, const std::string& log, const std::string& ready) {
  ::signal(SIGTERM, SIG_DFL);  // doctest's crash handler came with the fork
  try {
    holdfast::handler_options o;
    o.ack_timeout = 10s;
    holdfast::preemption_handler<holdfast::presets::generic, Kv, logged_saves> h(
        holdfast::presets::generic(), std::move(kv), {task, 2, "run"}, logged_saves{log}, o);
    for (;;) {
      h.run([] { std::this_thread::sleep_for(1ms); });
      if (h.total_run_calls() == 5) holdfast_test::append_line(ready, "ready");
    }
  } catch (const holdfast::agreement_timeout& e) {
    holdfast_test::append_line(log, std::string("timeout ") + e.what());
    holdfast_test::end_worker(holdfast_test::worker_exit::timeout);
  } catch (const holdfast::agreement_unreachable& e) {
    holdfast_test::append_line(log, std::string("unreachable ") + e.what());
    holdfast_test::end_worker(holdfast_test::worker_exit::unreachable);
  } catch (const std::exception& e) {
    holdfast_test::append_line(log, std::string("error ") + e.what());
    holdfast_test::end_worker(holdfast_test::worker_exit::store);
  }
}

// Blocks until `c` is stopped (or ended); true when stopped.
bool await_stopped(const holdfast_test::child& c) {
  siginfo_t si{};
  while (::waitid(P_PID, static_cast<id_t>(c.pid()), &si, WSTOPPED | WEXITED | WNOWAIT) != 0)
    if (errno != EINTR) return false;
  return si.si_code == CLD_STOPPED;
}

// True once `key` is absent, polled every 20 ms for at most `timeout`.
bool gone_within(holdfast::etcd_kv& kv, const std::string& key, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (kv.try_get(key)) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

}  // namespace lease_case

// W0 claims, collects W1's ack and records the round's step; W1 is frozen (SIGSTOP) after its ack
// and before the step exists; W0 saves and exits, its lease (TTL 1 s) expires while W1 is still
// frozen. Invariant: the outcome key holds one outcome for the round, from the moment it is
// recorded (a lease expiry must not delete it), and W1 thawed follows it: it saves at that step.
// Before issue 32 every write carried the lease, so the step key vanished with W0's lease and the
// thawed W1 never saw the step.
TEST_CASE("etcd lease: a worker frozen past the lease TTL still follows the recorded step") {
  holdfast_test::job j;
  const holdfast::kv_namespace ns(j.run, "0");
  holdfast::etcd_options o;
  o.endpoints = {holdfast_test::shared_etcd().url()};
  o.request_timeout = 5000ms;
  o.lease_ttl = 1s;
  o.leased_prefix = "live";  // liveness keys only: the handler's keys are never leased
  const std::string step_key = "holdfast/run/ctl/r0/step", gate = j.dir / "gate";
  holdfast::etcd_kv observer(holdfast_test::etcd_client_options(o.endpoints, 5000ms), ns);
  auto ctl = observer.watch("holdfast/run/ctl");  // every value the outcome key ever holds

  std::vector<holdfast_test::child> kids;
  kids.emplace_back([&] {  // W0, the claimant, with a liveness key under its lease
    holdfast::etcd_kv kv(o, ns);
    kv.put("live/0", "up");
    lease_case::worker(lease_case::gated_outcome_kv{kv, step_key, gate}, 0, j.log(0), j.ready(0));
  });
  kids.emplace_back([&] { lease_case::worker(holdfast::etcd_kv(o, ns), 1, j.log(1), j.ready(1)); });
  for (int t = 0; t < 2; ++t) REQUIRE(holdfast::await_file(j.ready(t), std::chrono::seconds(20)));

  kids[0].kill(SIGTERM);                                    // W0's notice: it claims
  REQUIRE(observer.get("holdfast/run/ack/r0/1", 20000ms));  // W1 acked ...
  kids[1].kill(SIGSTOP);                                    // ... and is frozen
  REQUIRE(lease_case::await_stopped(kids[1]));
  holdfast_test::append_line(gate, "go");  // now W0 records the step
  auto r0 = kids[0].wait(20s);
  INFO("W0: " << r0.failures);
  REQUIRE(r0.exit_code == holdfast_test::worker_exit::saved);
  const auto log0 = holdfast_test::read_lines(j.log(0));
  REQUIRE(log0.size() == 1);
  const auto recorded = observer.try_get(step_key);
  REQUIRE(recorded);
  const auto outcome = holdfast::parse_agreement_value(*recorded);
  REQUIRE(outcome);
  REQUIRE(outcome->what == holdfast::agreement_value::kind::step);
  CHECK(log0[0] == "save " + std::to_string(outcome->step));

  // W0's lease expires (its liveness key goes) while W1 is frozen.
  REQUIRE(lease_case::gone_within(observer, "live/0", 10000ms));
  CHECK(observer.try_get(step_key) == recorded);  // the outcome outlives its writer's lease

  kids[1].kill(SIGCONT);
  auto r1 = kids[1].wait(30s);
  const auto log1 = holdfast_test::read_lines(j.log(1));
  INFO("W1: " << r1.failures << " " << (log1.empty() ? "" : log1.back()));
  CHECK(r1.exit_code == holdfast_test::worker_exit::saved);
  CHECK(log1 == std::vector<std::string>{log0[0]});  // W1 saved at the recorded step

  observer.put("holdfast/run/ctl/end", "");  // its event ends the follow: all before it came
  auto events = holdfast_test::follow_watch(ctl, 10000ms, [](const auto& evs) {
    return !evs.empty() && evs.back().key == "holdfast/run/ctl/end";
  });
  std::set<std::string> outcomes;
  for (const auto& e : events)
    if (e.key == step_key && e.value) outcomes.insert(*e.value);
  CHECK(outcomes == std::set<std::string>{*recorded});  // never a second, different outcome
  CHECK(observer.try_get(step_key) == recorded);
}

// ---- issue 44, item 2: a start that fails in seconds and says why ------------------------------

namespace start_case {

using namespace std::chrono_literals;

// How one handler's construction ended, as its child process wrote it: "constructed", or the
// exception's kind ("unreachable", "timeout", "error", "other"), its errno, the milliseconds the
// constructor took, and its what().
struct start_result {
  std::string kind;
  int errnum = 0;
  double ms = 0;
  std::string what;
};

// Task 0 of `n` constructed over `kv` with `o` (a SIGTERM notice, the default Checkpointer in
// `dir`), in a child (the parent starts no thread); `as_nobody`: the child runs as nobody when
// the test runs as root (root ignores permission bits). The handler types are the suite's.
template <class Kv>
start_result start(const holdfast_test::job& j, Kv kv, int n, const holdfast::handler_options& o,
                   bool as_nobody = false) {
  const std::string out = j.dir / "start-result";
  std::remove(out.c_str());
  holdfast_test::child kid([&] {
    if (as_nobody && ::geteuid() == 0) {
      CHILD_REQUIRE(::setgid(65534) == 0);
      CHILD_REQUIRE(::setuid(65534) == 0);
    }
    holdfast_test::worker_state st;
    const auto t0 = std::chrono::steady_clock::now();
    auto took = [&] {
      return std::to_string(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    };
    std::string line;
    try {
      holdfast::preemption_handler<holdfast::presets::generic, Kv> h(
          holdfast::presets::generic(), std::move(kv), {0, n, "start"},
          holdfast_test::make_checkpoints(j.dir / "ckpt", &st), o);
      line = "constructed 0 " + took() + " -";
    } catch (const holdfast::agreement_unreachable& e) {
      line = "unreachable " + std::to_string(e.errnum()) + " " + took() + " " + e.what();
    } catch (const holdfast::agreement_timeout& e) {
      line = "timeout " + std::to_string(e.errnum()) + " " + took() + " " + e.what();
    } catch (const holdfast::error& e) {
      line = "error " + std::to_string(e.errnum()) + " " + took() + " " + e.what();
    } catch (const std::exception& e) {
      line = "other 0 " + took() + " " + e.what();
    }
    holdfast_test::append_line(out, line);
  });
  auto r = kid.wait(60s);
  REQUIRE_MESSAGE(r.ok(), r.failures);
  const auto lines = holdfast_test::read_lines(out);
  REQUIRE(lines.size() == 1);
  start_result s;
  std::istringstream in(lines[0]);
  in >> s.kind >> s.errnum >> s.ms;
  std::getline(in >> std::ws, s.what);
  return s;
}

// A log hook appending each line to `file` (the start's lines, read by the parent).
holdfast::log_fn lines_to(std::string file) {
  return [file = std::move(file)](std::string_view l) {
    holdfast_test::append_line(file, std::string(l));
  };
}

holdfast::etcd_kv etcd_at(const std::string& url, std::chrono::milliseconds request_timeout) {
  holdfast::etcd_options e;
  e.endpoints = {url};
  e.request_timeout = request_timeout;
  return holdfast::etcd_kv(e, {"start", 0});
}

}  // namespace start_case

TEST_CASE("start: the defaults bound the start to 10 s and the restore wait to 10 minutes") {
  const holdfast::handler_options o;
  CHECK(o.start_timeout == std::chrono::seconds(10));
  CHECK(o.restore_timeout == std::chrono::minutes(10));
  CHECK(o.restore_report_interval == std::chrono::seconds(10));
}

TEST_CASE(
    "start: an etcd nobody listens on fails the start by start_timeout, with its URL and "
    "ECONNREFUSED") {
  // Before: the restore agreement retried until ack_timeout, recorded, retried for one more, then
  // raised "...: Connection refused): No route to host" (a fixed EHOSTUNREACH): 360 s by default.
  using namespace std::chrono_literals;
  holdfast_test::job j;
  const std::string url = holdfast_test::refused_url();
  holdfast::handler_options o;
  o.start_timeout = 1500ms;
  auto s = start_case::start(j, start_case::etcd_at(url, 5000ms), 2, o);
  INFO(s.kind << " after " << s.ms << " ms: " << s.what);
  CHECK(s.kind == "unreachable");
  CHECK(s.errnum == ECONNREFUSED);
  CHECK(s.ms >= 1500);
  CHECK(s.ms < 1500 + 1500);
  CHECK(s.what.find(url.substr(7)) != std::string::npos);  // "127.0.0.1:<port>"
  CHECK(s.what.find("Connection refused") != std::string::npos);
  CHECK(s.what.find("start_timeout") != std::string::npos);
  CHECK(s.what.find("No route to host") == std::string::npos);
}

TEST_CASE(
    "start: an etcd endpoint that never answers fails the start by start_timeout, as "
    "ETIMEDOUT") {
  // Its request_timeout (5 s) is longer than the start's bound: the bound still holds.
  using namespace std::chrono_literals;
  holdfast_test::job j;
  holdfast_test::blackhole silent;
  holdfast::handler_options o;
  o.start_timeout = 1500ms;
  auto s = start_case::start(j, start_case::etcd_at(silent.url(), 5000ms), 2, o);
  INFO(s.kind << " after " << s.ms << " ms: " << s.what);
  CHECK(s.kind == "unreachable");
  CHECK(s.errnum == ETIMEDOUT);
  CHECK(s.ms >= 1400);
  CHECK(s.ms < 1500 + 1500);
  CHECK(s.what.find(silent.url().substr(7)) != std::string::npos);
  CHECK(s.what.find("start_timeout") != std::string::npos);
}

TEST_CASE(
    "start: a store directory this worker cannot write fails the start at once, naming "
    "the file and EACCES") {
  holdfast_test::job j;
  const std::string root = j.dir / "kv-ro";
  holdfast::filesystem_kv(root, {"start", 0}).put("warm", "x");  // the namespace exists
  for (auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_directory()) ::chmod(e.path().c_str(), 0555);
  ::chmod(root.c_str(), 0555);
  ::chmod(j.dir.path().c_str(), 0777);  // nobody makes its checkpoint directory there
  holdfast::handler_options o;
  o.start_timeout = 5s;
  auto s = start_case::start(j, holdfast::filesystem_kv(root, {"start", 0}), 2, o, true);
  INFO(s.kind << " after " << s.ms << " ms: " << s.what);
  CHECK(s.kind == "error");
  CHECK(s.errnum == EACCES);
  CHECK(s.ms < 1000);  // not retried: no outage, a permission
  CHECK(s.what.find(root) != std::string::npos);
  CHECK(s.what.find("Permission denied") != std::string::npos);
}

TEST_CASE(
    "start: the restore wait reports who is there every interval and ends by "
    "restore_timeout, stating it; over a directory no 'Connection'") {
  using namespace std::chrono_literals;
  holdfast_test::job j;
  const std::string lines_file = j.dir / "start-lines";
  holdfast::handler_options o;
  o.restore_timeout = 900ms;
  o.restore_report_interval = 250ms;
  o.ack_timeout = 2s;  // recording the outcome: not the wait's bound
  o.log = start_case::lines_to(lines_file);
  // 3 tasks: task 2's list is there, task 1 never comes
  holdfast::filesystem_kv kv(j.dir / "kv", {"start", 0});
  kv.put("holdfast/start/restore/have/2", "");
  auto s = start_case::start(j, kv, 3, o);
  INFO(s.kind << " after " << s.ms << " ms: " << s.what);
  CHECK(s.kind == "timeout");
  CHECK(s.errnum == ETIMEDOUT);
  CHECK(s.ms >= 900);
  CHECK(s.ms < 900 + 1500);
  CHECK(s.what.find("no answer from tasks 1 within 900 ms (handler_options::restore_timeout)") !=
        std::string::npos);
  CHECK(s.what.find("Connection") == std::string::npos);
  auto lines = holdfast_test::read_lines(lines_file);
  // the wait's lines, then the failed start's warning (the same words as the exception)
  REQUIRE_FALSE(lines.empty());
  CHECK(lines.back().rfind("task 0: the start failed: ", 0) == 0);
  CHECK(lines.back().find("no answer from tasks 1 within 900 ms") != std::string::npos);
  lines.pop_back();
  CHECK(lines.size() >= 2);  // at 250, 500, 750 ms
  CHECK(lines.size() <= 4);
  for (const auto& l : lines) {
    INFO(l);
    CHECK(l.rfind("restore agreement: task 0 waited ", 0) == 0);
    CHECK(l.find("for the checkpoints of tasks 1 (there: 0,2; it gives up within 900 ms") !=
          std::string::npos);
  }
}

TEST_CASE(
    "start: a SIGTERM while the handler is still being constructed (the restore agreement waits "
    "for a late task) is acted on: both tasks save at one step and exit by the preset") {
  // Before: the notice was installed after the restore, so the signal's default action killed
  // the worker that was still waiting for its peer.
  using namespace std::chrono_literals;
  holdfast_test::job j;
  const std::string waiting = j.dir / "waiting";
  holdfast::handler_options o;
  o.restore_report_interval = 100ms;
  o.ack_timeout = 10s;
  auto worker = [&](int task) {
    return [&, task] {
      ::signal(SIGTERM, SIG_DFL);  // as in a fresh process (not doctest's crash handler)
      holdfast::handler_options mine = o;
      if (task == 0)  // a line every 100 ms while it waits for task 1: the parent's cue
        mine.log = start_case::lines_to(waiting);
      holdfast_test::worker_state st;
      st.log = j.dir / ("log-" + std::to_string(task));
      holdfast::preemption_handler<holdfast::presets::generic, holdfast::filesystem_kv> h(
          holdfast::presets::generic(), holdfast::filesystem_kv(j.dir / "kv", {"sigstart", 0}),
          {task, 2, "sigstart"},
          holdfast_test::make_checkpoints(j.dir / ("ckpt-" + std::to_string(task)), &st), mine);
      for (int i = 0; i < 3000; ++i)
        h.run([&] {
          ++st.acc;
          std::this_thread::sleep_for(2ms);
        });
      holdfast_test::append_line(st.log, "finished without a save");
    };
  };
  holdfast_test::child first(worker(0));
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (holdfast_test::read_lines(waiting).empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  REQUIRE_MESSAGE(!holdfast_test::read_lines(waiting).empty(), "task 0 never waited for task 1");
  REQUIRE(::kill(first.pid(), SIGTERM) == 0);  // task 0 is inside its constructor
  std::this_thread::sleep_for(200ms);
  holdfast_test::child second(worker(1));
  const auto r0 = first.wait(60s), r1 = second.wait(60s);
  const auto log0 = holdfast_test::read_lines(j.dir / "log-0");
  const auto log1 = holdfast_test::read_lines(j.dir / "log-1");
  INFO("task 0: exit " << r0.exit_code << " signal " << r0.term_signal << " " << r0.failures);
  INFO("task 1: exit " << r1.exit_code << " signal " << r1.term_signal << " " << r1.failures);
  CHECK(r0.term_signal == 0);  // not killed by the signal's default action
  CHECK(r0.exit_code == 42);   // presets::generic: saved, then exited with its code
  CHECK(r1.exit_code == 42);
  REQUIRE(log0.size() == 1);
  REQUIRE(log1.size() == 1);
  CHECK(log0[0].rfind("save ", 0) == 0);
  // one agreed step: "save <step> <acc>" on both
  CHECK(log0[0].substr(0, log0[0].rfind(' ')) == log1[0].substr(0, log1[0].rfind(' ')));
}

TEST_CASE(
    "start: a task paused past its restore_timeout while its peer arrives follows the one "
    "recorded restore: both start and restore the same step") {
  // Task 0 publishes its list and waits for task 1's; SIGSTOP holds it past its own deadline
  // while task 1 arrives, finds both lists and records the outcome. On SIGCONT task 0's wait
  // ends past its deadline: whatever it would propose, it follows the recorded outcome (one
  // decision per launch), so neither fails and both restore the step they both hold (7).
  using namespace std::chrono_literals;
  holdfast_test::job j;
  const std::string waiting = j.dir / "waiting";
  for (int task = 0; task < 2; ++task) {  // an earlier launch's checkpoint on both
    holdfast_test::worker_state st;
    st.acc = 70;
    holdfast_test::make_checkpoints(j.dir / ("ckpt-" + std::to_string(task)), &st).save(7);
  }
  holdfast::handler_options o;
  o.restore_timeout = 800ms;
  o.restore_report_interval = 100ms;
  o.ack_timeout = 10s;
  auto worker = [&](int task) {
    return [&, task] {
      holdfast::handler_options mine = o;
      if (task == 0) mine.log = start_case::lines_to(waiting);  // the parent's cue
      holdfast_test::worker_state st;
      const std::string log = j.dir / ("log-" + std::to_string(task));
      try {
        holdfast::preemption_handler<holdfast::presets::generic, holdfast::filesystem_kv> h(
            holdfast::presets::generic(), holdfast::filesystem_kv(j.dir / "kv", {"paused", 1}),
            {task, 2, "paused"},
            holdfast_test::make_checkpoints(j.dir / ("ckpt-" + std::to_string(task)), &st), mine);
        holdfast_test::append_line(log, "restored " +
                                            std::to_string(h.restored_step().value_or(-1)) +
                                            " acc " + std::to_string(st.acc));
      } catch (const std::exception& e) {
        holdfast_test::append_line(log, std::string("failed: ") + e.what());
      }
    };
  };
  holdfast_test::child first(worker(0));
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (holdfast_test::read_lines(waiting).empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  REQUIRE_MESSAGE(!holdfast_test::read_lines(waiting).empty(), "task 0 never waited for task 1");
  first.kill(SIGSTOP);
  holdfast_test::child second(worker(1));
  const auto r1 = second.wait(30s);     // task 1 starts while task 0 is stopped
  std::this_thread::sleep_for(1200ms);  // task 0 stays stopped well past its 800 ms deadline
  first.kill(SIGCONT);
  const auto r0 = first.wait(30s);
  REQUIRE_MESSAGE(r0.ok(), r0.failures);
  REQUIRE_MESSAGE(r1.ok(), r1.failures);
  const auto log0 = holdfast_test::read_lines(j.dir / "log-0");
  const auto log1 = holdfast_test::read_lines(j.dir / "log-1");
  REQUIRE(log0.size() == 1);
  REQUIRE(log1.size() == 1);
  CHECK(log0[0] == "restored 7 acc 70");
  CHECK(log1[0] == "restored 7 acc 70");
}
