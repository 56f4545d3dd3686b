// holdfast/handler.hpp — the preemption checkpoint handler: wraps each training step so that when
// any worker of a job is told its machine is going away, every worker checkpoints at one agreed
// step and exits (or, with a grace period, keeps training and checkpoints once more before the
// deadline), and a restarted job resumes exactly where it stopped.
//
//   holdfast::preemption_handler<holdfast::presets::generic, holdfast::filesystem_kv> h(
//       holdfast::presets::generic{}, kv, {task, num_tasks, "run-7"}, std::move(checkpoints));
//   while (h.total_run_calls() < steps) h.run(train_step, batch);
//
// It joins four policies: a termination Config (termination.hpp: where notices come from, how to
// exit, the grace period, an optional save override), a kv_store (kv.hpp) shared by the workers,
// a Checkpointer (`save(step)`, `restore()` → optional step; optionally `all_steps()` and
// `restore_step(step)` for the restore agreement, `pin(step)`, and `wait_until_finished()` for
// async saves, each detected by trait; checkpoint_manager by default) and a Clock. The protocol
// itself is step_agreement (agreement.hpp); this file only drives it.
//
// Guarantees:
//   - Construction restores and resumes total_run_calls() from the restored step. With a
//     Checkpointer that has all_steps() and restore_step() (checkpoint_manager does) the workers
//     first agree on it (handler_options::agree_on_restore, on by default): each puts the steps
//     it holds under restore/have/<task>, reads every task's list (waiting at most ack_timeout),
//     and proposes the newest step all of them hold; insert-once on restore/step records the
//     first proposal and every worker restores exactly that step (and pins it, when the
//     Checkpointer has pin(), so retention keeps it until a newer common step is known). A task
//     that never starts makes construction throw agreement_timeout naming it, on every task.
//     Without those members each worker restores its own latest checkpoint (weaker: a worker
//     whose last save failed resumes from an older step than its peers).
//   - Steady state (no notice, no claim): run() costs one relaxed atomic load, one atomic add
//     (the run counter the watcher reads) and one clock read plus two additions for the running
//     mean of step time; no store traffic, no lock, no allocation.
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
//     follow(key): a c10d-like store's wait) is told before every sleep which key matters: the
//     claim (or final claim, or the error key when no trigger can come) while idle, the outcome key
//     while waiting for it, the awaited ack and the outcome key while collecting; each wake-up is a
//     resync, after which the followed keys are read again. A store with a native get_many
//     (kv_supports(kv, kv_op::get_many)) has the claimant read the acks in batches instead of
//     through the ack watch: one get_many over every ack not read yet, in slices of
//     min(time left, max(watch_interval, 1 s)), the outcome key read between slices.
//     handler_options::watch_interval remains the fallback: the slice of a blocking get for
//     stores without a watch (in_process_kv, c10d-like stores, an any_kv holding one), and the
//     longest sleep when a notice source cannot wake.
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
//     reads, or over a store with neither one blocking get per other worker's ack. Each round's
//     keys are erased once acted on (single-key erases, where the store has erase): 1,000 rounds
//     leave as many keys as one. Scale (benchmarks/scale_bench.cpp): per worker and agreement about
//     2 requests and 2 watch events, whatever N (256 workers on one etcd: notice -> all saved in
//     ~0.1 s, the claimant's ack watch bringing the N acks as events). Over a store without a watch
//     the claimant's N - 1 reads are sequential, about N store round trips: the simulation models
//     that worst case (10,000 workers at 0.5 ms a request: ~6 s, well inside the 3-minute
//     ack_timeout; ~4 requests per worker). A 10,000-worker job needs
//     from etcd ~10,000 long-lived watch streams (one per worker, each idle but for a probe
//     every 2.5 s at the default request_timeout of 5 s: ~4,000 requests/s in all; with a lease
//     the keep-alives replace the probes) and ~30,000 requests per agreement.
//   - A worker that never acks (dead without notice) makes the others throw
//     holdfast::agreement_timeout naming the missing task ids within `ack_timeout`, never hang.
//   - An exception from a step is published; every other worker throws holdfast::peer_error
//     (origin task, type name, message) from its next run(); the origin re-throws its own.
//   - Saving: the Config's save override when it has one (then the Checkpointer never saves),
//     else Checkpointer::save(step); a Checkpointer with wait_until_finished() (async saves) is
//     waited for before the preemption save and again before the Exit policy runs, so a
//     periodic save in flight never races the final one or the exit. Then the Exit policy runs;
//     when it returns (no_exit) run() returns run_status::stopped, the step is not run, and the
//     handler is re-armed.
//   - Grace path: the grace ends at min(notice time + grace, the notice's announced deadline);
//     the final claim is made once now > end - 6 x mean step time (TF's rule) - 2 x (what the
//     first agreement and save took + one watch interval) - handler_options::grace_margin, so
//     the second agreement and save also end before the grace period does.
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

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>  // std::random_device: the handler's nonce
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>

#if defined(__GNUC__) || defined(__clang__)
#include <cxxabi.h>  // __cxa_current_exception_type, __cxa_demangle: the error's type name
#endif

#include "agreement.hpp"
#include "checkpoint.hpp"
#include "detail/waker.hpp"
#include "error.hpp"
#include "kv.hpp"
#include "termination.hpp"

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
  /// with a watch and waking notices do not use it. A claimant reading acks with get_many reads
  /// in slices of max(watch_interval, 1 s).
  std::chrono::milliseconds watch_interval{100};
  /// Grace path: the final claim is made this much earlier than the measured rule asks, so the
  /// final save ends before the deadline despite scheduling stalls the measurements missed.
  std::chrono::milliseconds grace_margin{std::chrono::seconds(3)};
  /// At construction, agree with every task on the newest step all of them hold and restore
  /// that (needs a Checkpointer with all_steps() and restore_step()); false: each worker
  /// restores its own latest checkpoint.
  bool agree_on_restore = true;
};

/// What run() / save_checkpoint_if_preempted() did.
enum class run_status : unsigned char {
  ran,      ///< no checkpoint; the step ran
  saved,    ///< checkpointed at the agreed step (first save of the grace path), then ran the step
  stopped,  ///< checkpointed and the Exit policy returned (no_exit): the step was NOT run; the
            ///< handler is re-armed, restart or go on as you see fit
};

namespace detail {

/// The dynamic type name of the exception being handled (call inside a catch block).
inline std::string current_exception_type_name() {
#if defined(__GNUC__) || defined(__clang__)
  if (const std::type_info* t = abi::__cxa_current_exception_type()) {
    int status = 0;
    char* d = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
    std::string name = status == 0 && d ? d : t->name();
    std::free(d);
    return name;
  }
#endif
  return "unknown exception";
}

/// The message of the exception being handled: what() for std::exception, else "".
inline std::string current_exception_message() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return {};
  }
}

/// Whether a config's Exit policy is no_exit: then the handler saves and returns, never calling
/// it. Any other policy is called after the last save (and may still return).
template <class Config>
inline constexpr bool is_no_exit_v = std::is_same_v<typename Config::exit_type, no_exit>;

/// `t` (a steady_clock time) on Clock.
template <class Clock>
typename Clock::time_point to_clock(std::chrono::steady_clock::time_point t) {
  if constexpr (std::is_same_v<Clock, std::chrono::steady_clock>) {
    return t;
  } else {
    return Clock::now() + std::chrono::duration_cast<typename Clock::duration>(
                              t - std::chrono::steady_clock::now());
  }
}

/// `t` (a wall-clock time) on Clock.
template <class Clock>
typename Clock::time_point to_clock(std::chrono::system_clock::time_point t) {
  return Clock::now() +
         std::chrono::duration_cast<typename Clock::duration>(t - std::chrono::system_clock::now());
}

}  // namespace detail

namespace detail {
template <class T>
using ckpt_save = decltype(std::declval<T&>().save(std::int64_t{}));
template <class T>
using ckpt_restore = std::enable_if_t<
    std::is_convertible_v<decltype(std::declval<T&>().restore()), std::optional<std::int64_t>>>;
template <class T>
using ckpt_all_steps =
    std::enable_if_t<std::is_convertible_v<decltype(std::declval<const T&>().all_steps()),
                                           std::vector<std::int64_t>>>;
template <class T>
using ckpt_restore_step = decltype(std::declval<T&>().restore_step(std::int64_t{}));
template <class T>
using ckpt_pin = decltype(std::declval<T&>().pin(std::optional<std::int64_t>{}));
template <class T>
using ckpt_wait = decltype(std::declval<T&>().wait_until_finished());
template <class T>
using cfg_exit_type = typename T::exit_type;
template <class T>
using cfg_notice = decltype(bool{std::declval<const T&>().noticed()},
                            std::optional<std::chrono::steady_clock::time_point>{
                                std::declval<const T&>().noticed_at()},
                            std::optional<std::chrono::system_clock::time_point>{
                                std::declval<const T&>().announced_deadline()});
template <class T>
using cfg_start_stop = decltype(std::declval<T&>().start(), std::declval<T&>().stop());
template <class T>
using cfg_grace = decltype(std::chrono::milliseconds{std::declval<const T&>().grace_period()});
template <class T>
using cfg_save_override = decltype(bool{std::declval<const T&>().has_save_override()},
                                   std::declval<const T&>().save_override()(std::int64_t{}));
template <class T>
using cfg_exit = decltype(std::declval<T&>().exit(std::declval<const exit_context&>()));
}  // namespace detail

/// Checks a Checkpointer policy at compile time; each static_assert names the missing member.
template <class C>
constexpr bool check_checkpointer() {
  static_assert(detail::detect<detail::ckpt_save, C>::value,
                "holdfast: a Checkpointer needs save(std::int64_t step)");
  static_assert(detail::detect<detail::ckpt_restore, C>::value,
                "holdfast: a Checkpointer needs restore() returning std::optional<std::int64_t>");
  return true;
}

/// True when a Checkpointer can take part in the restore agreement: it has all_steps() (the
/// complete steps it holds) and restore_step(step).
template <class C>
inline constexpr bool has_step_restore_v = detail::detect<detail::ckpt_all_steps, C>::value&&
    detail::detect<detail::ckpt_restore_step, C>::value;

/// Checks a termination Config (termination_config or a preset) at compile time.
template <class C>
constexpr bool check_termination_config() {
  static_assert(detail::detect<detail::cfg_exit_type, C>::value,
                "holdfast: a termination config needs a member type exit_type");
  static_assert(detail::detect<detail::cfg_start_stop, C>::value,
                "holdfast: a termination config needs start() and stop()");
  static_assert(detail::detect<detail::cfg_notice, C>::value,
                "holdfast: a termination config needs noticed(), noticed_at() and "
                "announced_deadline()");
  static_assert(detail::detect<detail::cfg_grace, C>::value,
                "holdfast: a termination config needs grace_period() (milliseconds)");
  static_assert(detail::detect<detail::cfg_save_override, C>::value,
                "holdfast: a termination config needs has_save_override() and save_override()");
  static_assert(detail::detect<detail::cfg_exit, C>::value,
                "holdfast: a termination config needs exit(const exit_context&)");
  return true;
}

/// The preemption checkpoint handler; see the top of handler.hpp.
template <class Config, class Kv, class Checkpointer = checkpoint_manager<>,
          class Clock = std::chrono::steady_clock>
class preemption_handler {
  static_assert(check_coordination_store<Kv>());
  static_assert(check_checkpointer<Checkpointer>());
  static_assert(check_termination_config<Config>());

 public:
  using config_type = Config;                          ///< the termination config
  using kv_type = Kv;                                  ///< the coordination store
  using checkpointer_type = Checkpointer;              ///< saves and restores
  using clock = Clock;                                 ///< the clock of step times and deadlines
  using agreement_type = basic_step_agreement<Clock>;  ///< the protocol

  /// Restores from `checkpointer`, resumes the run counter, starts the notice and the watcher.
  preemption_handler(Config config, Kv kv, cluster_info cluster, Checkpointer checkpointer,
                     handler_options options = {})
      : config_(std::move(config)),
        kv_(std::move(kv)),
        evented_(has_kv_watch_v<Kv> && kv_supports(kv_, kv_op::watch)),
        batched_acks_(kv_supports(kv_, kv_op::get_many)),
        cluster_(std::move(cluster)),
        checkpointer_(std::move(checkpointer)),
        options_(options),
        scope_("holdfast/" + checked_run_id(cluster_.run_id) + "/"),
        error_key_(agreement_key_name(scope_, agreement_key::error, 0)),
        machine_(machine_config(cluster_, config_, options_)) {
    restored_ = restore();
    word_.store(static_cast<std::uint64_t>(restored_.value_or(0)) << 1);
    if constexpr (detail::can_set_waker_v<Config>) config_.set_waker(&waker_);
    config_.start();
    notice_started_ = true;
    ctl_.prefix = agreement_control_prefix(scope_);
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
    if (word_.load(std::memory_order_relaxed) & attention_bit) {
      st = consult();
      if (st == run_status::stopped) return st;
    }
    try {
      std::invoke(std::forward<F>(step), std::forward<Args>(args)...);
    } catch (...) {
      publish_error();
      throw;
    }
    stamp();
    word_.fetch_add(counter_one, std::memory_order_relaxed);
    return st;
  }

  /// For loops that run several steps per call: counts one call, checks for an agreed
  /// checkpoint, and keeps the step-time estimate (the interval between calls).
  run_status save_checkpoint_if_preempted() {
    stamp();
    run_status st = run_status::ran;
    if (word_.load(std::memory_order_relaxed) & attention_bit) {
      st = consult();
      if (st == run_status::stopped) return st;
    }
    word_.fetch_add(counter_one, std::memory_order_relaxed);
    return st;
  }

  /// Steps run so far, including those restored from the checkpoint.
  std::int64_t total_run_calls() const noexcept {
    return static_cast<std::int64_t>(word_.load(std::memory_order_relaxed) >> 1);
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

  /// Stops the watcher and the notice policy; the handler then only runs steps. Idempotent.
  void shutdown() noexcept {
    stop_watcher();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      machine_.on_stop();
    }
    word_.fetch_and(~attention_bit, std::memory_order_relaxed);
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

  template <class K, bool = has_kv_watch_v<K>>
  struct watch_of {
    using type = char;
  };
  template <class K>
  struct watch_of<K, true> {
    using type = detail::kv_watch_t<K>;
  };

  // A watch on the keys below `prefix` and the values it brought (see await_watches).
  struct followed {
    using watch_type = typename watch_of<Kv>::type;
    std::string prefix;
    std::optional<watch_type> watch;
    std::map<std::string, std::optional<std::string>> seen;
    std::set<std::string> stale;  // keys a lost insert proved present, not yet read
    bool complete = false;        // `seen` holds every key (the watch's snapshot)

    bool covers(const std::string& key) const {
      return key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
             key[prefix.size()] == '/';
    }
    void open(Kv& kv, const std::string& p) {
      close();
      watch.emplace(kv.watch(p));
      prefix = p;
    }
    void close() {
      watch.reset();
      forget(false);
    }
    // The key whose appearance matters now: a watch that waits on named keys wakes on it.
    void follow(const std::string& key) {
      if constexpr (has_kv_watch_follow_v<watch_type>) {
        if (watch) watch->follow(key);
      } else {
        static_cast<void>(key);
      }
    }
    void forget(bool now_complete) {
      seen.clear();
      stale.clear();
      complete = now_complete;
    }
    void apply(kv_changes changes) {
      if (changes.complete || changes.resync || seen.size() > 256)
        forget(changes.complete);  // 256: a bound; forgetting costs reads, never correctness
      if (!changes.resync)
        for (auto& e : changes.events) seen[e.key] = std::move(e.value);
    }
  };

  // word_ = run counter << 1 | attention. The training thread adds counter_one per step (an
  // atomic add, so a concurrent fetch_or of the watcher is never lost); the watcher raises
  // attention with fetch_or, which also reads the counter at that instant: the training thread
  // then sees the bit at its next step boundary at the latest, so the counter the watcher
  // publishes in its ack is never more than one step behind.
  static constexpr std::uint64_t attention_bit = 1;
  static constexpr std::uint64_t counter_one = 2;

  static const std::string& checked_run_id(const std::string& id) {
    if (id.empty() || id.find('/') != std::string::npos || !is_valid_key(id))
      throw error(EINVAL, "preemption_handler", id, "run id must be one key segment");
    return id;
  }

  static typename agreement_type::config machine_config(const cluster_info& c, const Config& cfg,
                                                        const handler_options& o) {
    typename agreement_type::config m;
    m.task = c.task;
    m.num_tasks = c.num_tasks;
    m.grace = std::chrono::duration_cast<typename Clock::duration>(cfg.grace_period());
    m.ack_timeout = std::chrono::duration_cast<typename Clock::duration>(o.ack_timeout);
    m.exit_after_save = !detail::is_no_exit_v<Config>;
    m.grace_margin = std::chrono::duration_cast<typename Clock::duration>(o.grace_margin);
    m.nonce = make_nonce();
    return m;
  }

  // 64 random bits in hex: tells this handler's values from a restarted process's.
  static std::string make_nonce() {
    std::random_device rd;
    const std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd();
    static constexpr char hex[] = "0123456789abcdef";
    std::string n(16, '0');
    for (int i = 0; i < 16; ++i) n[static_cast<std::size_t>(i)] = hex[(r >> (4 * i)) & 15];
    return n;
  }

  // One clock read per step: the interval since the previous one counts as a step time, unless
  // the protocol held the step up in between (consult() clears stamped_).
  void stamp() noexcept {
    const auto t = Clock::now();
    if (stamped_) {
      step_time_sum_ += t - last_stamp_;
      ++steps_timed_;
    }
    last_stamp_ = t;
    stamped_ = true;
  }

  void raise_attention_locked() noexcept {
    if (machine_.needs_attention()) word_.fetch_or(attention_bit, std::memory_order_relaxed);
  }

  // The training thread's slow path: ask the machine; wait while it says so (the watcher is
  // agreeing); save and maybe exit when it says so.
  run_status consult() {
    word_.fetch_and(~attention_bit, std::memory_order_relaxed);
    const auto started = Clock::now();
    const std::int64_t counter = total_run_calls();
    std::unique_lock<std::mutex> lock(mutex_);
    bool held = false;  // this boundary waited or saved: not a step time, but overhead
    instruction in;
    // Wait until the watcher has the round's recorded outcome (it alone reads and records it,
    // within the round's deadline and its retries): this thread never decides on its own.
    for (;;) {
      in = machine_.decide(counter, Clock::now(), mean_step_time());
      if (in.action != agreement_action::wait) break;
      held = true;
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
        raise();
      case agreement_action::save_then_continue:
        lock.unlock();
        save(in.step);
        overhead_ += Clock::now() - started;  // the final claim leaves room for as much again
        lock.lock();
        // + one watch interval where the watcher may be in a blocking get when the final claim
        // is due (a store without a watch); with a watch, the waker wakes it at once
        machine_.note_overhead(overhead_ +
                               (evented_ ? typename Clock::duration{}
                                         : std::chrono::duration_cast<typename Clock::duration>(
                                               options_.watch_interval)));
        held = false;
        stamped_ = false;
        st = run_status::saved;
        break;
      case agreement_action::save:  // no exit: the machine re-armed itself
        lock.unlock();
        save(in.step);
        lock.lock();
        st = run_status::stopped;
        break;
      case agreement_action::save_then_exit:
        lock.unlock();
        save(in.step);
        exit_process();  // returns only when the Exit policy did not end the process
        lock.lock();
        machine_.rearm();
        st = run_status::stopped;
        break;
    }
    if (held) {
      overhead_ += Clock::now() - started;
      stamped_ = false;
    }
    if (st == run_status::stopped) {
      overhead_ = {};
      stamped_ = false;
    }
    raise_attention_locked();
    wake_watcher();
    return st;
  }

  [[noreturn]] void raise() {
    const agreement_failure_info& f = machine_.failure();
    if (f.kind == agreement_failure::timeout)
      throw agreement_timeout(agreement_key_name(scope_, f.key, f.round), f.missing_tasks);
    if (f.kind == agreement_failure::unreachable)
      throw agreement_unreachable(agreement_key_name(scope_, f.key, f.round), f.message);
    throw peer_error(f.task, f.type_name, f.message);
  }

  void save(std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    finish_saves();  // an async periodic save in flight never races the preemption save
    if (config_.has_save_override())
      config_.save_override()(step);
    else
      checkpointer_.save(step);
    last_save_duration_ = std::chrono::steady_clock::now() - t0;
  }

  // Waits for the Checkpointer's background save, when it has one (wait_until_finished()).
  void finish_saves() {
    if constexpr (detail::detect<detail::ckpt_wait, Checkpointer>::value)
      checkpointer_.wait_until_finished();
  }

  void exit_process() {
    using exit_type = typename Config::exit_type;
    // The watcher is asked to stop (not joined: it may be inside a store call for up to one
    // watch interval, and the exit should not wait for it); it touches only this handler, which
    // outlives any exit. If the Exit policy returns (no_exit semantics), join and restart it.
    // The notice stays started: a second SIGTERM must not kill the process before the Exit
    // policy runs.
    request_watcher_stop();
    finish_saves();  // the preemption save is on disk before the process ends
    config_.exit(exit_context{config_.noticed_at(), last_save_duration_});
    if constexpr (exit_returns<exit_type>::value) {
      stop_watcher();
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

  // ---- the watcher thread ----------------------------------------------------------------------

  void start_watcher() {
    stop_.store(false);
    watcher_ = std::thread([this] { watch(); });
  }

  void request_watcher_stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true);
    }
    wake_watcher();
  }

  // Wakes the watcher wherever it sleeps: a pause (watch_cv_) or poll() on the waker.
  void wake_watcher() noexcept {
    watch_cv_.notify_all();
    waker_.notify();
  }

  void stop_watcher() noexcept {
    request_watcher_stop();
    if (watcher_.joinable()) watcher_.join();
  }

  void watch() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_.load()) {
      lock.unlock();
      forward_notice();
      lock.lock();
      bool worked = false;
      try {
        worked = protocol_step(lock);
      } catch (const std::exception& e) {  // not a store error (those are fed to the machine)
        if (!lock.owns_lock()) lock.lock();
        machine_.on_store_failure(e.what());
        worked = true;
      }
      if (worked) {
        raise_attention_locked();
        train_cv_.notify_all();
        continue;
      }
      try {
        wait_for_trigger(lock);
      } catch (...) {
        // Watching failed (the store is unreachable for now): try again after a pause.
        if (!lock.owns_lock()) lock.lock();
        watch_cv_.wait_for(lock, options_.watch_interval, [&] { return stop_.load(); });
      }
    }
  }

  // Performs the machine's next store operation, if it has one (lock held on entry and exit,
  // released around the store call), retrying transient failures until the machine's retry
  // deadline; a call that fails for good is reported with on_store_failure. Returns false when
  // there was nothing to do.
  bool protocol_step(std::unique_lock<std::mutex>& lock) {
    std::int64_t counter = 0;
    if (machine_.wants_counter())  // the ack: raise attention and read the counter at once
      counter =
          static_cast<std::int64_t>(word_.fetch_or(attention_bit, std::memory_order_relaxed) >> 1);
    instruction in = machine_.protocol_next(counter, Clock::now());
    if (in.kind == op::decide) return false;
    const std::string key = agreement_key_name(scope_, in.key, in.round, in.task);
    const time_point until = machine_.retry_deadline();
    // The claimant waiting for an ack also looks at the outcome key (a step recorded past the
    // deadline by a peer, an abort after a peer's error).
    const std::string outcome = machine_.collecting()
                                    ? agreement_key_name(scope_, machine_.outcome_key(), in.round)
                                    : std::string();
    lock.unlock();
    try {
      switch (in.kind) {
        case op::insert: {
          bool created = insert_once(key, in.value, until);
          if (evented_) {  // what this worker knows now; a lost insert: read it again
            if (created) {
              ctl_.seen[key] = in.value;
            } else {  // it exists, and its event may not have come yet: read it
              ctl_.seen.erase(key);
              ctl_.stale.insert(key);
            }
          }
          lock.lock();
          machine_.on_insert(created);
          break;
        }
        case op::put:
          retrying([&] { kv_.put(key, in.value); }, until);
          lock.lock();
          machine_.on_put();
          break;
        case op::try_get: {
          auto v = retrying([&] { return kv_.try_get(key); }, until);
          lock.lock();
          machine_.on_value(v);
          break;
        }
        case op::wait: {
          std::optional<std::string> outcome_value;
          auto v = wait_for_key(key, in.deadline, outcome, outcome_value);
          lock.lock();
          if (stop_.load()) return true;  // abandoned: shutting down
          if (outcome_value)
            machine_.on_outcome_seen(*outcome_value);
          else
            machine_.on_value(v);
          break;
        }
        case op::erase:  // cleanup: best effort, never fails the round
          erase_quietly(key);
          lock.lock();
          break;
        case op::list: {
          auto v = retrying([&] { return list_acks(key); }, until);
          lock.lock();
          machine_.on_list(v);
          break;
        }
        case op::decide:
          lock.lock();
          break;
      }
    } catch (const std::exception& e) {
      if (!lock.owns_lock()) lock.lock();
      if (!stop_.load()) machine_.on_store_failure(e.what());
    }
    return true;
  }

  // The acks under `prefix` (which ends with '/'): one list where the store can list, else one
  // try_get per task (a store with c10d's operations only).
  kv_pairs list_acks(const std::string& prefix) {
    if constexpr (has_kv_list_v<Kv>) {
      if (can_list()) return kv_.list(prefix);
    }
    kv_pairs out;
    for (int t = 0; t < cluster_.num_tasks; ++t) {
      std::string key = prefix + std::to_string(t);
      if (auto v = kv_.try_get(key)) out.emplace_back(std::move(key), std::move(*v));
    }
    return out;
  }
  void erase_quietly(const std::string& key) noexcept {
    if constexpr (has_kv_erase_v<Kv>) {
      try {
        if (kv_supports(kv_, kv_op::erase)) kv_.erase(key);
      } catch (...) {
      }
    } else {
      (void)key;
    }
  }
  bool can_list() const { return kv_supports(kv_, kv_op::list); }

  // Calls `fn` until it returns, retrying transient store errors (is_transient_kv_error) with
  // backoff (5 ms, doubling up to 200 ms) until `deadline`; then, or for any other error, the
  // error is thrown. A stop request ends the retries at once.
  template <class F>
  auto retrying(F&& fn, time_point deadline) -> decltype(fn()) {
    std::chrono::milliseconds backoff(5);
    for (;;) {
      try {
        return fn();
      } catch (const std::exception& e) {
        if (!is_transient_kv_error(e) || stop_.load() || Clock::now() >= deadline) throw;
      }
      // the last attempt is made at the deadline
      const auto pause = std::min<typename Clock::duration>(backoff, deadline - Clock::now());
      std::unique_lock<std::mutex> lock(mutex_);
      watch_cv_.wait_for(lock, pause, [&] { return stop_.load(); });
      backoff = std::min(2 * backoff, std::chrono::milliseconds(200));
    }
  }

  // Insert-once that stays exactly-once across retries: an attempt that failed may have been
  // applied (a timed-out write), so a retry first reads the key; `value` names its writer
  // (task and nonce), so finding it means this handler created the key.
  bool insert_once(const std::string& key, const std::string& value, time_point deadline) {
    bool maybe_applied = false;
    return retrying(
        [&] {
          if (maybe_applied)
            if (auto current = kv_.try_get(key)) return *current == value;
          maybe_applied = true;
          return kv_.insert(key, value);
        },
        deadline);
  }

  // Waits until `key` holds a value or `deadline` passes; transient store errors are retried
  // until the deadline. With `also` (a key name: the claimant waiting for an ack also looks at
  // the round's outcome), the wait ends early when `also` holds a value, stored in `also_value`.
  // The claimant's acks come in batches where the store has a native get_many, else through a
  // watch on the round's acks where the store is evented, else from blocking gets; a control key
  // comes with the control watch where the store is evented.
  std::optional<std::string> wait_for_key(const std::string& key, time_point deadline,
                                          const std::string& also,
                                          std::optional<std::string>& also_value) {
    if (!also.empty() && batched_acks_) return collect_ack(key, deadline, also, also_value);
    if (evented_ && (ctl_.covers(key) || !also.empty()))
      return watch_for_key(key, deadline, also, also_value);
    return get_in_slices(key, deadline, also, also_value);
  }

  // wait_for_key with blocking gets of one watch_interval each, so a shutdown is never held up
  // longer than one; each slice that ends empty-handed also reads `also`.
  std::optional<std::string> get_in_slices(const std::string& key, time_point deadline,
                                           const std::string& also,
                                           std::optional<std::string>& also_value) {
    for (;;) {
      auto left = std::max<typename Clock::duration>(deadline - Clock::now(), {});
      auto slice = std::min<std::chrono::milliseconds>(
          std::chrono::ceil<std::chrono::milliseconds>(left), options_.watch_interval);
      auto v = retrying([&] { return kv_.get(key, slice); }, deadline);
      if (v || stop_.load() || Clock::now() >= deadline) return v;
      if (!also.empty()) {
        also_value = retrying([&] { return kv_.try_get(also); }, deadline);
        if (also_value) return std::nullopt;
      }
    }
  }

  // wait_for_key on the watches: a control key comes with the control watch; an ack the
  // claimant collects, with a watch on the round's acks (opened at its first ack wait, closed
  // once the watcher is idle): no request while waiting, however many acks are late. Before
  // each sleep the watches follow the keys waited for (a store that waits on named keys).
  std::optional<std::string> watch_for_key(const std::string& key, time_point deadline,
                                           const std::string& also,
                                           std::optional<std::string>& also_value) {
    if constexpr (can_watch) {
      const bool control = ctl_.covers(key);
      if (!control) {
        const std::string prefix = key.substr(0, key.rfind('/'));
        if (acks_.prefix != prefix || !acks_.watch)
          retrying([&] { acks_.open(kv_, prefix); }, deadline);
      }
      followed& f = control ? ctl_ : acks_;
      retrying([&] { await_watches(Clock::now()); }, deadline);  // what arrived already
      for (;;) {
        auto v = retrying([&] { return value_of(f, key); }, deadline);
        if (v || stop_.load()) return v;
        if (!control) {
          also_value = retrying([&] { return value_of(ctl_, also); }, deadline);
          if (also_value) return std::nullopt;
        }
        if (Clock::now() >= deadline)  // the last word is the store's, not the watch's
          return retrying([&] { return kv_.try_get(key); }, deadline);
        f.follow(key);
        if (!control) ctl_.follow(also);
        retrying([&] { await_watches(deadline); }, deadline);
      }
    }
    return std::nullopt;
  }

  // ---- the claimant's acks in batches (a store with a native get_many) -----------------------
  //
  // The machine asks for the acks one task at a time (a wait each, until the round's deadline).
  // A store that reads many keys in one wait answers them together: one get_many over every ack
  // of the round not read yet, in slices of min(time left, max(watch_interval, 1 s)), between
  // which the outcome key is read (a peer may have recorded the outcome, or aborted). What a
  // batch read serves the round's later waits. An ack not read by a batch that ended at or past
  // the deadline is missing, as a blocking get's would be.

  struct ack_batch {
    std::string prefix;                          // ".../ack/r<N>/": the round and the phase
    std::map<std::string, std::string> present;  // the acks read so far
    bool final = false;  // a batch ended at or past the deadline: what it lacked is missing
  };

  std::optional<std::string> collect_ack(const std::string& key, time_point deadline,
                                         const std::string& also,
                                         std::optional<std::string>& also_value) {
    const std::string prefix = key.substr(0, key.rfind('/') + 1);
    if (acks_read_.prefix != prefix) acks_read_ = ack_batch{prefix, {}, false};
    for (;;) {
      if (auto it = acks_read_.present.find(key); it != acks_read_.present.end()) return it->second;
      if (acks_read_.final || stop_.load()) return std::nullopt;
      read_acks(deadline);
      if (acks_read_.present.count(key) || acks_read_.final) continue;
      also_value = retrying([&] { return kv_.try_get(also); }, deadline);
      if (also_value) return std::nullopt;
    }
  }

  // One get_many over the round's acks not read yet, for one slice (at most until `deadline`).
  void read_acks(time_point deadline) {
    std::vector<std::string> keys;
    for (int t = 0; t < cluster_.num_tasks; ++t) {
      std::string k = acks_read_.prefix + std::to_string(t);
      if (!acks_read_.present.count(k)) keys.push_back(std::move(k));
    }
    using ms = std::chrono::milliseconds;
    const ms left =
        std::chrono::ceil<ms>(std::max<typename Clock::duration>(deadline - Clock::now(), {}));
    const ms slice = std::min(left, std::max<ms>(options_.watch_interval, std::chrono::seconds(1)));
    auto values = retrying([&] { return holdfast::get_many(kv_, keys, slice); }, deadline);
    for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i)
      if (values[i]) acks_read_.present.emplace(keys[i], std::move(*values[i]));
    if (Clock::now() >= deadline) acks_read_.final = true;
  }

  // ---- waiting for a trigger ------------------------------------------------------------------

  // What a wait for a trigger saw.
  struct trigger_seen {
    std::optional<std::string> value;  // the trigger key's value (a claim or final claim)
    std::optional<std::string> error;  // the error key's payload
  };

  // Blocks for one slice on the key that can start or end an agreement now (a claim, a final
  // claim, or the error key), and feeds what it saw to the machine.
  void wait_for_trigger(std::unique_lock<std::mutex>& lock) {
    const std::uint64_t round = machine_.round();
    const std::optional<agreement_key> trigger = machine_.watch_key();
    std::string key;
    if (trigger)
      key = agreement_key_name(scope_, *trigger, round);
    else if (!error_seen_)
      key = error_key_;
    trigger_seen seen;
    if (evented_) {
      const bool watch_error = !error_seen_;
      lock.unlock();
      seen = watch_for_trigger(key, trigger.has_value(), watch_error);
    } else {
      if (key.empty()) {
        watch_cv_.wait_for(lock, options_.watch_interval);
        return;
      }
      lock.unlock();
      seen = get_trigger(key, trigger.has_value());
    }
    lock.lock();
    if (seen.error) {
      error_seen_ = true;
      machine_.on_error_seen(*seen.error);
    } else if (seen.value && *trigger == agreement_key::claim) {
      machine_.on_claim_seen(round);
    } else if (seen.value && *trigger == agreement_key::final_claim) {
      machine_.on_final_seen(round);
    }
    if (seen.value || seen.error) {
      raise_attention_locked();
      train_cv_.notify_all();
    }
  }

  // What `v`, the value of the key waited for, means: the error payload when that key is the
  // error key (no `trigger`), or when it is an abort (then `read_error` reads the error key);
  // else the trigger's value.
  template <class ReadError>
  static trigger_seen classify_trigger(std::optional<std::string> v, bool trigger,
                                       ReadError read_error) {
    trigger_seen seen;
    if (v && !trigger)
      seen.error = std::move(v);
    else if (v && is_abort(*v))
      seen.error = read_error().value_or(std::string());
    else
      seen.value = std::move(v);
    return seen;
  }

  // The trigger wait over a store without a watch: one blocking get of one watch_interval.
  trigger_seen get_trigger(const std::string& key, bool trigger) {
    return classify_trigger(kv_.get(key, options_.watch_interval), trigger,
                            [&] { return kv_.try_get(error_key_); });
  }

  // The trigger wait on the control watch: what the watch knows of `key` (and of the error key
  // while `watch_error`), else one sleep in await_watches, following `key`, and a look again.
  trigger_seen watch_for_trigger(const std::string& key, bool trigger, bool watch_error) {
    if constexpr (can_watch) {
      // Idle: the round's acks are collected. Closing an inotify descriptor can take the
      // kernel tens of milliseconds, so it is done here, not before the outcome is recorded.
      acks_.close();
      std::optional<std::string> v, error_payload;
      auto look = [&] {
        if (!key.empty()) v = value_of(ctl_, key);
        if (watch_error && !v) error_payload = value_of(ctl_, error_key_);
        return v || error_payload;
      };
      if (!look()) {
        open_control();
        if (!key.empty()) ctl_.follow(key);
        await_watches(time_point::max());
        look();
      }
      if (error_payload) return trigger_seen{std::nullopt, std::move(error_payload)};
      return classify_trigger(std::move(v), trigger, [&] { return value_of(ctl_, error_key_); });
    }
    return {};
  }

  // ---- the watches (stores that can be waited on: has_kv_watch_v) ----------------------------
  //
  // One watch on ctl/ for the watcher's life, and the claimant's watch on one round's acks
  // while it collects them. Each `followed` holds the values its watch brought (nullopt: erased
  // or read absent); a key not among them is read once with try_get, unless the watch gave a
  // complete snapshot (etcd): then it is absent, no read. A resync (a store that only knows
  // something changed, a watch that follows named keys, a resumed watch that may have missed
  // events) forgets them, so each is read again. Whether the store is waited on is asked once,
  // at construction (evented_: kv_supports(kv, kv_op::watch), so an any_kv holding an etcd_kv
  // is); the code exists only where the type has a watch (can_watch).

  static constexpr bool can_watch = has_kv_watch_v<Kv>;

  std::optional<std::string> value_of(followed& f, const std::string& key) {
    if (auto it = f.seen.find(key); it != f.seen.end()) return it->second;
    if (f.complete && !f.stale.count(key)) return std::nullopt;  // absent, the watch says
    f.stale.erase(key);
    auto v = kv_.try_get(key);
    f.seen[key] = v;
    return v;
  }

  // Opens the control watch (ctl/) unless it is open.
  void open_control() {
    if constexpr (can_watch) {
      if (!ctl_.watch) ctl_.open(kv_, ctl_.prefix);
    }
  }

  // Sleeps in one poll() on the waker and the open watches until one is readable, a watch's
  // due time, or `until` (Clock::now() to only take what is there); when the notices cannot
  // wake the waker, at most one watch_interval. Then takes the watches' changes.
  void await_watches(time_point until) {
    if constexpr (can_watch) {
      open_control();
      followed* open[2] = {&ctl_, acks_.watch ? &acks_ : nullptr};
      const int watches = open[1] ? 2 : 1;
      bool buffered = false;
      using ms = std::chrono::milliseconds;
      auto left = [](auto d) { return std::chrono::ceil<ms>(std::max(d, decltype(d)::zero())); };
      ms timeout = ms::max();
      if (until != time_point::max()) timeout = left(until - Clock::now());
      if constexpr (!has_notice_waker_v<Config>)
        timeout = std::min(timeout, options_.watch_interval);
      pollfd fds[3] = {{waker_.fd(), POLLIN, 0}, {-1, POLLIN, 0}, {-1, POLLIN, 0}};
      for (int i = 0; i < watches; ++i) {
        auto& w = *open[i]->watch;
        buffered = buffered || w.buffered();
        fds[i + 1].fd = w.fd();  // -1: poll() ignores it
        if (w.due() != std::chrono::steady_clock::time_point::max())
          timeout = std::min(timeout, left(w.due() - std::chrono::steady_clock::now()));
      }
      if (!buffered) {
        const int t = timeout == ms::max()
                          ? -1
                          : static_cast<int>(std::min<ms::rep>(timeout.count(), 1 << 30));
        ::poll(fds, static_cast<nfds_t>(1 + watches), t);  // EINTR: the loop around looks again
      }
      waker_.drain();
      for (int i = 0; i < watches; ++i) open[i]->apply(open[i]->watch->take());
    } else {
      (void)until;
    }
  }

  static bool is_abort(const std::string& value) {
    auto v = parse_agreement_value(value);
    return v && v->what == agreement_value::kind::abort;
  }

  // ---- the restore agreement (construction) ----------------------------------------------------

  std::optional<std::int64_t> restore() {
    if constexpr (has_step_restore_v<Checkpointer>) {
      if (options_.agree_on_restore) return agree_on_restore();
    }
    return checkpointer_.restore();
  }

  // Every task publishes the steps it holds (restore/have/<task>); each reads all N lists,
  // waiting until ack_timeout, and proposes the newest common step ("none" when there is none,
  // a timeout naming the tasks with no list); insert-once on restore/step records the first
  // proposal and every task follows it.
  std::optional<std::int64_t> agree_on_restore() {
    const std::string have = scope_ + "restore/have/";
    const std::string outcome_key = scope_ + "restore/step";
    const time_point deadline = Clock::now() + options_.ack_timeout;
    const time_point recording = deadline + options_.ack_timeout;
    std::vector<std::vector<std::int64_t>> lists;
    std::vector<int> missing;
    try {
      const std::string mine = format_step_list(checkpointer_.all_steps());
      retrying([&] { kv_.put(have + std::to_string(cluster_.task), mine); }, deadline);
      for (int t = 0; t < cluster_.num_tasks; ++t) {
        const std::string key = have + std::to_string(t);
        auto left = std::chrono::ceil<std::chrono::milliseconds>(
            std::max<typename Clock::duration>(deadline - Clock::now(), {}));
        auto v = retrying([&] { return kv_.get(key, left); }, deadline);
        if (!v) {
          missing.push_back(t);
        } else if (auto steps = parse_step_list(*v)) {
          lists.push_back(std::move(*steps));
        } else {
          throw format_error(key, "not a step list: '" + *v + "'");
        }
      }
    } catch (const std::exception& e) {
      if (dynamic_cast<const format_error*>(&e) || !is_transient_kv_error(e)) throw;
      // the store failed until the deadline: record what this task knows (a timeout)
      if (missing.empty()) missing.push_back(cluster_.task);
    }
    std::optional<std::int64_t> common = newest_common_step(lists);
    std::string proposal = !missing.empty()
                               ? machine_.value_text(agreement_value::kind::timeout, -1, missing)
                           : common ? machine_.value_text(agreement_value::kind::step, *common)
                                    : machine_.value_text(agreement_value::kind::none);
    std::optional<agreement_value> decided;
    try {
      bool created = insert_once(outcome_key, proposal, recording);
      auto text = created ? std::optional<std::string>(proposal)
                          : retrying([&] { return kv_.try_get(outcome_key); }, recording);
      decided = parse_agreement_value(text.value_or(std::string()));
      if (!decided) throw format_error(outcome_key, "not an outcome: '" + text.value_or("") + "'");
    } catch (const format_error&) {
      throw;
    } catch (const std::exception& e) {
      throw agreement_unreachable(outcome_key, e.what());
    }
    return follow_restore(*decided, outcome_key);
  }

  std::optional<std::int64_t> follow_restore(const agreement_value& v, const std::string& key) {
    std::optional<std::int64_t> step;
    switch (v.what) {
      case agreement_value::kind::step:
        checkpointer_.restore_step(v.step);
        step = v.step;
        break;
      case agreement_value::kind::none:
        break;
      case agreement_value::kind::timeout:
        throw agreement_timeout(key, v.tasks);
      default:
        throw format_error(key, "not a restore outcome: '" + format_agreement_value(v) + "'");
    }
    if constexpr (detail::detect<detail::ckpt_pin, Checkpointer>::value) checkpointer_.pin(step);
    return step;
  }

  // Feeds a new notice to the machine.
  void forward_notice() {
    if (!config_.noticed()) return;
    auto at = config_.noticed_at();
    if (!at || (last_notice_ && *last_notice_ == *at)) return;
    last_notice_ = *at;
    std::optional<time_point> deadline;
    if (auto d = config_.announced_deadline()) deadline = detail::to_clock<Clock>(*d);
    std::lock_guard<std::mutex> lock(mutex_);
    machine_.on_notice(detail::to_clock<Clock>(*at), deadline);
    raise_attention_locked();
  }

  Config config_;
  Kv kv_;
  const bool evented_;       // waits on the store's watches (see await_watches)
  const bool batched_acks_;  // the claimant reads the acks with get_many (see collect_ack)
  cluster_info cluster_;
  Checkpointer checkpointer_;
  handler_options options_;
  std::string scope_;
  std::string error_key_;
  std::optional<std::int64_t> restored_;
  bool notice_started_ = false;

  // training thread only
  std::uint64_t steps_timed_ = 0;
  typename Clock::duration step_time_sum_{};
  time_point last_stamp_{};
  bool stamped_ = false;
  std::chrono::nanoseconds last_save_duration_{0};
  typename Clock::duration overhead_{};  // waiting + saving in this round's first phase

  std::atomic<std::uint64_t> word_{0};  // run counter << 1 | attention
  mutable std::mutex mutex_;            // guards machine_ and error_seen_
  agreement_type machine_;
  bool error_seen_ = false;
  std::condition_variable watch_cv_;  // wakes the watcher (work, stop)
  std::condition_variable train_cv_;  // wakes a training thread waiting for the step
  std::atomic<bool> stop_{false};
  std::optional<std::chrono::steady_clock::time_point> last_notice_;  // watcher thread only
  detail::waker waker_;  // notices, stop requests and the training thread wake the watcher
  followed ctl_;         // ctl/, for the watcher's life (watcher thread only)
  followed acks_;        // the claimant's: one round's acks while it collects (watcher thread only)
  ack_batch acks_read_;  // the claimant's acks read by get_many (watcher thread only)
  std::thread watcher_;
};

HOLDFAST_NAMESPACE_END
