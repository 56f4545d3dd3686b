// holdfast/checkpoint.hpp — checkpoints of a run as whole directories, with retention and an
// atomically replaced `latest` pointer (TF CheckpointManager's protocol on holdfast publishing),
// one writer and any number of readers side by side. checkpoint_manager is the Checkpointer
// preemption_handler uses by default. Include this header for all of it; each part lives in
// checkpoint/:
//
//   checkpoint/retention.hpp    retention_policy (keep_last, every_n_steps, every, best_n,
//                               custom, any_of), retention_candidate, metric_order
//   checkpoint/names.hpp        checkpoint_info; "<prefix><N>[.<G>]" names, written and read
//   checkpoint/metadata.hpp     checkpoint_metrics, checkpoint_metadata: holdfast-metadata.json
//   checkpoint/integrity.hpp    checkpoint_integrity, integrity_status: each file's size and
//                               CRC32C, recorded at save and checked before a restore
//   checkpoint/writer_lock.hpp  checkpoint_lock, checkpoint_locked, is_flock_trusted_filesystem;
//                               the writer's flock, or its lease and heartbeat (usable alone)
//   checkpoint/options.hpp      checkpoint_options
//   checkpoint/pointer.hpp      pointer_state; the pointer's format, its recovery from the disk
//   checkpoint/reader_lock.hpp  reading a checkpoint under LOCK_SH
//   checkpoint/maintenance.hpp  checkpoint_report; deletions, the start-up sweep, verify, repair
//   checkpoint/manager.hpp      read_only, checkpoint_manager<Store>: save, commit, async, restore
//                               (its parts: manager/{callables,saving,retaining,reading}.hpp)
//   checkpoint/save_policy.hpp  save_interval_policy (when to save: Daly's interval from the
//                               measured cost and the learned MTBI), run_history, save_when_due
//   checkpoint/two_tier.hpp     two_tier_checkpoints: a local tier, copied to a durable one
//
//   holdfast::checkpoint_options o;
//   o.retention = holdfast::retention_policy::keep_last(3) |
//                 holdfast::retention_policy::best_n(2, "loss", holdfast::metric_order::min);
//   o.async_save = true;                                  // fsyncs, rename, pointer in background
//   holdfast::checkpoint_manager<> ckpt(holdfast::store::create("/data/exp"), "run-7", o);
//   ckpt.set_writer([&](const std::string& dir) { model.save_to(dir); });
//   ckpt.set_reader([&](const std::string& dir) { model.load_from(dir); });
//   std::optional<std::int64_t> step = ckpt.restore();   // loads the latest, if any
//   if (ckpt.should_save(n)) ckpt.save(n, {{"loss", 0.25}});
//   ckpt.wait_until_finished();                           // before exiting
//
//   // An evaluator beside the trainer: never modifies anything.
//   holdfast::checkpoint_manager<> eval(holdfast::read_only, store, "run-7");
//   eval.restore([&](const std::string& dir) { model.load_from(dir); });
//
// For a restore agreement (every worker restores the newest step all of them hold):
//   std::vector<std::int64_t> mine = ckpt.all_steps();   // publish these, agree on `common`
//   ckpt.restore_step(common);                           // load exactly that step
//   ckpt.pin(common);                                    // retention keeps it until unpinned
//
// Guarantees and caveats: see each part. In short: a checkpoint appears whole or not at all,
// and the pointer names a complete one whenever the writer was killed; a bad pointer is
// reported once and recovered from, never thrown for; one writer at a time (flock on local
// filesystems, a lease elsewhere), and where flock is trusted no restore sees a checkpoint
// vanish under it; retention never deletes the latest nor the pinned step; a restore checks
// each file's recorded CRC32C first and never loads a corrupt checkpoint.
#pragma once

#include "checkpoint/integrity.hpp"
#include "checkpoint/maintenance.hpp"
#include "checkpoint/manager.hpp"
#include "checkpoint/metadata.hpp"
#include "checkpoint/names.hpp"
#include "checkpoint/options.hpp"
#include "checkpoint/pointer.hpp"
#include "checkpoint/reader_lock.hpp"
#include "checkpoint/retention.hpp"
#include "checkpoint/save_policy.hpp"
#include "checkpoint/staging.hpp"
#include "checkpoint/two_tier.hpp"
#include "checkpoint/writer_lock.hpp"
