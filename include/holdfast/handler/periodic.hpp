// holdfast/handler/periodic.hpp — binds a save_interval_policy (checkpoint/save_policy.hpp) to a
// preemption_handler's periodic saves (handler_options::periodic_saves): task 0 asks the policy
// when the next save is due, every task saves at the step task 0 publishes, and the cost task 0
// records is the longest the tasks reported.
//
//   holdfast::save_interval_policy policy(o);               // on every task (used on task 0)
//   holdfast::run_history history(run_dir);                 // task 0 only writes it
//   if (task == 0) {
//     history.begin(std::chrono::system_clock::now());
//     policy.observe(history);                              // M learned from the restarts
//   }
//   policy.start(std::chrono::steady_clock::now());
//   holdfast::handler_options ho;
//   ho.periodic_saves = holdfast::agreed_periodic_saves(policy, task == 0 ? &history : nullptr);
//   holdfast::preemption_handler<...> h(config, kv, {task, n, "run-7"}, checkpoints, ho);
//
// Guarantees:
//   - next_due(now) is the policy's last save plus interval(now) (now before any), so it is at or
//     before `now` exactly when should_save(now) is true: the handler saves when the policy would.
//   - saved(cost, finished) is record_save(cost, finished), then history->note_save(wall clock
//     now, the policy's C) when a history is given: the next incarnation starts from C, and a
//     killed one's run time ends at its last save.
//   - copied(took) is record_copy(took): with a two-tier Checkpointer (on_copy), the handler
//     hands it to the copier, so the interval is never shorter than a durable copy.
// Caveats:
//   - The returned options refer to `policy` and `history`: both must outlive the handler.
//   - Only task 0's hooks are called; the history is written only where it is given.
#pragma once

#include <chrono>

#include "../checkpoint/save_policy.hpp"  // basic_save_interval_policy, basic_run_history
#include "../version.hpp"
#include "options.hpp"  // periodic_save_options

HOLDFAST_NAMESPACE_BEGIN

/// Periodic saves agreed across the workers, each decided by `policy` on task 0 and recorded in
/// `history` (nullptr: none; give it on task 0 only). Both must outlive the handler.
template <class Io = posix_io, class Durability = durable>
periodic_save_options agreed_periodic_saves(
    basic_save_interval_policy<std::chrono::steady_clock>& policy,
    basic_run_history<Io, Durability>* history = nullptr) {
  using steady = std::chrono::steady_clock;
  periodic_save_options o;
  o.enabled = true;
  o.next_due = [&policy](steady::time_point now) {
    const auto last = policy.last_save();
    if (!last) return now;
    return *last + std::chrono::duration_cast<steady::duration>(policy.interval(now));
  };
  o.saved = [&policy, history](save_seconds cost, steady::time_point finished) {
    policy.record_save(cost, finished);
    if (history) history->note_save(std::chrono::system_clock::now(), policy.save_cost());
  };
  o.copied = [&policy](save_seconds took) { policy.record_copy(took); };
  return o;
}

HOLDFAST_NAMESPACE_END
