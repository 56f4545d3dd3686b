// holdfast/handler/watcher.hpp — the handler's background thread and the state it shares with
// the training thread: it forwards this worker's notice, waits for the control keys that can
// start or end an agreement (claim, final claim, outcome, error), and runs the protocol
// (step_agreement, agreement.hpp) itself: it claims, acks with the run counter, collects the
// acks (the claimant) and records the outcome. preemption_handler (preemption_handler.hpp) is
// built on it and adds the training side.
//
// agreement_watcher is made of parts, one concern each, stacked as layers: each part is a class
// template over the same <Config, Kv, Clock, Hang> that derives from the part below it, holds
// its own state, and names what it uses of the parts below in using-declarations, so a part
// reaches only parts below it (a name from above would not compile). From the bottom:
//
//   watcher/state.hpp           the shared state: the config, the store, the machine, the run
//                               counter and its attention bit, the lock and the wake-ups
//   watcher/hang_watch.hpp      hang detection: the training thread's phase against its bound,
//                               a verdict recorded once, acted on once
//   watcher/watches.hpp         the store's watches (ctl/, a round's acks) and the one poll()
//   watcher/periodic_saves.hpp  task 0 publishes the periodic-save decisions; all learn them
//   watcher/acks.hpp            the claimant's acks in batches (a native get_many, or a list)
//   watcher/protocol.hpp        the protocol step (the machine's store operations), key waits
//   watcher/triggers.hpp        an idle watcher's wait for a claim, a final claim or an error
//   watcher/thread.hpp          starting and stopping the thread, and its loop
//
// Guarantees (each part's header says them in full):
//   - A worker blocked inside a step still takes part: the watcher acks with the run counter it
//     reads in the same atomic operation that raises the training thread's attention (state.hpp,
//     protocol.hpp).
//   - Event-driven waiting where the store can be waited on: one poll() on a waker and the
//     store's watches, with no time slicing (watches.hpp); the claimant's acks through a watch
//     on them, in batches, or by blocking gets (protocol.hpp, acks.hpp).
//   - One rule for the round's outcome key in every wait for a key (protocol.hpp).
//   - Store calls retried until the machine's retry deadline, a call that fails for good fed to
//     the machine (protocol.hpp); once the machine has failed, no store call more (triggers.hpp).
//   - Hang detection (hang_watch.hpp); periodic saves (periodic_saves.hpp); the decisions beside
//     the rounds followed by a watch of named keys (triggers.hpp).
//   - Stopping wakes the watcher wherever it sleeps, and joins it (thread.hpp).
// Caveats: without a watch, or with a notice that cannot wake, a notice or a claim is seen
// within one watch interval (watches.hpp, triggers.hpp); a stop during a batched collection
// waits for the slice (acks.hpp).
#pragma once

#include "../version.hpp"
#include "watcher/thread.hpp"  // the top part, and through it every part below

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The watcher thread of a preemption_handler and the state both its threads share: every part
/// (watcher/*.hpp), composed. It adds no member, so the thread is joined (~watcher_thread)
/// before any state goes.
template <class Config, class Kv, class Clock, class Hang>
class agreement_watcher : public watcher_thread<Config, Kv, Clock, Hang> {
  using below = watcher_thread<Config, Kv, Clock, Hang>;

 public:
  agreement_watcher(const agreement_watcher&) = delete;
  agreement_watcher& operator=(const agreement_watcher&) = delete;

 protected:
  using below::below;  // (config, kv, cluster, options), as preemption_handler constructs it

  /// Stops and joins the watcher (the handler has done so already): ~watcher_thread does it.
  ~agreement_watcher() = default;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
