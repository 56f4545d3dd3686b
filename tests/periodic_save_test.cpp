// Periodic saves agreed across workers (handler_options::periodic_saves, issue 35 item 4): task 0
// asks the save-interval policy, publishes "save at step S" and every task saves at exactly S; a
// task that learns it past S skips it and logs; the decisions' keys stay O(1); a job killed after
// its periodic saves restores a step every task holds. And the preemption save's wait for a hung
// durable tier is bounded by the grace period (set_durable_deadline), not by durable_wait.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <holdfast/checkpoint/two_tier.hpp>
#include <holdfast/handler.hpp>
#include <holdfast/handler/periodic.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/handler_harness.hpp"
#include "support/key_wait_kv.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using steps = std::vector<std::int64_t>;

namespace {

using config_t = holdfast::termination_config<holdfast_test::flag_notice, holdfast::no_exit>;
using memory_handler = holdfast::preemption_handler<config_t, holdfast::in_process_kv,
                                                    holdfast_test::memory_checkpoints>;

std::atomic<bool> never{false};

config_t quiet_config() {
  return config_t(holdfast_test::flag_notice(holdfast_test::flag_poll{&never}));
}

// A policy whose interval is its bounds: a save every `every` once the last one finished.
holdfast::save_interval_options every(std::chrono::milliseconds d) {
  holdfast::save_interval_options o;
  o.min_interval = d;
  o.max_interval = d;
  return o;
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

// The tasks' steps kept within `skew` of each other, as a collective in each step keeps them: a
// task waits (on the others' progress, with a bound) before running ahead.
struct lockstep {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::int64_t> at;
  explicit lockstep(int n) : at(static_cast<std::size_t>(n), 0) {}
  void step(int task, std::int64_t counter, std::int64_t skew = 3) {
    std::unique_lock<std::mutex> l(m);
    at[static_cast<std::size_t>(task)] = counter;
    cv.notify_all();
    cv.wait_for(l, 5s, [&] {
      for (auto c : at)
        if (c < counter - skew) return false;
      return true;
    });
  }
  void leave(int task) {
    std::lock_guard<std::mutex> l(m);
    at[static_cast<std::size_t>(task)] = INT64_MAX;
    cv.notify_all();
  }
};

std::size_t keys_under(const holdfast::in_process_kv& kv, const std::string& prefix) {
  return kv.list(prefix).size();
}

// `n` tasks of Handler over `kv` in lock step, each running `last` steps of 1 ms, task 0's
// `policy` deciding a save every interval (lead time 100 ms); each task's saves go to st[task],
// skipped decisions to `log`. Returns each task's error ("" when it ran to the end).
template <class Handler, class Kv>
std::vector<std::string> run_in_lockstep(Kv& kv, int n, std::int64_t last,
                                         holdfast::save_interval_policy& policy,
                                         std::vector<holdfast_test::worker_state>& st,
                                         log_sink& log) {
  lockstep together(n);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      try {
        holdfast::handler_options o;
        o.ack_timeout = 20s;
        o.watch_interval = 20ms;
        o.periodic_saves = holdfast::agreed_periodic_saves(policy);
        o.periodic_saves.lead_time = 100ms;
        o.periodic_saves.log = log.fn();
        Handler h(quiet_config(), kv, {t, n, "run"},
                  holdfast_test::memory_checkpoints{&st[static_cast<std::size_t>(t)]}, o);
        while (h.total_run_calls() < last) {
          h.run([] { std::this_thread::sleep_for(1ms); });
          together.step(t, h.total_run_calls());
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
      together.leave(t);
    });
  for (auto& th : threads) th.join();
  return errors;
}

}  // namespace

TEST_CASE("periodic saves: every task saves at the same steps, several times, with O(1) keys") {
  // Three tasks at one step time; task 0's policy says a save every 150 ms. Every task's saves
  // are the same list of steps (the invariant), there are several, and the decisions' keys do
  // not pile up: at most the last two remain, whatever the number of saves.
  constexpr int n = 3;
  constexpr std::int64_t last = 1000;
  holdfast::in_process_kv kv(holdfast::kv_namespace("periodic", "0"));
  holdfast::save_interval_policy policy(every(100ms));
  policy.start(std::chrono::steady_clock::now());
  std::vector<holdfast_test::worker_state> st(n);
  log_sink log;
  const auto errors = run_in_lockstep<memory_handler>(kv, n, last, policy, st, log);
  for (int t = 0; t < n; ++t) CHECK(errors[static_cast<std::size_t>(t)] == "");
  INFO("task 0 saved at " << holdfast::format_step_list(st[0].saved_steps)
                          << "; log: " << log.get());
  CHECK(st[0].saved_steps.size() >= 3);
  CHECK(st[1].saved_steps == st[0].saved_steps);
  CHECK(st[2].saved_steps == st[0].saved_steps);
  CHECK(log.get() == "");  // nobody skipped
  CHECK(policy.save_cost().count() >= 0);
  CHECK(keys_under(kv, "holdfast/run/ctl/save") <= 2);
  CHECK(keys_under(kv, "holdfast/run/saved") == static_cast<std::size_t>(n));
}

TEST_CASE("periodic saves: a task that learns the decision past its step skips it and logs") {
  // Task 1 runs 400 steps before task 0 takes its first; task 0 then decides a save 100 ms of
  // its steps (about 100) ahead of its own counter. Task 1 is past that step when it learns it: it
  // skips the save and logs it, and saves at no other step; task 0 saves at that step.
  holdfast::in_process_kv kv(holdfast::kv_namespace("late", "0"));
  holdfast::save_interval_policy policy(every(1h));  // one save: the first is due at once
  std::vector<holdfast_test::worker_state> st(2);
  log_sink log;
  std::atomic<bool> ahead{false}, skipped{false}, done0{false};
  std::vector<std::string> errors(2);
  auto worker = [&](int t) {
    try {
      holdfast::handler_options o;
      o.ack_timeout = 20s;
      o.watch_interval = 20ms;
      o.periodic_saves = holdfast::agreed_periodic_saves(policy);
      o.periodic_saves.lead_time = 100ms;  // task 0's own watcher learns it in time
      o.periodic_saves.log = log.fn();
      memory_handler h(quiet_config(), kv, {t, 2, "run"},
                       holdfast_test::memory_checkpoints{&st[static_cast<std::size_t>(t)]}, o);
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      if (t == 1) {
        while (h.total_run_calls() < 400) h.run([] {});
        ahead = true;
        while (log.get().find("skipped: task 1") == std::string::npos &&
               std::chrono::steady_clock::now() < deadline)
          h.run([] { std::this_thread::sleep_for(1ms); });
        skipped = true;
        while (!done0 && std::chrono::steady_clock::now() < deadline)
          h.run([] { std::this_thread::sleep_for(1ms); });
      } else {
        while (!ahead && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(1ms);  // the other task's progress, not an order of ours
        policy.start(std::chrono::steady_clock::now() - 2h);
        while ((st[0].saved_steps.empty() || !skipped) &&
               std::chrono::steady_clock::now() < deadline)
          h.run([] { std::this_thread::sleep_for(1ms); });
        done0 = true;
      }
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(t)] = e.what();
    }
  };
  std::thread t1(worker, 1);
  std::thread t0(worker, 0);
  t0.join();
  t1.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  REQUIRE(st[0].saved_steps.size() == 1);
  CHECK(st[0].saved_steps[0] < 400);
  CHECK(st[1].saved_steps == steps{});
  CHECK(log.get().find("periodic save at step " + std::to_string(st[0].saved_steps[0]) +
                       " skipped: task 1") != std::string::npos);
}

namespace {

using fs_config = holdfast::termination_config<holdfast::signal_notice<SIGUSR2>, holdfast::no_exit>;
using fs_handler = holdfast::preemption_handler<fs_config, holdfast::filesystem_kv>;

std::int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::int64_t v = -1;
  in >> v;
  return v;
}

// The steps a task's save log names ("save <step> <acc>" lines).
steps saved_in(const std::string& log) {
  steps out;
  for (const auto& line : holdfast_test::read_lines(log)) {
    std::int64_t s = -1, acc = -1;
    if (std::sscanf(line.c_str(), "save %ld %ld", &s, &acc) == 2) out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "periodic saves: three processes over filesystem_kv killed after their saves restore a step "
    "all hold") {
  // Three forked workers with a checkpoint directory each make periodic saves (task 0's policy:
  // every 200 ms); once each has logged two saves they are SIGKILLed wherever they are. Restarted
  // with the restore agreement, all three restore one step, and every task had saved it.
  holdfast_test::temp_dir d("periodic-kill");
  constexpr int n = 3;
  auto log = [&](int t) { return d / ("saves-" + std::to_string(t)); };
  auto launch = [&](int t, bool train) {
    return std::make_unique<holdfast_test::child>([&, t, train] {
      holdfast_test::worker_state st;
      st.log = log(t);
      holdfast::filesystem_kv kv(d / "kv", holdfast::kv_namespace("job", train ? "0" : "1"));
      using std::chrono::steady_clock;
      using std::chrono::system_clock;
      const holdfast::save_interval_options options = every(200ms);
      const std::string run_dir = d / "run";
      const int task = t;
      // [snippet periodic-saves]
      holdfast::save_interval_policy policy(options);  // used on task 0 only
      holdfast::run_history history(run_dir);          // written by task 0 only
      if (task == 0) {
        history.begin(system_clock::now());
        policy.observe(history);
      }
      policy.start(steady_clock::now());
      holdfast::handler_options ho;
      ho.periodic_saves = holdfast::agreed_periodic_saves(policy, task == 0 ? &history : nullptr);
      // [/snippet periodic-saves]
      ho.ack_timeout = 20s;
      ho.periodic_saves.lead_time = 300ms;
      fs_handler h(fs_config(holdfast::signal_notice<SIGUSR2>(), holdfast::no_exit{}), kv,
                   {t, n, "run"},
                   holdfast_test::make_checkpoints(d / ("ckpt-" + std::to_string(t)), &st), ho);
      if (!train) {
        holdfast_test::append_line(d / ("restored-" + std::to_string(t)),
                                   std::to_string(h.restored_step().value_or(-1)));
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      while (std::chrono::steady_clock::now() < deadline)  // until the parent kills it
        h.run([&] {
          ++st.acc;
          std::this_thread::sleep_for(2ms);
        });
    });
  };
  ::mkdir((d / "run").c_str(), 0755);  // the run directory: task 0's history lives there
  std::vector<std::unique_ptr<holdfast_test::child>> kids;
  for (int t = 0; t < n; ++t) kids.push_back(launch(t, true));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto all_saved_twice = [&] {
    for (int t = 0; t < n; ++t)
      if (saved_in(log(t)).size() < 2) return false;
    return true;
  };
  while (!all_saved_twice() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);  // waits on the logs, with a deadline
  REQUIRE(all_saved_twice());
  for (auto& k : kids) k->kill(SIGKILL);
  for (auto& k : kids) CHECK(k->wait(20s).term_signal == SIGKILL);
  kids.clear();
  // task 0 noted each save in the run history: the next incarnation starts from its cost
  holdfast::run_history after(d / "run");
  after.begin(std::chrono::system_clock::now());
  CHECK(after.counters().unnoticed == 1);  // the kill: an interruption without a notice
  CHECK(after.save_cost().has_value());
  for (int t = 0; t < n; ++t) kids.push_back(launch(t, false));
  for (auto& k : kids) {
    auto r = k->wait(60s);
    CHECK(r.failures == "");
    CHECK(r.exit_code == 0);
  }
  const std::int64_t restored = read_number(d / "restored-0");
  INFO("task 0 saved " << holdfast::format_step_list(saved_in(log(0))) << ", task 1 "
                       << holdfast::format_step_list(saved_in(log(1))) << ", task 2 "
                       << holdfast::format_step_list(saved_in(log(2))));
  CHECK(restored > 0);
  for (int t = 0; t < n; ++t) {
    CHECK(read_number(d / ("restored-" + std::to_string(t))) == restored);
    const steps s = saved_in(log(t));
    CHECK(std::find(s.begin(), s.end(), restored) != s.end());
  }
}

namespace {

// A durable mount whose fsync never answers while `stalled()` (a dead NFS server).
std::atomic<bool>& stalled() {
  static std::atomic<bool> s{false};
  return s;
}
struct stalling_io : holdfast::posix_io {
  static int fsync(int fd) noexcept {
    while (stalled().load()) std::this_thread::sleep_for(1ms);
    return holdfast::posix_io::fsync(fd);
  }
};
using stalling_store = holdfast::basic_store<holdfast::basic_local_filesystem<stalling_io>>;
using hung_tiers = holdfast::two_tier_checkpoints<holdfast::store, stalling_store>;
using hung_handler = holdfast::preemption_handler<fs_config, holdfast::filesystem_kv, hung_tiers>;

}  // namespace

TEST_CASE(
    "durable deadline: the preemption path waits for a hung durable copy only within the grace "
    "period") {
  // durable_wait is 60 s, the grace period 4 s (1 s of it reserved for the exit): with the
  // durable mount hung, the notice's saves land locally and run() returns stopped within the
  // grace, not after durable_wait; unfinished() names the saved step.
  holdfast_test::temp_dir d("periodic-grace");
  holdfast_test::child c([&] {
    holdfast::two_tier_options o;
    o.durable_wait = 60s;
    o.log = [](std::string_view) {};
    hung_tiers t(d / "local", holdfast::directory_commit::rename, d / "durable",
                 holdfast::directory_commit::rename, o);
    t.set_writer([](const std::string& dir) { std::ofstream(dir + "/data") << "state"; });
    holdfast::filesystem_kv kv(d / "kv", holdfast::kv_namespace("job", "0"));
    holdfast::handler_options ho;
    ho.ack_timeout = 20s;
    ho.grace_margin = 1s;
    hung_handler h(fs_config(holdfast::signal_notice<SIGUSR2>(), holdfast::no_exit{}, 4s), kv,
                   {0, 1, "run"}, std::move(t), ho);
    stalled() = true;
    holdfast::run_status st = holdfast::run_status::ran;
    std::chrono::steady_clock::time_point noticed{};
    const auto deadline = std::chrono::steady_clock::now() + 50s;
    for (int i = 0;
         st != holdfast::run_status::stopped && std::chrono::steady_clock::now() < deadline; ++i) {
      if (i == 5) {
        noticed = std::chrono::steady_clock::now();
        ::kill(::getpid(), SIGUSR2);
      }
      st = h.run([] { std::this_thread::sleep_for(1ms); });
    }
    const auto took = std::chrono::steady_clock::now() - noticed;
    CHILD_REQUIRE(st == holdfast::run_status::stopped);
    CHILD_REQUIRE(took < 15s);  // the grace (4 s) bounds it, not durable_wait (60 s)
    auto& ck = h.checkpointer();
    CHILD_REQUIRE(!ck.unfinished().empty());
    CHILD_REQUIRE(ck.unfinished().back() == ck.local().latest_step());
    stalled() = false;  // the mount comes back: destruction need not wait out the hung copy
  });
  auto r = c.wait(120s);
  CHECK(!r.timed_out);
  CHECK(r.failures == "");
  CHECK(r.exit_code == 0);
}

TEST_CASE(
    "periodic saves: every task saves at the same steps over a store that follows named keys") {
  // Over a key-wait store (the torch store's kind: its watch wakes only for the keys it is told
  // to follow) the decisions (ctl/save/<k>) must reach task 1 as they reach task 0: two tasks in
  // lock step, a save every 100 ms, the same list of saved steps on both.
  constexpr int n = 2;
  constexpr std::int64_t last = 600;
  holdfast_test::key_wait_kv kv{holdfast::in_process_kv(holdfast::kv_namespace("follow", "0"))};
  using follow_handler = holdfast::preemption_handler<config_t, holdfast_test::key_wait_kv,
                                                      holdfast_test::memory_checkpoints>;
  holdfast::save_interval_policy policy(every(100ms));
  policy.start(std::chrono::steady_clock::now());
  std::vector<holdfast_test::worker_state> st(n);
  log_sink log;
  const auto errors = run_in_lockstep<follow_handler>(kv, n, last, policy, st, log);
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  INFO("task 0 saved at " << holdfast::format_step_list(st[0].saved_steps) << ", task 1 at "
                          << holdfast::format_step_list(st[1].saved_steps)
                          << "; log: " << log.get());
  CHECK(st[0].saved_steps.size() >= 2);
  CHECK(st[1].saved_steps == st[0].saved_steps);
  CHECK(log.get() == "");
}

namespace {

using faulty_store =
    holdfast::basic_store<holdfast::basic_filesystem_by_url<holdfast::testing::fault_io>>;
using faulty_handler = holdfast::preemption_handler<fs_config, holdfast::filesystem_kv,
                                                    holdfast::checkpoint_manager<faulty_store>>;

}  // namespace

TEST_CASE("periodic saves: a save that fails with ENOSPC is every other task's peer_error") {
  // Two forked workers over filesystem_kv save periodically; task 1's disk is full (every write
  // of its checkpoint manager fails with ENOSPC, through the Io policy). Task 1's run() throws
  // the ENOSPC error, and task 0 gets peer_error naming task 1 within one watch interval (plus
  // this machine's scheduling), instead of training on into a collective that never returns.
  holdfast_test::temp_dir d("periodic-enospc");
  constexpr int n = 2;
  auto stamp_file = [&](int t) { return d / ("failed-at-" + std::to_string(t)); };
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::vector<std::unique_ptr<holdfast_test::child>> kids;
  for (int t = 0; t < n; ++t)
    kids.push_back(std::make_unique<holdfast_test::child>([&, t] {
      holdfast::filesystem_kv kv(d / "kv", holdfast::kv_namespace("job", "0"));
      holdfast::save_interval_policy policy(every(150ms));
      policy.start(std::chrono::steady_clock::now());
      holdfast::handler_options ho;
      ho.ack_timeout = 20s;
      ho.watch_interval = 50ms;
      ho.periodic_saves = holdfast::agreed_periodic_saves(policy);
      ho.periodic_saves.lead_time = 200ms;
      holdfast::checkpoint_manager<faulty_store> m(d / ("ckpt-" + std::to_string(t)),
                                                   holdfast::directory_commit::rename);
      m.set_writer(
          [](const std::string& dir, std::int64_t step) { std::ofstream(dir + "/state") << step; });
      faulty_handler h(fs_config(holdfast::signal_notice<SIGUSR2>(), holdfast::no_exit{}), kv,
                       {t, n, "run"}, std::move(m), ho);
      if (t == 1)  // from now on every write of this process's checkpoints fails: a full disk
        holdfast::testing::fault_plan::arm({holdfast::testing::io_op::write, 1, ENOSPC, 1u << 30});
      std::string what;
      try {
        for (int i = 0; i < 20000; ++i) h.run([] { std::this_thread::sleep_for(1ms); });
      } catch (const holdfast::peer_error& e) {
        what = "peer_error " + std::to_string(e.origin_task()) + " " + e.what();
      } catch (const holdfast::error& e) {
        what = "error " + std::to_string(e.code().value());
      }
      holdfast_test::append_line(stamp_file(t), std::to_string(now_ns()) + " " + what);
    }));
  for (auto& k : kids) {
    auto r = k->wait(60s);
    CHECK(!r.timed_out);
    CHECK(r.failures == "");
    CHECK(r.exit_code == 0);
  }
  auto line = [&](int t) {
    auto lines = holdfast_test::read_lines(stamp_file(t));
    return lines.empty() ? std::string() : lines[0];
  };
  const std::string l0 = line(0), l1 = line(1);
  INFO("task 0: " << l0 << "; task 1: " << l1);
  REQUIRE(l1.find(" error " + std::to_string(ENOSPC)) != std::string::npos);
  REQUIRE(l0.find(" peer_error 1 ") != std::string::npos);
  const long long at0 = std::stoll(l0), at1 = std::stoll(l1);
  CHECK(at0 - at1 < std::chrono::nanoseconds(2s).count());  // one watch interval + scheduling
}

TEST_CASE("periodic saves: over two tiers the copies' time reaches task 0's save interval") {
  // One task saving periodically into two_tier_checkpoints: the handler hands the policy's
  // record_copy to the copier (periodic_save_options::copied), so after a copy the policy's
  // copy cost is that copy's time, with no call of the user's (it was 0: nothing called it).
  holdfast_test::temp_dir d("periodic-copies");
  using tiers = holdfast::two_tier_checkpoints<>;
  using tier_handler = holdfast::preemption_handler<config_t, holdfast::in_process_kv, tiers>;
  holdfast::two_tier_options to;
  to.log = [](std::string_view) {};
  tiers t(d / "local", holdfast::directory_commit::rename, d / "durable",
          holdfast::directory_commit::rename, to);
  t.set_writer([](const std::string& dir) { std::ofstream(dir + "/data") << "state"; });
  holdfast::save_interval_policy policy(every(100ms));
  policy.start(std::chrono::steady_clock::now());
  holdfast::in_process_kv kv(holdfast::kv_namespace("copies", "0"));
  holdfast::handler_options o;
  o.ack_timeout = 20s;
  o.watch_interval = 20ms;
  o.periodic_saves = holdfast::agreed_periodic_saves(policy);
  o.periodic_saves.lead_time = 50ms;
  tier_handler h(quiet_config(), kv, {0, 1, "run"}, std::move(t), o);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((!h.checkpointer().durable_step() || policy.copy_cost().count() <= 0.0) &&
         std::chrono::steady_clock::now() < deadline)
    h.run([] { std::this_thread::sleep_for(1ms); });
  REQUIRE(h.checkpointer().durable_step());
  CHECK(policy.copy_cost().count() > 0.0);
}
