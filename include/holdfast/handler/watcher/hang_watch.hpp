// holdfast/handler/watcher/hang_watch.hpp — the watcher's hang detection (the policies, the
// verdicts and the learned bounds are handler/hang.hpp's): it holds the training thread's phase
// to its bound, records a verdict once for the job and has the policy act on it once.
//
// Guarantees:
//   - Hang detection (Hang::detects): every sleep of the watcher ends when the training thread's
//     phase runs out of its bound (hang_next_: the poll's timeout in watches.hpp, a slice's end
//     in protocol.hpp), and every wake-up looks at it (look_for_hang_when_due), in an idle wait,
//     a protocol wait or a slice; a verdict is recorded once (record_hang: insert-once where
//     verdict_keys_locked says, a verdict already there being the one) and the policy acts on
//     the recorded one once (act_on_hang); a peer's is learned through the machine (a hang value
//     in a claim or outcome key) or ctl/hang.
//   - A frozen peer (on_peer_frozen, from the liveness monitor's thread) wakes the watcher, which
//     records the verdict at its next look.
//   - The restore, before the watcher starts, is watched by a guard thread of its own
//     (guard_restore), joined before guard_restore returns or throws.
// Caveats:
//   - A verdict that cannot be recorded (the store failing) is logged to stderr, and the policy
//     acts on it unrecorded.
//   - Without detection (Hang::detects false) nothing here runs: enter_phase does nothing and
//     guard_restore only runs the work.
#pragma once

#include <unistd.h>  // write: a verdict that could not be recorded, to stderr

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>  // the restore's guard thread
#include <utility>

#include "../../agreement/keys.hpp"
#include "../../agreement/value.hpp"
#include "../../version.hpp"
#include "../hang.hpp"  // hang_verdict, hang_learner, hang_phase: the verdicts and the bounds
#include "state.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's hang detection, on the shared state.
template <class Config, class Kv, class Clock, class Hang>
class watcher_hangs : public watcher_state<Config, Kv, Clock, Hang> {
  using below = watcher_state<Config, Kv, Clock, Hang>;

 protected:
  using below::below;

  // What this part uses of the state (state.hpp).
  using below::cluster_;
  using below::counter_and_attention_;
  using below::evented_;
  using below::kv_;
  using below::machine_;
  using below::mutex_;
  using below::nonce_;
  using below::options_;
  using below::raise_attention_locked;
  using below::scope_;
  using below::store_;
  using below::train_cv_;
  using below::wake_watcher;
  using typename below::time_point;

  // Whether `value` is a hang verdict (the protocol's inserts and the trigger waits ask too).
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

  hang_learner learner_{options_.hang};  // fed by the training thread; the watcher reads its bounds
  std::string hang_key_ = hang_key_name(scope_);  // ctl/hang: a verdict beside the rounds
  std::atomic<std::uint64_t> hang_stamp_{0};      // the training thread's phase (see enter_phase)
  std::atomic<bool> hang_acted_{false};           // the policy acted on a verdict
  std::atomic<bool> hang_next_wake_{false};       // frozen_ holds a verdict to record
  std::mutex hang_mutex_;                         // guards frozen_
  std::optional<hang_verdict> frozen_;            // a frozen peer, from the liveness monitor
  steady::time_point hang_next_{};                // the watcher's next look (watcher thread only)
  steady::time_point hang_read_next_{};           // its next read of ctl/hang (no watch; same)
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
