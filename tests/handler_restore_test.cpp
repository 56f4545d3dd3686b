// The restore agreement with real processes: 4 workers are preempted twice; in the second round
// one worker's save at the agreed step fails (ENOSPC, injected through the Io policy), so after
// the restart the workers hold different newest steps. Every worker must restore the newest
// step all of them hold, and the run must end with every step run exactly once after it.
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <holdfast/wait.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/handler_harness.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::append_line;
using holdfast_test::read_lines;

namespace {

using store_t = holdfast::basic_store<holdfast::basic_local_filesystem<fault_io>>;
using checkpoints_t = holdfast::checkpoint_manager<store_t>;
constexpr int workers = 4;

struct job {
  holdfast_test::temp_dir dir{"restore-agree"};
  std::string log(int t) const { return dir / ("log-" + std::to_string(t)); }
  std::string flag(const std::string& what, int inc, int t = -1) const {
    return dir / (what + "-" + std::to_string(inc) + (t < 0 ? "" : "-" + std::to_string(t)));
  }
};

// One worker of incarnation `inc`: restores (through the restore agreement), trains until
// `max_steps` or a notice; `fail_save` makes its next save fail with ENOSPC (the staging mkdir).
void worker(const job& j, int task, int inc, std::int64_t max_steps, bool fail_save) {
  ::signal(SIGTERM, SIG_DFL);  // doctest's handler came with the fork
  std::int64_t acc = 0;        // the model: one increment per step
  const std::string log = j.log(task);
  auto store = store_t::create(j.dir / ("store-" + std::to_string(task)));
  checkpoints_t ckpt(store, "run", holdfast::checkpoint_options{1});  // keep one (+ the pinned)
  ckpt.set_writer([&](const std::string& d, std::int64_t s) {
    std::ofstream(d + "/acc") << acc;
    append_line(log, "save " + std::to_string(s));
  });
  ckpt.set_reader([&](const std::string& d) { std::ifstream(d + "/acc") >> acc; });
  holdfast::filesystem_kv kv(j.dir / "kv", {"job", static_cast<std::uint64_t>(inc)});
  holdfast::handler_options o;
  o.ack_timeout = 5s;
  o.watch_interval = 20ms;
  holdfast::preemption_handler<holdfast::presets::generic, holdfast::filesystem_kv, checkpoints_t>
      h(holdfast::presets::generic(), kv, {task, workers, "run"}, std::move(ckpt), o);
  append_line(log, "restored " + std::to_string(h.restored_step().value_or(-1)) + " " +
                       std::to_string(acc));
  if (fail_save) fault_plan::arm(fault{io_op::mkdir, 1, ENOSPC, 0, 1000});
  append_line(j.flag("up", inc, task), "up");
  if (!holdfast::await_file(j.flag("go", inc), 20s)) std::_Exit(9);
  const std::int64_t start = h.total_run_calls();
  try {
    while (h.total_run_calls() < max_steps) {
      h.run([&] {
        ++acc;
        if (h.total_run_calls() == start + 10) append_line(j.flag("ready", inc, task), "ready");
        std::this_thread::sleep_for(1ms);
      });
    }
  } catch (const holdfast::error& e) {
    append_line(log, std::string("error ") + e.what());
    std::_Exit(7);
  }
  append_line(log, "finished " + std::to_string(h.total_run_calls()) + " " + std::to_string(acc));
}

// Runs incarnation `inc` to the end; with `noticed` >= 0, SIGTERMs it once all are training.
std::vector<holdfast_test::child_result> run(const job& j, int inc, std::int64_t max_steps,
                                             int noticed, int fail_task = -1) {
  std::vector<holdfast_test::child> kids;
  for (int t = 0; t < workers; ++t)
    kids.emplace_back([&, t] { worker(j, t, inc, max_steps, t == fail_task); });
  for (int t = 0; t < workers; ++t)
    REQUIRE(holdfast::await_file(j.flag("up", inc, t), 30s).has_value());
  append_line(j.flag("go", inc), "go");
  if (noticed >= 0) {
    for (int t = 0; t < workers; ++t)
      REQUIRE(holdfast::await_file(j.flag("ready", inc, t), 30s).has_value());
    kids[static_cast<std::size_t>(noticed)].kill(SIGTERM);
  }
  std::vector<holdfast_test::child_result> out;
  for (auto& k : kids) out.push_back(k.wait(60s));
  return out;
}

// The step of the last "save <step>" line in `lines`.
std::int64_t last_save(const std::vector<std::string>& lines) {
  std::int64_t s = -1;
  for (const auto& l : lines)
    if (l.rfind("save ", 0) == 0) s = std::stoll(l.substr(5));
  return s;
}

}  // namespace

TEST_CASE(
    "processes: after a failed save at the agreed step, every worker restores the newest "
    "common step") {
  job j;
  // incarnation 0: preempted; everyone saves at S1
  auto first = run(j, 0, 1000000, 1);
  std::set<std::int64_t> s1;
  for (int t = 0; t < workers; ++t) {
    CHECK(first[static_cast<std::size_t>(t)].exit_code == 42);
    s1.insert(last_save(read_lines(j.log(t))));
  }
  REQUIRE(s1.size() == 1);
  const std::int64_t S1 = *s1.begin();

  // incarnation 1: restores S1; preempted again; task 2's save at S2 fails (disk full). Its
  // failure is its error, published (issue 42, item 5): each other task either saved S2 and
  // exited with the preset's code before it learned of it, or learned of it first and raised
  // peer_error naming task 2 (saving nothing at S2).
  auto second = run(j, 1, 1000000, 0, 2);
  std::set<std::int64_t> s2;
  for (int t = 0; t < workers; ++t) {
    auto lines = read_lines(j.log(t));
    INFO("task " << t << ": " << lines.back());
    CHECK(std::count(lines.begin(), lines.end(),
                     "restored " + std::to_string(S1) + " " + std::to_string(S1)) == 1);
    if (t == 2) {
      CHECK(second[2].exit_code == 7);
      CHECK(lines.back().find("No space left on device") != std::string::npos);
    } else if (second[static_cast<std::size_t>(t)].exit_code == 42) {
      s2.insert(last_save(lines));
    } else {
      CHECK(second[static_cast<std::size_t>(t)].exit_code == 7);
      CHECK(lines.back().find("peer step 'task 2'") != std::string::npos);
      CHECK(lines.back().find("No space left on device") != std::string::npos);
      CHECK(last_save(lines) == S1);  // nothing saved at S2
    }
  }
  REQUIRE(s2.size() <= 1);  // whoever saved, saved the one agreed step
  const std::int64_t S2 = s2.empty() ? S1 + 1 : *s2.begin();
  REQUIRE(S2 > S1);

  // incarnation 2: the tasks that saved hold S2 (and S1, pinned although max_to_keep is 1),
  // task 2 holds S1 only: all restore S1 and run every step after it exactly once.
  auto third = run(j, 2, S2 + 20, -1);
  for (int t = 0; t < workers; ++t) {
    auto lines = read_lines(j.log(t));
    INFO("task " << t);
    CHECK(third[static_cast<std::size_t>(t)].ok());
    CHECK(lines[lines.size() - 2] == "restored " + std::to_string(S1) + " " + std::to_string(S1));
    CHECK(lines.back() == "finished " + std::to_string(S2 + 20) + " " + std::to_string(S2 + 20));
  }
  holdfast::filesystem_kv kv(j.dir / "kv", {"job", 2});
  auto v = holdfast::parse_agreement_value(kv.try_get("holdfast/run/restore/step").value_or(""));
  REQUIRE(v);
  CHECK(v->what == holdfast::agreement_value::kind::step);
  CHECK(v->step == S1);
}

// --- histories and stale keys (issue 32, item 6) ----------------------------------------------

namespace {

using flag_config = holdfast::termination_config<holdfast_test::flag_notice, holdfast::no_exit>;

// What each task of one launch restored (its step and the data it loaded), or the error its
// construction threw.
struct launch_result {
  std::vector<std::optional<std::int64_t>> restored;
  std::vector<std::int64_t> acc;
  std::vector<std::string> errors;
};

// One launch of `n` tasks as threads, task t on make_kv(t) and its checkpoints in
// <dir>/ckpt-<t>; `then(t, handler)` runs after a construction that succeeded.
template <class MakeKv, class Then>
launch_result launch(const holdfast_test::temp_dir& dir, int n, MakeKv make_kv, Then then) {
  launch_result r{std::vector<std::optional<std::int64_t>>(static_cast<std::size_t>(n)),
                  std::vector<std::int64_t>(static_cast<std::size_t>(n), -1),
                  std::vector<std::string>(static_cast<std::size_t>(n))};
  std::atomic<bool> never{false};
  std::vector<std::thread> th;
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      const auto i = static_cast<std::size_t>(t);
      holdfast_test::worker_state st;
      st.acc = -1;
      try {
        holdfast::handler_options o;
        o.ack_timeout = 10s;  // every task starts at once: only a hang would use it
        o.watch_interval = 20ms;
        flag_config c(holdfast_test::flag_notice(holdfast_test::flag_poll{&never}, 1ms),
                      holdfast::no_exit{}, 0ms);
        using kv_t = decltype(make_kv(0));
        holdfast::preemption_handler<flag_config, kv_t> h(
            std::move(c), make_kv(t), {t, n, "run"},
            holdfast_test::make_checkpoints(dir / ("ckpt-" + std::to_string(t)), &st), o);
        r.restored[i] = h.restored_step();
        r.acc[i] = st.acc;
        then(t, h);
      } catch (const std::exception& e) {
        r.errors[i] = e.what();
      }
    });
  for (auto& x : th) x.join();
  return r;
}

const auto nothing = [](int, auto&) {};

// Rewrites the metadata of `task`'s checkpoint of `step` as saved in history `h`.
void set_history(const holdfast_test::temp_dir& dir, int task, std::int64_t step,
                 const std::string& h) {
  holdfast_test::worker_state st;
  auto m = holdfast_test::make_checkpoints(dir / ("ckpt-" + std::to_string(task)), &st);
  for (const auto& c : m.checkpoints())
    if (c.step == step)
      std::ofstream(c.path + "/holdfast-metadata.json", std::ios::trunc)
          << "{\"format\": \"holdfast-checkpoint-metadata 1\", \"step\": " << step
          << ", \"history\": \"" << h << "\", \"time_unix_ns\": 1, \"metrics\": null}";
}

// Saves `steps` in `task`'s checkpoints, the data of step s being s.
void hold(const holdfast_test::temp_dir& dir, int task, std::vector<std::int64_t> steps) {
  holdfast_test::worker_state st;
  auto m = holdfast_test::make_checkpoints(dir / ("ckpt-" + std::to_string(task)), &st);
  for (auto s : steps) {
    st.acc = s;
    m.save(s);
  }
}

}  // namespace

TEST_CASE(
    "threads: checkpoints of one step from different histories are not taken for one: the "
    "agreement picks the newest step held with one identity, or none") {
  // Invariant: every task restores the same step, and every task's checkpoint of it has the
  // same identity (step and history).
  holdfast_test::temp_dir dir("restore-history");
  hold(dir, 0, {10, 20});
  hold(dir, 1, {10, 20});
  // step 10 from one launch (h0); step 20 saved by task 0 in launch hA, whose save failed on
  // task 1, and by task 1 in launch hB, which restored 10 again, after task 0's save failed
  set_history(dir, 0, 10, "h0");
  set_history(dir, 1, 10, "h0");
  set_history(dir, 0, 20, "hA");
  set_history(dir, 1, 20, "hB");
  holdfast::in_process_kv kv({"job", 0});
  auto r = launch(
      dir, 2, [&](int) { return kv; }, nothing);
  for (int t = 0; t < 2; ++t) {
    INFO("task " << t << ": " << r.errors[static_cast<std::size_t>(t)]);
    CHECK(r.restored[static_cast<std::size_t>(t)] == 10);
    CHECK(r.acc[static_cast<std::size_t>(t)] == 10);
  }
  // no step with one identity: every task starts fresh
  set_history(dir, 1, 10, "hX");
  holdfast::in_process_kv kv1({"job", 1});
  r = launch(
      dir, 2, [&](int) { return kv1; }, nothing);
  for (int t = 0; t < 2; ++t) {
    INFO("task " << t << ": " << r.errors[static_cast<std::size_t>(t)]);
    CHECK(r.errors[static_cast<std::size_t>(t)].empty());
    CHECK(r.restored[static_cast<std::size_t>(t)] == std::nullopt);
  }
}

namespace {

// A reused run id + incarnation: a launch leaves its restore and control keys; the next launch
// on the same namespace must refuse them, naming the key and the namespace, not follow them.
template <class MakeKv>
void stale_launch_is_refused(const holdfast_test::temp_dir& dir, MakeKv make_kv) {
  hold(dir, 0, {10});
  hold(dir, 1, {10});
  auto first = launch(dir, 2, make_kv, [](int, auto& h) {
    // this launch trains on and saves 20 (an outcome recorded as round 0's step, as a
    // preemption would)
    h.checkpointer().save(20);
  });
  for (int t = 0; t < 2; ++t) CHECK(first.restored[static_cast<std::size_t>(t)] == 10);
  // the job is relaunched with the same run id and incarnation: restore/step says "step 10",
  // but the tasks hold 20 now; following the stale value would restore 10
  auto second = launch(dir, 2, make_kv, nothing);
  for (int t = 0; t < 2; ++t) {
    const std::string& e = second.errors[static_cast<std::size_t>(t)];
    INFO("task " << t << " restored " << second.restored[static_cast<std::size_t>(t)].value_or(-1));
    CHECK(e.find("holdfast/run/restore/have/" + std::to_string(t)) != std::string::npos);
    CHECK(e.find("earlier launch") != std::string::npos);
    CHECK(e.find("run id 'job' incarnation '7'") != std::string::npos);
  }
}

// A round-0 outcome left in the control keys (an earlier launch under the same incarnation that
// ran no restore agreement, or crashed before it): refused before it can be followed.
template <class Kv>
void stale_control_key_is_refused(const holdfast_test::temp_dir& dir, Kv kv) {
  kv.put("holdfast/run/ctl/r0/step", "step 57 by 1/0123456789abcdef");
  auto r = launch(
      dir, 2, [&](int) { return kv; }, nothing);
  for (int t = 0; t < 2; ++t) {
    const std::string& e = r.errors[static_cast<std::size_t>(t)];
    INFO("task " << t << " restored " << r.restored[static_cast<std::size_t>(t)].value_or(-1));
    CHECK(e.find("holdfast/run/ctl/r0/step") != std::string::npos);
    CHECK(e.find("step 57 by 1/0123456789abcdef") != std::string::npos);
  }
}

}  // namespace

TEST_CASE(
    "threads: a reused run id and incarnation is refused, naming the stale key (in-process)") {
  holdfast_test::temp_dir dir("restore-stale-mem");
  holdfast::in_process_kv kv({"job", 7});
  stale_launch_is_refused(dir, [&](int) { return kv; });
  // a fresh incarnation restores step 20: both tasks saved it in one launch, whose history the
  // restore agreement gave both managers
  holdfast::in_process_kv fresh({"job", 8});
  auto r = launch(
      dir, 2, [&](int) { return fresh; },
      [](int, auto& h) {
        CHECK(h.checkpointer().metadata(20)->history.size() == 16);  // the first launch's nonce
        CHECK(h.checkpointer().history() != h.checkpointer().metadata(20)->history);  // a new one
      });
  for (int t = 0; t < 2; ++t) {
    INFO("task " << t << ": " << r.errors[static_cast<std::size_t>(t)]);
    CHECK(r.restored[static_cast<std::size_t>(t)] == 20);
    CHECK(r.acc[static_cast<std::size_t>(t)] == 10);  // what step 20 saved: no step ran
  }
  holdfast_test::temp_dir dir2("restore-stale-mem-ctl");
  stale_control_key_is_refused(dir2, holdfast::in_process_kv({"job", 7}));
}

TEST_CASE(
    "threads: a reused run id and incarnation is refused, naming the stale key (filesystem)") {
  holdfast_test::temp_dir dir("restore-stale-fs");
  const std::string root = dir / "kv";
  stale_launch_is_refused(dir, [&](int) { return holdfast::filesystem_kv(root, {"job", 7}); });
  holdfast_test::temp_dir dir2("restore-stale-fs-ctl");
  stale_control_key_is_refused(dir2, holdfast::filesystem_kv(dir2 / "kv", {"job", 7}));
}

TEST_CASE(
    "threads: a damaged metadata file in one task's checkpoint never fails the start: every task "
    "restores the newest step all of them hold that counts") {
  // Invariant: the restore agreement starts whatever a task's directory holds besides its
  // checkpoints (issue 42, item 7); a step is common only where every task's copy counts.
  holdfast_test::temp_dir dir("restore-damaged");
  hold(dir, 0, {10, 20, 30});
  hold(dir, 1, {10, 20, 30});
  auto damage = [&](int task, std::int64_t step) {
    std::ofstream(dir / ("ckpt-" + std::to_string(task)) + "/step-" + std::to_string(step) +
                      "/holdfast-metadata.json",
                  std::ios::trunc)
        << "{\"format\": \"holdfast-checkpoint-met";  // torn
  };
  // A launch of both tasks over a store of its own: each starts and restores `step`.
  auto every_task_restores = [&](std::uint64_t launch_no, std::int64_t step) {
    holdfast::in_process_kv kv({"job", launch_no});
    auto r = launch(
        dir, 2, [&](int) { return kv; }, nothing);
    for (int t = 0; t < 2; ++t) {
      INFO("launch " << launch_no << ", task " << t << ": "
                     << r.errors[static_cast<std::size_t>(t)]);
      CHECK(r.errors[static_cast<std::size_t>(t)].empty());
      CHECK(r.restored[static_cast<std::size_t>(t)] == step);
      CHECK(r.acc[static_cast<std::size_t>(t)] == step);
    }
  };
  damage(1, 20);  // an older one
  every_task_restores(0, 30);
  damage(0, 30);  // and task 0's newest: 10 is the newest both hold that counts
  every_task_restores(1, 10);
}
