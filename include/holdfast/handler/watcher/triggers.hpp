// holdfast/handler/watcher/triggers.hpp — what an idle watcher (one with no store operation to
// perform) waits for: the key that can start or end an agreement now (the round's claim or
// final claim, or the error key) and, beside the rounds, the next periodic-save decision and a
// hang verdict; what it sees is fed to the machine.
//
// Guarantees:
//   - Over an evented store the wait is one sleep on the control watch (watches.hpp), and what
//     the watch knows already is answered with no sleep; else it is one blocking get of one
//     watch_interval.
//   - Decisions beside the rounds over a watch that follows named keys (the torch store): an
//     idle watcher follows the next decision (ctl/save/<k>) and the verdict key (ctl/hang)
//     beside its trigger (idle_keys), so they wake it as a watch of the whole prefix would.
//   - An abort in the trigger key is taken with the error key's payload, and a verdict there
//     fails the machine; a verdict in ctl/hang fails nothing: the policy acts on it.
//   - Once the machine has failed the watcher makes no store call more: it closes its watches
//     and waits for its stop, so a destruction is never held up by a reconnection.
//   - The claimant's ack watch is closed here, once the watcher is idle again (closing an
//     inotify descriptor can take the kernel tens of milliseconds: not before the outcome).
// Caveats:
//   - Over a store without a watch, or with a notice source that cannot wake, a notice or a
//     claim is seen within one watch interval, and an idle worker makes a blocking get per
//     interval.
//   - Over a store whose watch follows named keys, an error written alone is seen only through
//     the key followed then (a failing worker also writes aborts into the followed keys).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../agreement/keys.hpp"
#include "../../agreement/value.hpp"
#include "../../version.hpp"
#include "protocol.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's waits for a trigger while idle, on the parts below.
template <class Config, class Kv, class Clock, class Hang>
class watcher_triggers : public watcher_protocol<Config, Kv, Clock, Hang> {
  using below = watcher_protocol<Config, Kv, Clock, Hang>;

 protected:
  using below::below;

  // What this part uses of the parts below.
  using below::ack_cache_;
  using below::act_on_hang;
  using below::await_watches;
  using below::can_watch;
  using below::control_cache_;
  using below::detects_hangs;
  using below::evented_;
  using below::hang_acted_;
  using below::hang_key_;
  using below::is_hang;
  using below::kv_;
  using below::machine_;
  using below::open_control;
  using below::options_;
  using below::periodic_next_k_;
  using below::raise_attention_locked;
  using below::scope_;
  using below::stop_;
  using below::train_cv_;
  using below::watch_cv_;
  using typename below::time_point;

  // Whether `value` is an abort (a failing worker's, in the key a peer waits on).
  static bool is_abort(const std::string& value) {
    auto v = parse_agreement_value(value);
    return v && v->what == agreement_value::kind::abort;
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
        seen = classify_trigger(std::move(v), trigger, [&] {
          // An abort proves the error key written (the failing worker writes it first): read it
          // from the store, not as this cache last saw it. Over a watch of named keys the
          // error key is not followed, and its "absent" from before the failure made a peer's
          // failure a payload-less "agreement aborted" (origin -1) now and then.
          control_cache_.mark_stale(error_key_);
          return control_cache_.lookup(kv_, error_key_);
        });
      seen.reported = std::move(reported);
      return seen;
    }
    return {};
  }

  std::string error_key_ = agreement_key_name(scope_, agreement_key::error, 0);
  bool error_seen_ = false;      // the error key's value was seen (guarded by mutex_)
  bool hang_key_taken_ = false;  // ctl/hang holds a value that is no verdict (watcher only)
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
