// holdfast/handler/traits.hpp — the compile-time contract of the handler's policies: what a
// Checkpointer and a termination Config must have (checked with readable static_asserts), the
// optional members the handler detects (all_steps/restore_step, all_identities/begin_history,
// pin, wait_until_finished, set_durable_deadline), whether a Config's Exit policy is called after
// the last save, and the Clock conversions.
//
// Guarantees:
//   - check_checkpointer<C>() and check_termination_config<C>() fail with a message naming the
//     first missing member; each optional member is detected separately (detail::detect).
//   - detail::exits_after_save<Exit> is false only for no_exit: then the handler saves, re-arms
//     and returns run_status::stopped without calling the policy. Any other policy is called
//     after the last save (and may still return).
// Caveats:
//   - to_clock converts through Clock::now(): for a clock other than steady_clock a time point
//     moves by as much as the two now() reads are apart.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>  // ckpt_on_copy's hook type
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../agreement/step_list.hpp"  // checkpoint_identity: what all_identities() lists
#include "../detail/detect.hpp"
#include "../termination/exit.hpp"  // exit_context, no_exit: the Exit policy the Config names
#include "../version.hpp"
#include "hang.hpp"  // hang_bounds: what a Checkpointer may record and restore

HOLDFAST_NAMESPACE_BEGIN

namespace detail {
template <class T>
using ckpt_save = decltype(std::declval<T&>().save(std::int64_t{}));
template <class T>
using ckpt_restore = std::enable_if_t<
    std::is_convertible_v<decltype(std::declval<T&>().restore()), std::optional<std::int64_t>>>;
template <class T>
using ckpt_all_steps =
    std::enable_if_t<std::is_convertible_v<decltype(std::declval<const T&>().all_steps()),
                                           std::vector<std::int64_t>>>;
template <class T>
using ckpt_all_identities =
    std::enable_if_t<std::is_convertible_v<decltype(std::declval<const T&>().all_identities()),
                                           std::vector<checkpoint_identity>>>;
template <class T>
using ckpt_begin_history = decltype(std::declval<T&>().begin_history(std::string{}));
template <class T>
using ckpt_restore_step = decltype(std::declval<T&>().restore_step(std::int64_t{}));
template <class T>
using ckpt_pin = decltype(std::declval<T&>().pin(std::optional<std::int64_t>{}));
template <class T>
using ckpt_wait = decltype(std::declval<T&>().wait_until_finished());
template <class T>
using ckpt_durable_deadline =
    decltype(std::declval<T&>().set_durable_deadline(std::chrono::steady_clock::time_point{}));
template <class T>
using ckpt_hang_bounds_out = decltype(std::declval<T&>().set_hang_bounds(hang_bounds{}));
template <class T>
using ckpt_hang_bounds_in = std::enable_if_t<std::is_convertible_v<
    decltype(std::declval<const T&>().restored_hang_bounds()), std::optional<hang_bounds>>>;
template <class T>  // a hook for each durable copy's time (two_tier_checkpoints)
using ckpt_on_copy = decltype(std::declval<T&>().on_copy(
    std::function<void(std::int64_t, std::chrono::duration<double>)>{}));
template <class T>  // the bounds the newest checkpoint records, read before the restore
using ckpt_hang_bounds_newest =
    std::enable_if_t<std::is_convertible_v<decltype(std::declval<const T&>().newest_hang_bounds()),
                                           std::optional<hang_bounds>>>;
template <class T>
using cfg_exit_type = typename T::exit_type;
template <class T>
using cfg_notice = decltype(bool{std::declval<const T&>().noticed()},
                            std::optional<std::chrono::steady_clock::time_point>{
                                std::declval<const T&>().noticed_at()},
                            std::optional<std::chrono::system_clock::time_point>{
                                std::declval<const T&>().announced_deadline()});
template <class T>
using cfg_start_stop = decltype(std::declval<T&>().start(), std::declval<T&>().stop());
template <class T>
using cfg_grace = decltype(std::chrono::milliseconds{std::declval<const T&>().grace_period()});
template <class T>
using cfg_save_override = decltype(bool{std::declval<const T&>().has_save_override()},
                                   std::declval<const T&>().save_override()(std::int64_t{}));
template <class T>
using cfg_exit = decltype(std::declval<T&>().exit(std::declval<const exit_context&>()));
}  // namespace detail

/// Checks a Checkpointer policy at compile time; each static_assert names the missing member.
template <class C>
constexpr bool check_checkpointer() {
  static_assert(detail::detect<detail::ckpt_save, C>::value,
                "holdfast: a Checkpointer needs save(std::int64_t step)");
  static_assert(detail::detect<detail::ckpt_restore, C>::value,
                "holdfast: a Checkpointer needs restore() returning std::optional<std::int64_t>");
  return true;
}

/// True when a Checkpointer can take part in the restore agreement: it has all_steps() (the
/// complete steps it holds) and restore_step(step).
template <class C>
inline constexpr bool has_step_restore_v = detail::detect<detail::ckpt_all_steps, C>::value&&
    detail::detect<detail::ckpt_restore_step, C>::value;

/// True when a Checkpointer knows its checkpoints' histories: it has all_identities() (the
/// identity of each step all_steps() lists) and begin_history(id) (the history its next saves
/// record). Without them the restore agreement compares its steps as of unknown history.
template <class C>
inline constexpr bool has_identity_v = detail::detect<detail::ckpt_all_identities, C>::value&&
    detail::detect<detail::ckpt_begin_history, C>::value;

/// Checks a termination Config (termination_config or a preset) at compile time.
template <class C>
constexpr bool check_termination_config() {
  static_assert(detail::detect<detail::cfg_exit_type, C>::value,
                "holdfast: a termination config needs a member type exit_type");
  static_assert(detail::detect<detail::cfg_start_stop, C>::value,
                "holdfast: a termination config needs start() and stop()");
  static_assert(detail::detect<detail::cfg_notice, C>::value,
                "holdfast: a termination config needs noticed(), noticed_at() and "
                "announced_deadline()");
  static_assert(detail::detect<detail::cfg_grace, C>::value,
                "holdfast: a termination config needs grace_period() (milliseconds)");
  static_assert(detail::detect<detail::cfg_save_override, C>::value,
                "holdfast: a termination config needs has_save_override() and save_override()");
  static_assert(detail::detect<detail::cfg_exit, C>::value,
                "holdfast: a termination config needs exit(const exit_context&)");
  return true;
}

namespace detail {

/// Whether the handler calls an Exit policy after the last save. no_exit is the policy that asks
/// not to be: the handler saves, re-arms and returns run_status::stopped. A callable that merely
/// returns is still called (and the handler then goes on as after no_exit). A trait rather than
/// a type comparison at the call site: what the handler asks is "is it called", and the answer
/// lives here once.
template <class Exit>
struct exits_after_save : std::true_type {};
template <>
struct exits_after_save<no_exit> : std::false_type {};

/// Whether a config's Exit policy is called after the last save (see exits_after_save).
template <class Config>
inline constexpr bool calls_exit_v = exits_after_save<typename Config::exit_type>::value;

/// Whether Clock is the clock notices are stamped with (noticed_at(): steady_clock), so their
/// time points need no conversion. This one is about one type on purpose: a test clock whose
/// time_point is steady_clock's but whose now() is its own still needs the conversion.
template <class Clock>
inline constexpr bool is_notice_clock_v = std::is_same_v<Clock, std::chrono::steady_clock>;

/// `t` (a steady_clock time) on Clock.
template <class Clock>
typename Clock::time_point to_clock(std::chrono::steady_clock::time_point t) {
  if constexpr (is_notice_clock_v<Clock>) {
    return t;
  } else {
    return Clock::now() + std::chrono::duration_cast<typename Clock::duration>(
                              t - std::chrono::steady_clock::now());
  }
}

/// `t` (a wall-clock time) on Clock.
template <class Clock>
typename Clock::time_point to_clock(std::chrono::system_clock::time_point t) {
  return Clock::now() +
         std::chrono::duration_cast<typename Clock::duration>(t - std::chrono::system_clock::now());
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
