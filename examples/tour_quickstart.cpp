// tour_quickstart — the README's front-page example (built and run by CTest, checked against
// README.md): one worker, a SIGTERM at step 42, a checkpoint at the agreed step; then the same
// program again in the same directory (a relaunch: a new incarnation, the checkpoint restored).
#include <stdlib.h>  // mkdtemp

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <holdfast/holdfast.hpp>
#include <string>
#include <thread>
#include <utility>

// The example, in `dir`; the steps run when it returned (the first launch stops at the notice;
// a rerun restores that checkpoint and trains on to 100).
long long quickstart(const std::string& dir) {
  // [snippet]
  // The notice is SIGTERM; no_exit makes run() return `stopped` (exit_with<42> would exit).
  using config = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::no_exit>;
  // Where the workers agree on a step: the keys of one launch (an incarnation) of run-1. Each
  // launch takes a number no earlier one had, so a rerun never reads this run's keys.
  holdfast::filesystem_kv launches(dir + "/kv", holdfast::incarnation_namespace("run-1"));
  holdfast::filesystem_kv kv(dir + "/kv",
                             {"run-1", holdfast::take_incarnation(launches, "task-0")});
  holdfast::checkpoint_manager<> ckpt(holdfast::store::create(dir + "/store"), "run-1");
  double weights = 0;  // the "model"
  auto train_step = [&] {
    weights += 0.5;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the rest of a real step
  };
  ckpt.set_writer([&](const std::string& d) { std::ofstream(d + "/w") << weights; });
  ckpt.set_reader([&](const std::string& d) { std::ifstream(d + "/w") >> weights; });

  holdfast::cluster_info me{/*task=*/0, /*num_tasks=*/1, /*run_id=*/"run-1"};
  holdfast::preemption_handler<config, holdfast::filesystem_kv> handler(config{}, kv, me,
                                                                        std::move(ckpt));
  bool stopped = false;  // run() saved at the agreed step and returned `stopped`
  while (!stopped && handler.total_run_calls() < 100) {
    if (handler.total_run_calls() == 42) std::raise(SIGTERM);  // the platform's notice
    stopped = handler.run(train_step) == holdfast::run_status::stopped;
  }
  std::printf("%s after step %lld\n", stopped ? "checkpoint saved, stopped" : "done",
              static_cast<long long>(handler.total_run_calls()));
  // [/snippet]
  return static_cast<long long>(handler.total_run_calls());
}

int main() {
  // A fresh directory in $TMPDIR (else /tmp), removed at the end.
  std::string dir =
      (std::filesystem::temp_directory_path() / "holdfast-quickstart-XXXXXX").string();
  if (!::mkdtemp(dir.data())) return 1;
  const long long first = quickstart(dir);   // stopped at the notice: 43
  const long long second = quickstart(dir);  // the same program again: restored, then to 100
  const int rc = first < 100 && second == 100 ? 0 : 1;
  std::filesystem::remove_all(dir);
  return rc;
}
