// tests/support/handler_team.hpp — worker threads that train over preemption handlers, for the
// handler tests that run a job in one process (handler_wake_test): each thread runs 1 ms steps
// through its handler's run() until run() answers stopped or throws, and records how it ended.
//
// Guarantees:
//   - train_thread() is the one training loop: it stops when run() answers stopped, when `quit`
//     is set, after 100000 calls, or (stop_after >= 0) once that many calls ran without a notice
//     (a dead worker); it records the last status, the calls made, and when it ended.
//   - record_outcome() turns what a worker's body threw into its outcome: agreement_timeout as
//     "timeout" with the missing tasks, anything else as "other <what>"; a body that escapes
//     with an exception never ends the test binary.
//   - thread_outcome::progress is max() once the thread ended, so a wait for N steps also ends
//     when a thread ended early; thread_team joins its threads on destruction, so a failed
//     REQUIRE cannot leave one running over a destroyed handler.
//   - ignored_signals sets SIGUSR1 and SIGUSR2 to SIG_IGN for a scope and restores the previous
//     actions: a stray delivery while no notice is started cannot end the test binary.
// Caveats:
//   - thread_team keeps references to the handlers it trains: they must outlive it (or its
//     finish()).
//   - ignored_signals is not chained to: a signal_notice started inside the scope replaces it
//     and, stopped, restores it.
#pragma once

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <holdfast/agreement.hpp>  // agreement_timeout
#include <holdfast/handler.hpp>    // run_status
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "scoped_disposition.hpp"  // ignored_signals

namespace holdfast_test {

/// SIGUSR1 and SIGUSR2 ignored for the scope (the notices of the tests are raised in-process).
class ignored_signals {
  scoped_disposition usr1_{SIGUSR1, SIG_IGN};
  scoped_disposition usr2_{SIGUSR2, SIG_IGN};
};

/// How one training thread ended.
struct thread_outcome {
  std::atomic<std::int64_t> progress{-1};  ///< run calls so far; max() once the thread ended
  holdfast::run_status last = holdfast::run_status::ran;
  std::int64_t counter = 0;
  std::string error;                              ///< "" none, "timeout", "other <what>"
  std::vector<int> missing;                       ///< a timeout's missing tasks
  std::chrono::steady_clock::time_point ended{};  ///< when run() answered stopped or threw
};

/// Runs `body` (a worker's life: building its handler, training); what it throws is recorded
/// in `o`, which is marked ended (progress max()) afterwards in every case.
template <class Body>
void record_outcome(thread_outcome& o, Body body) {
  try {
    body();
  } catch (const holdfast::agreement_timeout& e) {
    o.ended = std::chrono::steady_clock::now();
    o.error = "timeout";
    o.missing = e.missing_tasks();
  } catch (const std::exception& e) {
    o.ended = std::chrono::steady_clock::now();
    o.error = std::string("other ") + e.what();
  }
  o.progress.store(std::numeric_limits<std::int64_t>::max());
}

/// The training loop: `step` per h.run() until run() answers stopped, `quit` is set, 100000
/// calls ran, or (stop_after >= 0) stop_after calls ran; progress and the last status in `o`.
template <class Handler, class Step>
void train_thread(Handler& h, thread_outcome& o, const std::atomic<bool>& quit, Step step,
                  std::int64_t stop_after = -1) {
  while (!quit.load() && h.total_run_calls() < 100000) {
    if (stop_after >= 0 && h.total_run_calls() >= stop_after) break;  // dead: no more run()
    o.last = h.run(step);
    o.progress.store(h.total_run_calls());
    if (o.last == holdfast::run_status::stopped) {
      o.ended = std::chrono::steady_clock::now();
      break;
    }
  }
  o.counter = h.total_run_calls();
}

/// Training threads over handlers built by the caller: 1 ms steps until run() answers stopped
/// or throws, or the team is finished. Joined on destruction.
class thread_team {
 public:
  explicit thread_team(int n) : out_(static_cast<std::size_t>(n)) {}
  thread_team(const thread_team&) = delete;
  thread_team& operator=(const thread_team&) = delete;
  ~thread_team() { finish(); }

  /// Starts thread `t` training over `h`.
  template <class Handler>
  void train(int t, Handler& h) {
    thread_outcome& o = out_[static_cast<std::size_t>(t)];
    threads_.emplace_back([this, &o, &h] {
      record_outcome(o, [&] {
        train_thread(h, o, quit_,
                     [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
      });
    });
  }
  /// True once every thread ran `steps` steps (or ended), within `timeout`.
  bool wait_steps(std::int64_t steps, std::chrono::milliseconds timeout) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      bool all = std::all_of(out_.begin(), out_.end(),
                             [&](const thread_outcome& o) { return o.progress.load() >= steps; });
      if (all) return true;
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  /// True once every thread ended, within `timeout`.
  bool wait_ended(std::chrono::milliseconds timeout) const {
    return wait_steps(std::numeric_limits<std::int64_t>::max(), timeout);
  }
  /// Asks every thread to stop and joins them.
  void finish() {
    quit_.store(true);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  const thread_outcome& operator[](int t) const { return out_[static_cast<std::size_t>(t)]; }

 private:
  std::deque<thread_outcome> out_;  // atomics: never moved
  std::atomic<bool> quit_{false};
  std::vector<std::thread> threads_;
};

}  // namespace holdfast_test
