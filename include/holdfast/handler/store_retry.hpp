// holdfast/handler/store_retry.hpp — how the handler calls its store during an agreement:
// transient failures retried with backoff until a deadline, and inserts that stay exactly-once
// across those retries.
//
// Guarantees:
//   - retrying(fn, deadline) calls `fn` until it returns, retrying transient store errors
//     (is_transient_kv_error: refused, reset, timed out, etcd "unavailable") with backoff (5 ms
//     doubling to 200 ms) until `deadline`, the last attempt at the deadline; then, or for any
//     other error, the error is thrown. A stop request (the flag, with the condition variable
//     notified under the mutex) ends the retries and the pause between them at once.
//   - insert_once(kv, key, value, deadline) stays exactly-once across retries: an attempt that
//     failed may have been applied (a timed-out write), so a retry first reads the key; `value`
//     names its writer (task and nonce), so finding it means this caller created the key.
// Caveats:
//   - The pause locks the mutex it was given: never call retrying() with it held.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

#include "../kv.hpp"  // is_transient_kv_error
#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Retries store calls until a deadline, as long as no stop is requested (see the top).
template <class Clock>
class store_retry {
 public:
  using time_point = typename Clock::time_point;

  /// `stop` is set (and `wake` notified, under `mutex`) to end the retries.
  store_retry(std::mutex& mutex, std::condition_variable& wake, const std::atomic<bool>& stop)
      : mutex_(mutex), wake_(wake), stop_(stop) {}

  // Calls `fn` until it returns, retrying transient store errors (is_transient_kv_error) with
  // backoff (5 ms, doubling up to 200 ms) until `deadline`; then, or for any other error, the
  // error is thrown. A stop request ends the retries at once.
  template <class F>
  auto retrying(F&& fn, time_point deadline) const -> decltype(fn()) {
    std::chrono::milliseconds backoff(5);
    for (;;) {
      try {
        return fn();
      } catch (const std::exception& e) {
        if (!is_transient_kv_error(e) || stop_.load() || Clock::now() >= deadline) throw;
      }
      // the last attempt is made at the deadline
      const auto pause = std::min<typename Clock::duration>(backoff, deadline - Clock::now());
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, pause, [&] { return stop_.load(); });
      backoff = std::min(2 * backoff, std::chrono::milliseconds(200));
    }
  }

  // Insert-once that stays exactly-once across retries: an attempt that failed may have been
  // applied (a timed-out write), so a retry first reads the key; `value` names its writer
  // (task and nonce), so finding it means this handler created the key.
  template <class Kv>
  bool insert_once(Kv& kv, const std::string& key, const std::string& value,
                   time_point deadline) const {
    bool maybe_applied = false;
    return retrying(
        [&] {
          if (maybe_applied)
            if (auto current = kv.try_get(key)) return *current == value;
          maybe_applied = true;
          return kv.insert(key, value);
        },
        deadline);
  }

 private:
  std::mutex& mutex_;
  std::condition_variable& wake_;
  const std::atomic<bool>& stop_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
