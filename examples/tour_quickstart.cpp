// tour_quickstart — the README's front-page example (built and run by CTest, checked against
// README.md): one worker, a SIGTERM at step 42, a checkpoint at the agreed step.
#include <stdlib.h>  // mkdtemp

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <holdfast/holdfast.hpp>
#include <string>
#include <thread>
#include <utility>

// The example, in `dir`; 0 when it stopped at the notice.
int quickstart(const std::string& dir) {
  // [snippet]
  // The notice is SIGTERM; no_exit makes run() return `stopped` (exit_with<42> would exit).
  using config = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::no_exit>;
  holdfast::filesystem_kv kv(dir + "/kv", {"run-1", 1});  // where the workers agree on a step
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
  while (handler.total_run_calls() < 100) {
    if (handler.total_run_calls() == 42) std::raise(SIGTERM);  // the platform's notice
    auto status = handler.run(train_step);
    if (status == holdfast::run_status::stopped) break;  // saved at the agreed step
  }
  std::printf("stopped after step %lld, checkpoint saved\n",
              static_cast<long long>(handler.total_run_calls()));
  // [/snippet]
  return handler.total_run_calls() < 100 ? 0 : 1;
}

int main() {
  // A fresh directory in $TMPDIR (else /tmp), removed at the end.
  std::string dir =
      (std::filesystem::temp_directory_path() / "holdfast-quickstart-XXXXXX").string();
  if (!::mkdtemp(dir.data())) return 1;
  const int rc = quickstart(dir);
  std::filesystem::remove_all(dir);
  return rc;
}
