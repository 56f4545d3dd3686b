// holdfast/handler/watcher/periodic_saves.hpp — the watcher's side of periodic saves
// (handler_options::periodic_saves; the interval policy is handler/periodic.hpp, the training
// side preemption_handler.hpp): task 0 publishes each decision its training thread asks for,
// and every watcher learns the decisions in order and hands them to its training thread.
//
// Guarantees:
//   - Task 0's watcher inserts the decision its training thread asked for (ctl/save/<k>,
//     "save <step>"), after reading every task's report (saved/<task>: O(N) reads per save, none
//     between saves) and erasing the decisions every task reported; every watcher learns each
//     decision in order, from the control watch (or one try_get per wake-up over a store without
//     one), queues its step for the training thread and raises its attention.
//   - A decision key that exists already (left by an earlier launch with this run id) is learned
//     as it is, and the next one tried (8 at most, then the publication fails).
//   - A store failure is retried at the next wake-up: a decision not published is asked for
//     again (periodic_retry_, with the training thread's attention raised).
// Caveats:
//   - Nothing is read or written while the periodic saves are off, or once the machine failed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>  // EEXIST: every decision key tried was taken
#include <cstdint>
#include <deque>  // the periodic saves decided and not acted on
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "../../agreement/keys.hpp"
#include "../../agreement/value.hpp"
#include "../../error.hpp"
#include "../../version.hpp"
#include "watches.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's side of the periodic saves, on the watches and the parts below them.
template <class Config, class Kv, class Clock, class Hang>
class watcher_periodic : public watcher_watches<Config, Kv, Clock, Hang> {
  using below = watcher_watches<Config, Kv, Clock, Hang>;

 protected:
  using below::below;

  // What this part uses of the parts below (state.hpp, watches.hpp).
  using below::attention_bit;
  using below::can_watch;
  using below::cluster_;
  using below::control_cache_;
  using below::counter_and_attention_;
  using below::erase_quietly;
  using below::evented_;
  using below::kv_;
  using below::machine_;
  using below::mutex_;
  using below::nonce_;
  using below::options_;
  using below::scope_;
  using below::train_cv_;

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

  std::deque<std::int64_t> periodic_steps_;  // decided, not acted on yet (guarded by mutex_)
  std::int64_t periodic_publish_ = -1;       // task 0's request to publish (guarded by mutex_)
  bool periodic_retry_ = false;              // the request failed: ask again (guarded by mutex_)
  std::atomic<std::int64_t> periodic_others_cost_us_{-1};  // the longest reported by the others
  std::uint64_t periodic_next_k_ = 1;  // the next decision to learn (watcher thread only)
  std::deque<std::pair<std::uint64_t, std::int64_t>> periodic_published_;  // task 0: k, step
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
