// holdfast/termination/notice.hpp — the Notice contract every notice source meets, the record a
// background source keeps its outcome in, and any_of to combine sources.
//
// A Notice policy has start(), stop(), a non-blocking `bool noticed() const noexcept`,
// `noticed_at()` (steady-clock time of the notice) and `deadline()` (the wall-clock time the
// source announced the machine goes away, when it says). Nothing runs until start().
//
// Guarantees:
//   - is_notice_policy_v<T> and check_notice_policy<T>() (C++17), notice_policy<T> (C++20) check
//     the five members; check_notice_policy's static_asserts name the first one missing.
//   - Once noticed, a notice stays noticed: notice_record keeps the first notice and its deadline,
//     readable from any thread (lock-free atomics).
//   - any_of is noticed when any of its sources is, with the earliest noticed_at() and the
//     earliest deadline(); its start() starts all sources or none.
//   - Waking: a source may have `void set_waker(const detail::waker*) noexcept` (nullptr
//     detaches): it then notifies that waker (detail/waker.hpp) the moment it notices, so a
//     watcher sleeps in poll() on the waker's descriptor. has_notice_waker_v<N> is true when N
//     has set_waker and every notice it raises wakes (a source whose set_waker covers only part
//     of its notices declares `static constexpr bool wakes_on_notice = false`). Waking sources:
//     signal_notice (from its signal handler), polled_notice and the notices built on it
//     (file_notice, the cloud notices: from their polling thread). any_of always has set_waker,
//     forwards it to each source that has one, and wakes on notice only when all of them do.
// Caveats:
//   - noticed_at() uses CLOCK_MONOTONIC, which is std::chrono::steady_clock on Linux.
//   - A source without set_waker (one that notices only when noticed() is called) wakes no one:
//     a watcher must keep looking at noticed() for it.
//   - An attached waker must outlive its attachment: set_waker(nullptr) before destroying it.
#pragma once

#include <time.h>  // clock_gettime: async-signal-safe time, also in signal handlers

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../detail/waker.hpp"  // detail::waker: what set_waker attaches
#include "../io.hpp"            // detail::detect
#include "../log.hpp"           // log_fn, log_to_stderr: the one logging hook

HOLDFAST_NAMESPACE_BEGIN

/// What a poll found: a notice, and the deadline it announced (if any).
struct poll_result {
  bool noticed = false;
  std::optional<std::chrono::system_clock::time_point> deadline;
  /// From a plain bool: noticed or not, no deadline.
  poll_result(bool n = false) noexcept : noticed(n) {}  // NOLINT: implicit on purpose
  /// Noticed with an announced deadline.
  poll_result(bool n, std::optional<std::chrono::system_clock::time_point> d) noexcept
      : noticed(n), deadline(d) {}
};

namespace detail {

/// CLOCK_MONOTONIC in nanoseconds (async-signal-safe).
inline std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

/// CLOCK_REALTIME (system_clock) in nanoseconds since the epoch (async-signal-safe).
inline std::int64_t realtime_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline std::chrono::steady_clock::time_point steady_from_ns(std::int64_t ns) noexcept {
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

inline std::chrono::system_clock::time_point system_from_ns(std::int64_t ns) noexcept {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

/// A notice's outcome, readable from any thread.
struct notice_record {
  std::atomic<bool> noticed{false};
  std::atomic<std::int64_t> at_ns{0};
  std::atomic<bool> has_deadline{false};
  std::atomic<std::int64_t> deadline_ns{0};  // system_clock, since the epoch

  void record(std::optional<std::chrono::system_clock::time_point> deadline) noexcept {
    if (noticed.load(std::memory_order_acquire)) return;
    if (deadline) {
      deadline_ns.store(
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline->time_since_epoch())
              .count());
      has_deadline.store(true);
    }
    at_ns.store(monotonic_ns());
    noticed.store(true, std::memory_order_release);
  }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    if (!noticed.load(std::memory_order_acquire)) return std::nullopt;
    return steady_from_ns(at_ns.load());
  }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    if (!noticed.load(std::memory_order_acquire) || !has_deadline.load()) return std::nullopt;
    return system_from_ns(deadline_ns.load());
  }
};

template <class T>
using notice_start = decltype(std::declval<T&>().start());
template <class T>
using notice_stop = decltype(std::declval<T&>().stop());
template <class T>
using notice_noticed = decltype(bool{std::declval<const T&>().noticed()});
template <class T>
using notice_at = decltype(std::optional<std::chrono::steady_clock::time_point>{
    std::declval<const T&>().noticed_at()});
template <class T>
using notice_deadline = decltype(std::optional<std::chrono::system_clock::time_point>{
    std::declval<const T&>().deadline()});
template <class T>
using notice_set_waker = decltype(std::declval<T&>().set_waker(static_cast<const waker*>(nullptr)));

template <class T>
using notice_source_member = decltype(std::string(std::declval<const T&>().source()));
template <class T>
using notice_accessor = decltype(std::declval<const T&>().notice());

/// What fired, for the log: a Notice's optional `std::string source() const` ("signal
/// SIGTERM", "file '/run/preempt'"), through a config's notice(); "" when it has none.
template <class N>
std::string notice_source_of(const N& n) {
  if constexpr (detect<notice_source_member, N>::value)
    return n.source();
  else if constexpr (detect<notice_accessor, N>::value)
    return notice_source_of(n.notice());
  else
    return {};
}

/// True when T has set_waker(const detail::waker*), whatever it covers.
template <class T>
inline constexpr bool can_set_waker_v = detect<notice_set_waker, T>::value;

/// T::wakes_on_notice when T declares it, else true.
template <class T, class = void>
struct declared_wakes : std::true_type {};
template <class T>
struct declared_wakes<T, std::void_t<decltype(T::wakes_on_notice)>>
    : std::bool_constant<T::wakes_on_notice> {};

/// Attaches `w` to `n` when it has set_waker; nothing otherwise.
template <class T>
void set_waker_if_any(T& n, const waker* w) noexcept {
  if constexpr (can_set_waker_v<T>) n.set_waker(w);
}

}  // namespace detail

/// True when N has `void set_waker(const detail::waker*) noexcept` and every notice it raises
/// notifies the attached waker (N::wakes_on_notice, when declared, is true). A termination
/// Config answers it too (termination_config forwards to its Notice).
template <class N>
inline constexpr bool has_notice_waker_v =
    detail::can_set_waker_v<N>&& detail::declared_wakes<N>::value;

/// True when T has the Notice interface (start, stop, noticed, noticed_at, deadline).
template <class T>
inline constexpr bool is_notice_policy_v =
    detail::detect<detail::notice_start, T>::value&& detail::detect<detail::notice_stop, T>::value&&
        detail::detect<detail::notice_noticed, T>::value&& detail::detect<
            detail::notice_at, T>::value&& detail::detect<detail::notice_deadline, T>::value;

/// Checks a Notice policy at compile time, naming the first missing member.
template <class T>
constexpr bool check_notice_policy() {
  static_assert(detail::detect<detail::notice_start, T>::value,
                "holdfast: a Notice policy needs void start()");
  static_assert(detail::detect<detail::notice_stop, T>::value,
                "holdfast: a Notice policy needs void stop()");
  static_assert(detail::detect<detail::notice_noticed, T>::value,
                "holdfast: a Notice policy needs bool noticed() const noexcept");
  static_assert(detail::detect<detail::notice_at, T>::value,
                "holdfast: a Notice policy needs "
                "std::optional<steady_clock::time_point> noticed_at() const");
  static_assert(detail::detect<detail::notice_deadline, T>::value,
                "holdfast: a Notice policy needs "
                "std::optional<system_clock::time_point> deadline() const");
  return true;
}

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_notice_policy_v.
template <class T>
concept notice_policy = is_notice_policy_v<T>;
#endif

/// Noticed when any of its sources is: the earliest notice time and the earliest deadline.
template <class... N>
class any_of {
  static_assert(sizeof...(N) > 0, "holdfast: any_of needs at least one notice source");
  static_assert((check_notice_policy<N>() && ...));

 public:
  any_of() = default;
  /// Combines these sources (moved in).
  explicit any_of(N... sources) : n_(std::move(sources)...) {}

  /// Starts every source; if one fails, the ones started are stopped and the error rethrown.
  void start() { start_from<0>(); }
  /// Stops every source (last first).
  void stop() noexcept { stop_before<sizeof...(N)>(); }
  /// True when every source wakes the attached waker on its notice.
  static constexpr bool wakes_on_notice = (has_notice_waker_v<N> && ...);
  /// Attaches `w` to every source that has set_waker (nullptr detaches).
  void set_waker(const detail::waker* w) noexcept {
    std::apply([w](auto&... n) { (detail::set_waker_if_any(n, w), ...); }, n_);
  }
  bool noticed() const noexcept {
    return std::apply([](const auto&... n) { return (n.noticed() || ...); }, n_);
  }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    std::optional<std::chrono::steady_clock::time_point> best;
    std::apply([&best](const auto&... n) { (earliest(best, n.noticed_at()), ...); }, n_);
    return best;
  }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    std::optional<std::chrono::system_clock::time_point> best;
    std::apply([&best](const auto&... n) { (earliest(best, n.deadline()), ...); }, n_);
    return best;
  }
  /// What fired: the source of the earliest notice ("" before one; a source without
  /// source() is "" too).
  std::string source() const {
    std::string what;
    std::optional<std::chrono::steady_clock::time_point> best;
    std::apply([&](const auto&... n) { (pick_source(what, best, n), ...); }, n_);
    return what;
  }
  /// The I-th source.
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(n_);
  }
  template <std::size_t I>
  const auto& get() const noexcept {
    return std::get<I>(n_);
  }

 private:
  template <class S>
  static void pick_source(std::string& what,
                          std::optional<std::chrono::steady_clock::time_point>& best, const S& n) {
    const auto at = n.noticed_at();
    if (!at || (best && *best <= *at)) return;
    best = at;
    what = detail::notice_source_of(n);
  }
  template <class T>
  static void earliest(std::optional<T>& best, const std::optional<T>& t) noexcept {
    if (t && (!best || *t < *best)) best = t;
  }
  template <std::size_t I>
  void start_from() {
    if constexpr (I < sizeof...(N)) {
      std::get<I>(n_).start();
      try {
        start_from<I + 1>();
      } catch (...) {
        std::get<I>(n_).stop();
        throw;
      }
    }
  }
  template <std::size_t I>
  void stop_before() noexcept {
    if constexpr (I > 0) {
      std::get<I - 1>(n_).stop();
      stop_before<I - 1>();
    }
  }

  std::tuple<N...> n_;
};

HOLDFAST_NAMESPACE_END
