// preemption_handler with 4 forked worker processes, real SIGTERM notices (signal_notice) and
// real exits, over filesystem_kv and over etcd_kv (a real etcd on loopback): TF's
// failure-handling cases — one notice, skew, simultaneous notices, grace, exit codes 42/143/
// custom, save override, step errors, restart with exact total work, a SIGKILLed worker — and a
// forked share of the randomized trials (handler_stress_test has the rest). The workers and the
// parent's side live in support/process_job.hpp. The parent process starts no thread (fork +
// TSAN).
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <holdfast/agreement.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/process_job.hpp"

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
    // The noticed worker exits before its grace period ends; the slack (10%, the project's
    // rule for timing assertions on a loaded 2-core machine) covers a scheduling stall between
    // the final claim and the exit that no reserve computed from measured step and save times
    // can foresee. The others exit with it (the parent's clock adds the signal's delivery).
    for (int t = 0; t < 4; ++t) REQUIRE(r.last(t).rfind("exit ", 0) == 0);
    CHECK(std::stol(r.last(1).substr(5)) < 1000 * 1.1);
    CHECK(std::stol(r.last(1).substr(5)) > 500);  // it did train through the grace period
    CHECK(r.notice_to_exit_ms < 1000 * 1.1 + 50);
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
      CHECK(std::stol(last.substr(11)) < 600 * 1.1 + 100);
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
