// holdfast/handler/store_retry.hpp — how the handler calls its store during an agreement:
// transient failures retried with backoff until a deadline, and inserts that stay exactly-once
// across those retries.
//
// Guarantees:
//   - retrying(fn, deadline) calls `fn` until it returns, retrying transient store errors
//     (is_transient_kv_error: refused, reset, timed out, etcd "unavailable") with backoff (5 ms
//     doubling to 200 ms) until `deadline`, the last attempt at the deadline; then, or for any
//     other error, the error is thrown. Each attempt runs under a kv_call_deadline
//     (kv/call_deadline.hpp) of `deadline`, or of 100 ms from its start when less is left (the
//     last attempt): a store call never outlasts the retries' deadline by more than that, over
//     etcd whatever its request_timeout and however many endpoints are out of reach. A stop request
//     (the flag, with the condition variable notified under the mutex) ends the retries and the
//     pause between them at once.
//   - insert_once(kv, key, value, deadline) stays exactly-once across retries, and never
//     reports as lost a key this caller created: an attempt that failed may have been applied
//     (a timed-out write), so a retry first reads the key; and an insert that answers `false`
//     is followed by a read of the key, since the write it found may be this caller's own (an
//     attempt that timed out and committed late, after the retry's read saw nothing; a write
//     the transport sent twice). `value` names its writer (task and nonce), so finding it means
//     this caller created the key: insert_once answers true. insert_or_read also hands back the
//     value it found (another writer's, when it did not create the key), so a caller that needs
//     that value does not read the key again.
// Caveats:
//   - The pause locks the mutex it was given: never call retrying() with it held.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>  // is_same_v (the steady clock needs no conversion), is_void_v

#include "../kv.hpp"                // is_transient_kv_error
#include "../kv/call_deadline.hpp"  // kv_call_deadline: an attempt ends by the deadline
#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// What an insert-once found: whether this caller created the key, and what the key holds (the
/// caller's value when it did; another writer's otherwise; nullopt when it was read absent).
struct insert_result {
  bool created = false;
  std::optional<std::string> current;
};

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
    using result = decltype(fn());
    static_assert(!std::is_reference_v<result>, "a retried store call returns a value");
    if constexpr (std::is_void_v<result>) {
      retry_loop(attempt(fn), deadline);
    } else {
      std::optional<result> out;
      auto once = [&] { out.emplace(fn()); };
      retry_loop(attempt(once), deadline);
      return std::move(*out);
    }
  }

  // Insert-once that stays exactly-once across retries: an attempt that failed may have been
  // applied (a timed-out write), so a retry first reads the key; an insert that answers false
  // reads it too (an earlier attempt may have committed late, a write may have been sent
  // twice). `value` names its writer (task and nonce), so finding it means this handler created
  // the key.
  template <class Kv>
  insert_result insert_or_read(Kv& kv, const std::string& key, const std::string& value,
                               time_point deadline) const {
    bool maybe_applied = false;
    auto found = [&](std::optional<std::string> current) {
      return insert_result{current && *current == value, std::move(current)};
    };
    return retrying(
        [&] {
          if (maybe_applied)
            if (auto current = kv.try_get(key)) return found(std::move(current));
          maybe_applied = true;
          if (kv.insert(key, value)) return insert_result{true, value};
          return found(kv.try_get(key));  // it exists: is the value in it this caller's own?
        },
        deadline);
  }

  // As insert_or_read: whether this caller created the key.
  template <class Kv>
  bool insert_once(Kv& kv, const std::string& key, const std::string& value,
                   time_point deadline) const {
    return insert_or_read(kv, key, value, deadline).created;
  }

 private:
  // One attempt, called without knowing its type: the loop below is compiled once per Clock,
  // not once per call site (it was a tenth of a handler test's generated code).
  class attempt {
   public:
    template <class F>
    explicit attempt(F& fn) : fn_(&fn), call_([](void* f) { (*static_cast<F*>(f))(); }) {}
    void operator()() const { call_(fn_); }

   private:
    void* fn_;
    void (*call_)(void*);
  };

  // Runs `once` until it returns, as retrying() says.
  void retry_loop(attempt once, time_point deadline) const {
    std::chrono::milliseconds backoff(5);
    for (;;) {
      try {
        const kv_call_deadline bound(attempt_end(deadline));
        once();
        return;
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

  // The least an attempt is given (the last one, made at the deadline).
  static constexpr std::chrono::milliseconds last_attempt{100};

  // When an attempt made now must end: `deadline` on the steady clock (through Clock::now()
  // for another clock), or last_attempt from now when that is later.
  static std::chrono::steady_clock::time_point attempt_end(time_point deadline) {
    using steady = std::chrono::steady_clock;
    const auto now = steady::now();
    steady::time_point end;
    if constexpr (std::is_same_v<Clock, steady>)
      end = deadline;
    else
      end = now + std::chrono::duration_cast<steady::duration>(deadline - Clock::now());
    return std::max(end, now + std::chrono::duration_cast<steady::duration>(last_attempt));
  }

  std::mutex& mutex_;
  std::condition_variable& wake_;
  const std::atomic<bool>& stop_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
