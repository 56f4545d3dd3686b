// holdfast/handler/watcher.hpp — the handler's background thread and the state it shares with
// the training thread: it forwards this worker's notice, waits for the control keys that can
// start or end an agreement (claim, final claim, outcome, error), and runs the protocol
// (step_agreement, agreement.hpp) itself: it claims, acks with the run counter, collects the
// acks (the claimant) and records the outcome. preemption_handler (preemption_handler.hpp) is
// built on it and adds the training side.
//
// Guarantees:
//   - A worker blocked inside a step (a collective waiting for a peer) still takes part: the
//     watcher acks with the run counter it reads in the same atomic operation that raises the
//     training thread's attention, so that thread stops at its next step boundary at the latest.
//   - Event-driven waiting: the watcher sleeps in one poll() on a waker (an eventfd) and on the
//     store's watches (watch_cache.hpp), with no time slicing, where the store can be waited on
//     (asked once, at construction: kv_supports(kv, kv_op::watch)); notices with set_waker, a
//     stop and the training thread wake it through the same waker. The claimant collects the
//     acks through a second watch on the round's acks (closed once the watcher is idle again),
//     or in get_many batches where the store has a native one, or, over a store that can list
//     but has neither, with one list of the round's acks per look (and a blocking get of the
//     awaited ack when the list lacked it), else with blocking gets of one watch_interval each.
//   - Waiting for a key has one rule for the round's outcome key, whichever way the key is
//     waited on: while the claimant waits for an ack, each look that finds nothing is followed
//     by a look at the outcome key, and a value there ends the wait (wait_or_outcome).
//   - Store calls are retried while they fail transiently, until the machine's retry deadline
//     (store_retry.hpp), each attempt under a kv_call_deadline of that deadline (at least 100
//     ms), so over etcd a worker cut off from every member still ends its agreement within the
//     round's deadline plus one ack_timeout; a call that fails for good is fed to the machine
//     (on_store_failure). Once the machine has failed the watcher makes no store call more: it
//     closes its watches and waits for its stop, so a destruction is never held up by a
//     reconnection.
//     An insert that finds the key holding this worker's own value (a late commit) is fed to
//     the machine as created, so a claimant never takes itself for a loser.
//   - Hang detection (Hang::detects): every sleep ends when the training thread's phase runs out
//     of its bound (hang_next_), and every wake-up looks at it (look_for_hang), in an idle wait,
//     a protocol wait or a slice; a verdict is recorded once (record_hang: insert-once where
//     verdict_keys_locked says, a verdict already there being the one) and the policy acts on
//     the recorded one once (act_on_hang); a peer's is learned through the machine (a hang value
//     in a claim or outcome key) or ctl/hang.
//   - Periodic saves (handler_options::periodic_saves): task 0's watcher inserts the decision its
//     training thread asked for (ctl/save/<k>, "save <step>"), after reading every task's report
//     (saved/<task>: O(N) reads per save, none between saves) and erasing the decisions every task
//     reported; every watcher learns each decision in order, from the control watch (or one
//     try_get per wake-up over a store without one), queues its step for the training thread and
//     raises its attention.
//   - Decisions beside the rounds over a watch that follows named keys (the torch store): an
//     idle watcher follows the next decision (ctl/save/<k>) and the verdict key (ctl/hang)
//     beside its trigger (idle_keys), so they wake it as a watch of the whole prefix would.
//   - Stopping (request_watcher_stop, stop_watcher) wakes the watcher wherever it sleeps;
//     stop_watcher joins it, and the destructor does too.
// Caveats:
//   - Over a store without a watch, or with a notice source that cannot wake, a notice or a
//     claim is seen within one watch interval, and an idle worker makes a blocking get per
//     interval. With batched acks a stop during the claimant's collection waits for the current
//     slice (up to max(watch_interval, 1 s)).
//   - Over a store whose watch follows named keys, an error written alone is seen only through
//     the key followed then (a failing worker also writes aborts into the followed keys).
#pragma once

#include <poll.h>  // poll: one sleep on the waker and the watches

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>  // the periodic saves decided and not acted on
#include <exception>
#include <functional>  // std::function: the restore guard's work
#include <map>
#include <mutex>
#include <optional>
#include <random>  // std::random_device: the handler's nonce
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../agreement.hpp"
#include "../detail/waker.hpp"
#include "../error.hpp"
#include "../kv.hpp"
#include "../termination/notice.hpp"  // has_notice_waker_v: whether a notice can wake the watcher
#include "../version.hpp"
#include "hang.hpp"
#include "options.hpp"
#include "store_retry.hpp"
#include "traits.hpp"  // calls_exit_v, to_clock
#include "watch_cache.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The watcher thread of a preemption_handler and the state both its threads share.
template <class Config, class Kv, class Clock, class Hang>
class agreement_watcher {
  // Checked here too: the handler's base is instantiated before its own static_asserts run, and
  // a missing member should be named before any error it causes below.
  static_assert(check_coordination_store<Kv>());
  static_assert(check_termination_config<Config>());

 public:
  using agreement_type = basic_step_agreement<Clock>;  ///< the protocol

  agreement_watcher(const agreement_watcher&) = delete;
  agreement_watcher& operator=(const agreement_watcher&) = delete;

 protected:
  using time_point = typename Clock::time_point;
  using instruction = typename agreement_type::instruction;
  using op = typename instruction::op;

  agreement_watcher(Config config, Kv kv, cluster_info cluster, handler_options options)
      : config_(std::move(config)),
        kv_(std::move(kv)),
        evented_(has_kv_watch_v<Kv> && kv_supports(kv_, kv_op::watch)),
        ack_reads_(choose_ack_reads(kv_, evented_)),
        cluster_(std::move(cluster)),
        options_(options),
        scope_("holdfast/" + checked_run_id(cluster_.run_id) + "/"),
        error_key_(agreement_key_name(scope_, agreement_key::error, 0)),
        hang_key_(hang_key_name(scope_)),
        machine_(machine_config(cluster_, config_, options_, nonce_)),
        learner_(options_.hang) {
    control_cache_.prefix = agreement_control_prefix(scope_);
  }

  /// Stops and joins the watcher (the handler has done so already).
  ~agreement_watcher() { stop_watcher(); }

  // counter_and_attention_ = run counter << 1 | attention. The training thread adds counter_one
  // per step (an atomic add, so a concurrent fetch_or of the watcher is never lost); the watcher
  // raises attention with fetch_or, which also reads the counter at that instant: the training
  // thread then sees the bit at its next step boundary at the latest, so the counter the watcher
  // publishes in its ack is never more than one step behind.
  static constexpr std::uint64_t attention_bit = 1;
  static constexpr std::uint64_t counter_one = 2;

  static const std::string& checked_run_id(const std::string& id) {
    if (id.empty() || id.find('/') != std::string::npos || !is_valid_key(id))
      throw error(EINVAL, "preemption_handler", id, "run id must be one key segment");
    return id;
  }

  static typename agreement_type::config machine_config(const cluster_info& c, const Config& cfg,
                                                        const handler_options& o,
                                                        const std::string& nonce) {
    typename agreement_type::config m;
    m.task = c.task;
    m.num_tasks = c.num_tasks;
    m.grace = std::chrono::duration_cast<typename Clock::duration>(cfg.grace_period());
    m.ack_timeout = std::chrono::duration_cast<typename Clock::duration>(o.ack_timeout);
    m.exit_after_save = calls_exit_v<Config>;
    m.grace_margin = std::chrono::duration_cast<typename Clock::duration>(o.grace_margin);
    m.nonce = nonce;
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

  void raise_attention_locked() noexcept {
    if (machine_.needs_attention())
      counter_and_attention_.fetch_or(attention_bit, std::memory_order_relaxed);
  }

  // ---- starting and stopping ------------------------------------------------------------------

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

  // ---- the watcher thread ----------------------------------------------------------------------

  void watch() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_.load()) {
      lock.unlock();
      if constexpr (detects_hangs) {
        learn_hang();
        look_for_hang_when_due();
      }
      forward_notice();
      periodic_work();
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

  // Feeds a new notice to the machine.
  void forward_notice() {
    if (!config_.noticed()) return;
    auto at = config_.noticed_at();
    if (!at || (last_notice_ && *last_notice_ == *at)) return;
    last_notice_ = *at;
    std::optional<time_point> deadline;
    if (auto d = config_.announced_deadline()) deadline = to_clock<Clock>(*d);
    std::lock_guard<std::mutex> lock(mutex_);
    machine_.on_notice(to_clock<Clock>(*at), deadline);
    raise_attention_locked();
  }

  // ---- periodic saves (handler_options::periodic_saves) ---------------------------------------

  // Task 0's request to publish (periodic_publish_), then what is new under ctl/save/. A store
  // failure here is retried at the next wake-up (a decision not published is asked for again).
  void periodic_work() noexcept {
    if (!options_.periodic_saves.enabled) return;
    std::int64_t publish = -1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (machine_.state() == agreement_state::failed) return;
      std::swap(publish, periodic_publish_);
    }
    try {
      learn_periodic();
      if (publish >= 0) publish_periodic(publish);
    } catch (...) {
      if (publish >= 0) {  // the training thread asks again after a lead time
        std::lock_guard<std::mutex> lock(mutex_);
        periodic_retry_ = true;
        counter_and_attention_.fetch_or(attention_bit, std::memory_order_relaxed);
      }
    }
  }

  // Task 0: reads every task's report (the longest cost for the next record, and which decisions
  // every task has acted on: those are erased), then inserts "save <step>" as the next decision.
  // A key that exists already (left by an earlier launch with this run id) is learned as it is,
  // and the next one tried.
  void publish_periodic(std::int64_t step) {
    std::int64_t reported = INT64_MAX, cost = -1;
    for (int t = 0; t < cluster_.num_tasks; ++t) {
      auto v = kv_.try_get(periodic_report_key_name(scope_, t));
      auto a = v ? parse_agreement_value(*v) : std::nullopt;
      const bool ok = a && a->what == agreement_value::kind::saved;
      reported = std::min(reported, ok ? a->step : std::int64_t{-1});
      if (ok && t != cluster_.task) cost = std::max(cost, a->cost_us);
    }
    periodic_others_cost_us_.store(cost, std::memory_order_relaxed);
    while (!periodic_published_.empty() && periodic_published_.front().second <= reported) {
      erase_quietly(periodic_save_key_name(scope_, periodic_published_.front().first));
      periodic_published_.pop_front();
    }
    agreement_value v;
    v.what = agreement_value::kind::save;
    v.step = step;
    v.writer = cluster_.task;
    v.nonce = nonce_;
    for (int tries = 0; tries < 8; ++tries) {
      const std::uint64_t k = periodic_next_k_;
      const bool created = kv_.insert(periodic_save_key_name(scope_, k), format_agreement_value(v));
      if constexpr (can_watch) {
        if (created)
          control_cache_.note_written(periodic_save_key_name(scope_, k), format_agreement_value(v));
        else
          control_cache_.mark_stale(periodic_save_key_name(scope_, k));
      }
      learn_periodic();
      if (created) return;
    }
    throw error(EEXIST, "periodic save", periodic_save_key_name(scope_, periodic_next_k_),
                "every key tried was taken");
  }

  // Learns the decisions published since the last one learned, in order: each step is queued
  // for the training thread, whose attention is raised.
  void learn_periodic() {
    for (;;) {
      const std::string key = periodic_save_key_name(scope_, periodic_next_k_);
      std::optional<std::string> text;
      if constexpr (can_watch) {
        if (evented_) text = control_cache_.lookup(kv_, key);
      }
      if (!evented_) text = kv_.try_get(key);
      if (!text) return;
      auto a = parse_agreement_value(*text);
      std::lock_guard<std::mutex> lock(mutex_);
      if (a && a->what == agreement_value::kind::save) {
        periodic_steps_.push_back(a->step);
        if (cluster_.task == 0) periodic_published_.emplace_back(periodic_next_k_, a->step);
        counter_and_attention_.fetch_or(attention_bit, std::memory_order_relaxed);
        train_cv_.notify_all();
      }
      ++periodic_next_k_;
    }
  }

  // Performs the machine's next store operation, if it has one (lock held on entry and exit,
  // released around the store call), retrying transient failures until the machine's retry
  // deadline; a call that fails for good is reported with on_store_failure. Returns false when
  // there was nothing to do.
  bool protocol_step(std::unique_lock<std::mutex>& lock) {
    std::int64_t counter = 0;
    if (machine_.wants_counter())  // the ack: raise attention and read the counter at once
      counter = static_cast<std::int64_t>(
          counter_and_attention_.fetch_or(attention_bit, std::memory_order_relaxed) >> 1);
    instruction in = machine_.protocol_next(counter, Clock::now());
    if (in.kind == op::decide) return false;
    const std::string key = agreement_key_name(scope_, in.key, in.round, in.task);
    const time_point until = machine_.retry_deadline();
    // The claimant waiting for an ack also looks at the outcome key (a step recorded past the
    // deadline by a peer, an abort after a peer's error).
    const std::string outcome_key =
        machine_.collecting() ? agreement_key_name(scope_, machine_.outcome_key(), in.round)
                              : std::string();
    lock.unlock();
    try {
      switch (in.kind) {
        case op::insert: {
          // created: also when the key holds this worker's own value (a late commit)
          insert_result r = store_.insert_or_read(kv_, key, in.value, until);
          if (evented_) {  // what this worker knows now (its value, or the one it read back)
            if (r.current)
              control_cache_.note_written(key, *r.current);
            else  // it exists, and its event may not have come yet: read it
              control_cache_.mark_stale(key);
          }
          lock.lock();
          if (!r.created && r.current && is_hang(*r.current))  // a verdict took the key
            machine_.on_hang_seen(*r.current);
          else
            machine_.on_insert(r.created);
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
          // Its store calls are retried until the machine's retry deadline, which may be later
          // than the wait's own end (a wait issued at its deadline while recording).
          wait_retry_until_ = std::max(until, in.deadline);
          std::optional<std::string> outcome_value;
          auto v = wait_for_key(key, in.deadline, outcome_key, outcome_value);
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

  template <class F>
  auto retrying(F&& fn, time_point deadline) -> decltype(fn()) {
    return store_.retrying(std::forward<F>(fn), deadline);
  }

  // ---- waiting for a key (the machine's wait instruction) -------------------------------------

  // What one look for the awaited key found: its value, or `done` when waiting longer is futile
  // (the deadline passed, or a batch that ended at or past it lacked the key).
  struct key_look {
    std::optional<std::string> value;
    bool done = false;
  };

  // Waits until `key` holds a value or `deadline` passes; transient store errors are retried
  // until wait_retry_until_ (the machine's retry deadline, or the wait's deadline if later). With
  // `outcome_key` (the claimant waiting for an ack also looks at the round's outcome), the wait
  // ends early when that key holds a value, stored in `outcome_value`. The claimant's acks come in
  // batches where the store has a native get_many or can list without a watch, else through a watch
  // on the round's acks where the store is evented, else from blocking gets; a control key comes
  // with the control watch where the store is evented.
  std::optional<std::string> wait_for_key(const std::string& key, time_point deadline,
                                          const std::string& outcome_key,
                                          std::optional<std::string>& outcome_value) {
    const bool collecting = !outcome_key.empty();
    auto read_outcome = [&] {
      return retrying([&] { return kv_.try_get(outcome_key); }, wait_retry_until_);
    };
    if (collecting && ack_reads_ != ack_reads::one_by_one)
      return wait_or_outcome(outcome_key, outcome_value, batch_look(key, deadline), read_outcome);
    if constexpr (can_watch) {
      if (evented_ && (control_cache_.covers(key) || collecting))
        return wait_on_watches(key, deadline, outcome_key, outcome_value);
    }
    return wait_or_outcome(outcome_key, outcome_value, slice_look(key, deadline), read_outcome);
  }

  // The outcome-key rule, the one place it lives: `look()` looks for the awaited key (or sleeps
  // one slice and looks); when it found nothing and waiting goes on, the outcome key, if there
  // is one, is read with `read_outcome()`, and a value there ends the wait (in outcome_value).
  template <class Look, class ReadOutcome>
  std::optional<std::string> wait_or_outcome(const std::string& outcome_key,
                                             std::optional<std::string>& outcome_value, Look look,
                                             ReadOutcome read_outcome) {
    for (;;) {
      key_look seen = look();
      if (seen.value || seen.done || stop_.load()) return std::move(seen.value);
      if constexpr (detects_hangs) look_for_hang_when_due();  // a slice ended
      if (!outcome_key.empty()) {
        outcome_value = read_outcome();
        if (outcome_value) return std::nullopt;
      }
    }
  }

  // Looks with blocking gets of one watch_interval each, so a shutdown is never held up longer
  // than one.
  auto slice_look(const std::string& key, time_point deadline) {
    return [this, &key, deadline] {
      auto left = std::max<typename Clock::duration>(deadline - Clock::now(), {});
      auto slice = std::min<std::chrono::milliseconds>(
          std::chrono::ceil<std::chrono::milliseconds>(left), options_.watch_interval);
      auto v = retrying([&] { return kv_.get(key, slice); }, wait_retry_until_);
      return key_look{std::move(v), Clock::now() >= deadline};
    };
  }

  // Waits on the watches: a control key comes with the control watch; an ack the claimant
  // collects, with a watch on the round's acks (opened at its first ack wait, closed once the
  // watcher is idle): no request while waiting, however many acks are late. Before each sleep
  // the watches follow the keys waited for (a store that waits on named keys).
  std::optional<std::string> wait_on_watches(const std::string& key, time_point deadline,
                                             const std::string& outcome_key,
                                             std::optional<std::string>& outcome_value) {
    const bool control = control_cache_.covers(key);
    if (!control) {
      const std::string prefix = key.substr(0, key.rfind('/'));
      if (ack_cache_.prefix != prefix || !ack_cache_.watch)
        retrying([&] { ack_cache_.open(kv_, prefix); }, wait_retry_until_);
    }
    watch_cache<Kv>& cache = control ? control_cache_ : ack_cache_;
    const std::string& also_watched = control ? std::string() : outcome_key;
    retrying([&] { await_watches(Clock::now()); }, wait_retry_until_);  // what arrived already
    bool first = true;
    auto look = [&] {
      if (!first) {
        if (Clock::now() >= deadline)  // the last word is the store's, not the watch's
          return key_look{retrying([&] { return kv_.try_get(key); }, wait_retry_until_), true};
        cache.follow({key});
        if (!also_watched.empty()) control_cache_.follow({also_watched});
        retrying([&] { await_watches(deadline); }, wait_retry_until_);
      }
      first = false;
      return key_look{retrying([&] { return cache.lookup(kv_, key); }, wait_retry_until_), false};
    };
    auto read_outcome = [&] {
      return retrying([&] { return control_cache_.lookup(kv_, also_watched); }, wait_retry_until_);
    };
    return wait_or_outcome(also_watched, outcome_value, look, read_outcome);
  }

  // ---- the claimant's acks in batches (a native get_many, or a list) --------------------------
  //
  // The machine asks for the acks one task at a time (a wait each, until the round's deadline).
  // A store that reads many keys in one wait answers them together: one get_many over every ack
  // of the round not read yet, in slices of min(time left, max(watch_interval, 1 s)), between
  // which the outcome key is read (a peer may have recorded the outcome, or aborted). A store
  // that can list but cannot be waited on (no watch, no get_many: in_process_kv) answers with
  // one list of the round's ack prefix, then, when the awaited ack was not in it, one blocking
  // get of that ack for a slice: O(1) requests while the acks are there already, not one round
  // trip per task (issue 32, item 10). What a batch read serves the round's later waits. An ack
  // not read by a batch that ended at or past the deadline is missing, as a blocking get's
  // would be.

  // How the claimant reads the acks (chosen once, at construction).
  enum class ack_reads : unsigned char {
    one_by_one,  // the ack watch (an evented store), or a blocking get per ack (neither below)
    get_many,    // the store's native get_many
    list,        // a list of the round's acks, a blocking get of the awaited one it lacked
  };

  static ack_reads choose_ack_reads(const Kv& kv, bool evented) {
    if (kv_supports(kv, kv_op::get_many)) return ack_reads::get_many;
    if (!evented && kv_supports(kv, kv_op::list)) return ack_reads::list;
    return ack_reads::one_by_one;
  }

  struct ack_batch {
    std::string prefix;                          // ".../ack/r<N>/": the round and the phase
    std::map<std::string, std::string> present;  // the acks read so far
    bool final = false;  // a batch ended at or past the deadline: what it lacked is missing
  };

  // Looks for the ack `key` among those read, reading a batch when it is not there yet.
  auto batch_look(const std::string& key, time_point deadline) {
    const std::string prefix = key.substr(0, key.rfind('/') + 1);
    if (ack_batch_.prefix != prefix) ack_batch_ = ack_batch{prefix, {}, false};
    return [this, &key, deadline] {
      auto read = [&]() -> std::optional<std::string> {
        if (auto it = ack_batch_.present.find(key); it != ack_batch_.present.end())
          return it->second;
        return std::nullopt;
      };
      if (auto v = read()) return key_look{std::move(v), true};
      if (ack_batch_.final || stop_.load()) return key_look{std::nullopt, true};
      read_acks(key, deadline);
      auto v = read();
      const bool done = v.has_value() || ack_batch_.final;
      return key_look{std::move(v), done};
    };
  }

  // One batch read for one slice (at most until `deadline`): a get_many over the round's acks
  // not read yet, or a list and, when the awaited `key` was not listed, a blocking get of it.
  void read_acks(const std::string& key, time_point deadline) {
    using ms = std::chrono::milliseconds;
    const ms left =
        std::chrono::ceil<ms>(std::max<typename Clock::duration>(deadline - Clock::now(), {}));
    const ms slice = std::min(left, std::max<ms>(options_.watch_interval, std::chrono::seconds(1)));
    if constexpr (has_kv_list_v<Kv>) {
      if (ack_reads_ == ack_reads::list) {
        auto list = [&] {
          for (auto& e : retrying([&] { return kv_.list(ack_batch_.prefix); }, wait_retry_until_))
            ack_batch_.present.emplace(std::move(e.first), std::move(e.second));
        };
        list();
        if (!ack_batch_.present.count(key))
          if (auto v = retrying([&] { return kv_.get(key, slice); }, wait_retry_until_))
            ack_batch_.present.emplace(key, std::move(*v));
        if (Clock::now() >= deadline) {
          // the acks that came while the get waited: what a read of each at the deadline
          // would find (the list before the get is as old as the slice)
          list();
          ack_batch_.final = true;
        }
        return;
      }
    }
    (void)key;
    std::vector<std::string> keys;
    for (int t = 0; t < cluster_.num_tasks; ++t) {
      std::string k = ack_batch_.prefix + std::to_string(t);
      if (!ack_batch_.present.count(k)) keys.push_back(std::move(k));
    }
    auto values = retrying([&] { return holdfast::get_many(kv_, keys, slice); }, wait_retry_until_);
    for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i)
      if (values[i]) ack_batch_.present.emplace(keys[i], std::move(*values[i]));
    if (Clock::now() >= deadline) ack_batch_.final = true;
  }

  // ---- waiting for a trigger ------------------------------------------------------------------

  // What a wait for a trigger saw.
  struct trigger_seen {
    std::optional<std::string> value;     // the trigger key's value (a claim or final claim)
    std::optional<std::string> error;     // the error key's payload
    std::optional<std::string> hang;      // a verdict in the trigger key (it fails the machine)
    std::optional<std::string> reported;  // a verdict in ctl/hang (it fails nothing)
  };

  // Blocks for one slice on the key that can start or end an agreement now (a claim, a final
  // claim, or the error key), and feeds what it saw to the machine.
  // Once the machine has failed (sticky: nothing the store says changes it), it closes its
  // watches and waits for the stop only, without a store call that a stop could not cut short
  // (a reconnection to endpoints out of reach would hold up the handler's destruction).
  void wait_for_trigger(std::unique_lock<std::mutex>& lock) {
    if (machine_.state() == agreement_state::failed) {
      if constexpr (can_watch) {  // nothing more to learn: no stream left open on the store
        control_cache_.close();
        ack_cache_.close();
      }
      watch_cv_.wait(lock, [&] { return stop_.load(); });
      return;
    }
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
    if (seen.reported) {
      lock.unlock();
      act_on_hang(*seen.reported);
      lock.lock();
    }
    if (seen.hang) {
      machine_.on_hang_seen(*seen.hang);
    } else if (seen.error) {
      error_seen_ = true;
      machine_.on_error_seen(*seen.error);
    } else if (seen.value && *trigger == agreement_key::claim) {
      machine_.on_claim_seen(round);
    } else if (seen.value && *trigger == agreement_key::final_claim) {
      machine_.on_final_seen(round);
    }
    if (seen.value || seen.error || seen.hang) {
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
    else if (v && is_hang(*v))
      seen.hang = std::move(v);
    else if (v && is_abort(*v))
      seen.error = read_error().value_or(std::string());
    else
      seen.value = std::move(v);
    return seen;
  }

  // What an idle watcher waits for: `trigger` (the claim, final claim or error key), and the
  // decisions beside the rounds: the next periodic save (ctl/save/<k>) and a hang verdict
  // (ctl/hang) while none was acted on. A watch that waits on named keys (the torch store) wakes
  // on any of them; a watch of the whole prefix sees them anyway.
  std::vector<std::string> idle_keys(const std::string& trigger) const {
    std::vector<std::string> keys;
    if (!trigger.empty()) keys.push_back(trigger);
    if (options_.periodic_saves.enabled)
      keys.push_back(periodic_save_key_name(scope_, periodic_next_k_));
    if constexpr (detects_hangs)
      if (!hang_acted_.load() && !hang_key_taken_) keys.push_back(hang_key_);
    return keys;
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
      ack_cache_.close();
      std::optional<std::string> v, error_payload;
      auto read_cached_trigger = [&] {
        if (!key.empty()) v = control_cache_.lookup(kv_, key);
        if (watch_error && !v) error_payload = control_cache_.lookup(kv_, error_key_);
        return v || error_payload;
      };
      if (!read_cached_trigger()) {
        open_control();
        control_cache_.follow(idle_keys(key));
        await_watches(time_point::max());
        read_cached_trigger();
      }
      std::optional<std::string> reported;
      if constexpr (detects_hangs) {  // a verdict beside the rounds (ctl/hang)
        if (!hang_acted_.load() && !hang_key_taken_) {
          reported = control_cache_.lookup(kv_, hang_key_);
          if (reported && !is_hang(*reported)) {  // not a verdict: no reason to follow it
            hang_key_taken_ = true;
            reported.reset();
          }
        }
      }
      trigger_seen seen;
      if (error_payload)
        seen.error = std::move(error_payload);
      else
        seen = classify_trigger(std::move(v), trigger,
                                [&] { return control_cache_.lookup(kv_, error_key_); });
      seen.reported = std::move(reported);
      return seen;
    }
    return {};
  }

  // ---- the watches (stores that can be waited on: has_kv_watch_v) ----------------------------
  //
  // One watch on ctl/ for the watcher's life (control_cache_), and the claimant's watch on one
  // round's acks while it collects them (ack_cache_); watch_cache.hpp says what each knows.
  // Whether the store is waited on is asked once, at construction (evented_: kv_supports(kv,
  // kv_op::watch), so an any_kv holding an etcd_kv is); the code exists only where the type has
  // a watch (can_watch).

  static constexpr bool can_watch = has_kv_watch_v<Kv>;

  // Opens the control watch (ctl/) unless it is open.
  void open_control() {
    if constexpr (can_watch) {
      if (!control_cache_.watch) control_cache_.open(kv_, control_cache_.prefix);
    }
  }

  // Sleeps in one poll() on the waker and the open watches until one is readable, a watch's
  // due time, or `until` (Clock::now() to only take what is there); when the notices cannot
  // wake the waker, at most one watch_interval. Then takes the watches' changes.
  void await_watches(time_point until) {
    if constexpr (can_watch) {
      open_control();
      watch_cache<Kv>* open[2] = {&control_cache_, ack_cache_.watch ? &ack_cache_ : nullptr};
      const int watches = open[1] ? 2 : 1;
      bool buffered = false;
      using ms = std::chrono::milliseconds;
      auto left = [](auto d) { return std::chrono::ceil<ms>(std::max(d, decltype(d)::zero())); };
      ms timeout = ms::max();
      if (until != time_point::max()) timeout = left(until - Clock::now());
      if constexpr (!has_notice_waker_v<Config>)
        timeout = std::min(timeout, options_.watch_interval);
      if constexpr (detects_hangs)  // wake when the training thread's phase runs out
        if (hang_next_ != std::chrono::steady_clock::time_point::max())
          timeout = std::min(timeout, left(hang_next_ - std::chrono::steady_clock::now()));
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
      if constexpr (detects_hangs) look_for_hang_when_due();
    } else {
      (void)until;
    }
  }

  static bool is_abort(const std::string& value) {
    auto v = parse_agreement_value(value);
    return v && v->what == agreement_value::kind::abort;
  }
  static bool is_hang(const std::string& value) {
    auto v = parse_agreement_value(value);
    return v && v->what == agreement_value::kind::hang;
  }

  // ---- hang detection (handler/hang.hpp) -------------------------------------------------------
  //
  // The training thread publishes its phase and the steady time the phase began in one relaxed
  // atomic word (hang_stamp_: nanoseconds << 3 | phase). The watcher looks at it whenever it
  // wakes and wakes when the phase's bound runs out (hang_next_, which every sleep honours: the
  // poll's timeout, a slice's end), so a training thread stuck anywhere (a collective in a C
  // extension holds no lock of ours) is found within its bound plus the wake-up's latency.

  static constexpr bool detects_hangs = Hang::detects;
  using steady = std::chrono::steady_clock;

  static std::uint64_t hang_word(steady::time_point t, hang_phase p) noexcept {
    return (static_cast<std::uint64_t>(t.time_since_epoch().count()) << 3) |
           static_cast<std::uint64_t>(p);
  }

  // Training thread: it is in phase `p` since `t` (none: nothing to watch).
  void enter_phase(hang_phase p, steady::time_point t) noexcept {
    if constexpr (detects_hangs) hang_stamp_.store(hang_word(t, p), std::memory_order_relaxed);
  }

  // Any thread (the liveness monitor's): `task` stopped renewing its liveness key `silent` ago
  // (past `bound`); the watcher records the verdict at its next look.
  void on_peer_frozen(int task, std::chrono::milliseconds silent, std::chrono::milliseconds bound) {
    {
      std::lock_guard<std::mutex> lock(hang_mutex_);
      if (!frozen_) frozen_ = hang_verdict{task, hang_phase::frozen, -1, silent, bound, -1, {}};
    }
    hang_next_wake_.store(true);
    wake_watcher();
  }

  // The verdict a peer recorded and this worker's machine learned (it failed with kind hang):
  // the policy acts on it, once. A verdict beside the rounds (ctl/hang) comes with the control
  // watch, or over a store without a watch is read once per hang_options::period.
  void learn_hang() {
    if (hang_acted_.load()) return;
    std::string recorded;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (machine_.state() == agreement_state::failed &&
          machine_.failure().kind == agreement_failure::hang)
        recorded = machine_.failure().message;
    }
    if (recorded.empty() && !evented_ && steady::now() >= hang_read_next_) {
      hang_read_next_ = steady::now() + options_.hang.period;
      try {
        if (auto v = kv_.try_get(hang_key_); v && is_hang(*v)) recorded = std::move(*v);
      } catch (...) {  // the next period reads again
      }
    }
    if (!recorded.empty()) act_on_hang(recorded);
  }

  // The watcher thread's look: when the next look is due, or a frozen peer was reported.
  void look_for_hang_when_due() {
    if (hang_next_wake_.load() || steady::now() >= hang_next_) hang_next_ = look_for_hang();
  }

  // Looks at the training thread's phase (and a frozen peer reported): records a verdict when
  // one is due and acts on it. Returns when to look next. Never called with mutex_ held.
  steady::time_point look_for_hang() {
    if constexpr (!detects_hangs) {
      return steady::time_point::max();
    } else {
      if (hang_acted_.load()) return steady::time_point::max();
      std::optional<hang_verdict> v;
      if (hang_next_wake_.exchange(false)) {
        std::lock_guard<std::mutex> lock(hang_mutex_);
        v = std::move(frozen_);
        frozen_.reset();
      }
      const steady::time_point now = steady::now();
      const steady::time_point next = now + options_.hang.period;
      if (!v) {
        const std::uint64_t w = hang_stamp_.load(std::memory_order_relaxed);
        const auto p = static_cast<hang_phase>(w & 7);
        if (p == hang_phase::none || p == hang_phase::frozen) return next;
        const steady::time_point start{steady::duration(static_cast<steady::rep>(w >> 3))};
        const std::chrono::nanoseconds bound = learner_.bound(p);
        const auto elapsed = now - start;
        if (elapsed < bound) return bound > next - start ? next : start + bound;
        using ms = std::chrono::milliseconds;
        v = hang_verdict{
            cluster_.task,
            p,
            static_cast<std::int64_t>(counter_and_attention_.load(std::memory_order_relaxed) >> 1),
            std::chrono::duration_cast<ms>(elapsed),
            std::chrono::duration_cast<ms>(bound),
            -1,
            {}};
      }
      record_hang(std::move(*v));
      return steady::time_point::max();
    }
  }

  // Records verdict `v` once for the job (insert-once; a verdict someone recorded first is the
  // one) where the policy says (verdict_keys_locked), feeds it to the machine when it went into
  // a key the machine waits on, and acts on it.
  void record_hang(hang_verdict v) {
    v.recorder = cluster_.task;
    v.nonce = nonce_;
    const std::string mine = format_agreement_value(hang_verdict_value(v));
    std::string recorded = mine;
    bool fails_round = false;
    try {
      std::pair<std::string, std::string> keys;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        keys = verdict_keys_locked();
      }
      const time_point until =
          Clock::now() + std::chrono::duration_cast<typename Clock::duration>(options_.ack_timeout);
      // The verdict in `key`, or nullopt when the key holds another value (in `other`).
      std::optional<std::string> other;
      auto insert = [&](const std::string& key) -> std::optional<std::string> {
        insert_result r = store_.insert_or_read(kv_, key, mine, until);
        if (r.created) return mine;
        if (r.current && is_hang(*r.current)) return r.current;
        other = std::move(r.current);
        return std::nullopt;
      };
      std::optional<std::string> got = insert(keys.first);
      fails_round = got && keys.first != hang_key_;
      if (!got && !keys.second.empty() && other) {  // a claim came first: its round's outcome
        auto o = parse_agreement_value(*other);
        if (o && o->what == agreement_value::kind::claim) {
          got = insert(keys.second);
          fails_round = got.has_value();
        }
      }
      if (!got) got = insert(hang_key_);  // the round was decided first: beside it, for the log
      if (got) recorded = std::move(*got);
    } catch (const std::exception& e) {  // acts on its own verdict, unrecorded
      const std::string line =
          std::string("holdfast: a hang verdict could not be recorded: ") + e.what() + "\n";
      (void)!::write(2, line.data(), line.size());
    }
    if (fails_round) {
      std::lock_guard<std::mutex> lock(mutex_);
      machine_.on_hang_seen(recorded);
      raise_attention_locked();
    }
    train_cv_.notify_all();
    act_on_hang(recorded);
  }

  // Where a verdict goes: the outcome key of a round under way (it is that round's outcome,
  // never beside it); for a policy that ends the job, the trigger key every idle worker waits on
  // (second: that round's outcome key, should a claim come first); else ctl/hang.
  std::pair<std::string, std::string> verdict_keys_locked() const {
    const std::uint64_t round = machine_.round();
    std::string outcome = agreement_key_name(scope_, machine_.outcome_key(), round);
    if (holdfast::agreement_under_way(machine_.state())) return {std::move(outcome), {}};
    if constexpr (Hang::ends_job) {
      if (auto t = machine_.watch_key())
        return {agreement_key_name(scope_, *t, round), std::move(outcome)};
    }
    return {hang_key_, {}};
  }

  // The policy acts on the recorded verdict `value`, once per handler.
  void act_on_hang(const std::string& value) {
    if (hang_acted_.exchange(true)) return;
    auto a = parse_agreement_value(value);
    std::optional<hang_verdict> v = a ? hang_verdict_of(*a) : std::nullopt;
    if (v) Hang::act(*v, options_.hang);
  }

  // Construction: the watcher starts after the restore, so the restore is watched by a guard
  // thread of its own while `work` runs (phase restore since `t0`).
  template <class Work>
  void guard_restore(Work&& work) {
    if constexpr (!detects_hangs) {
      std::forward<Work>(work)();
    } else {
      enter_phase(hang_phase::restore, steady::now());
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      std::thread guard([&] {
        std::unique_lock<std::mutex> lock(m);
        while (!done) {
          lock.unlock();
          const steady::time_point next =
              std::min(look_for_hang(), steady::now() + options_.hang.period);
          lock.lock();
          cv.wait_until(lock, next, [&] { return done; });
        }
      });
      struct joiner {
        std::mutex& m;
        std::condition_variable& cv;
        bool& done;
        std::thread& t;
        ~joiner() {
          {
            std::lock_guard<std::mutex> lock(m);
            done = true;
          }
          cv.notify_all();
          t.join();
        }
      } join{m, cv, done, guard};
      std::forward<Work>(work)();
    }
  }

  // ---- state ----------------------------------------------------------------------------------

  Config config_;
  Kv kv_;
  const bool evented_;         // waits on the store's watches (see await_watches)
  const ack_reads ack_reads_;  // how the claimant reads the acks (see batch_look)
  cluster_info cluster_;
  handler_options options_;
  std::string scope_;
  std::string error_key_;
  std::string hang_key_;
  std::string nonce_ = make_nonce();  // this handler's, in every value it writes

  std::atomic<std::uint64_t> counter_and_attention_{0};  // run counter << 1 | attention
  mutable std::mutex mutex_;                             // guards machine_ and error_seen_
  agreement_type machine_;
  bool error_seen_ = false;
  std::condition_variable watch_cv_;  // wakes the watcher (work, stop)
  std::condition_variable train_cv_;  // wakes a training thread waiting for the step
  std::atomic<bool> stop_{false};
  store_retry<Clock> store_{mutex_, watch_cv_, stop_};  // retries end at a stop request
  time_point wait_retry_until_{};  // the current wait's retry deadline (watcher thread only)
  std::optional<std::chrono::steady_clock::time_point> last_notice_;  // watcher thread only
  waker waker_;  // notices, stop requests and the training thread wake the watcher
  // ctl/, for the watcher's life (watcher thread only)
  watch_cache<Kv> control_cache_;
  // the claimant's: one round's acks while it collects (watcher thread only)
  watch_cache<Kv> ack_cache_;
  ack_batch ack_batch_;  // the claimant's acks read in batches (watcher thread only)
  // hang detection
  hang_learner learner_;  // the training thread feeds it; the watcher reads its bounds
  std::atomic<std::uint64_t> hang_stamp_{0};  // the training thread's phase (see enter_phase)
  std::atomic<bool> hang_acted_{false};       // the policy acted on a verdict
  std::atomic<bool> hang_next_wake_{false};   // frozen_ holds a verdict to record
  std::mutex hang_mutex_;                     // guards frozen_
  std::optional<hang_verdict> frozen_;        // a frozen peer, from the liveness monitor
  steady::time_point hang_next_{};            // the watcher's next look (watcher thread only)
  steady::time_point hang_read_next_{};       // its next read of ctl/hang (no watch; same)
  bool hang_key_taken_ = false;  // ctl/hang holds a value that is no verdict (watcher only)
  // periodic saves
  std::deque<std::int64_t> periodic_steps_;  // decided, not acted on yet (guarded by mutex_)
  std::int64_t periodic_publish_ = -1;       // task 0's request to publish (guarded by mutex_)
  bool periodic_retry_ = false;              // the request failed: ask again (guarded by mutex_)
  std::atomic<std::int64_t> periodic_others_cost_us_{-1};  // the longest reported by the others
  std::uint64_t periodic_next_k_ = 1;  // the next decision to learn (watcher thread only)
  std::deque<std::pair<std::uint64_t, std::int64_t>> periodic_published_;  // task 0: k, step
  std::thread watcher_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
