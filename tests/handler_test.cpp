// preemption_handler with worker threads over the real in_process_kv: TF's failure-handling
// cases and XLA's sync-manager cases (no notice, one notice, skew, simultaneous notices, grace,
// save override, step errors, restart, dead worker, destruction in every state) and 100
// randomized trials. Forked processes over filesystem_kv and etcd_kv: handler_process_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <holdfast/handler.hpp>
#include <holdfast/kv/any.hpp>
#include <holdfast/kv/in_process.hpp>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/c10d_like_kv.hpp"
#include "support/child.hpp"
#include "support/files.hpp"
#include "support/handler_harness.hpp"
#include "support/own_write_kv.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

using namespace std::chrono_literals;
using holdfast::run_status;
using holdfast_test::flag_notice;
using holdfast_test::flag_poll;
using holdfast_test::worker_state;
using std::chrono::milliseconds;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define HF_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define HF_SANITIZED 1
#endif
#endif

namespace {

using kv_t = holdfast::counting_kv<holdfast::in_process_kv>;
using config_t = holdfast::termination_config<flag_notice, holdfast::no_exit>;
using handler_t = holdfast::preemption_handler<config_t, kv_t>;
using memory_handler_t =
    holdfast::preemption_handler<config_t, kv_t, holdfast_test::memory_checkpoints>;

// memory_checkpoints whose every save takes one known time: where the time a save takes is part
// of the behaviour under test (the grace path reserves what the first save took for the final
// one), a save to this shared machine's disk varies too much (4 to 430 ms in one series).
struct timed_memory_checkpoints {
  static constexpr milliseconds cost{100};
  holdfast_test::memory_checkpoints inner;
  void save(std::int64_t step) {
    std::this_thread::sleep_for(cost);
    inner.save(step);
  }
  std::optional<std::int64_t> restore() { return inner.restore(); }
};
using timed_handler_t = holdfast::preemption_handler<config_t, kv_t, timed_memory_checkpoints>;

// Progress of every worker, waited on by the test thread with a deadline.
struct board {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::int64_t> progress;
  void set(int task, std::int64_t step) {
    {
      std::lock_guard<std::mutex> l(m);
      progress[static_cast<std::size_t>(task)] = step;
    }
    cv.notify_all();
  }
  bool wait_all(std::int64_t step, milliseconds timeout, const std::set<int>& skip = {}) {
    std::unique_lock<std::mutex> l(m);
    return cv.wait_for(l, timeout, [&] {
      for (std::size_t i = 0; i < progress.size(); ++i)
        if (!skip.count(static_cast<int>(i)) && progress[i] < step) return false;
      return true;
    });
  }
  // Until `task` is done: its handler destroyed, its progress set to the maximum.
  bool wait_done(int task, milliseconds timeout) {
    std::unique_lock<std::mutex> l(m);
    return cv.wait_for(l, timeout, [&] {
      return progress[static_cast<std::size_t>(task)] == std::numeric_limits<std::int64_t>::max();
    });
  }
};

struct scenario {
  int n = 4;
  std::int64_t max_steps = 1000000;  // a worker stops at this counter (no notice needed)
  std::vector<int> step_us;          // per-task step time; default 200 µs each
  std::vector<int> noticed;          // tasks noticed together once all reached notice_at
  std::int64_t notice_at = 20;
  milliseconds grace{0};
  milliseconds ack_timeout{2000};
  milliseconds watch{5};
  milliseconds grace_margin{100};  // the tests' grace periods are 300-800 ms
  bool agree_on_restore = true;
  int throw_task = -1;
  std::int64_t throw_at = -1;
  int throw_after_us = 0;  // the throwing step runs this long first
  int dead_task = -1;      // stops calling run() at dead_at, without a notice
  std::int64_t dead_at = -1;
  bool save_override = false;
  bool lockstep = false;  // steps coupled as by a collective: none ends two steps ahead of another
  std::string run_id = "run";
};

struct outcome {
  run_status last = run_status::ran;
  std::int64_t counter = 0;
  std::optional<std::int64_t> restored;
  worker_state st;
  std::vector<std::int64_t> overrides;
  std::string error;  // "peer <task> <type> <msg>", "timeout <ids>", "own <msg>", "other <what>"
  std::vector<int> missing;
  double error_ms = 0;                                     // duration of the run() call that threw
  std::chrono::steady_clock::time_point stopped_at{};      // when run() returned stopped
  std::chrono::steady_clock::time_point first_saved_at{};  // when run() first returned saved
  std::chrono::steady_clock::duration mean_step{};         // mean_step_time() at the end
  bool finished = false;
};

struct job {
  holdfast_test::temp_dir dir{"handler"};
  kv_t kv{holdfast::in_process_kv(holdfast::kv_namespace("job", "0"))};
  std::vector<std::unique_ptr<std::atomic<bool>>> flags;
  board b;
  std::chrono::steady_clock::time_point noticed_at{};  // when run_job set the notice flags
  explicit job(int n) {
    for (int i = 0; i < n; ++i) flags.push_back(std::make_unique<std::atomic<bool>>(false));
    b.progress.assign(static_cast<std::size_t>(n), -1);
  }
  std::string ckpt_dir(int task) const { return dir / ("ckpt-" + std::to_string(task)); }
};

config_t make_config(job& j, int task, const scenario& sc, outcome* out) {
  config_t c(flag_notice(flag_poll{j.flags[static_cast<std::size_t>(task)].get()}, 1ms),
             holdfast::no_exit{}, sc.grace);
  if (sc.save_override) c.set_save_override([out](std::int64_t s) { out->overrides.push_back(s); });
  return c;
}

holdfast::handler_options opts(const scenario& sc) {
  holdfast::handler_options o;
  o.ack_timeout = sc.ack_timeout;
  o.watch_interval = sc.watch;
  o.grace_margin = sc.grace_margin;
  o.agree_on_restore = sc.agree_on_restore;
  return o;
}

// A step's work: sleeping leaves the 2 shared cores to the other workers.
void busy(int us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

holdfast::checkpoint_manager<> make_ckpt(job& j, int task, outcome& out, handler_t*) {
  return holdfast_test::make_checkpoints(j.ckpt_dir(task), &out.st);
}
holdfast_test::memory_checkpoints make_ckpt(job&, int, outcome& out, memory_handler_t*) {
  return {&out.st};
}
timed_memory_checkpoints make_ckpt(job&, int, outcome& out, timed_handler_t*) {
  return {holdfast_test::memory_checkpoints{&out.st}};
}

// Once the test set a task's flag, its poller has latched it before the task's next step: a
// notice is the moment it was set, never first seen after the save that served it (on a loaded
// machine a poller starved past that save would latch a new notice and open round 1).
template <class Handler>
void wait_latched(job& j, int task, Handler& h) {
  if (!j.flags[static_cast<std::size_t>(task)]->load()) return;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!h.config().notice().noticed() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

template <class Handler = handler_t>
void worker(job& j, int task, const scenario& sc, outcome& out) {
  try {
    Handler h(make_config(j, task, sc, &out), j.kv, {task, sc.n, sc.run_id},
              make_ckpt(j, task, out, static_cast<Handler*>(nullptr)), opts(sc));
    out.restored = h.restored_step();
    int us = sc.step_us.empty() ? 200 : sc.step_us[static_cast<std::size_t>(task)];
    while (h.total_run_calls() < sc.max_steps) {
      if (task == sc.dead_task && h.total_run_calls() >= sc.dead_at) break;
      auto t0 = std::chrono::steady_clock::now();
      try {
        out.last = h.run([&] {
          if (task == sc.throw_task && h.total_run_calls() == sc.throw_at) {
            busy(sc.throw_after_us);
            throw std::runtime_error("nan loss");
          }
          ++out.st.acc;
          busy(us);
          // a collective: the step ends once every other worker is at most one step behind
          if (sc.lockstep) (void)j.b.wait_all(h.total_run_calls() - 1, 20s, {task});
        });
      } catch (...) {
        out.error_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        throw;
      }
      if (out.last == run_status::saved && out.first_saved_at == decltype(out.first_saved_at){})
        out.first_saved_at = std::chrono::steady_clock::now();
      j.b.set(task, h.total_run_calls());
      wait_latched(j, task, h);
      if (out.last == run_status::stopped) {
        out.stopped_at = std::chrono::steady_clock::now();
        break;
      }
    }
    out.mean_step = h.mean_step_time();
    out.counter = h.total_run_calls();
    out.finished = true;
  } catch (const holdfast::peer_error& e) {
    out.error = "peer " + std::to_string(e.origin_task()) + " " + e.type_name() + " " + e.message();
  } catch (const holdfast::agreement_timeout& e) {
    out.error = "timeout";
    out.missing = e.missing_tasks();
  } catch (const std::runtime_error& e) {
    out.error = std::string("own ") + e.what();
  } catch (const std::exception& e) {
    out.error = std::string("other ") + e.what();
  }
  j.b.set(task, std::numeric_limits<std::int64_t>::max());  // done: never waited on again
}

// Runs a job; returns the outcomes and (through notice_to_done_ms) the time from the notice
// until every worker returned.
template <class Handler = handler_t>
std::vector<outcome> run_job(job& j, const scenario& sc, double* notice_to_done_ms = nullptr) {
  // notice_to_done_ms: from the notice until the last worker's run() returned stopped
  std::vector<outcome> out(static_cast<std::size_t>(sc.n));
  std::vector<std::thread> threads;
  for (int t = 0; t < sc.n; ++t)
    threads.emplace_back([&, t] { worker<Handler>(j, t, sc, out[static_cast<std::size_t>(t)]); });
  std::chrono::steady_clock::time_point noticed_at{};
  if (!sc.noticed.empty()) {
    std::set<int> skip;
    if (sc.dead_task >= 0) skip.insert(sc.dead_task);
    CHECK(j.b.wait_all(sc.notice_at, 20s, skip));
    // the dead worker is gone, its watcher with it, before the notice: one still alive, however
    // slow its steps, would ack
    if (sc.dead_task >= 0) CHECK(j.b.wait_done(sc.dead_task, 20s));
    j.kv.reset_counts();  // from here on the store counts the agreement only
    noticed_at = std::chrono::steady_clock::now();
    j.noticed_at = noticed_at;
    for (int t : sc.noticed) j.flags[static_cast<std::size_t>(t)]->store(true);
  }
  for (auto& th : threads) th.join();
  if (notice_to_done_ms) {
    auto last = noticed_at;
    for (auto& o : out) last = std::max(last, o.stopped_at);
    *notice_to_done_ms = std::chrono::duration<double, std::milli>(last - noticed_at).count();
  }
  return out;
}

// The handler of task `t` in an `n`-task job under run id `run`, the scenario's defaults
// otherwise: what the tests that drive the handler themselves start each thread with.
handler_t task_handler(job& j, int t, int n, const std::string& run, outcome& o) {
  scenario sc;
  sc.n = n;
  return handler_t(make_config(j, t, sc, &o), j.kv, {t, n, run},
                   holdfast_test::make_checkpoints(j.ckpt_dir(t), &o.st), opts(sc));
}

std::set<std::int64_t> first_saves(const std::vector<outcome>& out) {
  std::set<std::int64_t> s;
  for (auto& o : out)
    if (!o.st.saved_steps.empty()) s.insert(o.st.saved_steps.front());
  return s;
}

}  // namespace

TEST_CASE("threads: no notice → the handler never saves and makes no store traffic per step") {
  job j(4);
  scenario sc;
  sc.max_steps = 1000;
  sc.step_us = {100, 100, 100, 100};
  sc.watch = 300ms;  // the watcher's blocking get is the only store call
  const auto started = std::chrono::steady_clock::now();
  auto out = run_job(j, sc);
  const auto took = std::chrono::steady_clock::now() - started;
  for (auto& o : out) {
    CHECK(o.finished);
    CHECK(o.error == "");
    CHECK(o.counter == 1000);
    CHECK(o.st.saves == 0);
    CHECK(o.last == run_status::ran);
  }
  // the restore agreement at construction only: each worker puts the steps it has, reads the
  // four lists and proposes the outcome (one insert wins, the three others read it), after
  // reading the five keys an earlier launch could have left (restore_agreement.hpp); nothing
  // per step (1000 steps each)
  auto c = j.kv.counts();
  CHECK(c.insert == 4);
  CHECK(c.put == 4);
  CHECK(c.list == 0);
  // ... and, with hang detection (hang_report, the default) over a store without a watch, one
  // read of the hang verdict key per worker and hang_options::period (1 s), from the first wake
  const auto periods = std::chrono::duration_cast<std::chrono::seconds>(took).count() + 1;
  CHECK(c.try_get >= 3 + 4 * 5 + 4);
  CHECK(c.try_get <= 3 + 4 * 5 + 4 * periods);
  CHECK(c.get <= 4 * 4 + 4 * 6);  // 4 lists each, then one blocking get per watch interval
}

namespace {
// The parsed value of `key` in the job's store (a claim or an outcome).
std::optional<holdfast::agreement_value> value_at(job& j, const std::string& key) {
  auto text = j.kv.inner().try_get(key);
  return text ? holdfast::parse_agreement_value(*text) : std::nullopt;
}
}  // namespace

TEST_CASE("threads: one notice → every worker saves once, at one agreed step") {
  for (int target : {0, 3}) {
    job j(4);
    scenario sc;
    sc.noticed = {target};
    auto out = run_job(j, sc);
    auto steps = first_saves(out);
    REQUIRE(steps.size() == 1);
    for (auto& o : out) {
      CHECK(o.error == "");
      CHECK(o.last == run_status::stopped);
      CHECK(o.st.saves == 1);
      CHECK(o.counter == *steps.begin());  // stopped at the agreed step, step not run
      CHECK(o.st.acc == o.counter);        // nothing ran after the save
    }
    auto claim = value_at(j, "holdfast/run/ctl/r0/claim");
    auto step = value_at(j, "holdfast/run/ctl/r0/step");
    REQUIRE(claim);
    REQUIRE(step);
    CHECK(claim->what == holdfast::agreement_value::kind::claim);
    CHECK(claim->writer == target);
    CHECK(step->what == holdfast::agreement_value::kind::step);
    CHECK(step->step == *steps.begin());
  }
}

TEST_CASE("threads: skewed workers, notice to the slowest or the fastest → same step") {
  for (int target : {0, 3}) {
    job j(4);
    scenario sc;
    sc.step_us = {2000, 600, 200, 100};  // task 0 slowest, task 3 fastest
    sc.notice_at = 5;
    sc.noticed = {target};
    auto out = run_job(j, sc);
    auto steps = first_saves(out);
    CHECK(steps.size() == 1);
    for (auto& o : out) {
      CHECK(o.error == "");
      CHECK(o.st.saves == 1);
    }
  }
}

TEST_CASE("threads: simultaneous notices on 2 or all workers → one claim, one step") {
  for (auto noticed : {std::vector<int>{1, 2}, std::vector<int>{0, 1, 2, 3}}) {
    job j(4);
    scenario sc;
    sc.noticed = noticed;
    auto out = run_job(j, sc);
    CHECK(first_saves(out).size() == 1);
    for (auto& o : out) CHECK(o.st.saves == 1);
    auto claim = value_at(j, "holdfast/run/ctl/r0/claim");
    REQUIRE(claim);
    CHECK(std::count(noticed.begin(), noticed.end(), claim->writer) == 1);
    CHECK(j.kv.inner().list("holdfast/run/ctl/r0").size() == 2);  // claim and step: no more
    CHECK(j.kv.inner().list("holdfast/run/ack/r0").size() <= 4);  // erased unless exit was first
  }
}

TEST_CASE("threads: grace path → exactly two saves, before the grace period ends") {
  job j(4);
  scenario sc;
  // The final save is aimed a quarter of the grace period before its end (grace_margin), so a
  // stall of up to 500 ms on this loaded machine still ends before the deadline itself.
  sc.grace = 2000ms;
  sc.grace_margin = 500ms;
  sc.step_us = {10000, 10000, 10000, 10000};
  // Coupled as a training job's steps are (by their collectives): the countdown reserves 6 mean
  // steps for the workers to reach the final step. Independent sleeps drift apart on a loaded
  // machine (asan beside a CPU hog: the noticed worker reached the final step 460 ms after the
  // others, 40 ms before the grace period's end).
  sc.lockstep = true;
  sc.noticed = {2};
  double ms = 0;
  // Saves of one known cost: the reserve is what the first save took (with saves on the disk, a
  // final run() of 1.6 s on every worker, the first's 50 ms, ended 2979 ms after the notice).
  auto out = run_job<timed_handler_t>(j, sc, &ms);
  for (auto& o : out) {
    CHECK(o.error == "");
    CHECK(o.st.saves == 2);
    CHECK(o.last == run_status::stopped);
  }
  std::set<std::vector<std::int64_t>> all;
  for (auto& o : out) all.insert(o.st.saved_steps);
  CHECK(all.size() == 1);  // the same two steps everywhere
  CHECK(ms < 2000);        // before the grace period ends: the deadline itself, no slack past it
  // It trained through the grace period: the noticed task claims the final save once now >
  // notice + grace - 6 x mean step - 2 x overhead - grace_margin (step_agreement's countdown),
  // the overhead being its first agreement and save (no longer than from the notice until that
  // save returned) + one watch interval, so the final save comes no earlier than that, however
  // slow the machine (a fixed 1000 ms read 960 under load: a slow first save reserves more).
  // Quiet, that is ~1300 ms; a final save right after the first, ~2 x first_ms.
  using ms_t = std::chrono::duration<double, std::milli>;
  const outcome& noticed = out[2];
  REQUIRE(noticed.first_saved_at > j.noticed_at);
  const double first_ms = ms_t(noticed.first_saved_at - j.noticed_at).count();
  const double mean_ms = ms_t(noticed.mean_step).count();
  const double earliest = ms_t(sc.grace - sc.grace_margin).count() - 6 * mean_ms -
                          2 * (first_ms + ms_t(sc.watch).count()) -
                          50;  // the mean the countdown read, a few steps before the end's
  INFO("first save " << first_ms << " ms after the notice, mean step " << mean_ms
                     << " ms: the final claim no earlier than " << earliest << " ms");
  CHECK(ms > earliest);
}

TEST_CASE("threads: save_checkpoint_if_preempted serves loops of several steps per call") {
  job j(3);
  std::vector<outcome> out(3);
  std::vector<std::int64_t> mean_us(3);
  std::vector<std::thread> th;
  for (int t = 0; t < 3; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      handler_t h = task_handler(j, t, 3, "loop", o);
      while (h.total_run_calls() < 100000) {
        for (int k = 0; k < 4; ++k) busy(250);  // four steps of a custom loop
        o.st.acc = h.total_run_calls() + 1;     // the state a save at the next call holds
        if (h.save_checkpoint_if_preempted() == run_status::stopped) break;
        j.b.set(t, h.total_run_calls());
      }
      o.counter = h.total_run_calls();
      mean_us[static_cast<std::size_t>(t)] =
          std::chrono::duration_cast<std::chrono::microseconds>(h.mean_step_time()).count();
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  REQUIRE(j.b.wait_all(10, 10s));
  j.flags[1]->store(true);
  for (auto& x : th) x.join();
  CHECK(first_saves(out).size() == 1);
  for (int t = 0; t < 3; ++t) {
    CHECK(out[static_cast<std::size_t>(t)].st.saves == 1);
    CHECK(mean_us[static_cast<std::size_t>(t)] >= 900);  // the estimate is kept (4 x 250 us)
  }
}

TEST_CASE("threads: a save override replaces the default save") {
  job j(4);
  scenario sc;
  sc.save_override = true;
  sc.noticed = {1};
  auto out = run_job(j, sc);
  std::set<std::int64_t> steps;
  for (int t = 0; t < 4; ++t) {
    auto& o = out[static_cast<std::size_t>(t)];
    CHECK(o.st.saves == 0);  // the checkpoint writer never ran
    REQUIRE(o.overrides.size() == 1);
    steps.insert(o.overrides[0]);
    holdfast::checkpoint_manager<> m(j.ckpt_dir(t), holdfast::directory_commit::rename);
    CHECK(m.checkpoints().empty());
  }
  CHECK(steps.size() == 1);
}

TEST_CASE("threads: a step error is raised on every worker") {
  job j(4);
  scenario sc;
  sc.throw_task = 1;
  sc.throw_at = 30;
  auto out = run_job(j, sc);
  for (int t = 0; t < 4; ++t) {
    auto& o = out[static_cast<std::size_t>(t)];
    if (t == 1)
      CHECK(o.error == "own nan loss");
    else
      CHECK(o.error == "peer 1 std::runtime_error nan loss");
  }
}

TEST_CASE("threads: a step error wakes peers blocked in an agreement") {
  job j(4);
  scenario sc;
  sc.step_us = {100, 100, 100, 100};
  sc.dead_task = 3;  // never acks: the agreement cannot complete, peers block at the boundary
  sc.dead_at = 1;
  sc.throw_task = 2;  // inside its step when the notice comes; throws 100 ms later
  sc.throw_at = 3;
  sc.throw_after_us = 100000;
  sc.notice_at = 3;
  sc.noticed = {0};
  sc.ack_timeout = 5000ms;
  auto out = run_job(j, sc);
  CHECK(out[2].error == "own nan loss");
  for (int t : {0, 1}) {
    CHECK(out[static_cast<std::size_t>(t)].error == "peer 2 std::runtime_error nan loss");
    CHECK(out[static_cast<std::size_t>(t)].error_ms < 2000);  // not the 5 s ack timeout
  }
}

TEST_CASE("threads: a worker stuck inside a step still acks (steps coupled by a collective)") {
  // Each step is a barrier through the store: step k of every worker waits for every worker's
  // "arrived" key of step k, as a gradient all-reduce would. A worker blocked there cannot reach
  // a step boundary, so its watcher must ack for it.
  for (int target : {0, 2}) {
    job j(3);
    std::vector<outcome> out(3);
    std::vector<std::thread> th;
    for (int t = 0; t < 3; ++t)
      th.emplace_back([&, t] {
        auto& o = out[static_cast<std::size_t>(t)];
        try {
          handler_t h = task_handler(j, t, 3, "sync", o);
          while (h.total_run_calls() < 100000) {
            const std::int64_t k = h.total_run_calls();
            auto st = h.run([&] {
              j.kv.put("grad/" + std::to_string(k) + "/" + std::to_string(t), "g");
              auto deadline = std::chrono::steady_clock::now() + 10s;
              while (j.kv.list("grad/" + std::to_string(k)).size() < 3 &&
                     std::chrono::steady_clock::now() < deadline)
                (void)j.kv.get("grad/" + std::to_string(k) + "/never", 1ms);
              ++o.st.acc;
            });
            j.b.set(t, h.total_run_calls());
            if (st == run_status::stopped) break;
          }
          o.counter = h.total_run_calls();
          o.finished = true;
        } catch (const std::exception& e) {
          o.error = e.what();
        }
        j.b.set(t, std::numeric_limits<std::int64_t>::max());
      });
    REQUIRE(j.b.wait_all(10, 10s));
    j.flags[static_cast<std::size_t>(target)]->store(true);
    for (auto& x : th) x.join();
    auto steps = first_saves(out);
    CHECK(steps.size() == 1);
    for (auto& o : out) {
      CHECK(o.error == "");
      CHECK(o.st.saves == 1);
      CHECK(o.finished);
    }
  }
}

TEST_CASE(
    "threads: a step waiting for a dead peer stops with step_abandoned: the recorded timeout") {
  // Steps coupled by an exchange through the store (as a gradient all-reduce): task 2 stops
  // after step 4 without a notice (its handler gone, it never acks), so tasks 0 and 1 block in
  // step 5 waiting for its part. A notice to task 0 starts an agreement that records a timeout
  // naming task 2 after ack_timeout; the blocked steps see agreement_failed() and throw
  // step_abandoned, and run() raises that timeout at once, long before the steps' own 30 s.
  job j(3);
  std::vector<outcome> out(3);
  std::vector<std::thread> th;
  std::atomic<int> abandoned{0};
  constexpr auto ack_timeout = 500ms;
  for (int t = 0; t < 3; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      auto t0 = std::chrono::steady_clock::now();
      try {
        scenario sc;
        sc.n = 3;
        sc.ack_timeout = ack_timeout;
        handler_t h(make_config(j, t, sc, &o), j.kv, {t, 3, "abandon"},
                    holdfast_test::make_checkpoints(j.ckpt_dir(t), &o.st), opts(sc));
        while (h.total_run_calls() < (t == 2 ? 5 : 100000)) {
          const std::int64_t k = h.total_run_calls();
          t0 = std::chrono::steady_clock::now();
          h.run([&] {
            const std::string prefix = "grad/" + std::to_string(k);
            j.kv.put(prefix + "/" + std::to_string(t), "g");
            const auto give_up = std::chrono::steady_clock::now() + 30s;
            while (j.kv.list(prefix).size() < 3) {
              if (h.agreement_failed()) {
                ++abandoned;
                throw holdfast::step_abandoned{};
              }
              if (std::chrono::steady_clock::now() >= give_up)
                throw std::runtime_error("the step waited out its own 30 s");
              (void)j.kv.get(prefix + "/never", 5ms);  // waits a little for the peers
            }
            ++o.st.acc;
          });
          j.b.set(t, h.total_run_calls());
        }
        o.finished = true;
      } catch (const holdfast::agreement_timeout& e) {
        o.error = "timeout";
        o.missing = e.missing_tasks();
        o.error_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
      } catch (const std::exception& e) {
        o.error = std::string("other ") + e.what();
      }
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  th[2].join();  // task 2 ran its 5 steps and is gone
  REQUIRE(out[2].finished);
  REQUIRE(j.b.wait_all(5, 10s));  // tasks 0 and 1 are inside step 5, waiting for task 2
  j.flags[0]->store(true);
  th[0].join();
  th[1].join();
  for (int t : {0, 1}) {
    auto& o = out[static_cast<std::size_t>(t)];
    INFO("task " << t << ": " << o.error);
    CHECK(o.error == "timeout");
    CHECK(o.missing == std::vector<int>{2});
    // about the claim's ack_timeout after the notice; what matters: far below the steps' 30 s
    CHECK(o.error_ms < 10000);
    CHECK(o.st.saves == 0);
  }
  CHECK(abandoned.load() == 2);
}

TEST_CASE("threads: step_abandoned with no failed agreement is published as an error") {
  job j(2);
  std::vector<outcome> out(2);
  std::vector<std::thread> th;
  for (int t = 0; t < 2; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      try {
        handler_t h = task_handler(j, t, 2, "misuse", o);
        while (h.total_run_calls() < 10000) {  // 1 ms steps: 10 s at most
          h.run([&] {
            if (t == 1 && h.total_run_calls() == 3) throw holdfast::step_abandoned{};
            std::this_thread::sleep_for(1ms);
          });
          j.b.set(t, h.total_run_calls());
        }
      } catch (const holdfast::peer_error& e) {
        o.error = "peer " + std::to_string(e.origin_task()) + " " + e.type_name();
      } catch (const std::logic_error& e) {
        o.error = std::string("logic ") + e.what();
      } catch (const std::exception& e) {
        o.error = std::string("other ") + e.what();
      }
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  for (auto& x : th) x.join();
  CHECK(out[1].error.find("logic holdfast: a step threw step_abandoned, but no agreement failed") ==
        0);
  CHECK(out[0].error.find("peer 1 ") == 0);
  CHECK(out[0].error.find("logic_error") != std::string::npos);  // what the origin threw
}

TEST_CASE("threads: restart restores and resumes, the total work is exact") {
  job j(4);
  scenario sc;
  sc.noticed = {3};
  auto first = run_job(j, sc);
  auto steps = first_saves(first);
  REQUIRE(steps.size() == 1);
  const std::int64_t saved = *steps.begin();

  for (auto& f : j.flags) f->store(false);
  scenario again;
  again.max_steps = saved + 50;
  again.run_id = "run-restarted";  // a new incarnation's keys
  auto second = run_job(j, again);
  std::int64_t total = 0;
  for (auto& o : second) {
    CHECK(o.error == "");
    CHECK(o.restored == saved);
    CHECK(o.counter == saved + 50);
    CHECK(o.st.acc == saved + 50);  // restored work + new work, nothing lost or repeated
    total += o.st.acc;
  }
  CHECK(total == 4 * (saved + 50));
}

TEST_CASE("threads: re-armed after an in-process save, a second notice agrees again") {
  job j(2);
  std::vector<outcome> out(2);
  std::vector<std::int64_t> first(2), second(2);
  std::vector<std::thread> th;
  std::atomic<int> phase_done{0};
  for (int t = 0; t < 2; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      handler_t h = task_handler(j, t, 2, "rearm", o);
      int stops = 0;
      while (stops < 2 && h.total_run_calls() < 100000) {
        if (h.run([&] { busy(200); }) == run_status::stopped) {
          ++stops;
          (stops == 1 ? first : second)[static_cast<std::size_t>(t)] = h.total_run_calls();
          ++phase_done;
        }
        j.b.set(t, h.total_run_calls());
      }
      o.finished = stops == 2;
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  REQUIRE(j.b.wait_all(10, 10s));
  j.flags[0]->store(true);
  // a fresh notice on the other worker once both served the first
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (phase_done.load() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  j.flags[1]->store(true);
  for (auto& x : th) x.join();
  CHECK(out[0].finished);
  CHECK(out[1].finished);
  CHECK(first[0] == first[1]);
  CHECK(second[0] == second[1]);
  CHECK(second[0] > first[0]);
  auto claim = value_at(j, "holdfast/rearm/ctl/r1/claim");
  REQUIRE(claim);
  CHECK(claim->writer == 1);
}

TEST_CASE("threads: a dead worker gives agreement_timeout naming it, within the deadline") {
  job j(4);
  scenario sc;
  sc.dead_task = 2;
  sc.dead_at = 10;
  sc.notice_at = 15;
  sc.noticed = {0};
  sc.ack_timeout = 500ms;
  auto out = run_job(j, sc);
  for (int t : {0, 1, 3}) {
    auto& o = out[static_cast<std::size_t>(t)];
    CHECK(o.error == "timeout");
    CHECK(o.missing == std::vector<int>{2});
    CHECK(o.error_ms < 500 * 1.5);  // at its deadline, not an ack_timeout later
  }
}

TEST_CASE("threads: destruction in every state leaves no thread") {
  // The threads of each handler are those not running before it (ids, not counts: a thread
  // joined a moment ago, an earlier case's or the restore guard the constructor joins, is listed
  // until the kernel releases it), each count waited for with a deadline.
  auto check_state = [&](const char* name, auto drive, milliseconds ack_timeout = 200ms) {
    INFO(name);
    job j(2);
    outcome o;
    scenario sc;
    sc.n = 2;
    sc.ack_timeout = ack_timeout;
    sc.agree_on_restore = false;  // task 1 is played by the test: no restore agreement with it
    const auto before = holdfast_test::thread_ids();
    {
      handler_t h(make_config(j, 0, sc, &o), j.kv, {0, 2, "d"},
                  holdfast_test::make_checkpoints(j.ckpt_dir(0), &o.st), opts(sc));
      // the watcher and the flag poller
      CHECK(holdfast_test::settled_new_threads(before, 2).size() == 2);
      drive(h, j);
    }
    CHECK(holdfast_test::settled_new_threads(before, 0).size() == 0);
  };
  auto step = [](handler_t& h) {
    try {
      h.run([] {});
    } catch (const holdfast::error&) {
    }
  };
  using as = holdfast::agreement_state;
  // Until `want(h.state())` holds (stepping the handler when `run`), for up to 10 s: the state
  // the destruction is meant to meet is observed, not assumed after a pause.
  auto reach = [&](handler_t& h, auto want, bool run) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (!want(h.state()) && std::chrono::steady_clock::now() < end) {
      if (run) step(h);
      std::this_thread::sleep_for(2ms);
    }
    return want(h.state());
  };
  auto is = [](as want) { return [want](as s) { return s == want; }; };
  check_state("idle", [&](handler_t& h, job&) { step(h); });
  check_state("noticed, not yet run", [&](handler_t& h, job& j) {
    j.flags[0]->store(true);
    // the watcher picked it up: the agreement left idle (noticed, or further on its own)
    CHECK(reach(
        h, [](as s) { return s != as::idle; }, false));
  });
  check_state(
      "claim seen by the watcher",
      [&](handler_t& h, job& j) {
        j.kv.insert("holdfast/d/ctl/r0/claim", "claim by 1/peer");
        // without a run() call: the peer's claim is seen (and perhaps acked) by the watcher,
        // which then waits for task 1's ack until the ack_timeout: a minute, far past the look
        CHECK(reach(
            h, [](as s) { return s == as::claimed || s == as::acked; }, false));
      },
      60s);
  check_state("step published", [&](handler_t& h, job& j) {
    j.kv.put("holdfast/d/ack/r0/1", "100");
    j.kv.insert("holdfast/d/ctl/r0/claim", "claim by 1/peer");
    // the watcher alone acks (counter 0) and publishes step 101; only a run() at that counter
    // leaves step_published, so it is observed without one, and a step then stays in it
    CHECK(reach(h, is(as::step_published), false));
    step(h);
    CHECK(h.state() == as::step_published);
  });
  check_state("failed: agreement timeout", [&](handler_t& h, job& j) {
    j.flags[0]->store(true);
    CHECK(reach(h, is(as::failed), true));
  });
  check_state("failed: local error", [&](handler_t& h, job&) {
    CHECK_THROWS_AS(h.run([] { throw std::logic_error("x"); }), std::logic_error);
    CHECK(h.state() == holdfast::agreement_state::failed);
  });
  check_state("failed: peer error", [&](handler_t& h, job& j) {
    j.kv.insert("holdfast/d/ctl/error", "1\nE\nm");  // as a failing peer does: the error, then
    j.kv.insert("holdfast/d/ctl/r0/claim", "abort by 1/peer");  // and abort the keys peers wait on
    bool raised = false;
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (!raised && std::chrono::steady_clock::now() < end) {
      try {
        h.run([] {});
      } catch (const holdfast::peer_error& e) {
        raised = e.origin_task() == 1;
      }
      std::this_thread::sleep_for(2ms);
    }
    CHECK(raised);
  });
  check_state("shut down twice", [&](handler_t& h, job&) {
    h.shutdown();
    h.shutdown();
    step(h);
  });
}

TEST_CASE("threads: destruction in the grace countdown and after the final agreement") {
  using as = holdfast::agreement_state;
  for (auto until : {as::grace, as::final_published}) {
    INFO("destroyed in state " << static_cast<int>(until));
    job j(1);
    outcome o;
    scenario sc;
    sc.n = 1;
    sc.grace = 300ms;
    const auto before = holdfast_test::thread_ids();  // see "destruction in every state"
    {
      handler_t h(make_config(j, 0, sc, &o), j.kv, {0, 1, "g"},
                  holdfast_test::make_checkpoints(j.ckpt_dir(0), &o.st), opts(sc));
      j.flags[0]->store(true);
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      auto step = [] { busy(1000); };
      // The grace countdown starts inside the run() that makes the first save: that save (the
      // Checkpointer's writer counts it) is what the loop waits for, not a state between calls.
      // Nothing but the next run() leaves grace (one task: no peer's final claim).
      while (o.st.saves == 0 && std::chrono::steady_clock::now() < deadline) h.run(step);
      REQUIRE(o.st.saves == 1);
      CHECK(h.state() == as::grace);
      if (until == as::final_published) {
        // The countdown's end is decided inside a run() (final_noticed), which then returns at
        // once; the watcher alone claims, acks this task's counter and publishes the final step,
        // one past it. With no run() from here, nothing takes the machine past final_published
        // (a run() at the final step would save and re-arm within one call): waited for as is.
        while (h.state() == as::grace && std::chrono::steady_clock::now() < deadline) h.run(step);
        CHECK(h.state() != as::grace);
        while (h.state() != until && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(1ms);
      }
      CHECK(h.state() == until);
    }
    CHECK(holdfast_test::settled_new_threads(before, 0).size() == 0);
    CHECK(o.st.saves == 1);  // the first save only: destroyed before the final one
  }
}

namespace {
// The real in_process_kv with injected failures, shared by copies: the next `puts` puts fail
// (-1: all), the next `calls` calls of any kind fail (-1: all), the next `applied_inserts`
// inserts are applied and then fail (a write whose answer was lost: unknown outcome).
struct failing_kv {
  struct faults {
    std::atomic<int> puts{0}, calls{0}, applied_inserts{0};
    std::atomic<int> errnum{EIO};
  };
  holdfast::in_process_kv inner;
  std::shared_ptr<faults> f = std::make_shared<faults>();

  static bool take(std::atomic<int>& n) {
    int v = n.load();
    while (v != 0 && !n.compare_exchange_weak(v, v < 0 ? v : v - 1)) {
    }
    return v != 0;
  }
  void fault(const std::string& op, const std::string& k, bool put = false) {
    if (take(f->calls) || (put && take(f->puts))) throw holdfast::error(f->errnum, op, k);
  }
  bool insert(const std::string& k, std::string_view v) {
    fault("kv insert", k);
    bool created = inner.insert(k, v);
    if (take(f->applied_inserts)) throw holdfast::error(ETIMEDOUT, "kv insert", k);
    return created;
  }
  void put(const std::string& k, std::string_view v) {
    fault("kv put", k, true);
    inner.put(k, v);
  }
  std::optional<std::string> try_get(const std::string& k) {
    fault("kv try_get", k);
    return inner.try_get(k);
  }
  std::optional<std::string> get(const std::string& k, std::chrono::milliseconds t) {
    fault("kv get", k);
    return inner.get(k, t);
  }
  holdfast::kv_pairs list(const std::string& p) {
    fault("kv list", p);
    return inner.list(p);
  }
  bool erase(const std::string& k) { return inner.erase(k); }
  std::size_t erase_prefix(const std::string& p) { return inner.erase_prefix(p); }
};

using failing_handler_t = holdfast::preemption_handler<config_t, failing_kv>;

// One worker (task 0 of 1) over a failing_kv whose faults the test sets after construction.
struct lone_worker {
  job j{1};
  outcome o;
  scenario sc;
  failing_kv kv{holdfast::in_process_kv(holdfast::kv_namespace("f", "0"))};
  failing_handler_t h;
  explicit lone_worker(milliseconds ack_timeout = 2000ms)
      : sc(with_ack_timeout(ack_timeout)),
        h(make_config(j, 0, sc, &o), kv, {0, 1, "f"},
          holdfast_test::make_checkpoints(j.ckpt_dir(0), &o.st), opts(sc)) {}
  static scenario with_ack_timeout(milliseconds t) {
    scenario s;
    s.n = 1;
    s.ack_timeout = t;
    return s;
  }
};

// One worker over `kv`, noticed at once; runs steps until run() returns stopped or throws
// (at most 5 s). Returns "saved <step>" or the exception ("timeout <ids>", "unreachable <what>",
// "error <what>"), and how long it took.
std::string run_noticed(failing_handler_t& h, job& j, double* ms = nullptr) {
  j.flags[0]->store(true);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    if (ms)
      *ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    while (std::chrono::steady_clock::now() - t0 < 5s)
      if (h.run([] { busy(500); }) == run_status::stopped) {
        elapsed();
        return "saved " + std::to_string(h.total_run_calls());
      }
    return "still running";
  } catch (const holdfast::agreement_timeout& e) {
    elapsed();
    std::string ids;
    for (int m : e.missing_tasks()) ids += std::to_string(m) + ",";
    return "timeout " + ids;
  } catch (const holdfast::agreement_unreachable& e) {
    elapsed();
    return std::string("unreachable ") + e.what();
  } catch (const holdfast::error& e) {
    elapsed();
    return std::string("error ") + e.what();
  }
}
}  // namespace

TEST_CASE("threads: transient store failures mid-agreement are retried — the agreement succeeds") {
  lone_worker w;
  w.kv.f->errnum = ECONNRESET;
  w.kv.f->puts = 3;  // the ack fails three times, then lands
  auto r = run_noticed(w.h, w.j);
  CHECK(r.rfind("saved ", 0) == 0);
  CHECK(w.kv.f->puts == 0);
  CHECK(w.o.st.saves == 1);
}

TEST_CASE("threads: an insert applied but unanswered is recognised on retry: exactly once") {
  lone_worker w;
  w.kv.f->applied_inserts = 2;  // the claim and the step: applied, then "timed out"
  auto r = run_noticed(w.h, w.j);
  REQUIRE(r.rfind("saved ", 0) == 0);
  auto claim =
      holdfast::parse_agreement_value(w.kv.inner.try_get("holdfast/f/ctl/r0/claim").value_or(""));
  REQUIRE(claim);
  CHECK(claim->writer == 0);
  CHECK(w.kv.f->applied_inserts == 0);  // both inserts were applied and their answers lost
  auto step = w.kv.inner.try_get("holdfast/f/ctl/r0/step");
  REQUIRE(step);
  auto v = holdfast::parse_agreement_value(*step);
  REQUIRE(v);
  CHECK(v->what == holdfast::agreement_value::kind::step);
  CHECK(v->writer == 0);
  CHECK(w.o.st.saved_steps == std::vector<std::int64_t>{v->step});
}

TEST_CASE("threads: a put failing for good records a timeout naming this worker, then raises it") {
  lone_worker w(200ms);
  w.kv.f->puts = -1;  // EIO: not transient, no retry
  CHECK(run_noticed(w.h, w.j) == "timeout 0,");
  auto v =
      holdfast::parse_agreement_value(w.kv.inner.try_get("holdfast/f/ctl/r0/step").value_or(""));
  REQUIRE(v);
  CHECK(v->what == holdfast::agreement_value::kind::timeout);
  CHECK(v->tasks == std::vector<int>{0});
  CHECK_THROWS_AS(w.h.run([] {}), holdfast::agreement_timeout);  // sticky
  CHECK(w.o.st.saves == 0);
}

TEST_CASE("threads: a store unreachable past the deadline gives agreement_unreachable, no save") {
  lone_worker w(200ms);
  w.kv.f->errnum = ETIMEDOUT;
  w.kv.f->calls = -1;
  double ms = 0;
  auto r = run_noticed(w.h, w.j, &ms);
  CHECK(r.rfind("unreachable agree 'holdfast/f/ctl/r0/step'", 0) == 0);
  CHECK(r.find("Connection timed out") != std::string::npos);  // the cause's own text
  CHECK(r.find("No route to host") == std::string::npos);      // no fixed errno's
  // retried until the deadline (200 ms), then recording retried for one more ack_timeout
  CHECK(ms >= 350);
  CHECK(ms < 400 * 1.5 + 300);  // the timeouts at 1.5 x, + the handler's start
  CHECK(w.o.st.saves == 0);
}

// A store whose inserts of a claim key fail with ETIMEDOUT (transient) for `block` from the
// first attempt: the noticed worker's claim that cannot be written (an etcd leader lost with
// its node) for longer than the round's deadline. A zero `block` never fails.
struct claim_blocked_kv {
  using clock = std::chrono::steady_clock;
  holdfast::in_process_kv inner;
  clock::duration block{};
  std::shared_ptr<std::atomic<clock::rep>> until = std::make_shared<std::atomic<clock::rep>>(0);
  bool insert(const std::string& k, std::string_view v) {
    if (block > clock::duration::zero() && k.size() > 6 &&
        k.compare(k.size() - 6, 6, "/claim") == 0) {
      const auto now = clock::now().time_since_epoch().count();
      clock::rep unset = 0;
      until->compare_exchange_strong(unset, now + block.count());  // from the first attempt
      if (now < until->load()) throw holdfast::error(ETIMEDOUT, "kv insert", k);
    }
    return inner.insert(k, v);
  }
  void put(const std::string& k, std::string_view v) { inner.put(k, v); }
  std::optional<std::string> try_get(const std::string& k) { return inner.try_get(k); }
  std::optional<std::string> get(const std::string& k, std::chrono::milliseconds t) {
    return inner.get(k, t);
  }
  holdfast::kv_pairs list(const std::string& p) { return inner.list(p); }
  bool erase(const std::string& k) { return inner.erase(k); }
  std::size_t erase_prefix(const std::string& p) { return inner.erase_prefix(p); }
};

TEST_CASE(
    "threads: a claim that cannot be written until the deadline: every worker follows one "
    "outcome") {
  // Task 0 is noticed, but its claim insert fails for 1.5 x ack_timeout, past the round's
  // deadline: it goes on to record the outcome (a timeout). That outcome must not be recorded
  // without its claim: the idle tasks watch the claim key, and would train on, never learning
  // that task 0 raised a timeout naming them. So every task ends with the same recorded timeout.
  constexpr auto ack_timeout = 500ms;
  job j(3);
  claim_blocked_kv store{holdfast::in_process_kv(holdfast::kv_namespace("blocked", "0"))};
  using blocked_handler_t = holdfast::preemption_handler<config_t, claim_blocked_kv>;
  std::vector<outcome> out(3);
  std::vector<std::thread> th;
  for (int t = 0; t < 3; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      try {
        scenario sc;
        sc.n = 3;
        sc.ack_timeout = ack_timeout;
        claim_blocked_kv kv = store;
        if (t == 0) kv.block = ack_timeout * 3 / 2;  // past the round's deadline
        blocked_handler_t h(make_config(j, t, sc, &o), kv, {t, 3, "blocked"},
                            holdfast_test::make_checkpoints(j.ckpt_dir(t), &o.st), opts(sc));
        while (h.total_run_calls() < 50000) {  // 200 us steps: 10 s at most
          h.run([&] { busy(200); });
          j.b.set(t, h.total_run_calls());
        }
        o.finished = true;
      } catch (const holdfast::agreement_timeout& e) {
        o.error = "timeout";
        o.missing = e.missing_tasks();
      } catch (const std::exception& e) {
        o.error = std::string("other ") + e.what();
      }
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  REQUIRE(j.b.wait_all(20, 10s));
  j.flags[0]->store(true);
  for (auto& x : th) x.join();
  for (int t = 0; t < 3; ++t) {
    const auto& o = out[static_cast<std::size_t>(t)];
    INFO("task " << t << ": " << o.error);
    CHECK(o.error == "timeout");
    CHECK_FALSE(o.finished);
    CHECK(o.missing == out[0].missing);  // one recorded decision
    CHECK(o.st.saves == 0);
  }
  CHECK(!out[0].missing.empty());
  auto v = holdfast::parse_agreement_value(
      store.inner.try_get("holdfast/blocked/ctl/r0/claim").value_or(""));
  CHECK(v.has_value());  // the claim exists beside the outcome
}

TEST_CASE("threads: the restore agreement resumes every worker from the newest common step") {
  job j(3);
  // task 0 holds 10, 20, 30; task 1 holds 10, 20; task 2 holds 20, 30: the common newest is 20
  const std::vector<std::vector<std::int64_t>> held = {{10, 20, 30}, {10, 20}, {20, 30}};
  std::vector<outcome> out(3);
  for (int t = 0; t < 3; ++t)
    for (auto s : held[static_cast<std::size_t>(t)]) {
      out[static_cast<std::size_t>(t)].st.acc = s;
      holdfast_test::make_checkpoints(j.ckpt_dir(t), &out[static_cast<std::size_t>(t)].st).save(s);
    }
  std::vector<std::optional<std::int64_t>> restored(3), pinned(3);
  std::vector<std::thread> th;
  for (int t = 0; t < 3; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      o.st.acc = -1;
      handler_t h = task_handler(j, t, 3, "restore", o);
      restored[static_cast<std::size_t>(t)] = h.restored_step();
      pinned[static_cast<std::size_t>(t)] = h.checkpointer().pinned();
      o.counter = h.total_run_calls();
    });
  for (auto& x : th) x.join();
  for (int t = 0; t < 3; ++t) {
    auto& o = out[static_cast<std::size_t>(t)];
    CHECK(restored[static_cast<std::size_t>(t)] == 20);
    CHECK(pinned[static_cast<std::size_t>(t)] == 20);  // retention keeps it until a newer one
    CHECK(o.counter == 20);
    CHECK(o.st.acc == 20);  // the data of step 20, not the newest the worker holds
  }
  auto v = value_at(j, "holdfast/restore/restore/step");
  REQUIRE(v);
  CHECK(v->what == holdfast::agreement_value::kind::step);
  CHECK(v->step == 20);
}

TEST_CASE("threads: the restore agreement skips a step one task holds with a file missing") {
  // Invariant: the agreed step restores on every task. Task 1's step 30 lost its state file, so
  // task 1 lists 10 and 20 only: every task resumes from 20, not 30.
  job j(3);
  const std::vector<std::vector<std::int64_t>> held = {{10, 20, 30}, {10, 20, 30}, {20, 30}};
  std::vector<outcome> out(3);
  for (int t = 0; t < 3; ++t)
    for (auto s : held[static_cast<std::size_t>(t)]) {
      out[static_cast<std::size_t>(t)].st.acc = s;
      holdfast_test::make_checkpoints(j.ckpt_dir(t), &out[static_cast<std::size_t>(t)].st).save(s);
    }
  {
    auto m = holdfast_test::make_checkpoints(j.ckpt_dir(1), &out[1].st);
    REQUIRE(m.latest()->step == 30);
    REQUIRE(std::remove((m.latest()->path + "/state").c_str()) == 0);
  }
  std::vector<std::optional<std::int64_t>> restored(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> th;
  for (int t = 0; t < 3; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      o.st.acc = -1;
      try {
        handler_t h = task_handler(j, t, 3, "restore", o);
        restored[static_cast<std::size_t>(t)] = h.restored_step();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  for (auto& x : th) x.join();
  for (int t = 0; t < 3; ++t) {
    INFO("task " << t << ": " << errors[static_cast<std::size_t>(t)]);
    CHECK(errors[static_cast<std::size_t>(t)].empty());
    CHECK(restored[static_cast<std::size_t>(t)] == 20);
    CHECK(out[static_cast<std::size_t>(t)].st.acc == 20);  // the data of step 20
  }
}

TEST_CASE("threads: the restore agreement with no common step starts every worker fresh") {
  job j(2);
  std::vector<outcome> out(2);
  out[0].st.acc = 5;
  holdfast_test::make_checkpoints(j.ckpt_dir(0), &out[0].st).save(5);  // task 1 holds nothing
  std::vector<std::optional<std::int64_t>> restored(2, 0);
  std::vector<std::thread> th;
  for (int t = 0; t < 2; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      handler_t h = task_handler(j, t, 2, "fresh", o);
      restored[static_cast<std::size_t>(t)] = h.restored_step();
      o.counter = h.total_run_calls();
    });
  for (auto& x : th) x.join();
  for (int t = 0; t < 2; ++t) {
    CHECK(restored[static_cast<std::size_t>(t)] == std::nullopt);
    CHECK(out[static_cast<std::size_t>(t)].counter == 0);
  }
  auto v = value_at(j, "holdfast/fresh/restore/step");
  REQUIRE(v);
  CHECK(v->what == holdfast::agreement_value::kind::none);
}

TEST_CASE("threads: a task that never starts fails the restore agreement, naming it") {
  job j(2);
  outcome o;
  scenario sc;
  sc.n = 2;
  sc.ack_timeout = 300ms;
  holdfast::handler_options o_start = opts(sc);
  o_start.restore_timeout = 300ms;  // the wait's own bound (ack_timeout is not it)
  const auto t0 = std::chrono::steady_clock::now();
  try {
    handler_t h(make_config(j, 0, sc, &o), j.kv, {0, 2, "lonely"},
                holdfast_test::make_checkpoints(j.ckpt_dir(0), &o.st), o_start);
    FAIL("constructed without task 1");
  } catch (const holdfast::agreement_timeout& e) {
    CHECK(e.missing_tasks() == std::vector<int>{1});
    CHECK(e.path() == "holdfast/lonely/restore/step");
    CHECK(std::string(e.what()) ==
          "agree 'holdfast/lonely/restore/step' (no answer from tasks 1 within 300 ms "
          "(handler_options::restore_timeout))");
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ms >= 300);
  CHECK(ms < 300 * 1.5 + 200);  // the restore timeout at 1.5 x, + the handler's start
  // task 1 starting late finds the recorded timeout and raises the same
  outcome o1;
  CHECK_THROWS_AS(handler_t(make_config(j, 1, sc, &o1), j.kv, {1, 2, "lonely"},
                            holdfast_test::make_checkpoints(j.ckpt_dir(1), &o1.st), o_start),
                  holdfast::agreement_timeout);
}

TEST_CASE("threads: store operations per worker per agreement do not grow with workers") {
  std::map<int, double> per_worker;
  for (int n : {2, 4, 8}) {
    job j(n);
    scenario sc;
    sc.n = n;
    sc.step_us.assign(static_cast<std::size_t>(n), 200);
    sc.noticed = {0};
    auto out = run_job(j, sc);
    CHECK(first_saves(out).size() == 1);
    auto c = j.kv.counts();
    // protocol ops (the blocking gets aside: the claimant's one per ack a list lacked, the
    // others' one wait on the outcome): claim insert by the noticed worker, one put each, the
    // claimant's step insert, its lists of the round's acks (in_process_kv can list: one per
    // look that did not find the awaited ack among those read, and one more per slice an ack
    // came late)
    double ops = static_cast<double>(c.insert + c.put + c.list + c.try_get) / n;
    per_worker[n] = ops;
    CHECK(c.put == static_cast<std::uint64_t>(n));
    CHECK(c.list >= 1);  // at most one per look: bounded by ops below, not by a timing
    CHECK(ops <= 3.5);
  }
  MESSAGE("protocol ops per worker: n=2 " << per_worker[2] << ", n=4 " << per_worker[4] << ", n=8 "
                                          << per_worker[8]);
}

TEST_CASE("threads: 100 randomized trials — notice times, noticed subsets, skews — one step") {
#ifdef HF_SANITIZED
  const int trials = 20;  // sanitizers slow threads ~10x: fewer trials, same checks
#else
  const int trials = 100;
#endif
  std::mt19937 rng(20261121);
  for (int trial = 0; trial < trials; ++trial) {
    int n = 2 + static_cast<int>(rng() % 3);
    job j(n);
    scenario sc;
    sc.n = n;
    sc.watch = 2ms;
    // skew up to 8x; a larger skew is tolerated too, it only makes the slow worker catch up for
    // longer (every worker saves at the fastest one's counter + 1)
    for (int t = 0; t < n; ++t) sc.step_us.push_back(50 + static_cast<int>(rng() % 350));
    for (int t = 0; t < n; ++t)
      if (rng() % 2) sc.noticed.push_back(t);
    if (sc.noticed.empty())
      sc.noticed.push_back(static_cast<int>(rng() % static_cast<unsigned>(n)));
    sc.notice_at = static_cast<std::int64_t>(rng() % 30);
    auto out = run_job<memory_handler_t>(j, sc);  // the agreement is under test, not the disk
    INFO("trial " << trial);
    for (auto& o : out) {
      REQUIRE(o.error == "");
      REQUIRE(o.st.saves == 1);
    }
    REQUIRE(first_saves(out).size() == 1);
  }
}

namespace {
// A Checkpointer with async saves: save() leaves a save "in flight", wait_until_finished()
// completes it; every call is logged in order.
struct async_checkpoints {
  std::shared_ptr<std::vector<std::string>> calls = std::make_shared<std::vector<std::string>>();
  std::string log;  // also appended to this file, when set (for a child process)
  void note(const std::string& what) {
    calls->push_back(what);
    if (!log.empty()) holdfast_test::append_line(log, what);
  }
  void save(std::int64_t step) { note("save " + std::to_string(step)); }
  std::optional<std::int64_t> restore() { return std::nullopt; }
  void wait_until_finished() { note("wait"); }
};
}  // namespace

TEST_CASE("threads: an async Checkpointer is waited for before and after the preemption save") {
  job j(1);
  outcome o;
  scenario sc;
  sc.n = 1;
  async_checkpoints ckpt;
  auto calls = ckpt.calls;
  holdfast::preemption_handler<config_t, kv_t, async_checkpoints> h(
      make_config(j, 0, sc, &o), j.kv, {0, 1, "async"}, ckpt, opts(sc));
  j.flags[0]->store(true);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (h.run([] { busy(200); }) != run_status::stopped &&
         std::chrono::steady_clock::now() < until) {
  }
  REQUIRE(calls->size() == 3);
  CHECK(calls->at(0) == "wait");  // a periodic save in flight finishes first
  CHECK(calls->at(1) == "save " + std::to_string(h.total_run_calls()));
  CHECK(calls->at(2) == "wait");  // the preemption save is measured to its durable end
}

TEST_CASE(
    "threads: a staged preemption save is committed when run() returns, with the call's bytes") {
  job j(1);
  outcome o;
  scenario sc;
  sc.n = 1;
  std::vector<std::int64_t> state(1 << 18);
  holdfast::checkpoint_manager<> m(j.ckpt_dir(0), holdfast::directory_commit::rename);
  std::int64_t staged_step = -1;
  m.set_writer([&](holdfast::checkpoint_stage& stage, std::int64_t step) {
    staged_step = step;
    stage.write("state.bin", state.data(), state.size() * sizeof(std::int64_t));
  });
  handler_t h(make_config(j, 0, sc, &o), j.kv, {0, 1, "staged"}, std::move(m), opts(sc));
  j.flags[0]->store(true);
  const auto until = std::chrono::steady_clock::now() + 5s;
  std::int64_t calls = 0;
  while (std::chrono::steady_clock::now() < until) {
    std::fill(state.begin(), state.end(), calls);  // the step's state
    ++calls;
    if (h.run([] { busy(200); }) == run_status::stopped) break;
    // the step after a save changes the state at once: the checkpoint must not see it
    std::fill(state.begin(), state.end(), -1);
  }
  REQUIRE(staged_step >= 0);
  // run() returned: the staged save's background commit was waited for.
  CHECK(!h.checkpointer().save_in_flight());
  auto l = h.checkpointer().latest();
  REQUIRE(l);
  CHECK(l->step == staged_step);
  const std::string bytes = holdfast_test::read_file(l->path + "/state.bin");
  REQUIRE(bytes.size() == state.size() * sizeof(std::int64_t));
  std::int64_t first = 0;
  std::memcpy(&first, bytes.data(), sizeof first);
  CHECK(first == calls - 1);  // the state of the step run() saved at, not the one changed after
  CHECK(h.checkpointer().verify_step(staged_step).status == holdfast::integrity_status::ok);
}

TEST_CASE("process: an async Checkpointer is waited for again before the Exit policy ends it") {
  holdfast_test::temp_dir dir("async-exit");
  const std::string log = dir / "calls";
  job j(1);  // made here, so this process removes its directory (the child ends by its Exit)
  holdfast_test::child c([&] {
    outcome o;
    scenario sc;
    sc.n = 1;
    async_checkpoints ckpt;
    ckpt.log = log;
    using exit_config = holdfast::termination_config<flag_notice, holdfast::exit_with<42>>;
    holdfast::preemption_handler<exit_config, kv_t, async_checkpoints> h(
        exit_config(flag_notice(flag_poll{j.flags[0].get()}, 1ms), holdfast::exit_with<42>{}), j.kv,
        {0, 1, "async"}, ckpt, opts(sc));
    j.flags[0]->store(true);
    for (int i = 0; i < 100000; ++i) h.run([] { busy(200); });  // exits inside run()
  });
  auto r = c.wait(20s);
  CHECK(r.exit_code == 42);
  auto calls = holdfast_test::read_lines(log);
  REQUIRE(calls.size() == 3);
  CHECK(calls[0] == "wait");
  CHECK(calls[1].rfind("save ", 0) == 0);
  CHECK(calls[2] == "wait");  // the save is finished before the process ends
}

namespace {

// 4 threads over `kv` (a c10d-like store, directly or in an any_kv); task 1 is noticed after 20
// steps; `dead` stops stepping at step 10 without a notice. Returns each worker's outcome.
template <class Kv>
std::vector<outcome> agree_over(Kv kv, int dead = -1) {
  job j(4);
  std::vector<outcome> out(4);
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&, t] {
      auto& o = out[static_cast<std::size_t>(t)];
      scenario sc;
      sc.ack_timeout = 500ms;
      try {
        holdfast::preemption_handler<config_t, Kv, holdfast_test::memory_checkpoints> h(
            make_config(j, t, sc, &o), kv, {t, 4, "c10d"}, {&o.st}, opts(sc));
        while (h.total_run_calls() < 100000 && !(t == dead && h.total_run_calls() >= 10)) {
          j.b.set(t, h.total_run_calls());
          if (h.run([] { busy(200); }) == run_status::stopped) break;
        }
      } catch (const holdfast::agreement_timeout& e) {
        o.error = "timeout";
        o.missing = e.missing_tasks();
      }
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  REQUIRE(j.b.wait_all(20, 10s, {dead}));
  if (dead >= 0) CHECK(j.b.wait_done(dead, 10s));  // gone before the notice (see run_job)
  j.flags[1]->store(true);
  for (auto& x : th) x.join();
  return out;
}
}  // namespace

TEST_CASE("threads: a store with c10d's operations only (no list) serves the agreement") {
  auto check = [](const std::vector<outcome>& out) {
    CHECK(first_saves(out).size() == 1);
    for (auto& o : out) CHECK(o.st.saves == 1);
  };
  check(agree_over(holdfast_test::c10d_like_kv{holdfast::in_process_kv({"c", 0})}));
  check(
      agree_over(holdfast::any_kv(holdfast_test::c10d_like_kv{holdfast::in_process_kv({"c", 1})})));
  // a dead worker: the others record and raise the same timeout, read task by task
  auto out = agree_over(holdfast_test::c10d_like_kv{holdfast::in_process_kv({"c", 2})}, 2);
  for (int t : {0, 1, 3}) {
    CHECK(out[static_cast<std::size_t>(t)].error == "timeout");
    CHECK(out[static_cast<std::size_t>(t)].missing == std::vector<int>{2});
  }
}

TEST_CASE("threads: an any_kv holding in_process_kv agrees as the concrete type does") {
  // in_process_kv has no watch: the handler over any_kv asks at run time and takes the sliced
  // path (blocking gets), as over the concrete type, and agrees
  kv_t counted(holdfast::in_process_kv({"any", 0}));
  holdfast::any_kv kv(counted);
  CHECK_FALSE(holdfast::kv_supports(kv, holdfast::kv_op::watch));
  auto out = agree_over(kv);
  CHECK(first_saves(out).size() == 1);
  for (auto& o : out) CHECK(o.st.saves == 1);
  CHECK(counted.counts().get > 0);  // the sliced path's gets, through the any_kv
  CHECK(counted.counts().get_many == 0);
}

namespace {

// `rounds` agreements in a row between 2 threads over `kv` (no_exit: each save re-arms; task 0
// is noticed anew once both served the last); returns the number of keys under the job's scope
// after round 1 (once stable) and after the last (once down to round 1's count, or at 10 s).
template <class Kv, class Count>
std::pair<std::size_t, std::size_t> rounds_in_a_row(Kv kv, int rounds, Count count_keys) {
  using cfg = holdfast::termination_config<holdfast_test::repeat_notice, holdfast::no_exit>;
  std::atomic<std::int64_t> at_ns{0};
  std::atomic<int> served[2] = {{0}, {0}};
  std::atomic<std::int64_t> pos[2] = {{0}, {0}};
  std::atomic<bool> done{false};
  std::vector<worker_state> st(2);
  std::vector<std::thread> th;
  for (int t = 0; t < 2; ++t)
    th.emplace_back([&, t] {
      holdfast::handler_options o;
      o.ack_timeout = 10s;
      o.watch_interval = 1ms;
      holdfast::preemption_handler<cfg, Kv, holdfast_test::memory_checkpoints> h(
          cfg(holdfast_test::repeat_notice{&at_ns}, holdfast::no_exit{}), kv, {t, 2, "rounds"},
          {&st[static_cast<std::size_t>(t)]}, o);
      // the steps are coupled like a collective: neither runs more than one step ahead
      auto& mine = pos[t];
      auto& other = pos[1 - t];
      while (!done.load()) {
        mine.store(h.total_run_calls());
        auto coupled = [&] {
          while (!done.load() && mine.load() > other.load() + 1) std::this_thread::yield();
        };
        if (h.run(coupled) == run_status::stopped) ++served[t];
      }
    });
  struct joiner {  // a failed REQUIRE below still stops and joins the workers
    std::atomic<bool>& done;
    std::vector<std::thread>& th;
    ~joiner() {
      done.store(true);
      for (auto& x : th)
        if (x.joinable()) x.join();
    }
  } join_at_exit{done, th};
  auto settled = [&] {  // the last round's cleanup runs in the watchers, after the saves
    std::size_t n = count_keys(), before = n + 1;
    for (int i = 0; i < 200 && n != before; ++i) {
      std::this_thread::sleep_for(5ms);
      before = n;
      n = count_keys();
    }
    return n;
  };
  std::size_t after_one = 0;
  for (int r = 1; r <= rounds; ++r) {
    at_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((served[0].load() < r || served[1].load() < r) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(100us);
    REQUIRE(served[0].load() == r);
    REQUIRE(served[1].load() == r);
    if (r == 1) after_one = settled();
  }
  // After the last round: wait (up to 10 s) until the cleanup is down to round 1's count; a
  // cleanup that leaks keys never gets there. (after_one, read once stable, is only the
  // reference: read early it is larger, which makes this wait shorter, never a false failure.)
  std::size_t after_all = count_keys();
  const auto cleaned = std::chrono::steady_clock::now() + 10s;
  while (after_all > after_one && std::chrono::steady_clock::now() < cleaned) {
    std::this_thread::sleep_for(1ms);
    after_all = count_keys();
  }
  done.store(true);
  for (auto& x : th) x.join();
  CHECK(st[0].saved_steps == st[1].saved_steps);  // every round agreed on one step
  CHECK(st[0].saves == rounds);
  return {after_one, after_all};
}

}  // namespace

TEST_CASE("threads: 1000 rounds in a row leave no more keys than one round") {
  SUBCASE("in_process_kv (list, erase)") {
    holdfast::in_process_kv kv({"rounds", 0});
    auto [one, all] = rounds_in_a_row(kv, 1000, [&] { return kv.list("holdfast/rounds").size(); });
    CHECK(one > 0);
    CHECK(all <= one);
    CHECK(kv.list("holdfast/rounds/ack").empty());  // every ack erased
  }
  SUBCASE("a c10d-like store (single-key erase only, no list)") {
    holdfast_test::c10d_like_kv kv{holdfast::in_process_kv({"rounds", 1})};
    auto [one, all] =
        rounds_in_a_row(kv, 1000, [&] { return kv.inner.list("holdfast/rounds").size(); });
    CHECK(one > 0);
    CHECK(all <= one);
  }
}

// Issue 32, item 10: over a store that can list but has neither a watch nor a get_many
// (in_process_kv), the claimant read the acks one blocking get per task: N - 1 round trips, so
// 100,000 workers took ~50 s from notice to published (benchmarks: handler/simulated). It now
// reads the round's acks with a list of their prefix (one request while they are there), and a
// blocking get only of an ack the list lacked. Invariant: the claimant lists the round's acks,
// and every worker saves once at the one agreed step.
TEST_CASE("threads: over a store that can list but not watch, the claimant lists the acks") {
  kv_t counted(holdfast::in_process_kv({"listed", 0}));
  CHECK_FALSE(holdfast::kv_supports(counted, holdfast::kv_op::watch));
  CHECK_FALSE(holdfast::kv_supports(counted, holdfast::kv_op::get_many));
  auto out = agree_over(counted);
  CHECK(first_saves(out).size() == 1);
  for (auto& o : out) CHECK(o.st.saves == 1);
  // no worker timed out, so no one but the claimant listed: its collection did
  CHECK(counted.counts().list >= 1);
}

namespace {
// An async Checkpointer whose commit (the fsyncs, rename and pointer of checkpoint_manager's
// background thread) takes `commit` after save() returns: save() is quick, the commit runs on
// in the background, wait_until_finished() returns once it is durable. Each save's durable time
// is save time + commit (or the wait's return, when later).
struct slow_commit_checkpoints {
  milliseconds commit{0};
  std::shared_ptr<std::vector<std::chrono::steady_clock::time_point>> saved_at =
      std::make_shared<std::vector<std::chrono::steady_clock::time_point>>();
  std::optional<std::chrono::steady_clock::time_point> in_flight;
  void save(std::int64_t) {
    wait_until_finished();
    in_flight = std::chrono::steady_clock::now();
    saved_at->push_back(*in_flight);
  }
  std::optional<std::int64_t> restore() { return std::nullopt; }
  void wait_until_finished() {
    if (in_flight) std::this_thread::sleep_until(*in_flight + commit);  // the commit's own time
    in_flight.reset();
  }
};
}  // namespace

TEST_CASE(
    "threads: an async save's commit is reserved in the grace path: the final save is "
    "durable before the grace period ends") {
  // Invariant: the final save is durable (its commit done) by notice + grace. The commit (5 x
  // the margin) is what the reserve must hold: measured to save()'s return only, the final claim
  // comes ~grace_margin + 6 steps before the end and the commit runs ~commit past it.
  const milliseconds grace = 2000ms, commit = 500ms, step = 10ms;
  job j(1);
  outcome o;
  scenario sc;
  sc.n = 1;
  sc.grace = grace;
  sc.grace_margin = 100ms;
  slow_commit_checkpoints ckpt;
  ckpt.commit = commit;
  auto saved_at = ckpt.saved_at;
  holdfast::preemption_handler<config_t, kv_t, slow_commit_checkpoints> h(
      make_config(j, 0, sc, &o), j.kv, {0, 1, "async-grace"}, ckpt, opts(sc));
  for (int i = 0; i < 5; ++i) h.run([&] { std::this_thread::sleep_for(step); });
  const auto noticed = std::chrono::steady_clock::now();  // noticed_at() is no earlier
  j.flags[0]->store(true);
  const auto until = noticed + 4 * grace;
  while (h.run([&] { std::this_thread::sleep_for(step); }) != run_status::stopped &&
         std::chrono::steady_clock::now() < until) {
  }
  REQUIRE(saved_at->size() == 2);  // the first save of the grace path and the final one
  const auto durable = saved_at->back() + commit;
  INFO("final save durable " << std::chrono::duration_cast<milliseconds>(durable - noticed).count()
                             << " ms after the notice; grace " << grace.count() << " ms");
  CHECK(durable <= noticed + grace);
}

namespace {
using own_kv = holdfast_test::own_write_kv<holdfast::in_process_kv>;
using own_handler_t =
    holdfast::preemption_handler<config_t, own_kv, holdfast_test::memory_checkpoints>;

// Four workers over `kv`; task 0 alone is noticed once every worker ran 20 steps, so it claims.
// Returns the outcomes and (through notice_to_done_ms) the time from the notice until the last
// worker's run() returned stopped (or threw).
std::vector<outcome> run_own_write_team(own_kv kv, const scenario& sc, double& notice_to_done_ms) {
  job j(sc.n);
  std::vector<outcome> out(static_cast<std::size_t>(sc.n));
  std::vector<std::thread> threads;
  for (int t = 0; t < sc.n; ++t)
    threads.emplace_back([&, t] {
      outcome& o = out[static_cast<std::size_t>(t)];
      try {
        own_handler_t h(make_config(j, t, sc, &o), kv, {t, sc.n, sc.run_id},
                        holdfast_test::memory_checkpoints{&o.st}, opts(sc));
        while (h.total_run_calls() < sc.max_steps) {
          o.last = h.run([&] {
            ++o.st.acc;
            busy(200);
          });
          j.b.set(t, h.total_run_calls());
          if (o.last == run_status::stopped) break;
        }
        o.finished = true;
      } catch (const std::exception& e) {
        o.error = e.what();
      }
      o.stopped_at = std::chrono::steady_clock::now();
      j.b.set(t, std::numeric_limits<std::int64_t>::max());
    });
  CHECK(j.b.wait_all(sc.notice_at, 20s));
  const auto noticed_at = std::chrono::steady_clock::now();
  j.flags[0]->store(true);
  for (auto& th : threads) th.join();
  auto last = noticed_at;
  for (auto& o : out) last = std::max(last, o.stopped_at);
  notice_to_done_ms = std::chrono::duration<double, std::milli>(last - noticed_at).count();
  return out;
}

// The invariant: the claimant recognises the claim it created (its own value, its nonce), so it
// collects the acks and every worker saves once at one step, promptly: not at its deadline.
void check_claimant_recognised_its_claim(holdfast_test::own_write_fault fault) {
  scenario sc;
  sc.ack_timeout = 4000ms;  // every worker would wait this long for a claim nobody serves
  sc.max_steps = 200000;    // a bound on a worker that never stops (200 µs steps: 40 s)
  own_kv kv(holdfast::in_process_kv(holdfast::kv_namespace("own", "0")), fault, "/claim");
  double ms = 0;
  auto out = run_own_write_team(kv, sc, ms);
  CHECK(kv.fired() == 1);
  for (auto& o : out) {
    CAPTURE(o.error);
    CHECK(o.finished);
    CHECK(o.last == run_status::stopped);
    CHECK(o.st.saves == 1);
  }
  CHECK(first_saves(out).size() == 1);
  auto claim =
      holdfast::parse_agreement_value(kv.inner().try_get("holdfast/run/ctl/r0/claim").value_or(""));
  REQUIRE(claim);
  CHECK(claim->writer == 0);
  CHECK(ms < static_cast<double>(sc.ack_timeout.count()) / 2);  // not a deadline's wait
}
}  // namespace

TEST_CASE("threads: a claim applied but answered false is the claimant's own: no stall") {
  check_claimant_recognised_its_claim(holdfast_test::own_write_fault::lost_answer);
}

TEST_CASE("threads: a claim that commits late, after the retry read nothing, is the claimant's") {
  check_claimant_recognised_its_claim(holdfast_test::own_write_fault::late_commit);
}

namespace {

using file_config_t = holdfast::termination_config<holdfast::file_notice, holdfast::no_exit>;
using file_handler_t =
    holdfast::preemption_handler<file_config_t, kv_t, holdfast_test::memory_checkpoints>;

// One task over in_process_kv with a file notice, `log` its handler's hook: runs until the
// notice file (created 5 steps after the start) is seen and the agreed save is done; returns the
// saved step.
std::int64_t run_to_notice(const holdfast_test::temp_dir& dir, worker_state& st,
                           holdfast::log_fn log) {
  const std::string flag = dir / "preempt";
  ::unlink(flag.c_str());
  holdfast::handler_options o;
  o.watch_interval = 5ms;
  o.log = std::move(log);
  kv_t kv{holdfast::in_process_kv(holdfast::kv_namespace("log", "0"))};
  file_handler_t h(file_config_t(holdfast::file_notice(flag, 5ms), holdfast::no_exit{}), kv,
                   {0, 1, "log"}, {&st}, o);
  const std::int64_t first = h.total_run_calls();
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < until) {
    if (h.total_run_calls() == first + 5)
      ::close(::open(flag.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    if (h.run([] { std::this_thread::sleep_for(1ms); }) == run_status::stopped) break;
  }
  return st.saved_steps.empty() ? -1 : st.saved_steps.back();
}

}  // namespace

TEST_CASE(
    "log: the handler's events reach a two-argument hook at info, a one-argument hook and "
    "the default get warnings only") {
  holdfast_test::temp_dir dir("log");
  const std::string flag = dir / "preempt";
  worker_state st;
  std::vector<std::pair<holdfast::log_level, std::string>> events;
  std::mutex m;
  auto record = [&](holdfast::log_level level, std::string_view line) {
    std::lock_guard<std::mutex> l(m);
    events.emplace_back(level, std::string(line));
  };
  const std::int64_t saved = run_to_notice(dir, st, record);
  REQUIRE(saved >= 5);
  auto find = [&](const std::string& text) {
    std::lock_guard<std::mutex> l(m);
    for (std::size_t i = 0; i < events.size(); ++i)
      if (events[i].second.find(text) != std::string::npos) return static_cast<int>(i);
    return -1;
  };
  const std::string agreed = "task 0: step " + std::to_string(saved) + " agreed: saving";
  const int start = find("task 0: no checkpoint to restore: starting at step 0");
  const int notice = find("task 0: preemption notice from file '" + flag + "'");
  const int agreement = find(agreed);
  const int done = find("task 0: step " + std::to_string(saved) + " saved in ");
  CHECK(start >= 0);
  CHECK(notice > start);
  CHECK(agreement > notice);
  CHECK(done > agreement);
  {
    std::lock_guard<std::mutex> l(m);
    for (const auto& e : events) CHECK(e.first == holdfast::log_level::info);  // all went well
  }

  // A restart restores the saved step, and says so.
  events.clear();
  run_to_notice(dir, st, record);
  CHECK(find("task 0: restored step " + std::to_string(saved) + " (start: ") >= 0);

  // A hook written for problems (one argument) hears none of it.
  std::vector<std::string> problems;
  run_to_notice(dir, st, [&](std::string_view line) { problems.emplace_back(line); });
  CHECK(problems.empty());

  // Nor does stderr, by default: a child whose stderr is a file.
  const std::string err = dir / "stderr";
  holdfast_test::child c([&] {
    const int fd = ::open(err.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    worker_state mine;
    CHILD_REQUIRE(run_to_notice(dir, mine, {}) >= 5);
  });
  CHECK(c.wait().ok());
  CHECK(holdfast_test::read_file(err) == "");
}

TEST_CASE("log: a failure raised by run() goes to the hook at warning, naming the task") {
  // A dead peer: task 1 never starts, so task 0's agreement times out.
  holdfast_test::temp_dir dir("log-fail");
  std::vector<std::pair<holdfast::log_level, std::string>> events;
  std::mutex m;
  holdfast::handler_options o;
  o.watch_interval = 5ms;
  o.ack_timeout = 300ms;
  o.agree_on_restore = false;
  o.log = [&](holdfast::log_level level, std::string_view line) {
    std::lock_guard<std::mutex> l(m);
    events.emplace_back(level, std::string(line));
  };
  const std::string flag = dir / "preempt";
  kv_t kv{holdfast::in_process_kv(holdfast::kv_namespace("log", "1"))};
  worker_state st;
  file_handler_t h(file_config_t(holdfast::file_notice(flag, 5ms), holdfast::no_exit{}), kv,
                   {0, 2, "log"}, {&st}, o);
  ::close(::open(flag.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  std::string what;
  try {
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < until)
      h.run([] { std::this_thread::sleep_for(1ms); });
  } catch (const holdfast::agreement_timeout& e) {
    what = e.what();
  }
  REQUIRE(what != "");
  CHECK_THROWS_AS(h.run([] {}), holdfast::agreement_timeout);  // raised again, not logged again
  std::lock_guard<std::mutex> l(m);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back().first == holdfast::log_level::warning);
  CHECK(events.back().second == "task 0: " + what);
  CHECK(std::count_if(events.begin(), events.end(),
                      [](const auto& e) { return e.first == holdfast::log_level::warning; }) == 1);
}
