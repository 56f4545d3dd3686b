// holdfast/handler.hpp — the preemption checkpoint handler: wraps each training step so that when
// any worker of a job is told its machine is going away, every worker checkpoints at one agreed
// step and exits (or, with a grace period, keeps training and checkpoints once more before the
// deadline), and a restarted job resumes exactly where it stopped.
//
//   holdfast::preemption_handler<holdfast::presets::generic, holdfast::filesystem_kv> h(
//       holdfast::presets::generic{}, kv, {task, num_tasks, "run-7"}, std::move(checkpoints));
//   while (h.total_run_calls() < steps) h.run(train_step, batch);
//
// Include this header for all of it (with checkpoint_manager as the default Checkpointer); each
// part lives in handler/:
//
//   handler/preemption_handler.hpp  preemption_handler<Config, Kv, Checkpointer, Clock>: the
//                                   training side (run, save_checkpoint_if_preempted, save, exit)
//                                   and the handler's full list of guarantees and caveats
//   handler/periodic_schedule.hpp   task 0's periodic-save schedule (S a lead ahead, the costs)
//   handler/checkpointer_calls.hpp  save or the Config's override; the optional members
//   handler/raise.hpp               the exception for each failure kind
//   handler/watcher.hpp             the background thread: notices, triggers, the protocol's store
//                                   operations, waiting for a key (one outcome-key rule); its
//                                   parts, bottom first, in handler/watcher/: state, hang_watch,
//                                   watches, periodic_saves, acks, protocol, triggers, thread
//   handler/watch_cache.hpp         a watch on a prefix and the values it brought
//   handler/store_retry.hpp         transient store errors retried until a deadline; inserts
//                                   exactly-once across retries
//   handler/restore_agreement.hpp   the start-up agreement on the newest common checkpoint
//   handler/traits.hpp              check_checkpointer, check_termination_config,
//                                   has_step_restore_v, the Exit and Clock traits
//   handler/options.hpp             cluster_info, handler_options, run_status
//   handler/exception_info.hpp      a step exception's type name and message, for peer_error
//
// The handler/ headers do not include checkpoint.hpp: a program with a Checkpointer of its own
// can include handler/preemption_handler.hpp alone and compile neither the store nor JSON nor
// publishing. This header adds the default, `Checkpointer = checkpoint_manager<>`, by
// redeclaring the class template (a later declaration may add a default template argument), so
// `preemption_handler<Config, Kv>` is the same class it always was, for every includer of
// handler.hpp.
//
// Guarantees and caveats: see each part; the handler's own are at the top of
// handler/preemption_handler.hpp.
#pragma once

#include "agreement.hpp"
#include "checkpoint.hpp"  // checkpoint_manager: the default Checkpointer
#include "detail/waker.hpp"
#include "error.hpp"
#include "handler/exception_info.hpp"
#include "handler/hang.hpp"
#include "handler/options.hpp"
#include "handler/preemption_handler.hpp"
#include "handler/restore_agreement.hpp"
#include "handler/store_retry.hpp"
#include "handler/traits.hpp"
#include "handler/watch_cache.hpp"
#include "handler/watcher.hpp"
#include "kv.hpp"
#include "termination.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The default Checkpointer of preemption_handler (see the top of this header): the template is
/// declared in handler/preemption_handler.hpp without it, so that header never needs
/// checkpoint.hpp; this redeclaration supplies it (Clock keeps its default from there).
template <class Config, class Kv, class Checkpointer = checkpoint_manager<>, class Clock,
          class Hang>
class preemption_handler;

HOLDFAST_NAMESPACE_END
