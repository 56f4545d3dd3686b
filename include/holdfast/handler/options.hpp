// holdfast/handler/options.hpp — what a preemption_handler is told about its job and how to tune
// it: cluster_info (who this worker is), handler_options (the agreement's timeouts, periodic
// saves agreed across workers: periodic_save_options), and what run() reports (run_status).
//
// Guarantees:
//   - Plain values: no I/O, no policy, nothing to check at compile time. periodic_save_options
//     holds two callables (the save-interval policy, handler/periodic.hpp binds one), called on
//     task 0's training thread only.
// Caveats:
//   - cluster_info::run_id must be one key segment; the handler checks it at construction.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>  // std::function: periodic_save_options' hooks
#include <string>

#include "../log.hpp"  // log_fn: a periodic save skipped, the restore agreement's wait
#include "../version.hpp"
#include "hang.hpp"  // hang_options

HOLDFAST_NAMESPACE_BEGIN

/// Who this worker is.
struct cluster_info {
  int task = 0;                ///< this worker's task id, 0 <= task < num_tasks
  int num_tasks = 1;           ///< workers in the job
  std::string run_id = "run";  ///< run/incarnation id: one key segment that scopes every key
};

/// Periodic saves that land at the same step on every task (docs/save-policy.md, "In the
/// handler"): task 0 asks next_due at its run() boundaries; when a save is due it publishes
/// "save at step S" (S = its run counter + a lead in steps), and every task saves at exactly S.
struct periodic_save_options {
  /// Whether this handler takes part (set it on every task: the others watch for the decision).
  bool enabled = false;
  /// Task 0: when the next save is due, asked at its start and after each save (at or before
  /// `now`: due now); handler/periodic.hpp binds it to a save_interval_policy.
  std::function<std::chrono::steady_clock::time_point(std::chrono::steady_clock::time_point now)>
      next_due;
  /// Task 0: a periodic save finished at `finished`; `cost`: how long it blocked, the longest
  /// over the tasks that reported (the others' reports come with one save's delay).
  std::function<void(std::chrono::duration<double> cost,
                     std::chrono::steady_clock::time_point finished)>
      saved;
  /// Task 0: a durable copy of one of its saves committed after `took` (a Checkpointer with
  /// on_copy(), two_tier_checkpoints, calls it on its copier's thread; the handler hands it
  /// over at construction): the interval is then never shorter than a copy.
  std::function<void(std::chrono::duration<double> took)> copied;
  /// How long every task may take to learn a decision (the watch's latency, a loaded machine):
  /// S is at least this far ahead at the mean step time.
  std::chrono::milliseconds lead_time{std::chrono::seconds(1)};
  /// S is at least this many steps ahead of task 0's counter.
  std::int64_t min_lead_steps = 2;
  /// Where a skipped save is reported (a task that learned the decision past its step; empty:
  /// handler_options::log).
  log_fn log;
};

/// Tuning of the agreement.
struct handler_options {
  /// How long a worker waits for every other worker's ack (XLA's barrier: 3 minutes); at the
  /// start, how long recording the restore agreement's outcome may take after the wait below.
  std::chrono::milliseconds ack_timeout{std::chrono::minutes(3)};
  /// At construction, how long the start may take to reach the store at all: its reads of the
  /// keys an earlier launch may have left and its put of this task's checkpoints. A store out of
  /// reach that long (refused, unreachable, not answering) fails the start with
  /// agreement_unreachable carrying the store's own error (its URL or path) and errno.
  std::chrono::milliseconds start_timeout{std::chrono::seconds(10)};
  /// At construction, how long the restore agreement waits for every task's checkpoints (the
  /// ranks of one job may start minutes apart); then agreement_timeout names the tasks that
  /// never came, and this bound.
  std::chrono::milliseconds restore_timeout{std::chrono::minutes(10)};
  /// While the restore agreement waits, a line this often names the tasks there and those not.
  std::chrono::milliseconds restore_report_interval{std::chrono::seconds(10)};
  /// Where the handler's lines go (log.hpp; empty: log_to_stderr, which prints warnings only).
  /// info: the step restored at the start, a notice and its source, each agreed step, a save's
  /// start and its end with its seconds. warning: the restore agreement's wait (every
  /// restore_report_interval), a failure as it is raised (a timeout, a peer's error, a hang
  /// verdict), a skipped periodic save. A hang verdict's line goes here too unless
  /// hang_options::log is set. Lines name this task ("task 1: ...").
  log_fn log;
  /// The fallback slice: how long one blocking get lasts over a store that cannot be waited on
  /// (no watch()), and the longest sleep when a notice source cannot wake the watcher. Stores
  /// with a watch and waking notices do not use it. A claimant reading acks in batches (a
  /// store's get_many, or a list and a blocking get where the store can list but not watch)
  /// reads in slices of max(watch_interval, 1 s): a stop or a peer's abort is then seen within
  /// such a slice.
  std::chrono::milliseconds watch_interval{100};
  /// Grace path: the final claim is made this much earlier than the measured rule asks, so the
  /// final save ends before the deadline despite scheduling stalls the measurements missed.
  std::chrono::milliseconds grace_margin{std::chrono::seconds(3)};
  /// At construction, agree with every task on the newest step all of them hold and restore
  /// that (needs a Checkpointer with all_steps() and restore_step()); false: each worker
  /// restores its own latest checkpoint.
  bool agree_on_restore = true;
  /// The hang detector's tuning (handler/hang.hpp; the handler's Hang policy decides whether it
  /// runs and what a verdict does).
  hang_options hang;
  /// Periodic saves agreed across the workers (off by default).
  periodic_save_options periodic_saves;
};

/// What run() / save_checkpoint_if_preempted() did.
enum class run_status : unsigned char {
  ran,      ///< no checkpoint; the step ran
  saved,    ///< checkpointed at the agreed step (first save of the grace path, or a periodic
            ///< save), then ran the step
  stopped,  ///< checkpointed and the Exit policy returned (no_exit): the step was NOT run; the
            ///< handler is re-armed, restart or go on as you see fit
};

HOLDFAST_NAMESPACE_END
