// holdfast/handler/options.hpp — what a preemption_handler is told about its job and how to tune
// it: cluster_info (who this worker is), handler_options (the agreement's timeouts), and what
// run() reports (run_status).
//
// Guarantees:
//   - Plain values: no I/O, no policy, nothing to check at compile time.
// Caveats:
//   - cluster_info::run_id must be one key segment; the handler checks it at construction.
#pragma once

#include <chrono>
#include <string>

#include "../version.hpp"
#include "hang.hpp"  // hang_options

HOLDFAST_NAMESPACE_BEGIN

/// Who this worker is.
struct cluster_info {
  int task = 0;                ///< this worker's task id, 0 <= task < num_tasks
  int num_tasks = 1;           ///< workers in the job
  std::string run_id = "run";  ///< run/incarnation id: one key segment that scopes every key
};

/// Tuning of the agreement.
struct handler_options {
  /// How long a worker waits for every other worker's ack (XLA's barrier: 3 minutes); also the
  /// bound of the start-up restore agreement.
  std::chrono::milliseconds ack_timeout{std::chrono::minutes(3)};
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
};

/// What run() / save_checkpoint_if_preempted() did.
enum class run_status : unsigned char {
  ran,      ///< no checkpoint; the step ran
  saved,    ///< checkpointed at the agreed step (first save of the grace path), then ran the step
  stopped,  ///< checkpointed and the Exit policy returned (no_exit): the step was NOT run; the
            ///< handler is re-armed, restart or go on as you see fit
};

HOLDFAST_NAMESPACE_END
