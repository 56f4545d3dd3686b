// holdfast/handler/liveness.hpp — the liveness signal of a whole process: each worker keeps one
// leased key alive, and watches its successor's (a ring), so a worker frozen by SIGSTOP, a
// frozen VM or a SIGKILL is named by its predecessor within about one lease TTL.
//
// A stopped process cannot report itself. liveness_monitor puts `<scope>live/<task>/beat`
// ("alive <nonce>") with the store's lease; the store's own keep-alives (etcd: a round per
// TTL / 3 from the client's thread, each member tried for TTL / 6 and the next at once:
// kv/etcd/lease.hpp) renew it while the process runs, and once they stop the store deletes the
// key a TTL later: one event. The monitor's thread watches ONE key, its successor's
// `<scope>live/<(task + 1) % num_tasks>/beat`, and calls on_frozen(successor, silent) when that
// key, seen alive, is deleted and not back within a grace of TTL / 2. `<task>/beat` keeps
// live/1's watch (directory semantics: the keys below "live/1/") off live/10's key.
//
// The lease rule (etcd): the handler's scope is "holdfast/<run_id>/", so the etcd_options of the
// store set `lease_ttl` and `leased_prefix = "holdfast/<run_id>/live"`
// (liveness_leased_prefix(run_id)), relative to the etcd_kv handle's namespace as every key is;
// a URL says the same: `etcd://host:2379?lease_ttl=6&leased_prefix=holdfast/<run_id>/live`. No
// other key of the handler lies below it, so no decision is ever leased.
//
// Guarantees:
//   - available(kv, scope, task) is true only where the store can be watched and leases the
//     liveness keys (kv_lease_ttl > 0: etcd_kv, or an any_kv holding one, with a leased_prefix
//     covering them); elsewhere the monitor starts no thread and writes nothing (active() is
//     false). A SIGSTOPped worker over a store without leases is then found by its peers' own
//     step bounds (hang.hpp), as their steps wait for it.
//   - One watched key per worker: O(N) keys and watches for N workers, one event per detection.
//     The idle cost is the lease's keep-alives, which also postpone the store's watch probes
//     (kv/etcd/watch.hpp), so with a TTL of at least 6 s (liveness_default_ttl) a worker sends
//     at most 3 / TTL = 0.5 requests per second, and its handler's own watch no probe.
//   - A verdict comes only for a successor seen alive ("alive ..."), whose key is then deleted
//     (erased, or found missing in a later snapshot): nothing before the successor's key first
//     appears is a verdict (it may start late), nor the deletion of a key that said "done" (a
//     successor that finished: finish() and the destructor write it). One verdict per
//     disappearance; a key written alive again arms the monitor again.
//   - No verdict for a live worker whose lease etcd lost (a resumed stale leader revokes leases
//     a new leader kept alive, etcd-io/etcd#15247, in etcd releases before its 2024 fix, such as
//     the 3.4.23 the tests run): its store grants a new lease and puts the key back within a
//     keep-alive period, and a key back within the grace (TTL / 2) is no verdict.
//   - Time from the stall to the callback: the store deletes the key between TTL - TTL / 3 and
//     TTL after the last keep-alive (etcd checks expiries every 500 ms), the watch delivers
//     the delete at once, and the grace adds TTL / 2: within 1.5 x TTL + 1 s of the stall,
//     2 x TTL + 1 s with a slow store. `silent` is the lease TTL plus the time since the
//     deletion was seen: how long at least the successor sent no sign.
//   - on_frozen runs on the monitor's thread; an exception from it is logged, not propagated.
//     Store errors (a put, the watch) are logged and retried; they never end the thread.
// Caveats:
//   - A worker paused past the TTL + the grace is named frozen. When it resumes, its store
//     grants it a new lease and puts its key back (etcd_kv), which arms its predecessor again;
//     the verdict stands, and the worker's handler learns it from the store (the round's
//     outcome or ctl/hang, through its control watch) and acts on it by its hang policy.
//   - The ring has no repair: when task k finished cleanly, nobody watches task k + 1.
#pragma once

#include <poll.h>    // poll: the watch's descriptor and the stop waker
#include <unistd.h>  // getpid: the nonce

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>  // conditional_t, is_copy_constructible: what a store must be
#include <utility>

#include "../detail/waker.hpp"  // waker: stops the thread's poll
#include "../error.hpp"
#include "../kv.hpp"  // kv_lease_ttl, kv_supports, has_kv_watch_v, is_transient_kv_error
#include "../kv/call_deadline.hpp"  // kv_call_deadline: finish_by bounds its write
#include "../log.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The TTL liveness keys are meant for: 3 / 6 s = 0.5 keep-alives per second and worker, at
/// most 0.1 request per worker-second above an idle handler's watch probe (one per 2.5 s), and
/// a frozen worker named within 2 x 6 s + 1 s = 13 s.
inline constexpr std::chrono::seconds liveness_default_ttl{6};

/// The etcd_options::leased_prefix that leases a handler's liveness keys and nothing else:
/// "holdfast/<run_id>/live".
inline std::string liveness_leased_prefix(const std::string& run_id) {
  return "holdfast/" + run_id + "/live";
}

/// The liveness key of `task` under `scope` (the handler's "holdfast/<run_id>/"):
/// "<scope>live/<task>/beat".
inline std::string liveness_key(const std::string& scope, int task) {
  return scope + "live/" + std::to_string(task) + "/beat";
}

/// True when a store of type Kv may lease liveness keys at all: it can be watched, says which
/// keys carry a lease (has_kv_leases_v) and can be copied into the monitor. Over any other store
/// the handler compiles no monitor in.
template <class Kv>
inline constexpr bool can_carry_liveness_v =
    has_kv_watch_v<Kv>&& has_kv_leases_v<Kv>&& std::is_copy_constructible_v<Kv>;

/// Keeps this worker's liveness key alive (through the store's lease) and names its successor
/// when the successor's key expires (see the header). Owns one thread; not copyable.
template <class Kv>
class liveness_monitor {
 public:
  /// Called with the frozen task and how long at least it has been silent.
  using frozen_fn = std::function<void(int frozen_task, std::chrono::milliseconds silent)>;

  /// True when `kv` can carry this task's liveness signal: it can be watched and leases the
  /// liveness keys of `scope` (kv_lease_ttl of this task's key > 0).
  static bool available(const Kv& kv, const std::string& scope, int task) noexcept {
    if constexpr (has_kv_watch_v<Kv>) {
      try {
        return kv_supports(kv, kv_op::watch) &&
               kv_lease_ttl(kv, liveness_key(scope, task)).count() > 0;
      } catch (...) {
        return false;
      }
    } else {
      static_cast<void>(kv);
      static_cast<void>(scope);
      static_cast<void>(task);
      return false;
    }
  }

  /// Starts the monitor's thread where available(kv, scope, task); else does nothing. Throws
  /// holdfast::error(EINVAL) when `scope` does not end with '/' or task is not in
  /// [0, num_tasks).
  liveness_monitor(Kv kv, std::string scope, int task, int num_tasks, frozen_fn on_frozen,
                   log_fn log = {})
      : kv_(std::move(kv)),
        successor_(num_tasks > 0 ? (task + 1) % num_tasks : 0),
        own_key_(liveness_key(scope, task)),
        successor_key_(liveness_key(scope, successor_)),
        watch_prefix_(scope + "live/" + std::to_string(successor_)),
        on_frozen_(std::move(on_frozen)),
        log_(std::move(log)) {
    if (scope.empty() || scope.back() != '/')
      throw error(EINVAL, "liveness monitor", scope, "the scope must end with '/'");
    if (task < 0 || task >= num_tasks)
      throw error(
          EINVAL, "liveness monitor", own_key_,
          "task " + std::to_string(task) + " not in [0, " + std::to_string(num_tasks) + ")");
    if (!available(kv_, scope, task)) return;
    ttl_ = kv_lease_ttl(kv_, own_key_);
    watching_ = num_tasks > 1;
    alive_value_ = "alive " + std::to_string(::getpid()) + "-" +
                   std::to_string(clock::now().time_since_epoch().count());
    thread_ = std::thread([this] {
      run();
      std::lock_guard<std::mutex> lock(mutex_);
      ended_ = true;
      ended_cv_.notify_all();
    });
  }
  liveness_monitor(const liveness_monitor&) = delete;
  liveness_monitor& operator=(const liveness_monitor&) = delete;
  /// finish(): writes "done" (no verdict for this worker) and stops the thread.
  ~liveness_monitor() { finish(); }

  /// True when the monitor runs (available() held when it was made).
  bool active() const noexcept { return ttl_.count() > 0; }
  /// The task this monitor watches.
  int successor() const noexcept { return successor_; }
  /// The liveness keys' lease TTL (0 s when not active).
  std::chrono::seconds ttl() const noexcept { return ttl_; }

  /// Waits up to `timeout` until the successor's key has been seen alive; true once it has
  /// (from then on its expiry is a verdict). For tests and diagnostics.
  bool wait_successor_seen(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return seen_cv_.wait_for(lock, timeout, [this] { return seen_; });
  }

  /// Ends this worker's part cleanly: stops the thread and writes "done" to its key, so its
  /// predecessor gives no verdict when the key expires later. Idempotent; never throws (a
  /// failed write is logged).
  void finish() noexcept { finish_by(std::chrono::steady_clock::time_point::max()); }

  /// finish() within `deadline` (an exit that must not wait for the store): stops the thread
  /// and, when it has ended by then, writes "done" under a kv_call_deadline of `deadline`. A
  /// thread still inside a store call then is left to end by itself and nothing is written
  /// now (the key expires with the process, as an exiting process's does); a later finish()
  /// or the destructor joins it and writes "done", within the store's own timeouts (the call
  /// in flight, then the write: over etcd up to twice its request_timeout). Never throws.
  void finish_by(std::chrono::steady_clock::time_point deadline) noexcept {
    if (!thread_.joinable()) return;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      stopping_ = true;
      waker_.notify();
      if (!ended_cv_.wait_until(lock, deadline, [this] { return ended_; })) return;
    }
    thread_.join();
    if (abandoned_) return;
    try {
      kv_call_deadline bound(deadline);
      kv_.put(own_key_, "done");
    } catch (const std::exception& e) {
      report(std::string("liveness: writing 'done' to ") + own_key_ + " failed: " + e.what());
    }
  }

  /// Stops the thread without writing "done": a worker that fails (its handler destroyed by an
  /// exception) is no clean exit, and its key is left to its lease. Never throws.
  void abandon() noexcept {
    abandoned_ = true;
    finish();
  }

 private:
  using clock = std::chrono::steady_clock;

  // vanished: seen alive, then deleted; a verdict once grace() passes without it back.
  enum class seen_state : unsigned char { unseen, alive, vanished, done };

  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  }

  // Sleeps up to `d`, or until finish(); true when stopping.
  bool pause(std::chrono::milliseconds d) {
    pollfd p{waker_.fd(), POLLIN, 0};
    static_cast<void>(::poll(&p, 1, static_cast<int>(d.count())));
    waker_.drain();
    return stopping();
  }

  void run() {
    beat();
    if constexpr (has_kv_watch_v<Kv>) {
      if (watching_) watch_loop();
    }
  }

  // Puts this worker's key, retrying transient failures until it is written or finish().
  void beat() {
    for (;;) {
      try {
        kv_.put(own_key_, alive_value_);
        return;
      } catch (const std::exception& e) {
        report(std::string("liveness: writing ") + own_key_ + " failed: " + e.what());
        if (!is_transient_kv_error(e)) return;  // the lease is gone: keep watching anyway
      }
      if (pause(std::chrono::milliseconds(200))) return;
    }
  }

  void watch_loop() {
    std::optional<decltype(kv_.watch(watch_prefix_))> w;
    while (!stopping()) {
      if (!w) {
        try {
          w.emplace(kv_.watch(watch_prefix_));
        } catch (const std::exception& e) {
          report(std::string("liveness: watching ") + watch_prefix_ + " failed: " + e.what());
          if (pause(std::chrono::milliseconds(500))) return;
          continue;
        }
      }
      if (!w->buffered()) wait_for(*w);
      if (stopping()) return;
      waker_.drain();
      kv_changes changes;
      try {
        changes = w->take();
      } catch (const std::exception& e) {  // the watch retries by itself
        report(std::string("liveness: watch of ") + watch_prefix_ + ": " + e.what());
        if (pause(std::chrono::milliseconds(100))) return;
        continue;
      }
      took_at_ = clock::now();
      apply(changes);
      judge();
    }
  }

  // Polls the watch's descriptor and the stop waker until the watch is due (or a vanished
  // successor's grace ends).
  template <class W>
  void wait_for(const W& w) {
    pollfd p[2] = {{waker_.fd(), POLLIN, 0}, {w.fd(), POLLIN, 0}};
    auto due = w.due();
    if (state_ == seen_state::vanished) due = std::min(due, vanished_at_ + grace());
    int timeout = -1;
    if (due != clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(due - clock::now());
      timeout = static_cast<int>(std::clamp<long long>(left.count(), 0, INT_MAX));
    }
    static_cast<void>(::poll(p, w.fd() >= 0 ? 2 : 1, timeout));
  }

  void apply(const kv_changes& changes) {
    bool named = false;
    for (const auto& ev : changes.events) named = named || ev.key == successor_key_;
    if (changes.complete && !named) gone();  // a snapshot without the key: it was deleted
    if (changes.resync && !changes.complete) {
      std::optional<std::string> v;
      try {
        v = kv_.try_get(successor_key_);
      } catch (const std::exception& e) {
        report(std::string("liveness: reading ") + successor_key_ + " failed: " + e.what());
        return;
      }
      if (v)
        written(*v);
      else
        gone();
    }
    for (const auto& ev : changes.events) {
      if (ev.key != successor_key_) continue;
      if (ev.value)
        written(*ev.value);
      else
        gone();
    }
  }

  void written(const std::string& value) {
    if (value.compare(0, 4, "done") == 0) {
      state_ = seen_state::done;
      return;
    }
    if (state_ == seen_state::vanished)
      report("liveness: " + successor_key_ + " came back within the grace: no verdict");
    state_ = seen_state::alive;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!seen_) {
      seen_ = true;
      seen_cv_.notify_all();
    }
  }

  // The successor's key was deleted: a verdict once grace() has passed without it coming back
  // (judge), when it had been seen alive.
  void gone() {
    if (state_ == seen_state::alive) {
      state_ = seen_state::vanished;
      vanished_at_ = took_at_;
    } else if (state_ != seen_state::vanished) {
      state_ = seen_state::unseen;
    }
  }

  // How long a deleted key may take to come back before its deletion is a verdict: a
  // keep-alive period (TTL / 3) and one endpoint's try (TTL / 6), in which a store that lost a
  // live worker's lease grants a new one and puts the key back (kv/etcd/lease.hpp).
  std::chrono::milliseconds grace() const noexcept { return std::chrono::milliseconds(ttl_) / 2; }

  // The verdict on a vanished successor whose grace has passed.
  void judge() {
    if (state_ != seen_state::vanished || clock::now() < vanished_at_ + grace()) return;
    state_ = seen_state::unseen;
    try {
      if (on_frozen_)
        on_frozen_(successor_,
                   std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::milliseconds(ttl_) + (clock::now() - vanished_at_)));
    } catch (const std::exception& e) {
      report(std::string("liveness: on_frozen threw: ") + e.what());
    } catch (...) {
      report("liveness: on_frozen threw");
    }
  }

  void report(const std::string& line) const noexcept { detail::log_line(log_, line); }

  Kv kv_;
  int successor_;
  std::string own_key_, successor_key_, watch_prefix_;
  frozen_fn on_frozen_;
  log_fn log_;
  std::chrono::seconds ttl_{0};
  bool watching_ = false;
  std::string alive_value_;
  seen_state state_ = seen_state::unseen;  // the monitor's thread only
  clock::time_point took_at_;              // when the last take() returned (ditto)
  clock::time_point vanished_at_;          // when the deletion was seen (ditto)
  detail::waker waker_;
  std::mutex mutex_;
  std::condition_variable seen_cv_;
  bool seen_ = false;
  bool stopping_ = false;
  bool ended_ = false;  // the thread's run() returned (guarded by mutex_)
  std::condition_variable ended_cv_;
  bool abandoned_ = false;  // abandon(): "done" is never written (owner's thread)
  std::thread thread_;
};

/// What the handler holds: a monitor (once started) where Kv can carry liveness keys, an empty
/// struct elsewhere, so no monitor is compiled for a store without leases.
struct no_liveness_monitor {};
template <class Kv>
using liveness_slot = std::conditional_t<can_carry_liveness_v<Kv>,
                                         std::optional<liveness_monitor<Kv>>, no_liveness_monitor>;

HOLDFAST_NAMESPACE_END
