// holdfast/termination/config.hpp — termination_config<Notice, Exit>: where the preemption
// notice comes from, how to exit, how long the grace period is, and an optional save override
// (after TF's TerminationConfig). The preemption handler (handler.hpp) consumes it.
//
// Guarantees:
//   - The Notice is checked at compile time (check_notice_policy names the member missing).
//   - grace_deadline() is noticed_at() + grace_period(), but no later than the deadline the
//     notice announced (AWS's `time`, a signal's configured time left).
//   - Nothing runs until start().
//   - Waking: set_waker(w) attaches a waker (detail/waker.hpp) to the Notice (to each source of
//     an any_of that has set_waker; a no-op for one without). wakes_on_notice, and
//     has_notice_waker_v<Config> (which also answers, false, for a Config without set_waker), is
//     true only when every notice wakes it: signal_notice, file_notice, the cloud notices and
//     any_of over those. Otherwise a watcher must keep polling noticed(). The presets and the
//     configs with_exit and rebind_exit_t give are termination_configs and have both.
// Caveats:
//   - grace_deadline() converts the announced wall-clock deadline to the steady clock when it is
//     called: a step of the wall clock in between moves it.
//   - An attached waker must outlive the attachment: set_waker(nullptr) before destroying it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "../detail/waker.hpp"  // detail::waker: what set_waker attaches
#include "exit.hpp"
#include "notice.hpp"  // has_notice_waker_v: whether the Notice wakes
#include "signal.hpp"  // signal_notice<>: the default Notice

HOLDFAST_NAMESPACE_BEGIN

/// Where the notice comes from, how to exit, the grace period, and an optional save override
/// (TF's TerminationConfig). The handler (handler.hpp) consumes it.
template <class Notice = signal_notice<>, class Exit = exit_with<42>>
class termination_config {
  static_assert(check_notice_policy<Notice>());

 public:
  using notice_type = Notice;
  using exit_type = Exit;
  /// A save override: called with the agreed step instead of the default checkpoint.
  using save_fn = std::function<void(std::int64_t step)>;
  /// The exit code, or -1 when the Exit policy does not announce one.
  static constexpr int exit_code = exit_code_of<Exit>::value;

  explicit termination_config(Notice notice = Notice(), Exit exit = Exit(),
                              std::chrono::milliseconds grace = std::chrono::milliseconds(0),
                              save_fn save = {})
      : notice_(std::move(notice)), exit_(std::move(exit)), grace_(grace), save_(std::move(save)) {}

  /// The notice source.
  Notice& notice() noexcept { return notice_; }
  const Notice& notice() const noexcept { return notice_; }
  /// The exit policy.
  Exit& exit_policy() noexcept { return exit_; }
  const Exit& exit_policy() const noexcept { return exit_; }
  /// How long training may go on after the notice (0: save at the next agreed step and exit).
  std::chrono::milliseconds grace_period() const noexcept { return grace_; }
  termination_config& set_grace_period(std::chrono::milliseconds g) noexcept {
    grace_ = g;
    return *this;
  }
  /// The save override, if set.
  const save_fn& save_override() const noexcept { return save_; }
  bool has_save_override() const noexcept { return static_cast<bool>(save_); }
  termination_config& set_save_override(save_fn f) {
    save_ = std::move(f);
    return *this;
  }

  /// True when every notice of the Notice notifies the waker given to set_waker; false: a
  /// watcher must also poll noticed().
  static constexpr bool wakes_on_notice = has_notice_waker_v<Notice>;
  /// Attaches `w` to the notice source(s) that can notify it (nullptr detaches); before or
  /// after start(). `w` must outlive the attachment.
  void set_waker(const detail::waker* w) noexcept { detail::set_waker_if_any(notice_, w); }

  /// Starts and stops the notice source.
  void start() { notice_.start(); }
  void stop() noexcept { notice_.stop(); }
  bool noticed() const noexcept { return notice_.noticed(); }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    return notice_.noticed_at();
  }
  std::optional<std::chrono::system_clock::time_point> announced_deadline() const noexcept {
    return notice_.deadline();
  }
  /// When the grace period ends: noticed_at + grace, but no later than the announced deadline.
  std::optional<std::chrono::steady_clock::time_point> grace_deadline() const noexcept {
    auto at = notice_.noticed_at();
    if (!at) return std::nullopt;
    auto end = *at + grace_;
    if (auto d = notice_.deadline()) {
      auto left = *d - std::chrono::system_clock::now();
      auto capped = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
      if (capped < end) end = capped;
    }
    return end;
  }
  /// Runs the exit policy. Returns only when it does (no_exit, or a callable that returns).
  void exit(const exit_context& ctx) { invoke_exit(exit_, ctx); }
  void exit() { invoke_exit(exit_, exit_context{notice_.noticed_at(), {}}); }

 private:
  Notice notice_;
  Exit exit_;
  std::chrono::milliseconds grace_;
  save_fn save_;
};

/// `config` (a termination_config or a preset) with `exit` as its Exit policy: the same notices,
/// grace period and save override. For a host that must not end the process from inside a call
/// (a Python extension raises instead), keeping a platform's notices and grace:
/// `auto cfg = holdfast::with_exit(holdfast::presets::kubernetes(), raise_preempted{143});`
template <class Notice, class Exit, class NewExit>
termination_config<Notice, NewExit> with_exit(termination_config<Notice, Exit> config,
                                              NewExit exit) {
  auto grace = config.grace_period();
  auto save = config.save_override();
  return termination_config<Notice, NewExit>(std::move(config.notice()), std::move(exit), grace,
                                             std::move(save));
}

/// The type with_exit gives for `Config` and `NewExit`.
template <class Config, class NewExit>
using rebind_exit_t = termination_config<typename Config::notice_type, NewExit>;

/// The exit code a config's Exit policy announces (42 for presets::generic, 143 for
/// presets::kubernetes, -1 for a callable), kept by a host that rebinds the Exit.
template <class Config>
inline constexpr int exit_code_v = Config::exit_code;

HOLDFAST_NAMESPACE_END
