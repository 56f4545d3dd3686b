// holdfast/handler/watcher/watches.hpp — the watcher's watches on the store, where the store
// can be waited on (has_kv_watch_v, and evented_ at run time): one on the control keys (ctl/)
// for the watcher's life and the claimant's on one round's acks (watch_cache.hpp says what each
// knows), and the one sleep of an evented watcher: a poll() on the waker and the watches.
//
// Guarantees:
//   - Event-driven waiting: the watcher sleeps in one poll() on a waker (an eventfd) and on the
//     store's watches (watch_cache.hpp), with no time slicing, where the store can be waited on
//     (asked once, at construction: kv_supports(kv, kv_op::watch), state.hpp); notices with
//     set_waker, a stop and the training thread wake it through the same waker.
//   - A sleep (await_watches) also ends at its `until`, at a watch's due time, and when the
//     training thread's phase runs out of its bound (hang_next_, hang_watch.hpp); then it takes
//     the changes every open watch brought.
// Caveats:
//   - With a notice source that cannot wake the waker (has_notice_waker_v false), a sleep lasts
//     at most one watch_interval, so a notice is seen within one.
//   - The caches are the watcher thread's alone (watch_cache.hpp is not thread-safe).
#pragma once

#include <poll.h>  // poll: one sleep on the waker and the watches

#include <algorithm>
#include <chrono>
#include <utility>

#include "../../agreement/keys.hpp"      // agreement_control_prefix: the control watch's keys
#include "../../termination/notice.hpp"  // has_notice_waker_v: whether a notice wakes the watcher
#include "../../version.hpp"
#include "../watch_cache.hpp"
#include "hang_watch.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's watches on the store, on hang detection and the shared state.
template <class Config, class Kv, class Clock, class Hang>
class watcher_watches : public watcher_hangs<Config, Kv, Clock, Hang> {
  using below = watcher_hangs<Config, Kv, Clock, Hang>;

 protected:
  // By reference, so that the arguments reach the state's constructor as they came: no extra
  // move or copy on the way.
  watcher_watches(Config&& config, Kv&& kv, cluster_info&& cluster, const handler_options& options)
      : below(std::move(config), std::move(kv), std::move(cluster), options) {
    control_cache_.prefix = agreement_control_prefix(scope_);
  }

  // What this part uses of the parts below (state.hpp, hang_watch.hpp).
  using below::detects_hangs;
  using below::hang_next_;
  using below::kv_;
  using below::look_for_hang_when_due;
  using below::options_;
  using below::scope_;
  using below::waker_;
  using typename below::time_point;

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

  // ctl/, for the watcher's life (watcher thread only)
  watch_cache<Kv> control_cache_;
  // the claimant's: one round's acks while it collects (watcher thread only)
  watch_cache<Kv> ack_cache_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
