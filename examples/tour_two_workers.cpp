// tour_two_workers — the README's two-worker tour (built and run by CTest): two forked workers
// agree through a filesystem store; a SIGTERM to one of them makes both save at one agreed step;
// a relaunch (incarnation 2) restores that step on both and finishes with no step lost or
// repeated. Each task has its own checkpoint directory.
#include <stdlib.h>  // mkdtemp
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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
#include <utility>

constexpr std::int64_t total_steps = 200;

// One worker of a two-task job, resuming from `resume` (0: a fresh start). `ready` gets a byte
// once its handler ran 10 steps (a SIGTERM before the handler exists would kill the process: the
// signal's default action); `out` gets the step it stopped at, or 0 when it ran every step.
int worker(const std::string& dir, int task, std::uint64_t incarnation, std::int64_t resume,
           int ready, int out) {
  using config = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::no_exit>;
  holdfast::filesystem_kv kv(dir + "/kv", {"tour", incarnation});  // shared by both tasks
  std::int64_t weights = 0;                                        // the "model"
  // Each task its own checkpoint directory: a step is saved by every task, each its own part.
  holdfast::checkpoint_manager<> ckpt(
      holdfast::store::create(dir + "/task-" + std::to_string(task)), "tour");
  ckpt.set_writer([&](const std::string& d) { std::ofstream(d + "/w") << weights; });
  ckpt.set_reader([&](const std::string& d) { std::ifstream(d + "/w") >> weights; });
  holdfast::cluster_info me{task, /*num_tasks=*/2, /*run_id=*/"tour"};
  holdfast::preemption_handler<config, holdfast::filesystem_kv> h(config{}, kv, me,
                                                                  std::move(ckpt));
  if (h.restored_step().value_or(0) != resume) return 1;  // the relaunch restores the saved step
  auto step = [&] {
    weights += 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  std::int64_t stopped_at = 0;
  while (h.total_run_calls() < total_steps) {
    if (h.run(step) == holdfast::run_status::stopped) {  // saved at the agreed step
      stopped_at = h.total_run_calls();
      break;
    }
    if (h.total_run_calls() == resume + 10) (void)!::write(ready, "r", 1);
  }
  (void)!::write(out, &stopped_at, sizeof stopped_at);
  return weights == (stopped_at ? stopped_at : total_steps) ? 0 : 1;  // every step run once
}

// Starts both workers (a launcher's job), SIGTERMs task 0 when `preempt` once both run, and
// collects what they report; true when both exited 0 having stopped at one step (`*stopped`).
bool launch(const std::string& dir, std::uint64_t incarnation, std::int64_t resume, bool preempt,
            std::int64_t* stopped) {
  int ready[2], out[2];
  if (::pipe(ready) != 0 || ::pipe(out) != 0) return false;
  pid_t pids[2];
  for (int task = 0; task < 2; ++task) {
    pids[task] = ::fork();
    if (pids[task] == 0) {
      const int rc = worker(dir, task, incarnation, resume, ready[1], out[1]);
      std::fflush(stdout);
      ::_exit(rc);
    }
  }
  ::close(ready[1]);  // a read ends (0) if a worker dies
  ::close(out[1]);
  char byte;
  if (preempt && ::read(ready[0], &byte, 1) == 1 && ::read(ready[0], &byte, 1) == 1)
    ::kill(pids[0], SIGTERM);  // the platform's notice, to one worker
  bool ok = true;
  std::int64_t at[2] = {-1, -1};
  for (auto& a : at) ok = ::read(out[0], &a, sizeof a) == static_cast<ssize_t>(sizeof a) && ok;
  for (pid_t pid : pids) {
    int status = 0;
    ok = ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok;
  }
  ::close(ready[0]);
  ::close(out[0]);
  *stopped = at[0];
  return ok && at[0] == at[1];
}

int main() {
  // A fresh directory in $TMPDIR (else /tmp), removed at the end.
  std::string dir = (std::filesystem::temp_directory_path() / "holdfast-tour-two-XXXXXX").string();
  if (!::mkdtemp(dir.data())) return 1;
  std::fflush(stdout);  // the children inherit no buffered output
  std::int64_t saved = 0, finished = 0;
  bool ok = launch(dir, 1, /*resume=*/0, /*preempt=*/true, &saved) && saved > 0;
  if (ok) std::printf("preempted: both tasks saved at step %lld\n", static_cast<long long>(saved));
  std::fflush(stdout);
  ok = ok && launch(dir, 2, /*resume=*/saved, /*preempt=*/false, &finished) && finished == 0;
  if (ok)
    std::printf("relaunched: both resumed at %lld and ran to %lld\n", static_cast<long long>(saved),
                static_cast<long long>(total_steps));
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
