// holdfast/handler/watcher/state.hpp — the lowest part of the handler's watcher (watcher.hpp):
// the state both of the handler's threads share (the termination config, the store, the
// machine, the run counter and its attention bit, the lock and the wake-ups) and the helpers
// every part above calls (retrying, erase_quietly, wake_watcher, raise_attention_locked).
//
// Guarantees:
//   - The run id is one key segment, checked at construction (holdfast::error EINVAL otherwise),
//     and every key the watcher uses lies under holdfast/<run id>/ (scope_).
//   - One atomic word holds the run counter and the attention bit (counter_and_attention_): the
//     watcher raises attention with the fetch_or that reads the counter, so the counter it acks
//     with (protocol.hpp) is never more than one step behind the training thread, which sees the
//     bit at its next step boundary at the latest.
//   - Every value the handler writes carries its nonce (64 random bits), which tells its values
//     from a restarted process's.
//   - Whether the store is waited on is asked once, here (evented_: kv_supports(kv,
//     kv_op::watch), so an any_kv holding an etcd_kv is).
//   - wake_watcher() wakes the watcher wherever it sleeps: a pause on watch_cv_, or the poll() on
//     the waker (watches.hpp). retrying() retries a store call while it fails transiently, until
//     the deadline it is given or a stop request (store_retry.hpp).
// Caveats:
//   - machine_, and each part's members marked "guarded by mutex_", are touched under mutex_
//     only; the members marked "watcher thread only" belong to the watcher thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>  // std::random_device: the handler's nonce
#include <string>
#include <utility>

#include "../../agreement/step_agreement.hpp"  // basic_step_agreement: the protocol
#include "../../detail/waker.hpp"
#include "../../error.hpp"
#include "../../kv.hpp"
#include "../../version.hpp"
#include "../options.hpp"
#include "../store_retry.hpp"
#include "../traits.hpp"  // calls_exit_v, check_termination_config

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The state both threads of a preemption_handler share: the lowest part of agreement_watcher.
template <class Config, class Kv, class Clock, class Hang>
class watcher_state {
  // Checked here too: the handler's bases are instantiated before its own static_asserts run,
  // this lowest part first, and a missing member should be named before any error it causes in
  // the parts above.
  static_assert(check_coordination_store<Kv>());
  static_assert(check_termination_config<Config>());

 public:
  using agreement_type = basic_step_agreement<Clock>;  ///< the protocol

  watcher_state(const watcher_state&) = delete;
  watcher_state& operator=(const watcher_state&) = delete;

 protected:
  using time_point = typename Clock::time_point;
  using instruction = typename agreement_type::instruction;
  using op = typename instruction::op;

  watcher_state(Config config, Kv kv, cluster_info cluster, handler_options options)
      : config_(std::move(config)),
        kv_(std::move(kv)),
        evented_(has_kv_watch_v<Kv> && kv_supports(kv_, kv_op::watch)),
        cluster_(std::move(cluster)),
        options_(with_default_logs(std::move(options))),
        scope_("holdfast/" + checked_run_id(cluster_.run_id) + "/"),
        machine_(machine_config(cluster_, config_, options_, nonce_)) {}

  // counter_and_attention_ = run counter << 1 | attention. The training thread adds counter_one
  // per step (an atomic add, so a concurrent fetch_or of the watcher is never lost); the watcher
  // raises attention with fetch_or, which also reads the counter at that instant: the training
  // thread then sees the bit at its next step boundary at the latest, so the counter the watcher
  // publishes in its ack is never more than one step behind.
  static constexpr std::uint64_t attention_bit = 1;
  static constexpr std::uint64_t counter_one = 2;

  // The parts' own sinks (periodic_saves.log, hang.log) are handler_options::log unless set.
  static handler_options with_default_logs(handler_options o) {
    if (!o.periodic_saves.log) o.periodic_saves.log = o.log;
    if (!o.hang.log) o.hang.log = o.log;
    return o;
  }

  // One line to handler_options::log, naming this task: "task 1: <line>".
  void log_event(const std::string& line, log_level level = log_level::info) const noexcept {
    if (!options_.log && level < log_level::warning) return;  // the default prints no info
    try {
      detail::log_line(options_.log, "task " + std::to_string(cluster_.task) + ": " + line, level);
    } catch (...) {  // no memory for the line: nothing to report it with
    }
  }

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

  // Wakes the watcher wherever it sleeps: a pause (watch_cv_) or poll() on the waker.
  void wake_watcher() noexcept {
    watch_cv_.notify_all();
    waker_.notify();
  }

  // A store call retried while it fails transiently, until `deadline` (store_retry.hpp).
  template <class F>
  auto retrying(F&& fn, time_point deadline) -> decltype(fn()) {
    return store_.retrying(std::forward<F>(fn), deadline);
  }

  // Erases `key` where the store can, ignoring a failure (cleanup never fails a round).
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

  Config config_;
  Kv kv_;
  const bool evented_;  // waits on the store's watches (see await_watches, watches.hpp)
  cluster_info cluster_;
  handler_options options_;
  std::string scope_;
  std::string nonce_ = make_nonce();  // this handler's, in every value it writes

  std::atomic<std::uint64_t> counter_and_attention_{0};  // run counter << 1 | attention
  mutable std::mutex mutex_;  // guards machine_ (and the parts' members that say so)
  agreement_type machine_;
  std::condition_variable watch_cv_;  // wakes the watcher (work, stop)
  std::condition_variable train_cv_;  // wakes a training thread waiting for the step
  std::atomic<bool> stop_{false};
  store_retry<Clock> store_{mutex_, watch_cv_, stop_};  // retries end at a stop request
  waker waker_;  // notices, stop requests and the training thread wake the watcher
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
