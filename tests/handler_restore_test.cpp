// The restore agreement with real processes: 4 workers are preempted twice; in the second round
// one worker's save at the agreed step fails (ENOSPC, injected through the Io policy), so after
// the restart the workers hold different newest steps. Every worker must restore the newest
// step all of them hold, and the run must end with every step run exactly once after it.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
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

  // incarnation 1: restores S1; preempted again; task 2's save at S2 fails (disk full)
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
    } else {
      CHECK(second[static_cast<std::size_t>(t)].exit_code == 42);
      s2.insert(last_save(lines));
    }
  }
  REQUIRE(s2.size() == 1);
  const std::int64_t S2 = *s2.begin();
  REQUIRE(S2 > S1);

  // incarnation 2: tasks 0, 1, 3 hold S2 (and S1, pinned although max_to_keep is 1), task 2
  // holds S1 only: all restore S1 and run every step after it exactly once.
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
