// holdfast/handler/preemption_handler.hpp — the preemption checkpoint handler: wraps each
// training step so that when any worker of a job is told its machine is going away, every worker
// checkpoints at one agreed step and exits (or, with a grace period, keeps training and
// checkpoints once more before the deadline), and a restarted job resumes exactly where it
// stopped.
//
//   holdfast::preemption_handler<holdfast::presets::generic, holdfast::filesystem_kv> h(
//       holdfast::presets::generic{}, kv, {task, num_tasks, "run-7"}, std::move(checkpoints));
//   while (h.total_run_calls() < steps) h.run(train_step, batch);
//
// It joins four policies: a termination Config (termination.hpp: where notices come from, how to
// exit, the grace period, an optional save override), a kv_store (kv.hpp) shared by the workers,
// a Checkpointer (`save(step)`, `restore()` → optional step; optionally `all_steps()` and
// `restore_step(step)` for the restore agreement, `pin(step)`, and `wait_until_finished()` for
// async saves, each detected by trait; checkpoint_manager by default, see below) and a Clock.
// The protocol itself is step_agreement (agreement.hpp); the handler only drives it. This file
// holds the training side (run(), save_checkpoint_if_preempted(), consult, save, exit); its
// parts: watcher.hpp (the background thread and the state it shares), watch_cache.hpp,
// store_retry.hpp, restore_agreement.hpp (construction), periodic_schedule.hpp (task 0's
// periodic decisions, every task's reports), checkpointer_calls.hpp (the Checkpointer's optional
// members, called), raise.hpp (what a failed agreement throws), traits.hpp, options.hpp.
//
// The default Checkpointer: this header declares preemption_handler without one, so including it
// (or any handler/ part) with a Checkpointer of your own does not compile checkpoint.hpp (the
// store, JSON, publishing). handler.hpp includes checkpoint.hpp and redeclares the template with
// `Checkpointer = checkpoint_manager<>` (a default template argument may be added by a later
// declaration), so `preemption_handler<Config, Kv>` names the same class as before for every
// user of handler.hpp.
//
// Guarantees:
//   - Construction restores and resumes total_run_calls() from the restored step. With a
//     Checkpointer that has all_steps() and restore_step() (checkpoint_manager does) the workers
//     first agree on it (handler_options::agree_on_restore, on by default): each puts the steps
//     it holds under restore/have/<task>, reads every task's list (waiting at most
//     restore_timeout; the store must answer within start_timeout),
//     and proposes the newest checkpoint all of them hold with one identity (the step and its
//     history, handler/restore_agreement.hpp: a step saved by another launch is not the same
//     checkpoint); insert-once on restore/step records the first proposal and every worker
//     restores exactly that step (and pins it, when the Checkpointer has pin(), so retention
//     keeps it until a newer common step is known). A task
//     that never starts makes construction throw agreement_timeout naming it, on every task.
//     Without those members each worker restores its own latest checkpoint (weaker: a worker
//     whose last save failed resumes from an older step than its peers).
//   - The notice source starts before the restore: a notice during construction (a SIGTERM
//     while the restore agreement waits for a late task) is kept, and the first run() acts on
//     it as on any other; the signal's default action never kills a worker still being
//     constructed. A construction that throws stops the notice source again.
//   - Steady state (no notice, no claim): run() costs one relaxed atomic load, one atomic add
//     (the run counter the watcher reads) and one clock read plus two additions for the running
//     mean of step time, and with hang detection a relaxed store and a compare or two (below);
//     no store traffic, no lock, no allocation.
//   - One background thread per handler (the watcher). It forwards this worker's notice, waits
//     for the control keys that can start or end an agreement (claim, final claim, outcome,
//     error), and runs the protocol itself: it claims, acks with the run counter, collects the
//     acks (the claimant) and records the outcome. So a worker blocked inside a step (a
//     collective waiting for a peer) still takes part; its training thread stops at its next
//     step boundary at the latest and waits only until the outcome is known. The destructor
//     stops and joins the watcher; destruction is safe in every state.
//   - Event-driven waiting: the watcher sleeps in one poll() on a waker (an eventfd) and on the
//     store's control watch (kv.hpp, "Waiting on a store": etcd_kv, filesystem_kv, and an any_kv
//     holding one, e.g. from make_kv), with no time slicing. Whether the store is waited on is
//     asked once, at construction: kv_supports(kv, kv_op::watch). Notice sources with set_waker
//     (signal_notice from its signal handler, the polled, file and cloud notices from their
//     threads) wake it the moment they notice; a stop and the training thread use the same waker.
//     The watch brings the control keys' changes (etcd: the values themselves, from one long-lived
//     stream; filesystem: inotify on one descriptor), so an idle worker sends no request but the
//     watch's health probes (etcd: one per max(1 s, request_timeout / 2)). The claimant collects
//     the acks through a second watch, on the round's acks, opened at its first ack wait and closed
//     once the watcher is idle again (after the outcome is recorded: closing an inotify descriptor
//     can take the kernel tens of milliseconds). A watch that can wait only on named keys (one with
//     follow(keys): a c10d-like store's wait) is told before every sleep which keys matter: while
//     idle the claim (or final claim, or the error key when no trigger can come), the next
//     periodic decision (ctl/save/<k>, with periodic saves) and the hang verdict key (ctl/hang,
//     with hang detection), so decisions beside the rounds reach it as they reach a watch of the
//     whole prefix; the outcome key while waiting for it; the awaited ack and the outcome key
//     while collecting. Each wake-up is a resync, after which the followed keys are read again. A
//     store with a native get_many (kv_supports(kv, kv_op::get_many)) has the claimant read the
//     acks in batches instead of through the ack watch: one get_many over every ack not read yet,
//     in slices of min(time left, max(watch_interval, 1 s)), the outcome key read between slices.
//     A store that can list but has neither (in_process_kv) has the claimant list the round's
//     acks and make a blocking get of an ack the list lacked, in the same slices.
//     handler_options::watch_interval remains the fallback: the slice of a blocking get for
//     stores without a watch (c10d-like stores, and in_process_kv outside the ack collection),
//     and the longest sleep when a notice source cannot wake.
//   - One recorded decision per round (agreement.hpp): every worker that acts follows the
//     outcome recorded in the round's outcome key — all save at its step, or all throw
//     holdfast::agreement_timeout naming the same missing tasks — including a worker paused past
//     the deadline (SIGSTOP, a frozen VM) that resumes later. The training thread never decides
//     on its own: it waits for the watcher, which reads or records the outcome within the
//     round's deadline plus one ack_timeout.
//   - Store calls during an agreement are retried with backoff (5 ms doubling to 200 ms) while
//     they fail transiently (is_transient_kv_error: refused, reset, timed out, etcd
//     "unavailable"), until the round's deadline; inserts stay exactly-once (values name their
//     writer, and a retry first reads the key). When the store cannot be reached to read or
//     record the outcome, this worker never saves and throws holdfast::agreement_unreachable.
//   - Per agreement the job makes O(N) store operations in all (agreement.hpp): each worker a
//     constant number (its ack put and erase; over etcd nothing to wait, the watch brings the
//     outcome), the claimant one ack watch (etcd: its snapshot and events bring the acks;
//     filesystem: one read per ack, on its wake-ups), over a store with get_many O(1) batched
//     reads, over a store that can list but not watch one list per look (and a get of an ack
//     it lacked), or over a store with none of these one blocking get per other ack. Each round's
//     keys are erased once acted on (single-key erases, where the store has erase): 1,000 rounds
//     leave as many keys as one. Scale (benchmarks/scale_bench.cpp): per worker and agreement about
//     2 requests and 2 watch events, whatever N (256 workers on one etcd: notice -> all saved in
//     ~0.1 s, the claimant's ack watch bringing the N acks as events). Over a store without a watch
//     the claimant's batched reads (get_many, list) take a few requests; read one by one they
//     were N store round trips: the simulation (scale_model_bench.cpp, one server with a
//     measured service time) has 100,000 workers on one TCPStore agree in ~2 s batched, 53 s one
//     by one (~3 requests per worker). A 10,000-worker job needs
//     from etcd ~10,000 long-lived watch streams (one per worker, each idle but for a probe
//     every 2.5 s at the default request_timeout of 5 s: ~4,000 requests/s in all; with a lease
//     the keep-alives replace the probes) and ~30,000 requests per agreement.
//   - A worker that never acks (dead without notice) makes the others throw
//     holdfast::agreement_timeout naming the missing task ids within `ack_timeout`, never hang.
//   - An exception from a step is published; every other worker throws holdfast::peer_error
//     (origin task, type name, message) from its next run(); the origin re-throws its own.
//   - A step blocked on its peers need not wait out its own timeout when the agreement failed
//     (a peer named dead, the store out of reach): it polls agreement_failed() (a lock and a
//     load) and throws holdfast::step_abandoned, which run() turns into the failure, not
//     published as this worker's error (a recorded timeout or a peer's error is in the store
//     already; an unreachable store is this worker's alone). The step is not counted.
//     agreement_under_way() says a round's outcome is still to come (within its deadline plus
//     one ack_timeout): such a step can hold its own timeout until then.
//   - Saving (checkpointer_calls.hpp: the Config's save override, else Checkpointer::save): a
//     Checkpointer with wait_until_finished() (async saves) is waited for before the preemption
//     save (a periodic save in flight never races it) and again right after it (one told the
//     grace's end, set_durable_deadline: two_tier_checkpoints, only after it), so a preemption
//     save is durable (commit, fsyncs, rename, pointer done) when it is measured and before
//     training goes on or the Exit policy runs. Then the Exit policy runs (the liveness key's
//     "done" first, given at most 500 ms whatever the store does); when it returns (no_exit) run()
//     returns run_status::stopped, the step is not run, and the handler is re-armed. A save that
//     throws (the preemption save, the grace path's, a periodic one: a full disk) is this worker's
//     error, as a step's is: published, so every other worker raises peer_error from its next
//     run(), and rethrown from run(). A handler destroyed by that exception's unwinding, or shut
//     down with shutdown(true), writes no "done" to its liveness key; shutdown() and a plain
//     destruction write it.
//   - Grace path: the grace ends at min(notice time + grace, the notice's announced deadline);
//     the final claim is made once now > end - 6 x mean step time (TF's rule) - 2 x (what the
//     first agreement and save took + one watch interval) - handler_options::grace_margin, so
//     the second agreement and save also end before the grace period does. The save is timed to
//     its durable end (an async Checkpointer's commit included), so the reserve holds the
//     final save's commit too.
//   - Periodic saves (handler_options::periodic_saves, off by default; handler/periodic.hpp
//     binds a save_interval_policy): every task saves at the same steps, each S decided by task
//     0 (periodic_schedule.hpp) and published in ctl/save/<k> (watcher.hpp); each training thread
//     saves at exactly S in run() (run_status::saved; the blocking part timed, not an async
//     Checkpointer's background) or, when already past S, skips it and logs (never another
//     step). With a Checkpointer that has on_copy() (two_tier_checkpoints), task 0's handler sets
//     it at construction to periodic_save_options::copied (the policy's record_copy), so the
//     interval is never shorter than a durable copy.
//   - Hang detection (the Hang policy, handler/hang.hpp; hang_report by default, hang_restart,
//     hang_none): the training thread publishes which phase it is in (a step: from one run()
//     boundary to the next; a save; the restore at construction) and since when, in one relaxed
//     atomic store per step, and feeds the step time to a windowed max (a compare or two). The
//     watcher (and, during the restore, a guard thread of the constructor's) wakes when the
//     phase's bound max(multiplier x learned, floor) runs out and records one verdict for the
//     job: into the outcome key of a round under way (the round fails: every worker throws
//     hang_detected), for a policy that ends the job into the claim key every idle worker waits
//     on (else ctl/hang). Every worker learns it through its watch (or a read per period over a
//     store without one) and its policy acts once: report (a warning line to hang_options::log,
//     then hang_options::on_hang) or restart (the same, then _exit(exit_code) from the watcher,
//     so a stuck training thread does not hold the process). The agreement itself is not watched:
//     its deadline plus one ack_timeout bound it, and its timeout is its recorded outcome.
//     pause_hang_detection() lifts the bound until the next run() (an evaluation), whose step is
//     watched from its entry, as is the step after a no_exit save; a failed, stopped or shut-down
//     handler watches nothing. The learned bounds go into each checkpoint the handler saves and
//     seed the next start (a Checkpointer with set_hang_bounds()/restored_hang_bounds(); with
//     newest_hang_bounds() the restore itself is held to the restore bound the newest checkpoint
//     recorded). The time from construction to the first step boundary (a relaunch's set-up: model
//     build, compile, the first collectives) is the start phase, held to the warm-up floor, not the
//     learned step bound.
//   - Signal handlers are the notice policy's business; this file installs none.
// Caveats:
//   - run() and save_checkpoint_if_preempted() must be called from one thread.
//   - Over a store without a watch, or with a notice source that cannot wake, a notice or a
//     claim is seen within one watch interval (default 100 ms), and an idle worker makes a
//     blocking get per interval.
//   - Over a store whose watch follows named keys, an error written alone is seen only through
//     the key followed then; a failing worker also writes aborts into the claim and outcome
//     keys (agreement.hpp), which are followed. With batched acks a shutdown during the
//     claimant's collection waits for the current slice (up to max(watch_interval, 1 s)).
//   - ack_timeout need not exceed the longest step: the watcher acks while a step runs.
//   - One writer per checkpoint directory (checkpoint_manager holds a writer lock): in a
//     multi-worker job each task writes its own directory (both examples do: run "worker-<t>" in
//     preemptible_training, ckpt/rank-<k> in the PyTorch example), or one task writes and the
//     others open it read_only and record the step only.
//   - Restore-agreement keys live in the kv namespace (run id + incarnation): a restart with a
//     different number of tasks agrees among the new tasks only, each reading its own task's
//     checkpoint directory; a task id that did not exist before holds nothing, so the common
//     step is none and every task starts fresh unless the checkpoints are shared (one writer).
//   - The step's return value is not forwarded: capture results in the step callable.
//   - Re-arming in the same handler (after a no_exit save) sees a new notice only when the
//     source reports a later noticed_at(); sources that latch their first notice (signal_notice,
//     polled_notice) need a new handler with a fresh config and run id (an in-process restart).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>   // uncaught_exceptions: shutdown() during a failure's unwinding
#include <functional>  // std::invoke: the step
#include <mutex>
#include <optional>
#include <stdexcept>  // logic_error: step_abandoned with nothing failed
#include <string>
#include <utility>
#include <vector>

#include "../agreement.hpp"
#include "../error.hpp"  // agreement_timeout, agreement_unreachable, peer_error
#include "../kv.hpp"
#include "../termination/exit.hpp"    // exit_context, exit_returns: the Exit policy
#include "../termination/notice.hpp"  // can_set_waker_v: notices that wake the watcher
#include "../version.hpp"
#include "checkpointer_calls.hpp"  // detail::checkpointer_save, checkpointer_finish, ...
#include "exception_info.hpp"
#include "hang.hpp"
#include "liveness.hpp"
#include "options.hpp"
#include "periodic_schedule.hpp"  // detail::periodic_schedule, put_periodic_report
#include "raise.hpp"              // detail::raise_agreement_failure: what a failure throws
#include "restore_agreement.hpp"
#include "traits.hpp"
#include "watcher.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The preemption checkpoint handler; see the top of handler/preemption_handler.hpp. The default
/// Checkpointer (checkpoint_manager<>) is supplied by handler.hpp.
template <class Config, class Kv, class Checkpointer, class Clock = std::chrono::steady_clock,
          class Hang = hang_report>
class preemption_handler : private detail::agreement_watcher<Config, Kv, Clock, Hang> {
  static_assert(check_coordination_store<Kv>());
  static_assert(check_checkpointer<Checkpointer>());
  static_assert(check_termination_config<Config>());

  using watcher = detail::agreement_watcher<Config, Kv, Clock, Hang>;
  // What the training side shares with the watcher (watcher.hpp).
  using watcher::attention_bit;
  using watcher::cluster_;
  using watcher::config_;
  using watcher::counter_and_attention_;
  using watcher::counter_one;
  using watcher::detects_hangs;
  using watcher::enter_phase;
  using watcher::evented_;
  using watcher::guard_restore;
  using watcher::kv_;
  using watcher::learner_;
  using watcher::log_event;
  using watcher::machine_;
  using watcher::mutex_;
  using watcher::on_peer_frozen;
  using watcher::options_;
  using watcher::periodic_others_cost_us_;
  using watcher::periodic_publish_;
  using watcher::periodic_retry_;
  using watcher::periodic_steps_;
  using watcher::raise_attention_locked;
  using watcher::request_watcher_stop;
  using watcher::scope_;
  using watcher::start_watcher;
  using watcher::stop_watcher;
  using watcher::store_;
  using watcher::train_cv_;
  using watcher::wake_watcher;
  using watcher::waker_;

 public:
  using config_type = Config;                          ///< the termination config
  using kv_type = Kv;                                  ///< the coordination store
  using checkpointer_type = Checkpointer;              ///< saves and restores
  using clock = Clock;                                 ///< the clock of step times and deadlines
  using hang_policy = Hang;                            ///< what a hang verdict does
  using agreement_type = basic_step_agreement<Clock>;  ///< the protocol

  /// Restores from `checkpointer`, resumes the run counter, starts the notice and the watcher.
  preemption_handler(Config config, Kv kv, cluster_info cluster, Checkpointer checkpointer,
                     handler_options options = {})
      : watcher(std::move(config), std::move(kv), std::move(cluster), options),
        checkpointer_(std::move(checkpointer)) {
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (detects_hangs) {  // the restore is held to the bound its predecessor learned
      if (auto b = detail::checkpointer_newest_hang_bounds(checkpointer_)) learner_.seed(*b);
      if constexpr (has_step_restore_v<Checkpointer>) {  // the agreement's wait is bounded
        if (options_.agree_on_restore)
          learner_.hold_restore_floor(options_.start_timeout + options_.restore_timeout +
                                      options_.ack_timeout + options_.hang.period);
      }
    }
    // The notice first: one that comes during the restore (its agreement may wait minutes for
    // a late task) is kept for the watcher, which starts below and acts on it; installed after
    // the restore, the signal's default action would kill a worker still being constructed.
    if constexpr (detail::can_set_waker_v<Config>) config_.set_waker(&waker_);
    config_.start();
    notice_started_ = true;
    try {
      guard_restore([&] {
        restored_ = detail::restore_at_start(
            kv_, checkpointer_,
            detail::restore_party<Clock>{cluster_, scope_, options_, machine_, store_});
      });
    } catch (...) {  // no handler: the notice source stops (and forgets the waker) with it
      notice_started_ = false;
      config_.stop();
      if constexpr (detail::can_set_waker_v<Config>) config_.set_waker(nullptr);
      log_start_failure();
      throw;
    }
    if constexpr (detects_hangs) {
      // the agreed checkpoint's (none: a fresh start)
      learner_.seed(
          detail::checkpointer_restored_hang_bounds(checkpointer_).value_or(hang_bounds{}));
      learner_.add_restore(std::chrono::steady_clock::now() - t0);
      // The set-up before the first step boundary is the start's: held to the warm-up floor.
      enter_phase(hang_phase::start, std::chrono::steady_clock::now());
    }
    counter_and_attention_.store(static_cast<std::uint64_t>(restored_.value_or(0)) << 1);
    log_event((restored_ ? "restored step " + std::to_string(*restored_)
                         : std::string("no checkpoint to restore: starting at step 0")) +
              " (start: " + detail::seconds_text(std::chrono::steady_clock::now() - t0) + ")");
    start_liveness();
    periodic_.start();
    if (periodic_.decides() && options_.periodic_saves.copied)  // the copies' cost, too
      detail::checkpointer_on_copy(checkpointer_, options_.periodic_saves.copied);
    start_watcher();
  }

  preemption_handler(const preemption_handler&) = delete;
  preemption_handler& operator=(const preemption_handler&) = delete;

  /// Stops and joins the watcher and stops the notice policy.
  ~preemption_handler() { shutdown(); }

  /// Checks for an agreed checkpoint (saving, maybe exiting), then runs `step(args...)` and
  /// updates the mean step time. Throws peer_error, agreement_timeout, or the step's exception.
  template <class F, class... Args>
  run_status run(F&& step, Args&&... args) {
    run_status st = run_status::ran;
    if constexpr (detects_hangs) {  // after a pause or a no_exit save: watched from here
      if (!watching_) enter_step_phase(std::chrono::steady_clock::now());
    }
    if (periodic_.due()) decide_periodic();
    if (counter_and_attention_.load(std::memory_order_relaxed) & attention_bit) {
      st = consult();
      if (st == run_status::stopped) return st;
    }
    try {
      std::invoke(std::forward<F>(step), std::forward<Args>(args)...);
    } catch (const step_abandoned&) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (machine_.state() == agreement_state::failed) {
          raise_attention_locked();  // the next run() raises it again
          raise(lock);
        }
      }
      try {  // misuse: this worker's error, published as what it is
        throw std::logic_error(
            "holdfast: a step threw step_abandoned, but no agreement failed (see "
            "preemption_handler::agreement_failed())");
      } catch (const std::logic_error&) {
        publish_error();
        throw;
      }
    } catch (...) {
      publish_error();
      throw;
    }
    stamp();
    counter_and_attention_.fetch_add(counter_one, std::memory_order_relaxed);
    return st;
  }

  /// For loops that run several steps per call: counts one call, checks for an agreed
  /// checkpoint, and keeps the step-time estimate (the interval between calls).
  run_status save_checkpoint_if_preempted() {
    stamp();
    run_status st = run_status::ran;
    if (periodic_.due()) decide_periodic();
    if (counter_and_attention_.load(std::memory_order_relaxed) & attention_bit) {
      st = consult();
      if (st == run_status::stopped) return st;
    }
    counter_and_attention_.fetch_add(counter_one, std::memory_order_relaxed);
    return st;
  }

  /// Steps run so far, including those restored from the checkpoint.
  std::int64_t total_run_calls() const noexcept {
    return static_cast<std::int64_t>(counter_and_attention_.load(std::memory_order_relaxed) >> 1);
  }
  /// The step restored at construction, if any.
  std::optional<std::int64_t> restored_step() const noexcept { return restored_; }
  /// The running mean of step time: the interval between consecutive steps (run() or
  /// save_checkpoint_if_preempted() calls), leaving out intervals that contained a wait for an
  /// agreement or a save. Zero before two steps.
  typename Clock::duration mean_step_time() const noexcept {
    return steps_timed_ ? step_time_sum_ / static_cast<typename Clock::rep>(steps_timed_)
                        : Clock::duration::zero();
  }
  /// The protocol's state.
  agreement_state state() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return machine_.state();
  }
  /// True once this worker's agreement failed (a recorded timeout naming tasks, a peer's error,
  /// the store out of reach): the next run() raises it. A step that waits for its peers (an
  /// exchange through the store, a collective with a timeout) checks it while it waits and
  /// throws holdfast::step_abandoned to stop: run() then raises the failure at once.
  bool agreement_failed() const { return state() == agreement_state::failed; }
  /// True while an agreement is under way whose outcome this worker does not know yet
  /// (holdfast::agreement_under_way(state())): it comes within the round's deadline plus one
  /// ack_timeout.
  bool agreement_under_way() const { return holdfast::agreement_under_way(state()); }
  /// A copy of the protocol (for inspection).
  agreement_type agreement() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return machine_;
  }
  /// The checkpointer.
  Checkpointer& checkpointer() noexcept { return checkpointer_; }
  /// The termination config.
  Config& config() noexcept { return config_; }
  /// The cluster info.
  const cluster_info& cluster() const noexcept { return cluster_; }
  /// The key prefix of this handler: "holdfast/<run_id>/".
  const std::string& key_scope() const noexcept { return scope_; }

  /// The bounds the hang detector learned so far (what a checkpoint records for the next start).
  hang_bounds learned_hang_bounds() const noexcept { return learner_.bounds(); }
  /// The current bound of `p` before it counts as hung (handler/hang.hpp).
  std::chrono::nanoseconds hang_bound(hang_phase p) const noexcept { return learner_.bound(p); }

  /// Suspends hang detection until the next run() or save_checkpoint_if_preempted(): for work
  /// between training steps that no bound covers (an evaluation, an export). The interval it
  /// ends is not taken for a step time.
  void pause_hang_detection() noexcept {
    enter_phase(hang_phase::none, std::chrono::steady_clock::now());
    watching_ = false;
    stamped_ = false;
  }

  /// Stops the watcher and the notice policy; the handler then only runs steps. Idempotent.
  /// `failed`: the handler ends with a failure its caller caught (a step's or a save's
  /// exception, a peer's error): its liveness key gets no "done", as on a destruction by an
  /// exception's unwinding, which needs no flag.
  void shutdown(bool failed = false) noexcept {
    if (failed || std::uncaught_exceptions() > uncaught_at_start_)
      abandon_liveness();  // a failure: no clean "done" for the peers
    else
      finish_liveness();
    stop_watcher();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      machine_.on_stop();
    }
    counter_and_attention_.fetch_and(~attention_bit, std::memory_order_relaxed);
    train_cv_.notify_all();
    if (notice_started_) {
      notice_started_ = false;
      config_.stop();
    }
    if constexpr (detail::can_set_waker_v<Config>) config_.set_waker(nullptr);
  }

 private:
  using time_point = typename Clock::time_point;
  using instruction = typename agreement_type::instruction;
  using op = typename instruction::op;

  // One clock read per step: the interval since the previous one counts as a step time, unless
  // the protocol held the step up in between (consult() clears stamped_).
  // With hang detection the same read starts the next step's phase for the watcher (one relaxed
  // store) and feeds the step time to the learner (handler/hang.hpp: a compare or two).
  void stamp() noexcept {
    const auto t = Clock::now();
    if constexpr (detects_hangs) {
      std::chrono::steady_clock::time_point s;
      if constexpr (detail::is_notice_clock_v<Clock>)
        s = t;
      else
        s = std::chrono::steady_clock::now();
      if (stamped_ && learner_.add_step(s - last_steady_stamp_)) record_bounds();
      last_steady_stamp_ = s;
      step_phase_ = hang_phase::step;  // a boundary: the start, if it was one, is over
      enter_step_phase(s);
    }
    if (stamped_) {
      step_time_sum_ += t - last_stamp_;
      ++steps_timed_;
    }
    last_stamp_ = t;
    stamped_ = true;
  }

  // The training thread enters the phase of the step it is in (the start until the first
  // boundary, then a step) since `t`.
  void enter_step_phase(std::chrono::steady_clock::time_point t) noexcept {
    enter_phase(step_phase_, t);
    watching_ = true;
  }

  // A save whose failure is this worker's error: published (every peer raises peer_error), then
  // rethrown to the caller.
  template <class F>
  void publishing_failure(F&& save_fn) {
    try {
      std::forward<F>(save_fn)();
    } catch (...) {
      publish_error();
      throw;
    }
  }

  // The training thread's slow path: ask the machine; wait while it says so (the watcher is
  // agreeing); save and maybe exit when it says so.
  run_status consult() {
    counter_and_attention_.fetch_and(~attention_bit, std::memory_order_relaxed);
    const auto started = Clock::now();
    // The agreement bounds itself (its deadline plus one ack_timeout): no hang bound while in it,
    // nor after a failure or a stop (the loop may end); the step that follows is watched again.
    enter_phase(hang_phase::none, std::chrono::steady_clock::now());
    const std::int64_t counter = total_run_calls();
    std::unique_lock<std::mutex> lock(mutex_);
    bool waited_or_saved = false;  // at this boundary: not a step time, but overhead
    instruction in;
    // Wait until the watcher has the round's recorded outcome (it alone reads and records it,
    // within the round's deadline and its retries): this thread never decides on its own.
    for (;;) {
      in = machine_.decide(counter, Clock::now(), mean_step_time());
      if (in.action != agreement_action::wait) break;
      waited_or_saved = true;
      train_cv_.wait_for(lock, options_.watch_interval);
    }
    wake_watcher();  // the grace countdown may have handed the watcher a final claim
    run_status st = run_status::ran;
    switch (in.action) {
      case agreement_action::proceed:
      case agreement_action::wait:
        break;
      case agreement_action::fail:
        raise_attention_locked();
        raise(lock);
      case agreement_action::save_then_continue:
        lock.unlock();
        log_event("step " + std::to_string(in.step) + " agreed: saving, then training on");
        publishing_failure([&] { save(in.step); });
        overhead_ += Clock::now() - started;  // the final claim leaves room for as much again
        lock.lock();
        // + one watch interval where the watcher may be in a blocking get when the final claim
        // is due (a store without a watch); with a watch, the waker wakes it at once
        machine_.note_overhead(overhead_ +
                               (evented_ ? typename Clock::duration{}
                                         : std::chrono::duration_cast<typename Clock::duration>(
                                               options_.watch_interval)));
        waited_or_saved = false;
        stamped_ = false;
        st = run_status::saved;
        break;
      case agreement_action::save:  // no exit: the machine re-armed itself
        lock.unlock();
        log_event("step " + std::to_string(in.step) + " agreed: saving, then stopping");
        publishing_failure([&] { save(in.step); });
        lock.lock();
        st = run_status::stopped;
        break;
      case agreement_action::save_then_exit:
        lock.unlock();
        log_event("step " + std::to_string(in.step) + " agreed: saving, then exiting");
        publishing_failure([&] { save(in.step); });
        exit_process();  // returns only when the Exit policy did not end the process
        lock.lock();
        machine_.rearm();
        st = run_status::stopped;
        break;
    }
    if (waited_or_saved) {
      overhead_ += Clock::now() - started;
      stamped_ = false;
    }
    if (st == run_status::stopped) {
      overhead_ = {};
      stamped_ = false;
      watching_ = false;  // the next run() watches its step from its entry
    }
    if (st != run_status::stopped && options_.periodic_saves.enabled &&
        periodic_locked(lock, counter))
      st = run_status::saved;
    raise_attention_locked();
    wake_watcher();
    if (st != run_status::stopped) enter_step_phase(std::chrono::steady_clock::now());
    return st;
  }

  // ---- periodic saves (handler_options::periodic_saves) ---------------------------------------

  // Task 0, when its schedule is due (periodic_schedule.hpp): asks its watcher to publish the
  // step S the schedule decides; over a store without a watch the lead is at least two
  // watch_intervals (a decision is seen within a blocking get). No decision before a step is
  // timed, and none more until it has acted on S.
  void decide_periodic() {
    periodic_.decide(std::chrono::duration_cast<std::chrono::nanoseconds>(mean_step_time()),
                     evented_ ? std::chrono::milliseconds(0) : 2 * options_.watch_interval,
                     total_run_calls(), [this](std::int64_t s) {
                       {
                         std::lock_guard<std::mutex> lock(mutex_);
                         periodic_publish_ = s;
                       }
                       wake_watcher();
                     });
  }

  // At a boundary with attention: acts on the decided steps this task has reached — saves at
  // exactly S, skips (and logs) a step it is already past — and keeps its attention raised while
  // one is ahead. Lock held on entry and exit. Returns whether it saved.
  bool periodic_locked(std::unique_lock<std::mutex>& lock, std::int64_t counter) {
    bool saved = false;
    if (periodic_retry_) {  // the publication failed: ask again after a lead time
      periodic_retry_ = false;
      periodic_.retry();
    }
    while (!periodic_steps_.empty()) {
      const std::int64_t s = periodic_steps_.front();
      if (counter < s) {
        counter_and_attention_.fetch_or(attention_bit, std::memory_order_relaxed);
        break;
      }
      periodic_steps_.pop_front();
      lock.unlock();
      struct relock {
        std::unique_lock<std::mutex>& l;
        ~relock() { l.lock(); }
      } relock_after{lock};
      if (counter == s) {
        publishing_failure([&] { periodic_save(s); });
        saved = true;
        stamped_ = false;  // the interval holding the save is no step time
      } else {
        detail::log_line(options_.periodic_saves.log,
                         "periodic save at step " + std::to_string(s) + " skipped: task " +
                             std::to_string(cluster_.task) + " learned it at step " +
                             std::to_string(counter) + ", past it");
        detail::put_periodic_report(kv_, scope_, cluster_.task, this->nonce_, s, -1);
        periodic_.skipped(s);
      }
    }
    return saved;
  }

  // A save, as the hang detector sees it: its phase from construction (the learned bounds handed
  // to the Checkpointer first, so the save carries them) to destruction, a save that throws
  // included (no hang either).
  struct save_phase {
    explicit save_phase(preemption_handler& handler) : h(handler) {
      h.enter_phase(hang_phase::save, start);
      h.record_bounds();
    }
    save_phase(const save_phase&) = delete;
    save_phase& operator=(const save_phase&) = delete;
    ~save_phase() { h.enter_phase(hang_phase::none, std::chrono::steady_clock::now()); }
    preemption_handler& h;
    const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };

  // A periodic save at `step`: timed (its blocking part: an async or two-tier Checkpointer's
  // background work is not waited for), reported under saved/<task>, and on task 0 recorded with
  // the longest cost the other tasks reported.
  void periodic_save(std::int64_t step) {
    const save_phase phase(*this);
    const auto t0 = phase.start;
    log_event("periodic save of step " + std::to_string(step) + " started");
    detail::checkpointer_save(checkpointer_, config_, step);
    const auto end = steady::now();
    log_event("periodic save of step " + std::to_string(step) + " done in " +
              detail::seconds_text(end - t0));
    if constexpr (detects_hangs) learner_.add_save(end - t0);
    const auto cost_us = std::chrono::duration_cast<std::chrono::microseconds>(end - t0).count();
    detail::put_periodic_report(kv_, scope_, cluster_.task, this->nonce_, step, cost_us);
    if (periodic_.decides())
      periodic_.saved(step, cost_us, periodic_others_cost_us_.load(std::memory_order_relaxed), end);
  }

  // The exception in flight, which ends the construction, as a warning.
  void log_start_failure() const noexcept {
    try {
      throw;
    } catch (const std::exception& e) {
      try {
        log_event(std::string("the start failed: ") + e.what(), log_level::warning);
      } catch (...) {  // no memory for the line
      }
    } catch (...) {
    }
  }

  // The failure the machine recorded, raised (raise.hpp). `lock` (on mutex_) is released
  // first: the log hook it goes to as a warning (once: every later run() raises it again) may
  // call back into the handler.
  [[noreturn]] void raise(std::unique_lock<std::mutex>& lock) {
    const agreement_failure_info failure = machine_.failure();
    lock.unlock();
    try {
      detail::raise_agreement_failure(failure, scope_);
    } catch (const std::exception& e) {
      if (!failure_logged_) {
        failure_logged_ = true;
        try {
          log_event(e.what(), log_level::warning);
        } catch (...) {  // the failure, not a bad_alloc of its line, reaches the caller
        }
      }
      throw;
    }
  }

  // Saves `step` and returns once it is durable: an async Checkpointer's save() returns when its
  // writer has run, and wait_until_finished() then covers the commit (fsyncs, rename, pointer).
  // So the time measured here (the grace path's reserve, exit_context::save_duration) is the
  // save's whole cost, not the part before the commit.
  void save(std::int64_t step) {
    const save_phase phase(*this);
    const auto t0 = phase.start;
    // A Checkpointer told the grace's end (set_durable_deadline: two_tier_checkpoints) has a
    // background part that never races a save (its copier copies published checkpoints): it is
    // not waited for first, and the wait after is bounded by that end. Others: an async periodic
    // save in flight never races the preemption save.
    if (!detail::checkpointer_tell_durable_deadline(checkpointer_, config_, options_.grace_margin))
      detail::checkpointer_finish(checkpointer_);
    detail::checkpointer_save(checkpointer_, config_, step);
    detail::checkpointer_finish(checkpointer_);  // to the durable end
    last_save_duration_ = std::chrono::steady_clock::now() - t0;
    log_event("step " + std::to_string(step) + " saved in " +
              detail::seconds_text(last_save_duration_));
    if constexpr (detects_hangs) learner_.add_save(last_save_duration_);
  }

  // Whole-process stalls (handler/liveness.hpp): where the store leases this run's liveness keys,
  // a monitor keeps this worker's alive and names its successor when that one's expires; the
  // watcher records the frozen verdict. Elsewhere nothing starts.
  void start_liveness() {
    if constexpr (detects_hangs && can_carry_liveness_v<Kv>) {
      if (!liveness_monitor<Kv>::available(kv_, scope_, cluster_.task)) return;
      liveness_.emplace(
          kv_, scope_, cluster_.task, cluster_.num_tasks,
          [this](int task, std::chrono::milliseconds silent) {
            on_peer_frozen(task, silent,
                           std::chrono::duration_cast<std::chrono::milliseconds>(liveness_->ttl()));
          });
    }
  }
  // Ends the liveness signal cleanly ("done": no verdict for this worker), by `deadline`.
  // Idempotent.
  void finish_liveness(std::chrono::steady_clock::time_point deadline =
                           std::chrono::steady_clock::time_point::max()) noexcept {
    if constexpr (detects_hangs && can_carry_liveness_v<Kv>) {
      if (liveness_) liveness_->finish_by(deadline);
    } else {
      static_cast<void>(deadline);
    }
  }
  // Ends the liveness signal without "done" (a failure unwinds the handler). Idempotent.
  void abandon_liveness() noexcept {
    if constexpr (detects_hangs && can_carry_liveness_v<Kv>) {
      if (liveness_) liveness_->abandon();
    }
  }

  // Hands the learned bounds to a Checkpointer that records them in its saves (the handler's and
  // the user's own): the next start begins from them. On a change of the bounds (rare) and
  // before each save of the handler's.
  void record_bounds() noexcept {
    if constexpr (detects_hangs) detail::checkpointer_record_bounds(checkpointer_, learner_);
  }

  void exit_process() {
    using exit_type = typename Config::exit_type;
    // The watcher is asked to stop (not joined: it may be inside a store call for up to one
    // watch interval, and the exit should not wait for it); it touches only this handler, which
    // outlives any exit. If the Exit policy returns (no_exit semantics), join and restart it.
    // The notice stays started: a second SIGTERM must not kill the process before the Exit
    // policy runs.
    request_watcher_stop();  // save() returned with the preemption save durable
    // An exit is no freeze: "done" spares this worker a verdict, if the store takes it within
    // the bound (the Exit policy runs at most that late, whatever the store does).
    finish_liveness(steady::now() + exit_liveness_bound);
    config_.exit(exit_context{config_.noticed_at(), last_save_duration_});
    if constexpr (exit_returns<exit_type>::value) {
      stop_watcher();
      start_liveness();  // alive again (a fresh key: the predecessor watches it anew)
      start_watcher();
    }
  }

  // This worker's step threw: publish it (best effort: the step's exception is what the
  // caller gets), so peers raise peer_error.
  void publish_error() noexcept {
    try {
      std::unique_lock<std::mutex> lock(mutex_);
      machine_.on_local_error(detail::current_exception_type_name(),
                              detail::current_exception_message());
      // Take every insert now, under the lock, so the watcher cannot pick one up and be cut
      // short by the process's exit: this thread writes the error before the aborts.
      std::vector<instruction> inserts;
      for (;;) {
        instruction in = machine_.protocol_next(total_run_calls(), Clock::now());
        if (in.kind != op::insert) break;
        inserts.push_back(std::move(in));
      }
      raise_attention_locked();
      lock.unlock();
      for (const auto& in : inserts) {  // the machine is failed: it needs no results
        try {
          kv_.insert(agreement_key_name(scope_, in.key, in.round, in.task), in.value);
        } catch (...) {
        }
      }
    } catch (...) {
    }
    train_cv_.notify_all();
  }

  // How long an exit after a save waits for the liveness thread and its "done" at most.
  static constexpr std::chrono::milliseconds exit_liveness_bound{500};

  Checkpointer checkpointer_;
  liveness_slot<Kv> liveness_;  // where the store leases liveness keys
  const int uncaught_at_start_ = std::uncaught_exceptions();  // shutdown() tells a failure
  std::optional<std::int64_t> restored_;
  bool notice_started_ = false;

  // training thread only
  std::uint64_t steps_timed_ = 0;
  typename Clock::duration step_time_sum_{};
  time_point last_stamp_{};
  std::chrono::steady_clock::time_point last_steady_stamp_{};  // hang detection's
  bool stamped_ = false;
  bool failure_logged_ = false;                // raise() logged the failure
  hang_phase step_phase_ = hang_phase::start;  // start until the first step boundary, then step
  bool watching_ = true;  // a step phase is stamped (pause and no_exit saves clear it)
  std::chrono::nanoseconds last_save_duration_{0};
  typename Clock::duration overhead_{};  // waiting + saving in this round's first phase
  using steady = std::chrono::steady_clock;
  // periodic saves: task 0's decisions (training thread only)
  detail::periodic_schedule periodic_{options_.periodic_saves, cluster_.task};
};

HOLDFAST_NAMESPACE_END
