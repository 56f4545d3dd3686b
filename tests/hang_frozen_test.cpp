// tests/hang_frozen_test.cpp — a whole worker process frozen (SIGSTOP) while its peers go on:
// it cannot report itself, so its predecessor's liveness monitor (handler/liveness.hpp: a key
// kept alive by the etcd lease) names it once the lease expires, the verdict is recorded once,
// and with hang_restart every live worker's process ends with the restartable exit code.
//
// Invariants checked in each repetition:
//   - every live worker exits with exit_code within 2 x TTL + 1 s (+ a scheduling allowance for
//     this loaded 2-core machine) of the SIGSTOP;
//   - the job's store holds exactly one hang value, phase frozen, naming the stopped task;
//   - the stopped worker is found in a step and in a save alike (its peers' own steps never
//     pass their bound: the verdict is the liveness signal's).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG: a worker never outlives the test
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <holdfast/handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/child.hpp"
#include "support/etcd_server.hpp"
#include "support/handler_harness.hpp"

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

constexpr auto ttl = 2s;
constexpr auto slack = 1500ms;  // scheduling on this loaded machine
constexpr int exit_code = 75;

using config_t = holdfast::termination_config<holdfast_test::repeat_notice, holdfast::no_exit>;

// A Checkpointer whose save tells the parent it started (one byte on a pipe) and then takes a
// while: the parent stops the process inside it.
struct slow_saves {
  int tell_fd = -1;
  bool victim = false;
  void save(std::int64_t) {
    if (!victim) return;
    (void)!::write(tell_fd, "S", 1);
    std::this_thread::sleep_for(30s);  // stopped inside: never ends in the test
  }
  std::optional<std::int64_t> restore() { return std::nullopt; }
};

using handler_t = holdfast::preemption_handler<config_t, holdfast::etcd_kv, slow_saves, steady,
                                               holdfast::hang_restart>;

// A client of the etcd at `url` for `run`; `leased`: a worker's, its liveness keys under a lease
// of `ttl`, else an observer's.
holdfast::etcd_kv etcd_client(const std::string& url, const std::string& run, bool leased) {
  holdfast::etcd_options eo;
  eo.endpoints = {url};
  if (leased) {
    eo.lease_ttl = ttl;
    eo.leased_prefix = holdfast::liveness_leased_prefix(run);
  }
  return holdfast::etcd_kv(eo, {run, "0"});
}

enum class where { step, save };

// One repetition: 3 workers; `victim` is stopped in a step or in a save. Returns how long after
// the SIGSTOP the last live worker ended.
steady::duration frozen_run(const std::string& run, int victim, where at) {
  constexpr int n = 3;
  const std::string url = holdfast_test::shared_etcd().url();
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  std::vector<std::unique_ptr<holdfast_test::child>> workers;
  for (int t = 0; t < n; ++t)
    workers.push_back(std::make_unique<holdfast_test::child>([&, t] {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      holdfast::etcd_kv kv = etcd_client(url, run, true);
      std::atomic<std::int64_t> notice_ns{0};
      holdfast::handler_options o;
      o.ack_timeout = 10s;
      o.agree_on_restore = false;
      o.hang.step_floor = 60s;  // the peers' own steps never pass theirs here
      o.hang.exit_code = exit_code;
      handler_t h(config_t(holdfast_test::repeat_notice{&notice_ns}), kv, {t, n, run},
                  slow_saves{p[1], t == victim}, o);
      for (int i = 0; i < 1000000; ++i) {
        h.run([] { std::this_thread::sleep_for(2ms); });
        if (t == victim && i == 30) {
          if (at == where::step)
            (void)!::write(p[1], "R", 1);  // running: the parent stops it mid-step
          else
            notice_ns = steady::now().time_since_epoch().count();  // a save at the next step
        }
      }
      CHILD_REQUIRE(false && "the loop ended without a verdict");
    }));
  ::close(p[1]);
  char c = 0;
  REQUIRE(::read(p[0], &c, 1) == 1);
  ::close(p[0]);
  workers[static_cast<std::size_t>(victim)]->kill(SIGSTOP);
  const auto stopped = steady::now();
  steady::time_point last = stopped;
  for (int t = 0; t < n; ++t) {
    if (t == victim) continue;
    auto r = workers[static_cast<std::size_t>(t)]->wait(30s);
    last = std::max(last, steady::now());
    CHECK(r.failures == "");
    CHECK(r.exit_code == exit_code);
  }
  auto& v = *workers[static_cast<std::size_t>(victim)];
  v.kill(SIGKILL);  // what torchrun's SIGTERM then SIGKILL does to a stopped rank
  v.kill(SIGCONT);
  (void)v.wait(10s);
  // exactly one verdict, naming the victim as frozen
  holdfast::etcd_kv kv = etcd_client(url, run, false);
  int verdicts = 0;
  for (auto& e : kv.list("holdfast/" + run + "/ctl")) {
    auto val = holdfast::parse_agreement_value(e.second);
    if (!val || val->what != holdfast::agreement_value::kind::hang) continue;
    ++verdicts;
    auto verdict = holdfast::hang_verdict_of(*val);
    REQUIRE(verdict);
    CHECK(verdict->task == victim);
    CHECK(verdict->phase == holdfast::hang_phase::frozen);
    CHECK(verdict->recorder == (victim + n - 1) % n);  // its predecessor in the ring
    CHECK(verdict->elapsed >= ttl);
  }
  CHECK(verdicts == 1);
  const auto took = last - stopped;
  std::fprintf(
      stderr, "hang-timing frozen-%s frozen stop-to-exit %lld bound %lld\n",
      at == where::step ? "step" : "save",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(2 * ttl + 1s).count()));
  CHECK(took <= 2 * ttl + 1s + slack);
  return took;
}

int serial() {
  static int n = 0;
  return ++n;
}

}  // namespace

TEST_CASE("a worker frozen mid-step is named by its predecessor and every live worker restarts") {
  for (int victim : {1, 0})
    frozen_run("frozen-step-" + std::to_string(serial()), victim, where::step);
}

TEST_CASE("a worker frozen mid-save is named by its predecessor and every live worker restarts") {
  frozen_run("frozen-save-" + std::to_string(serial()), 2, where::save);
}

namespace {

using report_handler_t = holdfast::preemption_handler<config_t, holdfast::etcd_kv, slow_saves,
                                                      steady, holdfast::hang_report>;

// The next "<worker> <named>\n" line on `fd` (a worker's on_hang: `worker` learned a verdict
// naming `named`), or {-1, -1} at `deadline`.
std::pair<int, int> next_report(int fd, std::string& buffer, steady::time_point deadline) {
  for (;;) {
    if (auto nl = buffer.find('\n'); nl != std::string::npos) {
      std::pair<int, int> r{-1, -1};
      std::sscanf(buffer.substr(0, nl).c_str(), "%d %d", &r.first, &r.second);
      buffer.erase(0, nl + 1);
      return r;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0) return {-1, -1};
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got > 0) buffer.append(buf, static_cast<std::size_t>(got));
  }
}

}  // namespace

// Under hang_report (the job goes on), a worker frozen past the TTL is named by its predecessor
// and every live worker reports it; once it resumes, its lease is granted again and its
// liveness key put back, and it learns the verdict that names it (its own on_hang runs): it
// never rejoins silently.
TEST_CASE("a frozen worker that resumes learns the verdict naming it and gets its key back") {
  constexpr int n = 3, victim = 1;
  const std::string run = "frozen-resume-" + std::to_string(serial());
  const std::string url = holdfast_test::shared_etcd().url();
  int running[2], reports[2];
  REQUIRE(::pipe2(running, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(reports, O_CLOEXEC) == 0);
  std::vector<std::unique_ptr<holdfast_test::child>> workers;
  for (int t = 0; t < n; ++t)
    workers.push_back(std::make_unique<holdfast_test::child>([&, t] {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      holdfast::etcd_kv kv = etcd_client(url, run, true);
      std::atomic<std::int64_t> notice_ns{0};
      holdfast::handler_options o;
      o.ack_timeout = 10s;
      o.agree_on_restore = false;
      o.hang.step_floor = 60s;  // only the liveness signal gives a verdict here
      o.hang.on_hang = [&](const holdfast::hang_verdict& v) {
        const std::string line = std::to_string(t) + " " + std::to_string(v.task) + "\n";
        (void)!::write(reports[1], line.data(), line.size());
      };
      report_handler_t h(config_t(holdfast_test::repeat_notice{&notice_ns}), kv, {t, n, run},
                         slow_saves{}, o);
      for (int i = 0;; ++i) {
        h.run([] { std::this_thread::sleep_for(2ms); });
        if (t == victim && i == 30) (void)!::write(running[1], "R", 1);
      }
    }));
  ::close(running[1]);
  ::close(reports[1]);
  char c = 0;
  REQUIRE(::read(running[0], &c, 1) == 1);
  ::close(running[0]);
  auto& v = *workers[victim];
  v.kill(SIGSTOP);
  const auto stopped = steady::now();
  std::string buffer;
  int peers = 0;
  while (peers < n - 1) {
    const auto r = next_report(reports[0], buffer, stopped + 2 * ttl + 1s + slack);
    REQUIRE_MESSAGE(r.first >= 0, "the live workers did not all report the verdict");
    CHECK(r.first != victim);
    CHECK(r.second == victim);
    ++peers;
  }
  v.kill(SIGCONT);
  const auto resumed = steady::now();
  const auto mine = next_report(reports[0], buffer, resumed + 10s);
  CHECK(mine.first == victim);
  CHECK(mine.second == victim);
  std::fprintf(
      stderr, "hang-timing frozen-resume learned %lld ms after SIGCONT\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - resumed).count()));
  holdfast::etcd_kv observer = etcd_client(url, run, false);
  const std::string key = holdfast::liveness_key("holdfast/" + run + "/", victim);
  std::optional<std::string> back;
  for (const auto until = steady::now() + 5s; steady::now() < until;) {
    if ((back = observer.try_get(key)) && back->rfind("alive", 0) == 0) break;
    std::this_thread::sleep_for(50ms);  // a bounded look at a condition, with a deadline
  }
  CHECK((back && back->rfind("alive", 0) == 0));
  for (auto& w : workers) w->kill(SIGKILL);
  for (auto& w : workers) (void)w->wait(10s);
  ::close(reports[0]);
}
