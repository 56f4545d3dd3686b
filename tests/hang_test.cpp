// tests/hang_test.cpp — the handler's hang detector (handler/hang.hpp): a step, a save or a
// restore that runs past its learned bound is found on the watcher thread while the training
// thread stays stuck, recorded once for the job, and acted on by the policy on every worker.
//
// Invariants checked in every case:
//   - detection: the verdict names the stuck task, its phase and step; it is recorded no sooner
//     than the bound (elapsed >= bound) and within the bound plus one detection period (plus a
//     scheduling allowance for this loaded 2-core machine);
//   - one recorded verdict: the store holds exactly one hang value for the job, and every
//     worker that reports one reports that one;
//   - a verdict during a round is that round's outcome: no worker saves, every one throws
//     hang_detected;
//   - with hang_restart every worker's process ends with hang_options::exit_code, and a save
//     that hung never becomes the latest checkpoint;
//   - no false verdict: steps inside their bound, hang_none, and pause_hang_detection().
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/handler_harness.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using holdfast::hang_phase;
using holdfast::hang_verdict;
using holdfast_test::flag_notice;
using holdfast_test::flag_poll;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

namespace {

using config_t = holdfast::termination_config<flag_notice, holdfast::no_exit>;

// What a test allows on top of bound + period: this machine's scheduling (2 loaded cores).
constexpr milliseconds slack = 1500ms;

// A gate a stuck step or save waits on until the test opens it.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> l(m);
      open = true;
    }
    cv.notify_all();
  }
};

// The verdicts one worker's policy reported, with when.
struct reports {
  std::mutex m;
  std::condition_variable cv;
  std::vector<hang_verdict> seen;
  std::vector<steady::time_point> at;
  void add(const hang_verdict& v) {
    {
      std::lock_guard<std::mutex> l(m);
      seen.push_back(v);
      at.push_back(steady::now());
    }
    cv.notify_all();
  }
  bool wait(std::size_t n, milliseconds timeout) {
    std::unique_lock<std::mutex> l(m);
    return cv.wait_for(l, timeout, [&] { return seen.size() >= n; });
  }
  std::size_t size() {
    std::lock_guard<std::mutex> l(m);
    return seen.size();
  }
};

holdfast::handler_options fast_options(reports* r) {
  holdfast::handler_options o;
  o.ack_timeout = 10s;
  o.watch_interval = 20ms;
  o.agree_on_restore = false;
  o.hang.step_floor = 300ms;
  o.hang.warmup_floor = 5s;
  o.hang.warmup_steps = 5;
  o.hang.save_floor = 400ms;
  o.hang.restore_floor = 400ms;
  o.hang.period = 100ms;
  if (r) o.hang.on_hang = [r](const hang_verdict& v) { r->add(v); };
  return o;
}

// The hang values the store holds under the run's ctl/ (the verdict key and the round keys).
std::vector<std::string> recorded_verdicts(holdfast::in_process_kv& kv, const std::string& run) {
  std::vector<std::string> out;
  for (auto& e : kv.list("holdfast/" + run + "/ctl")) {
    auto v = holdfast::parse_agreement_value(e.second);
    if (v && v->what == holdfast::agreement_value::kind::hang) out.push_back(e.second);
  }
  return out;
}

void check_timing(const hang_verdict& v, const holdfast::handler_options& o) {
  CHECK(v.elapsed >= v.bound);  // never before the bound
  CHECK(v.elapsed <= v.bound + o.hang.period + slack);
}

using memory_t = holdfast_test::memory_checkpoints;
template <class Hang = holdfast::hang_report>
using thread_handler =
    holdfast::preemption_handler<config_t, holdfast::in_process_kv, memory_t, steady, Hang>;

struct team {
  holdfast::in_process_kv kv{holdfast::kv_namespace("hang", "0")};
  std::vector<std::unique_ptr<std::atomic<bool>>> flags;
  std::vector<holdfast_test::worker_state> states;
  explicit team(int n) : states(static_cast<std::size_t>(n)) {
    for (int i = 0; i < n; ++i) flags.push_back(std::make_unique<std::atomic<bool>>(false));
  }
  config_t config(int t) {
    return config_t(flag_notice(flag_poll{flags[static_cast<std::size_t>(t)].get()}, 1ms),
                    holdfast::no_exit{});
  }
};

}  // namespace

TEST_CASE("a step stuck past its learned bound is found within bound + period and reported once") {
  constexpr int n = 3;
  team tm(n);
  std::vector<reports> rep(n);
  gate stuck;
  std::atomic<steady::rep> stall_at{0};
  std::atomic<std::int64_t> stuck_step{-1};
  std::vector<std::int64_t> after(n, 0);  // steps run after the verdict (report fails nothing)
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      try {
        auto o = fast_options(&rep[static_cast<std::size_t>(t)]);
        thread_handler<> h(tm.config(t), tm.kv, {t, n, "step"},
                           memory_t{&tm.states[static_cast<std::size_t>(t)]}, o);
        for (int i = 0; i < 100000; ++i) {
          h.run([&] {
            std::this_thread::sleep_for(2ms);
            if (t == 1 && h.total_run_calls() == 40) {
              stuck_step = h.total_run_calls();
              stall_at = steady::now().time_since_epoch().count();
              stuck.wait();  // a collective that never returns, until released
            }
          });
          if (rep[static_cast<std::size_t>(t)].size() > 0) ++after[static_cast<std::size_t>(t)];
          if (after[static_cast<std::size_t>(t)] >= 20 && t != 1) break;
          if (t == 1 && after[1] >= 1) break;
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  auto o = fast_options(nullptr);
  bool all = true;
  for (int t = 0; t < n; ++t) all = rep[static_cast<std::size_t>(t)].wait(1, 20s) && all;
  stuck.release();
  for (auto& th : threads) th.join();
  REQUIRE(all);
  for (int t = 0; t < n; ++t) CHECK(errors[static_cast<std::size_t>(t)] == "");
  const auto verdicts = recorded_verdicts(tm.kv, "step");
  REQUIRE(verdicts.size() == 1);  // one recorded verdict
  auto parsed = holdfast::hang_verdict_of(*holdfast::parse_agreement_value(verdicts[0]));
  REQUIRE(parsed);
  CHECK(parsed->task == 1);
  CHECK(parsed->phase == hang_phase::step);
  CHECK(parsed->step == stuck_step.load());
  check_timing(*parsed, o);
  const steady::time_point stalled{steady::duration(stall_at.load())};
  for (int t = 0; t < n; ++t) {
    auto& r = rep[static_cast<std::size_t>(t)];
    REQUIRE(r.seen.size() == 1);  // acted on once
    CHECK(holdfast::format_agreement_value(holdfast::hang_verdict_value(r.seen[0])) == verdicts[0]);
    // every worker learns it within one period of its recording (plus scheduling)
    CHECK(r.at[0] - stalled <= parsed->bound + 2 * o.hang.period + slack);
  }
  CHECK(after[0] >= 20);  // report fails nothing outside a round: the others trained on
  CHECK(after[2] >= 20);
}

TEST_CASE("a step stuck while a round is under way: the verdict is that round's outcome") {
  // Task 2 never starts, so the round task 0 claims stays open (its ack is missing until the
  // 10 s ack_timeout); task 1's step is stuck from before the claim (its watcher acks all the
  // same). Its verdict must end the round: the outcome key holds it, nobody saves, tasks 0 and
  // 1 throw hang_detected naming task 1.
  constexpr int n = 3;
  team tm(n);
  gate stuck;
  std::atomic<bool> is_stuck{false};
  std::vector<std::string> errors(2);
  std::vector<steady::time_point> ended(2);
  std::vector<std::thread> threads;
  const auto t0 = steady::now();
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      try {
        thread_handler<> h(tm.config(t), tm.kv, {t, n, "round"},
                           memory_t{&tm.states[static_cast<std::size_t>(t)]},
                           fast_options(nullptr));
        for (int i = 0; i < 100000; ++i) {
          h.run([&] {
            std::this_thread::sleep_for(2ms);
            if (t == 1 && h.total_run_calls() == 30) {
              is_stuck = true;
              stuck.wait();
            }
          });
          if (t == 0 && is_stuck.load())
            tm.flags[0]->store(true);  // the notice: a round whose task 2 never acks
        }
      } catch (const holdfast::hang_detected& e) {
        errors[static_cast<std::size_t>(t)] =
            "hang " + std::to_string(e.hung_task()) + " " + e.phase();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = std::string("other ") + e.what();
      }
      ended[static_cast<std::size_t>(t)] = steady::now();
      if (t == 0) stuck.release();  // task 0 learned it: let task 1 reach its run() boundary
    });
  for (auto& th : threads) th.join();
  CHECK(errors[0] == "hang 1 step");
  CHECK(errors[1] == "hang 1 step");
  CHECK(tm.states[0].saves == 0);
  CHECK(tm.states[1].saves == 0);
  auto outcome = tm.kv.try_get("holdfast/round/ctl/r0/step");
  REQUIRE(outcome);
  auto v = holdfast::parse_agreement_value(*outcome);
  REQUIRE(v);
  CHECK(v->what == holdfast::agreement_value::kind::hang);
  CHECK(!tm.kv.try_get("holdfast/round/ctl/hang"));  // never beside the round's outcome
  CHECK(ended[0] - t0 < 10s);                        // well before the round's own ack_timeout
}

TEST_CASE("a restore that never returns is found by the restore guard") {
  // The watcher starts after the restore; the constructor's guard thread watches it.
  struct stuck_restore {
    gate* g;
    void save(std::int64_t) {}
    std::optional<std::int64_t> restore() {
      g->wait();
      return std::nullopt;
    }
  };
  holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
  std::atomic<bool> flag{false};
  reports r;
  gate g;
  auto o = fast_options(&r);
  std::thread release([&] {
    r.wait(1, 20s);
    g.release();
  });
  holdfast::preemption_handler<config_t, holdfast::in_process_kv, stuck_restore> h(
      config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {0, 1, "restore"},
      stuck_restore{&g}, o);
  release.join();
  REQUIRE(r.size() == 1);
  CHECK(r.seen[0].phase == hang_phase::restore);
  CHECK(r.seen[0].task == 0);
  check_timing(r.seen[0], o);
  CHECK(recorded_verdicts(kv, "restore").size() == 1);
}

TEST_CASE("a save that never returns is found in the save phase") {
  struct stuck_save {
    gate* g;
    std::atomic<int>* saves;
    void save(std::int64_t) {
      saves->fetch_add(1);
      g->wait();
    }
    std::optional<std::int64_t> restore() { return std::nullopt; }
  };
  holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
  std::atomic<bool> flag{false};
  std::atomic<int> saves{0};
  reports r;
  gate g;
  auto o = fast_options(&r);
  std::thread release([&] {
    r.wait(1, 20s);
    g.release();
  });
  holdfast::preemption_handler<config_t, holdfast::in_process_kv, stuck_save> h(
      config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {0, 1, "save"},
      stuck_save{&g, &saves}, o);
  holdfast::run_status st = holdfast::run_status::ran;
  for (int i = 0; i < 10000 && st != holdfast::run_status::stopped; ++i) {
    if (i == 20) flag = true;
    st = h.run([] { std::this_thread::sleep_for(1ms); });
  }
  release.join();
  CHECK(st == holdfast::run_status::stopped);
  REQUIRE(r.size() == 1);
  CHECK(saves.load() == 1);
  CHECK(r.seen[0].phase == hang_phase::save);
  check_timing(r.seen[0], o);
}

TEST_CASE("no verdict for steps inside their bound, with hang_none, or while paused") {
  team tm(1);
  reports r;
  auto o = fast_options(&r);
  {
    thread_handler<> h(tm.config(0), tm.kv, {0, 1, "quiet"}, memory_t{&tm.states[0]}, o);
    for (int i = 0; i < 60; ++i)  // 2 ms steps and a few of 60 ms: under max(5 x max, 300 ms)
      h.run([i] { std::this_thread::sleep_for(i % 15 == 14 ? 60ms : 2ms); });
    h.pause_hang_detection();  // an evaluation longer than any bound
    std::this_thread::sleep_for(o.hang.step_floor + 4 * o.hang.period);
    h.run([] {});
    CHECK(h.learned_hang_bounds().step < 300ms);  // the paused interval was not a step
  }
  CHECK(r.size() == 0);
  {
    thread_handler<holdfast::hang_none> h(tm.config(0), tm.kv, {0, 1, "none"},
                                          memory_t{&tm.states[0]}, o);
    for (int i = 0; i < 10; ++i) h.run([] { std::this_thread::sleep_for(1ms); });
    h.run([&] { std::this_thread::sleep_for(o.hang.step_floor + 4 * o.hang.period); });
  }
  CHECK(r.size() == 0);
  CHECK(recorded_verdicts(tm.kv, "quiet").empty());
  CHECK(recorded_verdicts(tm.kv, "none").empty());
}

namespace {

// A mount that stops answering: once armed, every fsync blocks (the process ends it).
std::atomic<bool>* stalled_mount() {
  static std::atomic<bool> on{false};
  return &on;
}
struct stalling_io : holdfast::posix_io {
  static int fsync(int fd) noexcept {
    while (stalled_mount()->load()) ::pause();  // a dead NFS server: never answers
    return holdfast::posix_io::fsync(fd);
  }
};
using stalling_store = holdfast::basic_store<holdfast::basic_filesystem_by_url<stalling_io>>;
using stalling_manager = holdfast::checkpoint_manager<stalling_store>;
using fs_config = holdfast::termination_config<flag_notice, holdfast::no_exit>;
template <class Ckpt>
using process_handler = holdfast::preemption_handler<fs_config, holdfast::filesystem_kv, Ckpt,
                                                     steady, holdfast::hang_restart>;

}  // namespace

TEST_CASE("hang_restart: a step stuck in one process ends every worker's process, restartable") {
  // Three processes over filesystem_kv; task 2's step sleeps forever at step 30. Every worker's
  // watcher learns the verdict (the claim key every idle worker waits on) and _exits with
  // exit_code: the launcher (torchrun) would restart the group.
  holdfast_test::temp_dir d;
  constexpr int n = 3;
  const std::string kv_root = d.path() + "/kv";
  std::vector<std::unique_ptr<holdfast_test::child>> workers;
  for (int t = 0; t < n; ++t)
    workers.push_back(std::make_unique<holdfast_test::child>([&, t] {
      holdfast::filesystem_kv kv(kv_root, holdfast::kv_namespace("job", "0"));
      std::atomic<bool> flag{false};
      holdfast_test::worker_state st;
      auto o = fast_options(nullptr);
      o.hang.exit_code = 75;
      process_handler<memory_t> h(
          fs_config(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {t, n, "restart"},
          memory_t{&st}, o);
      for (int i = 0; i < 100000; ++i)
        h.run([&] {
          std::this_thread::sleep_for(2ms);
          if (t == 2 && h.total_run_calls() == 30)
            for (;;) ::pause();  // stuck in a C extension: no lock of ours held
        });
      CHILD_REQUIRE(!"the loop ended without a verdict");
    }));
  for (auto& w : workers) {
    auto r = w->wait(30s);
    CHECK(r.failures == "");
    CHECK(r.exit_code == 75);
    CHECK(!r.timed_out);
  }
  holdfast::filesystem_kv kv(kv_root, holdfast::kv_namespace("job", "0"));
  auto claim = kv.try_get("holdfast/restart/ctl/r0/claim");
  REQUIRE(claim);
  auto v = holdfast::parse_agreement_value(*claim);
  REQUIRE(v);
  auto verdict = holdfast::hang_verdict_of(*v);
  REQUIRE(verdict);
  CHECK(verdict->task == 2);
  CHECK(verdict->step == 30);
  check_timing(*verdict, fast_options(nullptr));
}

TEST_CASE("hang_restart: a save on a mount that stops answering never becomes the latest") {
  // One worker saves every 10 steps to a checkpoint_manager whose fsync stops answering (the Io
  // policy) from the save at step 30 on: the save phase's bound passes, the worker _exits with
  // exit_code, and a restart's restore finds step 20, not 30.
  holdfast_test::temp_dir d;
  const std::string ckpt = d.path() + "/ckpt";
  holdfast_test::child w([&] {
    holdfast::filesystem_kv kv(d.path() + "/kv", holdfast::kv_namespace("job", "0"));
    std::atomic<bool> flag{false};
    auto o = fast_options(nullptr);
    o.hang.exit_code = 75;
    stalling_manager m(ckpt, holdfast::directory_commit::rename);
    m.set_writer(
        [](const std::string& dir, std::int64_t step) { std::ofstream(dir + "/state") << step; });
    process_handler<stalling_manager> h(
        fs_config(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {0, 1, "mount"},
        std::move(m), o);
    for (int i = 0; i < 100000; ++i) {
      h.run([] { std::this_thread::sleep_for(2ms); });
      const std::int64_t c = h.total_run_calls();
      if (c % 10 == 0 && c <= 30) {
        if (c == 30) {
          stalled_mount()->store(true);
          flag = true;  // the preemption save at the next boundary hangs on the mount
        } else {
          h.checkpointer().save(c);
        }
      }
    }
    CHILD_REQUIRE(!"the loop ended without a verdict");
  });
  auto r = w.wait(30s);
  CHECK(r.failures == "");
  CHECK(r.exit_code == 75);
  holdfast::checkpoint_manager<> after(holdfast::read_only, ckpt,
                                       holdfast::directory_commit::rename);
  CHECK(after.latest_step() == std::optional<std::int64_t>(20));
}
