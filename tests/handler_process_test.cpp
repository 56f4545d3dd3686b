// preemption_handler with 4 forked worker processes, real SIGTERM notices (signal_notice) and
// real exits, over filesystem_kv and over etcd_kv (a real etcd on loopback): TF's
// failure-handling cases — one notice, skew, simultaneous notices, grace, exit codes 42/143/
// custom, save override, step errors, restart with exact total work, a SIGKILLed worker — and a
// forked share of the randomized trials. The parent process starts no thread (fork + TSAN).
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <holdfast/handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/wait.hpp>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/etcd_server.hpp"
#include "support/handler_harness.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using holdfast_test::append_line;
using holdfast_test::read_lines;
using std::chrono::milliseconds;

namespace {

// ---- backends --------------------------------------------------------------------------------

int next_job_id() {
  static int id = 0;
  return ++id;
}

struct filesystem_backend {
  static constexpr const char* name = "filesystem_kv";
  holdfast_test::temp_dir root{"handler-fskv"};
  holdfast::filesystem_kv make_kv(const holdfast::kv_namespace& ns) const {
    return holdfast::filesystem_kv(root.path(), ns);
  }
  static milliseconds watch() { return 20ms; }
};

holdfast_test::etcd_server& shared_etcd() {
  static holdfast_test::etcd_server server;  // one per test binary: starting etcd takes ~1 s
  return server;
}

struct etcd_backend {
  static constexpr const char* name = "etcd_kv";
  std::string url = shared_etcd().url();
  holdfast::etcd_kv make_kv(const holdfast::kv_namespace& ns) const {
    holdfast::etcd_options o;
    o.endpoints = {url};
    o.request_timeout = 5000ms;
    return holdfast::etcd_kv(o, ns);
  }
  static milliseconds watch() { return 50ms; }
};

// ---- one worker process ------------------------------------------------------------------------

enum class exit_kind { generic42, kubernetes143, custom77, grace42 };

struct scenario {
  int n = 4;
  std::int64_t max_steps = 1000000;
  std::vector<int> step_us;    // default 1000 µs each
  std::int64_t ready_at = 10;  // a worker touches ready-<task> after this many steps (this run)
  exit_kind exit = exit_kind::generic42;
  milliseconds grace{0};
  milliseconds ack_timeout{3000};
  int throw_task = -1;
  std::int64_t throw_at = -1;
  bool save_override = false;
  bool coupled = false;  // each step is a barrier through the store (a gradient exchange)
  std::string incarnation = "0";
};

// Exits the process with 77 (a callable Exit policy).
struct custom_exit {
  void operator()(const holdfast::exit_context&) const {
    std::fflush(nullptr);
    std::_Exit(77);
  }
};

// Logs how long after the notice it ran, then exits with 42 (the grace test's Exit policy).
struct logged_exit {
  std::string log;
  void operator()(const holdfast::exit_context& ctx) const {
    auto ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() -
                  ctx.noticed_at.value_or(std::chrono::steady_clock::time_point{}))
                  .count();
    append_line(log, "exit " + std::to_string(static_cast<long>(ms)));
    std::fflush(nullptr);
    std::_Exit(42);
  }
};

struct job {
  holdfast_test::temp_dir dir{"handler-proc"};
  std::string run = "job" + std::to_string(next_job_id());
  std::string log(int t) const { return dir / ("log-" + std::to_string(t)); }
  std::string ready(int t) const { return dir / ("ready-" + std::to_string(t)); }
  std::string ckpt(int t) const { return dir / ("ckpt-" + std::to_string(t)); }
  std::string up(int t, const std::string& inc) const {
    return dir / ("up-" + inc + "-" + std::to_string(t));
  }
  std::string go(const std::string& inc) const { return dir / ("go-" + inc); }
};

template <class Config, class Backend>
void worker_main(const Backend& be, const job& j, int task, const scenario& sc, Config cfg) {
  holdfast_test::worker_state st;
  st.log = j.log(task);
  if (sc.save_override)
    cfg.set_save_override(
        [&](std::int64_t s) { append_line(st.log, "override " + std::to_string(s)); });
  auto kv = be.make_kv(holdfast::kv_namespace(j.run, sc.incarnation));
  auto grads = be.make_kv(holdfast::kv_namespace(j.run, "grads-" + sc.incarnation));
  holdfast::handler_options o;
  o.ack_timeout = sc.ack_timeout;
  o.watch_interval = Backend::watch();
  holdfast::preemption_handler<Config, decltype(kv)> h(
      std::move(cfg), kv, {task, sc.n, "run"}, holdfast_test::make_checkpoints(j.ckpt(task), &st),
      o);
  // start together: the skew under test is the step time, not the process start-up time
  append_line(j.up(task, sc.incarnation), "up");
  if (!holdfast::await_file(j.go(sc.incarnation), 20s)) std::_Exit(9);
  const std::int64_t start = h.restored_step().value_or(0);
  append_line(st.log, "restored " + std::to_string(h.restored_step().value_or(-1)) + " " +
                          std::to_string(st.acc));
  const int us = sc.step_us.empty() ? 1000 : sc.step_us[static_cast<std::size_t>(task)];
  auto t0 = std::chrono::steady_clock::now();
  try {
    while (h.total_run_calls() < sc.max_steps) {
      t0 = std::chrono::steady_clock::now();
      h.run([&] {
        if (task == sc.throw_task && h.total_run_calls() == sc.throw_at)
          throw std::runtime_error("nan loss");
        if (sc.coupled) {  // wait for every worker's gradient of this step
          const std::string k = std::to_string(h.total_run_calls());
          grads.put(k + "/" + std::to_string(task), "g");
          auto until = std::chrono::steady_clock::now() + 20s;
          while (grads.list(k).size() < static_cast<std::size_t>(sc.n) &&
                 std::chrono::steady_clock::now() < until)
            (void)grads.get(k + "/never", 2ms);
        }
        ++st.acc;
        if (h.total_run_calls() == start + sc.ready_at) append_line(j.ready(task), "ready");
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      });
    }
    append_line(st.log,
                "finished " + std::to_string(h.total_run_calls()) + " " + std::to_string(st.acc));
    return;
  } catch (const holdfast::peer_error& e) {
    append_line(st.log, "peer " + std::to_string(e.origin_task()) + " " + e.type_name() + " " +
                            e.message());
    std::fflush(nullptr);
    std::_Exit(3);
  } catch (const holdfast::agreement_timeout& e) {
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string ids;
    for (int m : e.missing_tasks()) ids += std::to_string(m) + ",";
    append_line(st.log, "timeout " + ids + " " + std::to_string(static_cast<long>(ms)));
    std::_Exit(4);
  } catch (const std::runtime_error& e) {
    append_line(st.log, std::string("own ") + e.what());
    std::_Exit(5);
  }
}

template <class Backend>
void worker(const Backend& be, const job& j, int task, const scenario& sc) {
  // doctest's crash handler for SIGTERM came with the fork; a worker program has none (and
  // signal_notice would chain to it).
  ::signal(SIGTERM, SIG_DFL);
  switch (sc.exit) {
    case exit_kind::generic42:
      worker_main(be, j, task, sc, holdfast::presets::generic());
      break;
    case exit_kind::kubernetes143:
      worker_main(be, j, task, sc, holdfast::presets::kubernetes(0s));
      break;
    case exit_kind::custom77:
      worker_main(be, j, task, sc,
                  holdfast::termination_config<holdfast::signal_notice<SIGTERM>, custom_exit>());
      break;
    case exit_kind::grace42:
      worker_main(be, j, task, sc,
                  holdfast::termination_config<holdfast::signal_notice<SIGTERM>, logged_exit>(
                      holdfast::signal_notice<SIGTERM>(), logged_exit{j.log(task)}, sc.grace));
      break;
  }
}

// ---- the parent
// ----------------------------------------------------------------------------------

struct result {
  std::vector<holdfast_test::child_result> exits;
  std::vector<std::vector<std::string>> logs;
  double notice_to_exit_ms = 0;  // from the first signal until the last worker ended
  std::vector<std::int64_t> saves(int t) const {
    std::vector<std::int64_t> s;
    for (auto& l : logs[static_cast<std::size_t>(t)])
      if (l.rfind("save ", 0) == 0) s.push_back(std::stoll(l.substr(5)));
    return s;
  }
  std::string last(int t) const {
    auto& l = logs[static_cast<std::size_t>(t)];
    return l.empty() ? "" : l.back();
  }
  std::set<std::int64_t> first_saves() const {
    std::set<std::int64_t> s;
    for (std::size_t t = 0; t < logs.size(); ++t) {
      auto v = saves(static_cast<int>(t));
      if (!v.empty()) s.insert(v.front());
    }
    return s;
  }
};

// Forks the workers; once each touched its ready file, SIGKILLs `kill_task` (if any), then
// sends SIGTERM to every task in `noticed`, back to back; waits for all.
template <class Backend>
result run_job(const Backend& be, const job& j, const scenario& sc, const std::vector<int>& noticed,
               int kill_task = -1) {
  std::vector<holdfast_test::child> kids;
  for (int t = 0; t < sc.n; ++t) kids.emplace_back([&, t] { worker(be, j, t, sc); });
  result r;
  for (int t = 0; t < sc.n; ++t)
    REQUIRE(holdfast::await_file(j.up(t, sc.incarnation), 20s).has_value());
  append_line(j.go(sc.incarnation), "go");
  auto noticed_at = std::chrono::steady_clock::now();
  if (!noticed.empty() || kill_task >= 0) {
    for (int t = 0; t < sc.n; ++t) REQUIRE(holdfast::await_file(j.ready(t), 20s).has_value());
    if (kill_task >= 0) kids[static_cast<std::size_t>(kill_task)].kill(SIGKILL);
    noticed_at = std::chrono::steady_clock::now();
    for (int t : noticed) kids[static_cast<std::size_t>(t)].kill(SIGTERM);
  }
  for (auto& k : kids) r.exits.push_back(k.wait(30s));
  r.notice_to_exit_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - noticed_at)
          .count();
  for (int t = 0; t < sc.n; ++t) r.logs.push_back(read_lines(j.log(t)));
  return r;
}

std::string describe(const result& r) {
  std::ostringstream s;
  for (std::size_t t = 0; t < r.exits.size(); ++t) {
    s << "task " << t << ": exit " << r.exits[t].exit_code << " signal " << r.exits[t].term_signal
      << " timed_out " << r.exits[t].timed_out << " " << r.exits[t].failures << " log:";
    for (auto& l : r.logs[t]) s << " [" << l << "]";
    s << "\n";
  }
  return s.str();
}

// Checks: every worker exited with `code`, saved exactly `saves` times, all at the same steps.
void check_agreed_exit(const result& r, int code, std::size_t saves = 1) {
  INFO(describe(r));
  std::set<std::vector<std::int64_t>> steps;
  for (std::size_t t = 0; t < r.exits.size(); ++t) {
    CHECK(r.exits[t].exit_code == code);
    CHECK(r.exits[t].failures == "");
    auto s = r.saves(static_cast<int>(t));
    CHECK(s.size() == saves);
    steps.insert(s);
  }
  CHECK(steps.size() == 1);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("processes", Backend, processes_suite) {
  Backend be;
  INFO(Backend::name);

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
    auto kv = be.make_kv(holdfast::kv_namespace(j.run, "0"));
    CHECK(kv.try_get("holdfast/run/r0/claim") == "2");
    CHECK(kv.try_get("holdfast/run/r0/step") == std::to_string(*r.first_saves().begin()));
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
      auto kv = be.make_kv(holdfast::kv_namespace(j.run, "0"));
      auto claim = kv.try_get("holdfast/run/r0/claim");
      REQUIRE(claim);
      CHECK(std::count(noticed.begin(), noticed.end(), std::stoi(*claim)) == 1);
      CHECK(kv.list("holdfast/run").size() == 6);  // claim, 4 acks, step
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
