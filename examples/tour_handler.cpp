// tour_handler — the README's tour of handler.hpp (built and run by CTest, checked against
// README.md): one worker, a SIGTERM mid-run, a checkpoint at the agreed step, and a resume.
#include <stdlib.h>  // mkdtemp

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <holdfast/checkpoint.hpp>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/termination.hpp>
#include <string>
#include <thread>

// The tour, in `dir`; 0 when the resumed run finished with every step run once.
int tour(const std::string& dir) {
  // [snippet]
  // SIGTERM is the notice; no_exit: run() returns run_status::stopped instead of exiting, so an
  // in-process supervisor can restart (use exit_with<42> or a preset to exit for the scheduler).
  using config = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::no_exit>;
  std::int64_t weights = 0;  // the "model"
  auto step = [&] {          // one training step
    weights += 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  auto make_checkpoints = [&] {
    holdfast::checkpoint_manager<> ckpt(holdfast::store::create(dir + "/store"), "run-1");
    ckpt.set_writer([&](const std::string& d) { std::ofstream(d + "/w") << weights; });
    ckpt.set_reader([&](const std::string& d) { std::ifstream(d + "/w") >> weights; });
    return ckpt;
  };
  holdfast::cluster_info me{/*task=*/0, /*num_tasks=*/1, /*run_id=*/"run-1"};
  {
    holdfast::filesystem_kv kv(dir + "/kv", {"run-1", 1});  // incarnation 1
    holdfast::preemption_handler<config, holdfast::filesystem_kv> h(config{}, kv, me,
                                                                    make_checkpoints());
    for (;;) {
      if (h.total_run_calls() == 5) std::raise(SIGTERM);  // stand-in for the platform's notice
      auto status = h.run(step);
      if (status == holdfast::run_status::stopped) break;  // saved at the agreed step
    }
    std::printf("preempted: saved at step %lld\n", static_cast<long long>(h.total_run_calls()));
  }
  // The restarted job (incarnation 2) restores the checkpoint and resumes the step counter.
  holdfast::filesystem_kv kv(dir + "/kv", {"run-1", 2});
  holdfast::preemption_handler<config, holdfast::filesystem_kv> h(config{}, kv, me,
                                                                  make_checkpoints());
  while (h.total_run_calls() < 100) h.run(step);
  std::printf("resumed at %lld, finished with weights = %lld (100 steps, none lost or repeated)\n",
              static_cast<long long>(*h.restored_step()), static_cast<long long>(weights));
  // [/snippet]
  return weights == 100 ? 0 : 1;
}

int main() {
  // A fresh directory in $TMPDIR (else /tmp), removed at the end.
  std::string dir =
      (std::filesystem::temp_directory_path() / "holdfast-tour-handler-XXXXXX").string();
  if (!::mkdtemp(dir.data())) return 1;
  const int rc = tour(dir);
  std::filesystem::remove_all(dir);
  return rc;
}
