// holdfast/checkpoint/options.hpp — checkpoint_options: what a checkpoint_manager is told at
// construction (retention, save cadence, async saves, names, the writer lock, log and clock).
//
// Guarantees:
//   - The first two members keep their 0.1.0 order: {3} and {3, age} still initialize
//     max_to_keep and sweep_older_than.
//   - Every member has a default that works on a local filesystem: keep the last 5, save every
//     step, synchronous saves, "step-<N>" names, a 30 s wait for the writer lock, flock where
//     statfs trusts it (else a lease stale after 60 s), log_to_stderr, system_clock, metadata
//     with checksums.
// Caveats:
//   - step_prefix must stay the same for a run (names.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "../log.hpp"       // log_fn
#include "retention.hpp"    // retention_policy
#include "writer_lock.hpp"  // checkpoint_lock

HOLDFAST_NAMESPACE_BEGIN

/// Options of checkpoint_manager. The first two members keep their 0.1.0 order ({3} and
/// {3, age} still initialize max_to_keep and sweep_older_than).
struct checkpoint_options {
  /// How many checkpoints to keep (the newest, counting the latest); 0 keeps every one.
  /// Ignored when `retention` is set.
  std::size_t max_to_keep = 5;
  /// At construction, staging directories and publish temps at least this old are swept (the
  /// writer lock already proves their writer dead; 0 sweeps all).
  std::chrono::milliseconds sweep_older_than{0};
  /// Which checkpoints to keep; unset: keep_last(max_to_keep) (keep_all for 0).
  std::optional<retention_policy> retention{};
  /// should_save(step) is true for new steps that are a multiple of this (0: never by steps).
  std::int64_t save_interval_steps = 1;
  /// should_save(step) is also true once this much time passed since the last save (0: off).
  std::chrono::milliseconds save_interval{0};
  /// save() returns once the writer ran; syncs, rename, pointer and retention run on a
  /// background thread (wait_until_finished() waits for them).
  bool async_save = false;
  /// Names are <step_prefix><step>[.<generation>]; not empty, no '/', not starting with '.'.
  std::string step_prefix = "step-";
  /// Steps in new names are zero-padded to this many digits (0: unpadded).
  std::size_t step_format_fixed_length = 0;
  /// How long a writer waits for another writer's lock before checkpoint_locked.
  std::chrono::milliseconds writer_lock_timeout{30000};
  /// How the writer lock is taken (automatic: from statfs).
  checkpoint_lock lock = checkpoint_lock::automatic;
  /// A lease whose heartbeat is older than this is stale (the heartbeat beats 6 times per age).
  std::chrono::milliseconds lease_stale_after{60000};
  /// Where the manager's lines go (log.hpp; empty: log_to_stderr, which prints warnings only).
  /// info: each save committed, with its bytes (checksums on) and seconds. warning: a
  /// checkpoint skipped as incomplete or damaged (a restore falls back to an older one), a
  /// pointer recovered or rewritten, a background save's failure nobody waited for.
  log_fn log{};
  /// The wall clock of save times, should_save and retention periods (empty: system_clock).
  std::function<std::chrono::system_clock::time_point()> clock{};
  /// Write holdfast-metadata.json into each checkpoint.
  bool write_metadata = true;
  /// Record each file's size and CRC32C in the metadata at save, and check them before a
  /// restore loads a checkpoint (integrity.hpp); needs write_metadata.
  bool checksums = true;
  /// Who writes this directory, such as "task 1" (the job's task: each task needs a checkpoint
  /// directory of its own). Recorded in the writer lock: a writer whose owner differs from the
  /// holder's fails at once with checkpoint_locked naming both, instead of waiting
  /// writer_lock_timeout for a lock that is not going to be released (the same owner waits: a
  /// predecessor of the same task still finishing). Empty: not recorded, no such check.
  std::string owner{};
};

HOLDFAST_NAMESPACE_END
