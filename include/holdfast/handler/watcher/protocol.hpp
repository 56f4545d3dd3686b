// holdfast/handler/watcher/protocol.hpp — the protocol step: the watcher performs the machine's
// next store operation (step_agreement's instruction: insert, put, try_get, wait, erase, list,
// agreement.hpp) and feeds what came of it back; the machine's wait for a key is served here,
// by the batches of acks.hpp, the watches of watches.hpp, or blocking gets.
//
// Guarantees:
//   - A worker blocked inside a step (a collective waiting for a peer) still takes part: the
//     watcher acks with the run counter it reads in the same atomic operation that raises the
//     training thread's attention, so that thread stops at its next step boundary at the latest.
//   - Store calls are retried while they fail transiently, until the machine's retry deadline
//     (store_retry.hpp), each attempt under a kv_call_deadline of that deadline (at least 100
//     ms), so over etcd a worker cut off from every member still ends its agreement within the
//     round's deadline plus one ack_timeout; a call that fails for good is fed to the machine
//     (on_store_failure). An insert that finds the key holding this worker's own value (a late
//     commit) is fed to the machine as created, so a claimant never takes itself for a loser.
//   - Waiting for a key has one rule for the round's outcome key, whichever way the key is
//     waited on: while the claimant waits for an ack, each look that finds nothing is followed
//     by a look at the outcome key, and a value there ends the wait (wait_or_outcome).
//   - The claimant collects the acks through a second watch on the round's acks (closed once
//     the watcher is idle again) where the store is evented and has no native get_many, in
//     batches (acks.hpp) where it has one or can list without a watch, else with blocking gets
//     of one watch_interval each; a control key comes with the control watch where the store is
//     evented.
//   - A stop abandons a wait: nothing the wait saw is fed to the machine.
// Caveats:
//   - A wait by blocking gets sees a stop only between its gets (one watch_interval each).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "../../agreement/keys.hpp"
#include "../../error.hpp"  // errnum_of: a store failure's errno for the machine
#include "../../kv.hpp"     // kv_pairs, has_kv_list_v: the machine's list of the acks
#include "../../version.hpp"
#include "acks.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's protocol step and its waits for a key, on the parts below.
template <class Config, class Kv, class Clock, class Hang>
class watcher_protocol : public watcher_acks<Config, Kv, Clock, Hang> {
  using below = watcher_acks<Config, Kv, Clock, Hang>;

 protected:
  using below::below;

  // What this part uses of the parts below (state.hpp, hang_watch.hpp, watches.hpp, acks.hpp).
  using below::ack_cache_;
  using below::ack_reads_;
  using below::attention_bit;
  using below::await_watches;
  using below::batch_look;
  using below::can_watch;
  using below::cluster_;
  using below::control_cache_;
  using below::counter_and_attention_;
  using below::detects_hangs;
  using below::erase_quietly;
  using below::evented_;
  using below::is_hang;
  using below::kv_;
  using below::look_for_hang_when_due;
  using below::machine_;
  using below::options_;
  using below::retrying;
  using below::scope_;
  using below::stop_;
  using below::store_;
  using below::wait_retry_until_;
  using typename below::ack_reads;
  using typename below::instruction;
  using typename below::key_look;
  using typename below::op;
  using typename below::time_point;

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
      if (!stop_.load()) machine_.on_store_failure(e.what(), detail::errnum_of(e));
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
  bool can_list() const { return kv_supports(kv_, kv_op::list); }

  // ---- waiting for a key (the machine's wait instruction) -------------------------------------

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
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
