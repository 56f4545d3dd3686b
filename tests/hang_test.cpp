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
//   - no false verdict: steps inside their bound, hang_none, and pause_hang_detection(); a
//     relaunch's set-up before its first step boundary (held to the warm-up floor, not the
//     learned step bound), its restore (held to the restore bound its checkpoint recorded) and
//     the restore agreement's wait for a task that starts late (held to the start's bounds);
//   - no unwatched step: the step after a pause or after a no_exit save is watched from run()'s
//     entry;
//   - a verdict beside the rounds reaches every worker over a store whose watch follows named
//     keys (the torch store's kind) as over the others.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/handler_harness.hpp"
#include "support/key_wait_kv.hpp"
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

// The verdicts one worker's policy reported, with when, and its handler's warning lines (the
// verdict's line comes before on_hang: logged_first).
struct reports {
  std::mutex m;
  std::condition_variable cv;
  std::vector<hang_verdict> seen;
  std::vector<steady::time_point> at;
  std::vector<std::string> warnings;
  std::vector<bool> logged_first;
  void add(const hang_verdict& v) {
    {
      std::lock_guard<std::mutex> l(m);
      seen.push_back(v);
      at.push_back(steady::now());
      logged_first.push_back(!warnings.empty() &&
                             warnings.back() == "hang detected: " + v.describe());
    }
    cv.notify_all();
  }
  void line(holdfast::log_level level, std::string_view text) {
    std::lock_guard<std::mutex> l(m);
    if (level == holdfast::log_level::warning) warnings.emplace_back(text);
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
  if (r) o.log = [r](holdfast::log_level level, std::string_view text) { r->line(level, text); };
  return o;
}

// The hang values the store holds under the run's ctl/ (the verdict key and the round keys).
template <class Kv>
std::vector<std::string> recorded_verdicts(Kv& kv, const std::string& run) {
  std::vector<std::string> out;
  for (auto& e : kv.list("holdfast/" + run + "/ctl")) {
    auto v = holdfast::parse_agreement_value(e.second);
    if (v && v->what == holdfast::agreement_value::kind::hang) out.push_back(e.second);
  }
  return out;
}

// Checks when the verdict came, and prints it ("hang-timing <case> <phase> elapsed <ms> bound
// <ms> period <ms>": the closing note's repetitions are read from these lines).
void check_timing(const char* name, const hang_verdict& v, const holdfast::handler_options& o) {
  std::fprintf(stderr, "hang-timing %s %s elapsed %lld bound %lld period %lld\n", name,
               holdfast::hang_phase_name(v.phase), static_cast<long long>(v.elapsed.count()),
               static_cast<long long>(v.bound.count()),
               static_cast<long long>(o.hang.period.count()));
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
  check_timing("thread-step", *parsed, o);
  const steady::time_point stalled{steady::duration(stall_at.load())};
  for (int t = 0; t < n; ++t) {
    auto& r = rep[static_cast<std::size_t>(t)];
    REQUIRE(r.seen.size() == 1);  // acted on once
    CHECK(holdfast::format_agreement_value(holdfast::hang_verdict_value(r.seen[0])) == verdicts[0]);
    CHECK(r.logged_first[0]);  // its warning line to handler_options::log, then on_hang
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
  if (auto verdict = holdfast::hang_verdict_of(*v)) {
    CHECK(verdict->task == 1);
    check_timing("round-step", *verdict, fast_options(nullptr));
  }
  CHECK(ended[0] - t0 < 10s);  // well before the round's own ack_timeout
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
  check_timing("restore", r.seen[0], o);
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
  check_timing("save", r.seen[0], o);
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
// A notice without a thread of its own (the watcher reads it): the children _exit with the
// watcher running, and a sanitizer counts a finished notice thread nobody joined as a leak.
using fs_config = holdfast::termination_config<holdfast_test::repeat_notice, holdfast::no_exit>;
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
      std::atomic<std::int64_t> notice_ns{0};
      holdfast_test::worker_state st;
      auto o = fast_options(nullptr);
      o.hang.exit_code = 75;
      process_handler<memory_t> h(fs_config(holdfast_test::repeat_notice{&notice_ns}), kv,
                                  {t, n, "restart"}, memory_t{&st}, o);
      for (int i = 0; i < 100000; ++i)
        h.run([&] {
          std::this_thread::sleep_for(2ms);
          if (t == 2 && h.total_run_calls() == 30)
            for (;;) ::pause();  // stuck in a C extension: no lock of ours held
        });
      CHILD_REQUIRE(false && "the loop ended without a verdict");
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
  check_timing("process-step", *verdict, fast_options(nullptr));
}

TEST_CASE("hang_restart: a save on a mount that stops answering never becomes the latest") {
  // One worker saves every 10 steps to a checkpoint_manager whose fsync stops answering (the Io
  // policy) from the save at step 30 on: the save phase's bound passes, the worker _exits with
  // exit_code, and a restart's restore finds step 20, not 30.
  holdfast_test::temp_dir d;
  const std::string ckpt = d.path() + "/ckpt";
  holdfast_test::child w([&] {
    holdfast::filesystem_kv kv(d.path() + "/kv", holdfast::kv_namespace("job", "0"));
    std::atomic<std::int64_t> notice_ns{0};
    auto o = fast_options(nullptr);
    o.hang.exit_code = 75;
    stalling_manager m(ckpt, holdfast::directory_commit::rename);
    m.set_writer(
        [](const std::string& dir, std::int64_t step) { std::ofstream(dir + "/state") << step; });
    process_handler<stalling_manager> h(
        fs_config(holdfast_test::repeat_notice{&notice_ns}, holdfast::no_exit{}), kv,
        {0, 1, "mount"}, std::move(m), o);
    for (int i = 0; i < 100000; ++i) {
      h.run([] { std::this_thread::sleep_for(2ms); });
      const std::int64_t c = h.total_run_calls();
      if (c % 10 == 0 && c <= 30) {
        if (c == 30) {
          stalled_mount()->store(true);  // the preemption save at the next boundary hangs
          notice_ns = steady::now().time_since_epoch().count();
        } else {
          h.checkpointer().save(c);
        }
      }
    }
    CHILD_REQUIRE(false && "the loop ended without a verdict");
  });
  auto r = w.wait(30s);
  CHECK(r.failures == "");
  CHECK(r.exit_code == 75);
  holdfast::checkpoint_manager<> after(holdfast::read_only, ckpt,
                                       holdfast::directory_commit::rename);
  CHECK(after.latest_step() == std::optional<std::int64_t>(20));
  holdfast::filesystem_kv kv(d.path() + "/kv", holdfast::kv_namespace("job", "0"));
  // the preemption round was decided and the machine re-armed: the next round's claim key
  auto recorded = recorded_verdicts(kv, "mount");
  REQUIRE(recorded.size() == 1);
  CHECK(kv.try_get("holdfast/mount/ctl/r1/claim") == recorded[0]);
  auto v = holdfast::parse_agreement_value(recorded[0]);
  REQUIRE(v);
  auto verdict = holdfast::hang_verdict_of(*v);
  REQUIRE(verdict);
  CHECK(verdict->phase == hang_phase::save);
  check_timing("mount-save", *verdict, fast_options(nullptr));
}

TEST_CASE("the learned bounds go into the checkpoint and cover the first steps after a restart") {
  holdfast_test::temp_dir d;
  const std::string ckpt = d.path() + "/ckpt";
  holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
  auto o = fast_options(nullptr);
  o.hang.step_floor = 10ms;  // the learned rule, not the floor, sets the bound
  auto manager = [&] {
    holdfast::checkpoint_manager<> m(ckpt, holdfast::directory_commit::rename);
    m.set_writer(
        [](const std::string& dir, std::int64_t step) { std::ofstream(dir + "/state") << step; });
    return m;
  };
  using handler_t = holdfast::preemption_handler<config_t, holdfast::in_process_kv,
                                                 holdfast::checkpoint_manager<>>;
  holdfast::hang_bounds saved;
  {
    std::atomic<bool> flag{false};
    handler_t h(config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv,
                {0, 1, "first"}, manager(), o);
    holdfast::run_status st = holdfast::run_status::ran;
    for (int i = 0; i < 10000 && st != holdfast::run_status::stopped; ++i) {
      if (i == 30) flag = true;
      st = h.run([i] { std::this_thread::sleep_for(i % 10 == 9 ? 20ms : 2ms); });
      if (i == 20) h.checkpointer().save(h.total_run_calls());  // the user's own save
    }
    REQUIRE(st == holdfast::run_status::stopped);
    saved = h.learned_hang_bounds();
  }
  CHECK(saved.steps >= 25);
  {  // the user's save recorded the bounds learned by then
    holdfast::checkpoint_manager<> ro(holdfast::read_only, ckpt,
                                      holdfast::directory_commit::rename);
    auto md = ro.metadata(21);
    REQUIRE(md);
    REQUIRE(md->hang);
    CHECK(md->hang->steps >= 5);
    CHECK(md->hang->step >= 20ms);
  }
  CHECK(saved.step >= 20ms);
  std::atomic<bool> flag{false};
  handler_t again(config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv,
                  {0, 1, "second"}, manager(), o);
  REQUIRE(again.restored_step());
  // no warm-up: the restarted job's first step already has the learned bound (not 5 s)
  CHECK(again.learned_hang_bounds().steps == saved.steps);
  CHECK(again.hang_bound(hang_phase::step) ==
        std::chrono::nanoseconds(static_cast<std::int64_t>(
            o.hang.multiplier * static_cast<double>(saved.step.count()))));
  CHECK(again.learned_hang_bounds().restore > std::chrono::nanoseconds(0));
}

namespace {

// A Checkpointer restored from a predecessor's checkpoint (step 100) that recorded `bounds`:
// what checkpoint_manager answers after a relaunch. Its restore takes `restore_time`.
struct relaunched_checkpoints {
  holdfast::hang_bounds bounds;
  milliseconds restore_time{0};
  int* saves = nullptr;
  void save(std::int64_t) {
    if (saves) ++*saves;
  }
  std::optional<std::int64_t> restore() {
    std::this_thread::sleep_for(restore_time);
    return 100;
  }
  std::optional<holdfast::hang_bounds> restored_hang_bounds() const { return bounds; }
  std::optional<holdfast::hang_bounds> newest_hang_bounds() const { return bounds; }
};

// Bounds a predecessor learned from 1,000 steps of 20 ms (warm-up long over).
holdfast::hang_bounds learned_20ms_steps() {
  holdfast::hang_bounds b;
  b.step = 20ms;
  b.steps = 1000;
  return b;
}

template <class Hang>
using relaunch_handler = holdfast::preemption_handler<config_t, holdfast::in_process_kv,
                                                      relaunched_checkpoints, steady, Hang>;

}  // namespace

TEST_CASE("a relaunch's set-up before its first step is held to the warm-up floor") {
  // Restored bounds of a 20 ms step (5 x 20 ms = 100 ms, floor 200 ms: a step's bound is
  // 200 ms), then 600 ms of set-up (model build, compile) before the first run(): no verdict,
  // under hang_report or hang_restart (a restart loop otherwise). Once the first step boundary
  // passed, the learned bound applies again.
  auto o = fast_options(nullptr);
  o.hang.step_floor = 200ms;
  {
    reports r;
    auto ro = fast_options(&r);
    ro.hang.step_floor = 200ms;
    holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
    std::atomic<bool> flag{false};
    relaunch_handler<holdfast::hang_report> h(
        config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {0, 1, "setup"},
        relaunched_checkpoints{learned_20ms_steps(), 0ms, nullptr}, ro);
    CHECK(h.restored_step() == std::optional<std::int64_t>(100));
    CHECK(h.hang_bound(hang_phase::step) == std::chrono::nanoseconds(200ms));  // no warm-up
    CHECK(h.hang_bound(hang_phase::start) == std::chrono::nanoseconds(ro.hang.warmup_floor));
    std::this_thread::sleep_for(600ms);  // the set-up
    for (int i = 0; i < 5; ++i) h.run([] { std::this_thread::sleep_for(2ms); });
    CHECK(r.size() == 0);
    CHECK(recorded_verdicts(kv, "setup").empty());
    // past the first boundary: a stuck step is found at the learned bound
    gate stuck;
    std::thread release([&] {
      r.wait(1, 20s);
      stuck.release();
    });
    h.run([&] { stuck.wait(); });
    release.join();
    REQUIRE(r.size() == 1);
    CHECK(r.seen[0].phase == hang_phase::step);
    CHECK(r.seen[0].bound == 200ms);
  }
  holdfast_test::child restart([&] {  // hang_restart would _exit(75) on a false verdict
    holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
    std::atomic<bool> flag{false};
    relaunch_handler<holdfast::hang_restart> h(
        config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {0, 1, "setup"},
        relaunched_checkpoints{learned_20ms_steps(), 0ms, nullptr}, o);
    std::this_thread::sleep_for(600ms);
    for (int i = 0; i < 5; ++i) h.run([] { std::this_thread::sleep_for(2ms); });
    h.shutdown();
  });
  auto res = restart.wait(30s);
  CHECK(res.failures == "");
  CHECK(res.exit_code == 0);
}

TEST_CASE("a relaunch's restore is held to the restore bound its checkpoint recorded") {
  // The predecessor's restore took 1 s (recorded); this one takes 900 ms, past the 400 ms floor
  // but well inside 5 x 1 s: no verdict. (The bounds are read before the restore.)
  reports r;
  auto o = fast_options(&r);
  auto b = learned_20ms_steps();
  b.restore = 1s;
  holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
  std::atomic<bool> flag{false};
  relaunch_handler<holdfast::hang_report> h(
      config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv, {0, 1, "slow"},
      relaunched_checkpoints{b, 900ms, nullptr}, o);
  h.run([] {});
  CHECK(r.size() == 0);
  CHECK(recorded_verdicts(kv, "slow").empty());
  CHECK(h.learned_hang_bounds().restore >= 900ms);  // this restore, for the next start
}

// relaunched_checkpoints with the restore agreement's two calls (checkpoint_manager's): every
// task holds step 100.
struct agreeing_checkpoints : relaunched_checkpoints {
  std::vector<std::int64_t> all_steps() const { return {100}; }
  std::optional<std::int64_t> restore_step(std::int64_t step) { return step; }
};
static_assert(holdfast::has_step_restore_v<agreeing_checkpoints>);

TEST_CASE("the restore agreement's wait for a late task is not judged a hang of the restore") {
  // Task 1 starts 1 s after task 0, whose restore waits for it in the agreement: past the
  // 400 ms restore floor, but the wait is task 1's, bounded by the start's own timeouts.
  reports r;
  auto o = fast_options(&r);
  o.agree_on_restore = true;
  o.start_timeout = 2s;
  o.restore_timeout = 5s;
  o.ack_timeout = 2s;
  holdfast::in_process_kv kv(holdfast::kv_namespace("hang", "0"));
  std::atomic<bool> flag{false};
  using handler_t =
      holdfast::preemption_handler<config_t, holdfast::in_process_kv, agreeing_checkpoints, steady,
                                   holdfast::hang_report>;
  auto make = [&](int task) {
    return std::make_unique<handler_t>(
        config_t(flag_notice(flag_poll{&flag}, 1ms), holdfast::no_exit{}), kv,
        holdfast::cluster_info{task, 2, "late"},
        agreeing_checkpoints{{learned_20ms_steps(), 0ms, nullptr}}, o);
  };
  std::unique_ptr<handler_t> first;
  const auto t0 = steady::now();
  std::thread early([&] { first = make(0); });
  std::this_thread::sleep_for(1s);
  auto second = make(1);
  early.join();
  CHECK(steady::now() - t0 >= 1s);  // task 0's start waited for task 1
  CHECK(first->restored_step() == std::optional<std::int64_t>(100));
  CHECK(second->restored_step() == std::optional<std::int64_t>(100));
  CHECK(first->hang_bound(hang_phase::restore) >=
        std::chrono::nanoseconds(o.start_timeout + o.restore_timeout + o.ack_timeout));
  first->run([] {});
  second->run([] {});
  CHECK(r.size() == 0);
  CHECK(recorded_verdicts(kv, "late").empty());
}

TEST_CASE("the step after a pause and after a no_exit save is watched from run()'s entry") {
  for (const bool after_save : {false, true}) {
    CAPTURE(after_save);
    team tm(1);
    reports r;
    auto o = fast_options(&r);
    thread_handler<> h(tm.config(0), tm.kv, {0, 1, after_save ? "saved" : "paused"},
                       memory_t{&tm.states[0]}, o);
    for (int i = 0; i < 20; ++i) h.run([] { std::this_thread::sleep_for(2ms); });
    if (after_save) {
      tm.flags[0]->store(true);  // a preemption notice: no_exit saves and returns stopped
      holdfast::run_status st = holdfast::run_status::ran;
      for (int i = 0; i < 5000 && st != holdfast::run_status::stopped; ++i)
        st = h.run([] { std::this_thread::sleep_for(1ms); });
      REQUIRE(st == holdfast::run_status::stopped);
      CHECK(tm.states[0].saves == 1);
    } else {
      h.pause_hang_detection();  // an evaluation
      std::this_thread::sleep_for(50ms);
    }
    gate stuck;
    std::thread release([&] {
      r.wait(1, 20s);
      stuck.release();
    });
    h.run([&] { stuck.wait(); });  // the first collective after it never returns
    release.join();
    REQUIRE(r.size() == 1);
    CHECK(r.seen[0].phase == hang_phase::step);
    check_timing(after_save ? "after-save" : "after-pause", r.seen[0], o);
  }
}

TEST_CASE("a verdict beside the rounds reaches every worker over a store that follows named keys") {
  // Over a key-wait store (the torch store's kind: its watch wakes only for the keys it is told
  // to follow), task 1's stuck step is recorded in ctl/hang; task 0, idle, must learn it too.
  constexpr int n = 2;
  holdfast_test::key_wait_kv kv{holdfast::in_process_kv(holdfast::kv_namespace("hang", "0"))};
  std::vector<std::unique_ptr<std::atomic<bool>>> flags;
  for (int t = 0; t < n; ++t) flags.push_back(std::make_unique<std::atomic<bool>>(false));
  std::vector<reports> rep(n);
  std::vector<holdfast_test::worker_state> st(n);
  std::vector<std::string> errors(n);
  gate stuck;
  std::vector<std::thread> threads;
  using follow_handler = holdfast::preemption_handler<config_t, holdfast_test::key_wait_kv,
                                                      memory_t, steady, holdfast::hang_report>;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      try {
        const auto i = static_cast<std::size_t>(t);
        follow_handler h(config_t(flag_notice(flag_poll{flags[i].get()}, 1ms), holdfast::no_exit{}),
                         kv, {t, n, "follow"}, memory_t{&st[i]}, fast_options(&rep[i]));
        for (int k = 0; k < 100000 && rep[i].size() == 0; ++k)
          h.run([&] {
            std::this_thread::sleep_for(2ms);
            if (t == 1 && h.total_run_calls() == 40) stuck.wait();
          });
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  const bool both = rep[0].wait(1, 20s) && rep[1].wait(1, 20s);
  stuck.release();
  for (auto& th : threads) th.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  REQUIRE(both);
  CHECK(rep[0].seen[0].task == 1);
  CHECK(rep[1].seen[0].task == 1);
  CHECK(rep[0].seen[0].recorder == rep[1].seen[0].recorder);
}
