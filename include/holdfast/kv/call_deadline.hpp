// holdfast/kv/call_deadline.hpp — a deadline for the store calls one thread makes.
//
//   {
//     holdfast::kv_call_deadline scope(std::chrono::steady_clock::now() + 250ms);
//     auto v = kv.get(key, 100ms);  // over etcd: done (or failed) within 250 ms
//   }
//
// A store call over a network has its own timeouts (etcd_options::connect_timeout and
// request_timeout), per endpoint it tries: with three endpoints out of reach one call can take
// three of each. A caller that must be done by a time of its own (the handler, by a round's
// deadline; a training step that must notice a failed agreement) sets that time here.
//
// Guarantees:
//   - While a kv_call_deadline lives, the store calls its thread makes that honour it end by its
//     deadline: etcd_kv's requests (their connect and request timeouts are cut to the time left;
//     no further endpoint is tried once it has passed) and its blocking get's and watches' waits.
//     A call cut short fails as its own timeout does: holdfast::error with ETIMEDOUT, which
//     is_transient_kv_error accepts.
//   - Scopes nest: the earliest deadline in force applies; the destructor restores the one
//     before. kv_call_deadline::current() is the deadline in force on this thread, or nullopt.
// Caveats:
//   - filesystem_kv and in_process_kv ignore it: their calls wait on no network (a get still
//     ends by its own timeout).
//   - Per thread: the calls of other threads (an etcd lease's keep-alives) are not bounded.
//   - Make it a named local, destroyed on the thread that made it in the reverse order of
//     construction (a temporary ends at once; one on the heap breaks the nesting): it restores
//     the deadline before it in its destructor. Not copyable or movable.
//   - The bound covers the whole call: a connect and then the exchange each get what is left
//     (an http request sent again on a fresh connection too), within a millisecond.
#pragma once

#include <chrono>
#include <optional>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Bounds the store calls of the current thread while it lives (see the top of the header).
class kv_call_deadline {
 public:
  using clock = std::chrono::steady_clock;

  /// From now on, this thread's store calls end by `deadline` (or by an earlier one in force).
  explicit kv_call_deadline(clock::time_point deadline) noexcept : outer_(slot()) {
    if (!outer_ || deadline < *outer_) slot() = deadline;
  }
  kv_call_deadline(const kv_call_deadline&) = delete;
  kv_call_deadline& operator=(const kv_call_deadline&) = delete;
  /// Restores the deadline in force before this one.
  ~kv_call_deadline() { slot() = outer_; }

  /// The deadline in force on this thread, if any.
  static std::optional<clock::time_point> current() noexcept { return slot(); }

  /// What a call that would wait `otherwise` may wait: the time left before the deadline in
  /// force, rounded up to a millisecond (zero once it passed), when that is less.
  static std::chrono::milliseconds cap(std::chrono::milliseconds otherwise) {
    const auto& d = slot();
    if (!d) return otherwise;
    const auto left = *d - clock::now();
    if (left <= clock::duration::zero()) return std::chrono::milliseconds::zero();
    const auto cut = std::chrono::ceil<std::chrono::milliseconds>(left);
    return cut < otherwise ? cut : otherwise;
  }

  /// Whether a deadline is in force on this thread and has passed.
  static bool passed() noexcept {
    const auto& d = slot();
    return d && clock::now() >= *d;
  }

 private:
  static std::optional<clock::time_point>& slot() noexcept {
    static thread_local std::optional<clock::time_point> deadline;
    return deadline;
  }
  std::optional<clock::time_point> outer_;
};

HOLDFAST_NAMESPACE_END
