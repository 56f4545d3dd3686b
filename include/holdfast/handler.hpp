// holdfast/handler.hpp — the preemption checkpoint handler: wraps each training step so that when
// any worker of a job is told its machine is going away, every worker checkpoints at one agreed
// step and exits (or, with a grace period, keeps training and checkpoints once more before the
// deadline), and a restarted job resumes exactly where it stopped.
//
//   holdfast::preemption_handler<holdfast::generic, holdfast::filesystem_kv> h(
//       holdfast::generic{}, kv, {task, num_tasks, "run-7"}, std::move(checkpoints));
//   while (h.total_run_calls() < steps) h.run(train_step, batch);
//
// It joins four policies: a termination Config (termination.hpp: where notices come from, how to
// exit, the grace period, an optional save override), a kv_store (kv.hpp) shared by the workers,
// a Checkpointer (`save(step)`, `restore()` → optional step; checkpoint_manager by default) and a
// Clock. The protocol itself is step_agreement (agreement.hpp); this file only drives it.
//
// Guarantees:
//   - Construction restores the latest checkpoint and resumes total_run_calls() from its step.
//   - Steady state (no notice, no claim): run() costs one relaxed atomic load plus one clock read
//     and two additions for the running mean of step time; no store traffic, no lock, no
//     allocation.
//   - One background thread per handler (the watcher): it forwards this worker's notice and
//     blocks on the one store key that can start or end an agreement (claim, final claim, or the
//     error key) in slices of `handler_options::watch_interval`. The destructor stops and joins
//     it; destruction is safe in every state, including after a failed agreement.
//   - Per agreement each worker makes a constant number of store operations (see agreement.hpp),
//     whatever the number of workers; waiting for the others is one blocking get with a deadline.
//   - A worker that never acks (dead without notice) makes the others throw
//     holdfast::agreement_timeout naming the missing task ids within `ack_timeout`, never hang.
//   - An exception from a step is published; every other worker throws holdfast::peer_error
//     (origin task, type name, message) from its next run(); the origin re-throws its own.
//   - Saving: the Config's save override when it has one (then the Checkpointer never saves),
//     else Checkpointer::save(step). Then the Exit policy runs; when it returns (no_exit) run()
//     returns run_status::stopped, the step is not run, and the handler is re-armed.
//   - Signal handlers are the notice policy's business; this file installs none.
// Caveats:
//   - run() and save_checkpoint_if_preempted() must be called from one thread.
//   - ack_timeout must exceed the longest step: a worker acks only at its next step boundary.
//   - A store failure during an agreement is thrown from run() and ends agreement for this
//     handler (it then trains on without protocol); construct a new one to try again.
//   - The step's return value is not forwarded: capture results in the step callable.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
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
  /// How long a worker waits for every other worker's ack (XLA's barrier: 3 minutes).
  std::chrono::milliseconds ack_timeout{std::chrono::minutes(3)};
  /// The watcher's slice: latency of noticing a notice, and of a stop at destruction.
  std::chrono::milliseconds watch_interval{100};
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
  static_assert(check_kv_store<Kv>());
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
        cluster_(std::move(cluster)),
        checkpointer_(std::move(checkpointer)),
        options_(options),
        scope_("holdfast/" + checked_run_id(cluster_.run_id) + "/"),
        error_key_(agreement_key_name(scope_, agreement_key::error, 0)),
        machine_(machine_config(cluster_, config_, options_)) {
    restored_ = checkpointer_.restore();
    counter_ = restored_.value_or(0);
    publish_watch_target();
    config_.start();
    notice_started_ = true;
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
    if (attention_.load(std::memory_order_relaxed)) {
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
    ++counter_;
    return st;
  }

  /// For loops that run several steps per call: counts one call, checks for an agreed
  /// checkpoint, and keeps the step-time estimate (the interval between calls).
  run_status save_checkpoint_if_preempted() {
    stamp();
    run_status st = run_status::ran;
    if (attention_.load(std::memory_order_relaxed)) {
      st = consult();
      if (st == run_status::stopped) return st;
    }
    ++counter_;
    return st;
  }

  /// Steps run so far, including those restored from the checkpoint.
  std::int64_t total_run_calls() const noexcept { return counter_; }
  /// The step restored at construction, if any.
  std::optional<std::int64_t> restored_step() const noexcept { return restored_; }
  /// The running mean of step time: the interval between consecutive steps (run() or
  /// save_checkpoint_if_preempted() calls), leaving out intervals that contained an agreement or
  /// a save. Zero before two steps.
  typename Clock::duration mean_step_time() const noexcept {
    return steps_timed_ ? step_time_sum_ / static_cast<typename Clock::rep>(steps_timed_)
                        : Clock::duration::zero();
  }
  /// The protocol's state (read from the training thread).
  agreement_state state() const noexcept { return machine_.state(); }
  /// The protocol (read from the training thread).
  const agreement_type& agreement() const noexcept { return machine_; }
  /// The checkpointer.
  Checkpointer& checkpointer() noexcept { return checkpointer_; }
  /// The termination config.
  Config& config() noexcept { return config_; }
  /// The store.
  Kv& kv() noexcept { return kv_; }
  /// The cluster info.
  const cluster_info& cluster() const noexcept { return cluster_; }
  /// The key prefix of this handler: "holdfast/<run_id>/".
  const std::string& key_scope() const noexcept { return scope_; }

  /// Stops the watcher and the notice policy; the handler then only runs steps. Idempotent.
  void shutdown() noexcept {
    stop_watcher();
    machine_.on_stop();
    attention_.store(false, std::memory_order_relaxed);
    if (notice_started_) {
      notice_started_ = false;
      config_.stop();
    }
  }

 private:
  using time_point = typename Clock::time_point;
  using instruction = typename agreement_type::instruction;
  using op = typename instruction::op;

  struct watch_target {
    std::uint64_t round = 0;
    std::optional<agreement_key> key;
    bool reported = false;
  };
  struct mailbox {
    std::optional<time_point> notice;
    std::optional<time_point> deadline;
    std::optional<std::pair<std::uint64_t, agreement_key>> trigger;
    std::optional<std::string> error;
  };

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
    return m;
  }

  // One clock read per step: the interval since the previous one counts as a step time, unless
  // the protocol worked in between (consult() clears stamped_).
  void stamp() noexcept {
    const auto t = Clock::now();
    if (stamped_) {
      step_time_sum_ += t - last_stamp_;
      ++steps_timed_;
    }
    last_stamp_ = t;
    stamped_ = true;
  }

  // The slow path: feed what the watcher saw, then ask the machine until it decides.
  run_status consult() {
    attention_.store(false, std::memory_order_relaxed);
    deliver_mailbox();
    const auto started = Clock::now();
    bool busy = false;  // this call talked to the store: its time counts as overhead
    run_status st = run_status::ran;
    for (;;) {
      instruction in = machine_.next(counter_, Clock::now(), mean_step_time());
      if (in.kind != op::decide) {
        perform(in);
        busy = true;
        continue;
      }
      switch (in.action) {
        case agreement_action::proceed:
          break;
        case agreement_action::save_then_continue:
          save(in.step);
          // What the first agreement and save cost: the final claim leaves room for as much.
          overhead_ += Clock::now() - started;
          machine_.note_overhead(overhead_);
          busy = false;
          st = run_status::saved;
          break;
        case agreement_action::save:  // no exit: the machine re-armed itself
          save(in.step);
          st = run_status::stopped;
          break;
        case agreement_action::save_then_exit:
          save(in.step);
          exit_process();  // returns only when the Exit policy did not end the process
          machine_.rearm();
          st = run_status::stopped;
          break;
        case agreement_action::fail:
          after_consult();
          raise();
      }
      break;
    }
    if (busy) overhead_ += Clock::now() - started;
    if (busy || st != run_status::ran) stamped_ = false;  // not a step time
    if (st == run_status::stopped) overhead_ = {};
    after_consult();
    return st;
  }

  void after_consult() {
    publish_watch_target();
    if (machine_.needs_attention()) attention_.store(true, std::memory_order_relaxed);
  }

  [[noreturn]] void raise() {
    const agreement_failure_info& f = machine_.failure();
    switch (f.kind) {
      case agreement_failure::timeout:
        throw agreement_timeout(agreement_key_name(scope_, f.key, f.round), f.missing_tasks);
      case agreement_failure::peer:
      case agreement_failure::local:
      case agreement_failure::none:
        break;
    }
    throw peer_error(f.task, f.type_name, f.message);
  }

  void perform(const instruction& in) {
    const std::string key = agreement_key_name(scope_, in.key, in.round, in.task);
    try {
      switch (in.kind) {
        case op::insert:
          machine_.on_insert(kv_.insert(key, in.value));
          break;
        case op::put:
          kv_.put(key, in.value);
          machine_.on_put();
          break;
        case op::try_get:
          machine_.on_value(kv_.try_get(key));
          break;
        case op::wait: {
          using dur = typename Clock::duration;
          dur left = std::max<dur>(in.deadline - Clock::now(), dur::zero());
          machine_.on_value(kv_.get(key, std::chrono::ceil<std::chrono::milliseconds>(left)));
          break;
        }
        case op::list:
          machine_.on_list(kv_.list(key));
          break;
        case op::decide:
          break;
      }
    } catch (...) {
      machine_.on_stop();  // the store failed mid-protocol: no half-done agreement goes on
      publish_watch_target();
      throw;
    }
  }

  void save(std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    if (config_.has_save_override())
      config_.save_override()(step);
    else
      checkpointer_.save(step);
    last_save_duration_ = std::chrono::steady_clock::now() - t0;
  }

  void exit_process() {
    using exit_type = typename Config::exit_type;
    // The watcher is asked to stop (not joined: it may be inside a store call for up to one
    // watch interval, and the exit should not wait for it); it touches only this handler, which
    // outlives any exit. If the Exit policy returns (no_exit semantics), join and restart it.
    // The notice stays started: a second SIGTERM must not kill the process before the Exit
    // policy runs.
    request_watcher_stop();
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
      machine_.on_local_error(detail::current_exception_type_name(),
                              detail::current_exception_message());
      for (;;) {
        instruction in = machine_.next(counter_, Clock::now(), mean_step_time());
        if (in.kind == op::decide) break;
        const std::string key = agreement_key_name(scope_, in.key, in.round, in.task);
        try {
          (void)kv_.insert(key, in.value);
        } catch (...) {
        }
      }
      after_consult();
    } catch (...) {
    }
  }

  void deliver_mailbox() {
    mailbox m;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      m = std::move(mailbox_);
      mailbox_ = mailbox{};
    }
    if (m.error) machine_.on_error_seen(*m.error);
    if (m.notice) machine_.on_notice(*m.notice, m.deadline);
    if (m.trigger) {
      if (m.trigger->second == agreement_key::claim) machine_.on_claim_seen(m.trigger->first);
      if (m.trigger->second == agreement_key::final_claim) machine_.on_final_seen(m.trigger->first);
    }
  }

  void publish_watch_target() {
    std::lock_guard<std::mutex> lock(mutex_);
    auto key = machine_.watch_key();
    if (target_.round != machine_.round() || target_.key != key) {
      target_.round = machine_.round();
      target_.key = key;
      target_.reported = false;
    }
    cv_.notify_all();
  }

  // ---- the watcher thread ----------------------------------------------------------------------

  void start_watcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = false;
    }
    watcher_ = std::thread([this] { watch(); });
  }

  void request_watcher_stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
  }

  void stop_watcher() noexcept {
    request_watcher_stop();
    if (watcher_.joinable()) watcher_.join();
  }

  void watch() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      watch_target t = target_;
      bool want_error = !error_seen_;
      lock.unlock();
      if (forward_notice()) attention_.store(true, std::memory_order_relaxed);
      bool news = false;
      std::string key;
      bool is_error_key = false;
      if (t.key && !t.reported) {
        key = agreement_key_name(scope_, *t.key, t.round);
      } else if (want_error) {
        key = error_key_;
        is_error_key = true;
      }
      std::optional<std::string> value;
      std::optional<std::string> error_value;
      bool failed = false;
      if (!key.empty()) {
        try {
          value = kv_.get(key, options_.watch_interval);
          if (value && !is_error_key && *value == agreement_type::abort_value)
            error_value = kv_.try_get(error_key_).value_or(std::string());
        } catch (...) {
          failed = true;  // the store is down: try again after a slice
        }
      }
      lock.lock();
      if (value) {
        if (is_error_key) {
          mailbox_.error = *value;
          error_seen_ = true;
        } else if (error_value) {
          mailbox_.error = *error_value;
          error_seen_ = true;
        } else if (target_.round == t.round && target_.key == t.key) {
          mailbox_.trigger = std::make_pair(t.round, *t.key);
          target_.reported = true;
        }
        news = true;
      }
      if (news) attention_.store(true, std::memory_order_relaxed);
      if (key.empty() || failed) {
        cv_.wait_for(lock, options_.watch_interval, [&] {
          return stop_ || (target_.key && !target_.reported &&
                           !(target_.round == t.round && target_.key == t.key));
        });
      }
    }
  }

  // Forwards a new notice into the mailbox; true when there was one.
  bool forward_notice() {
    if (!config_.noticed()) return false;
    auto at = config_.noticed_at();
    if (!at || (last_notice_ && *last_notice_ == *at)) return false;
    last_notice_ = *at;
    std::optional<time_point> deadline;
    if (auto d = config_.announced_deadline()) deadline = detail::to_clock<Clock>(*d);
    std::lock_guard<std::mutex> lock(mutex_);
    mailbox_.notice = detail::to_clock<Clock>(*at);
    mailbox_.deadline = deadline;
    return true;
  }

  Config config_;
  Kv kv_;
  cluster_info cluster_;
  Checkpointer checkpointer_;
  handler_options options_;
  std::string scope_;
  std::string error_key_;
  agreement_type machine_;  // training thread only
  std::optional<std::int64_t> restored_;
  std::int64_t counter_ = 0;
  std::uint64_t steps_timed_ = 0;
  typename Clock::duration step_time_sum_{};
  time_point last_stamp_{};
  bool stamped_ = false;
  bool notice_started_ = false;
  std::chrono::nanoseconds last_save_duration_{0};
  typename Clock::duration overhead_{};  // agreeing + saving in this round's first phase

  std::atomic<bool> attention_{false};
  std::mutex mutex_;  // guards what follows (shared with the watcher)
  std::condition_variable cv_;
  bool stop_ = false;
  watch_target target_;
  mailbox mailbox_;
  bool error_seen_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_notice_;  // watcher thread only
  std::thread watcher_;
};

HOLDFAST_NAMESPACE_END
