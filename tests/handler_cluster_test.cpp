// preemption_handler over a real 3-member etcd cluster on loopback, with 4 forked workers whose
// etcd_kv lists all three members, the member under test FIRST (so the workers talk to it):
//   (a) that member frozen (SIGSTOP) mid-training, then a notice: it serves every worker's
//       control watch (the handler's watcher waits on one long-lived etcd watch; checked in the
//       member's /metrics), so the workers learn of the claim only once their watches find the
//       member frozen (a failed health probe) and resume on another member;
//   (b) a notice, then that member frozen right after it / right after the claim;
//   (c) the leader killed right after the notice / right after the claim.
// In each, every worker saves at the one recorded step and exits 42 within
// ack_timeout + 3 x request_timeout of the notice; the member is thawed or restarted afterwards.
// Each case prints how long its agreement took (notice → every worker exited). A heavy suite
// (HOLDFAST_HEAVY_TESTS). The parent process starts no thread (fork + TSAN).
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <holdfast/agreement.hpp>
#include <holdfast/detail/http.hpp>  // the members' /metrics
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/etcd_client.hpp"
#include "support/etcd_cluster_case.hpp"
#include "support/process_job.hpp"

using namespace std::chrono_literals;
using holdfast_test::action;
using holdfast_test::etcd_cluster;
using holdfast_test::job;
using holdfast_test::result;
using holdfast_test::scenario;
using holdfast_test::shared_cluster;  // one per test binary: starting three members takes seconds
using std::chrono::milliseconds;

namespace {

constexpr milliseconds request_timeout = 1000ms;

/// etcd_kv on every member: workers list `member` first, the parent (gates, outcomes) last.
struct cluster_backend {
  std::vector<std::string> workers, observer;

  cluster_backend(const etcd_cluster& c, int member) {
    workers.push_back(c.url(member));
    for (int i = 0; i < c.size(); ++i)
      if (i != member) workers.push_back(c.url(i));
    observer.assign(workers.rbegin(), workers.rend());
  }
  static holdfast::etcd_kv make(const std::vector<std::string>& urls,
                                const holdfast::kv_namespace& ns) {
    return holdfast::etcd_kv(holdfast_test::etcd_client_options(urls, request_timeout), ns);
  }
  holdfast::etcd_kv make_kv(const holdfast::kv_namespace& ns) const { return make(workers, ns); }
  holdfast::etcd_kv make_observer_kv(const holdfast::kv_namespace& ns) const {
    return make(observer, ns);
  }
  static milliseconds watch() { return 50ms; }
};

scenario cluster_scenario() {
  scenario sc;
  sc.ack_timeout = 3000ms;
  sc.step_us = {1000, 1000, 1000, 1000};
  return sc;
}

/// A call to the cluster at `at` after the notice moment.
action cluster_call(milliseconds at, std::function<void()> call, std::string what) {
  action a;
  a.at = at;
  a.call = std::move(call);
  a.what = std::move(what);
  return a;
}

/// `a`, but fired as soon as the round's claim exists (read through the parent's client).
action after_claim(action a, const cluster_backend& be, const job& j, const scenario& sc) {
  using kv_type = decltype(be.make_observer_kv(j.ns(sc)));
  a.gate = holdfast_test::keys_gate(std::make_shared<kv_type>(be.make_observer_kv(j.ns(sc))),
                                    {holdfast_test::handler_key("run", "ctl/r0/claim")});
  a.gate_timeout = 5s;
  return a;
}

/// Every worker saved at the recorded step and exited 42, within the bound of the notice (sent
/// `notice_at` after the schedule started); prints how long the agreement took.
void check_cluster_job(const char* what, const cluster_backend& be, const job& j,
                       const scenario& sc, const result& r, milliseconds notice_at) {
  const double took = r.notice_to_exit_ms - static_cast<double>(notice_at.count());
  const auto bound = sc.ack_timeout + 3 * request_timeout;
  std::printf(
      "cluster: %s: agreement took %.0f ms (notice -> every worker exited; bound %lld ms)\n", what,
      took, static_cast<long long>(bound.count()));
  std::fflush(stdout);
  INFO(what << "\n" << holdfast_test::describe(r));
  holdfast_test::check_agreed_exit(r, holdfast_test::worker_exit::saved);
  auto kv = be.make_observer_kv(j.ns(sc));
  auto step = holdfast_test::recorded_step(kv);
  REQUIRE(step);
  CHECK(step->what == holdfast::agreement_value::kind::step);
  CHECK(r.first_saves() == std::set<std::int64_t>{step->step});
  auto rep = holdfast_test::check_outcomes(kv, r);
  std::string violations;
  for (const auto& v : rep.violations) violations += v + "\n";
  INFO(violations);
  CHECK(rep.violations.empty());
  CHECK(took < static_cast<double>(bound.count()));
}

/// A follower (a member that does not lead now).
int follower(const etcd_cluster& c) { return (c.leader() + 1) % c.size(); }

/// The watchers member `i` serves now (its etcd_debugging_mvcc_watcher_total gauge: one per
/// watch stream of the gateway); -1 when its /metrics cannot be read.
int watchers_on(const etcd_cluster& c, int i) {
  namespace hd = holdfast::detail;
  try {
    auto r =
        hd::http_call(hd::parse_http_url(c.url(i)), hd::http_request{"GET", "/metrics", {}, {}},
                      hd::http_timeouts{200ms, 1000ms});
    const std::string name = "\netcd_debugging_mvcc_watcher_total ";
    const auto at = r.body.find(name);
    if (r.status != 200 || at == std::string::npos) return -1;
    return std::stoi(r.body.substr(at + name.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

/// Waits up to 10 s until no member serves a watch (the streams of the previous job's workers
/// are closed); the watchers left on each member.
std::vector<int> wait_no_watchers(const etcd_cluster& c) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  std::vector<int> left;
  do {
    left.clear();
    for (int i = 0; i < c.size(); ++i) left.push_back(watchers_on(c, i));
    if (std::all_of(left.begin(), left.end(), [](int n) { return n == 0; })) break;
    std::this_thread::sleep_for(20ms);  // the parent starts no thread: a plain sleep
  } while (std::chrono::steady_clock::now() < until);
  return left;
}

}  // namespace

TEST_CASE("cluster (a): the workers' member frozen mid-training, then a notice") {
  etcd_cluster& c = shared_cluster();
  c.wait_healthy(10s);
  for (bool leader : {false, true}) {
    const int m = leader ? c.leader() : follower(c);
    cluster_backend be(c, m);
    job j;
    const scenario sc = cluster_scenario();
    const milliseconds notice_at = 300ms;
    const std::vector<int> before = wait_no_watchers(c);
    std::vector<int> at_freeze;  // watchers per member just before the freeze
    std::vector<action> plan = {cluster_call(
                                    0ms,
                                    [&] {
                                      for (int i = 0; i < c.size(); ++i)
                                        at_freeze.push_back(watchers_on(c, i));
                                      c.freeze(m);
                                    },
                                    "freeze"),
                                holdfast_test::signal_at(notice_at, 1, SIGTERM, "notice")};
    auto r = holdfast_test::run_schedule(be, j, sc, plan);
    c.thaw(m);
    const char* what =
        leader ? "(a) leader frozen mid-training" : "(a) follower frozen mid-training";
    check_cluster_job(what, be, j, sc, r, notice_at);
    // The frozen member served every worker's control watch, and no other member any.
    std::string counts;
    for (std::size_t i = 0; i < at_freeze.size(); ++i)
      counts += " m" + std::to_string(i + 1) + ": " + std::to_string(before[i]) + " -> " +
                std::to_string(at_freeze[i]);
    std::string saving;  // when each worker started its save, after the notice
    for (const auto& log : r.logs)
      for (const auto& line : log)
        if (line.rfind("saving ", 0) == 0 && line.find(" at ") != std::string::npos)
          saving += " " + std::to_string(std::stoll(line.substr(line.find(" at ") + 4)) -
                                         r.noticed_at_ms - notice_at.count());
    std::printf(
        "cluster: %s: watchers before the job -> at the freeze (frozen m%d):%s; notice -> each "
        "save started (ms):%s\n",
        what, m + 1, counts.c_str(), saving.c_str());
    std::fflush(stdout);
    INFO(what << ": watchers before the job -> at the freeze (frozen m" << m + 1 << "):" << counts);
    REQUIRE(at_freeze.size() == static_cast<std::size_t>(c.size()));
    CHECK(at_freeze[static_cast<std::size_t>(m)] - before[static_cast<std::size_t>(m)] >= sc.n);
    for (int i = 0; i < c.size(); ++i)
      if (i != m)
        CHECK(at_freeze[static_cast<std::size_t>(i)] <= before[static_cast<std::size_t>(i)]);
    c.wait_healthy(10s);
  }
}

TEST_CASE("cluster (b): a notice, then the workers' member frozen mid-agreement") {
  etcd_cluster& c = shared_cluster();
  c.wait_healthy(10s);
  for (bool claimed : {false, true}) {
    const int m = follower(c);
    cluster_backend be(c, m);
    job j;
    const scenario sc = cluster_scenario();
    bool frozen = false;
    action freeze = cluster_call(
        0ms, [&] { c.freeze(m), frozen = true; }, "freeze");
    if (claimed) freeze = after_claim(freeze, be, j, sc);
    std::vector<action> plan = {holdfast_test::signal_at(0ms, 2, SIGTERM, "notice"), freeze};
    auto r = holdfast_test::run_schedule(be, j, sc, plan);
    c.thaw(m);
    CHECK(frozen);
    check_cluster_job(
        claimed ? "(b) frozen right after the claim" : "(b) frozen right after the notice", be, j,
        sc, r, 0ms);
    c.wait_healthy(10s);
  }
}

TEST_CASE("cluster (c): the leader killed mid-agreement") {
  etcd_cluster& c = shared_cluster();
  c.wait_healthy(10s);
  for (bool claimed : {false, true}) {
    const int m = c.leader();
    cluster_backend be(c, m);  // the leader first in every worker's list
    job j;
    const scenario sc = cluster_scenario();
    bool killed = false;
    action kill = cluster_call(
        0ms, [&] { c.kill(m), killed = true; }, "kill the leader");
    if (claimed) kill = after_claim(kill, be, j, sc);
    std::vector<action> plan = {holdfast_test::signal_at(0ms, 0, SIGTERM, "notice"), kill};
    auto r = holdfast_test::run_schedule(be, j, sc, plan);
    if (killed) c.restart(m);
    REQUIRE(killed);
    check_cluster_job(claimed ? "(c) leader killed right after the claim"
                              : "(c) leader killed right after the notice",
                      be, j, sc, r, 0ms);
    c.wait_healthy(10s);
  }
}
