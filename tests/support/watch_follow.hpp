// tests/support/watch_follow.hpp — follows a store's watch object (kv.hpp, "Waiting on a store")
// the way the handler's watcher does: poll() on fd() until min(deadline, due()) — a plain sleep
// while fd() is -1 — then take().
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <holdfast/kv.hpp>
#include <thread>
#include <vector>

namespace holdfast_test {

/// Takes from `w` until `done(events so far)` or `timeout`; returns every event seen (a
/// snapshot's included). `snapshot` / `resync`, when given, note whether a take was complete /
/// asked for a re-read.
template <class Watch, class Done>
std::vector<holdfast::kv_event> follow_watch(Watch& w, std::chrono::milliseconds timeout, Done done,
                                             bool* snapshot = nullptr, bool* resync = nullptr) {
  using clk = std::chrono::steady_clock;
  const auto deadline = clk::now() + timeout;
  std::vector<holdfast::kv_event> all;
  for (;;) {
    if (!w.buffered()) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(std::min(deadline, w.due()) - clk::now());
      const int ms = static_cast<int>(std::clamp<long long>(left.count(), 0, 1000));
      if (w.fd() >= 0) {
        pollfd p{w.fd(), POLLIN, 0};
        ::poll(&p, 1, ms);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
    }
    auto c = w.take();
    if (snapshot && c.complete) *snapshot = true;
    if (resync && c.resync) *resync = true;
    all.insert(all.end(), c.events.begin(), c.events.end());
    if (done(all) || clk::now() >= deadline) return all;
  }
}

}  // namespace holdfast_test
