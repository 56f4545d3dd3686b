// holdfast/termination/exit.hpp — how a process exits after its checkpoint: exit_with<Code>,
// no_exit, wait_then_exit<Code, WindowMs> or any callable, told what happened by exit_context.
//
// Guarantees:
//   - exit_with and wait_then_exit flush stdio and remove the temp files holdfast made in this
//     process (remove_temp_files: the cache files of create_cache), then call _Exit: no static
//     destructor runs while the program's other threads (data loaders, collectives, pollers)
//     still use what they destroy; the checkpoint is already durable.
//   - exit_code_of<Exit> and exit_returns<Exit> read what a policy announces (`code`,
//     `returns`); a plain callable announces -1 and may return.
// Caveats:
//   - A callable exit policy that wants cleanup must do it itself before exiting (call
//     remove_temp_files() when it ends the process without destructors).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>  // sleep_until: wait_then_exit
#include <type_traits>

#include "../detail/temp_files.hpp"  // remove_temp_files: the cache files go with the process
#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// What an exit policy is told: when the notice came, how long the checkpoint took.
struct exit_context {
  std::optional<std::chrono::steady_clock::time_point> noticed_at;
  std::chrono::nanoseconds checkpoint_duration{0};
};

/// Exits the process with `Code` after flushing stdio and removing holdfast's temp files
/// (remove_temp_files). It calls _Exit, not exit: static
/// destructors would run while the program's other threads (data loaders, collectives, our own
/// pollers) still use what they destroy, and the checkpoint is already durable. Use a callable
/// exit policy to run cleanup first.
template <int Code>
struct exit_with {
  static_assert(Code >= 0 && Code <= 255, "holdfast: exit codes are 0..255");
  /// The process exit status.
  static constexpr int code = Code;
  /// Never returns.
  static constexpr bool returns = false;
  [[noreturn]] void operator()(const exit_context& = {}) const noexcept {
    std::fflush(nullptr);
    remove_temp_files();
    std::_Exit(Code);
  }
};

/// Does not exit: the handler returns a status instead, for in-process restarts.
struct no_exit {
  static constexpr int code = -1;
  static constexpr bool returns = true;
  void operator()(const exit_context& = {}) const noexcept {}
};

/// Waits out a notice window less the measured checkpoint time, then exits with `Code`
/// (Borg TPU: exiting early gets the job rescheduled onto the slice still being drained). The
/// wait is `WindowMs - checkpoint_duration` from the call, never past noticed_at + WindowMs.
template <int Code, long long WindowMs>
struct wait_then_exit {
  static_assert(Code >= 0 && Code <= 255, "holdfast: exit codes are 0..255");
  static_assert(WindowMs >= 0, "holdfast: the window cannot be negative");
  static constexpr int code = Code;
  static constexpr bool returns = false;
  /// The notice window.
  static constexpr std::chrono::milliseconds window{WindowMs};
  [[noreturn]] void operator()(const exit_context& ctx = {}) const noexcept {
    auto now = std::chrono::steady_clock::now();
    auto until = now + window - ctx.checkpoint_duration;
    if (ctx.noticed_at && *ctx.noticed_at + window < until) until = *ctx.noticed_at + window;
    std::this_thread::sleep_until(until);
    std::fflush(nullptr);
    remove_temp_files();
    std::_Exit(Code);
  }
};

/// The exit code an Exit policy announces (`Exit::code`), or -1 for a callable.
template <class Exit, class = void>
struct exit_code_of : std::integral_constant<int, -1> {};
template <class Exit>
struct exit_code_of<Exit, std::void_t<decltype(Exit::code)>>
    : std::integral_constant<int, Exit::code> {};

/// Whether an Exit policy may return (`Exit::returns`); true for a plain callable.
template <class Exit, class = void>
struct exit_returns : std::true_type {};
template <class Exit>
struct exit_returns<Exit, std::void_t<decltype(Exit::returns)>>
    : std::bool_constant<Exit::returns> {};

/// Calls an Exit policy with the context if it takes one, else with no arguments.
template <class Exit>
void invoke_exit(Exit& exit, const exit_context& ctx) {
  static_assert(std::is_invocable_v<Exit&, const exit_context&> || std::is_invocable_v<Exit&>,
                "holdfast: an Exit policy is callable as exit(const exit_context&) or exit()");
  if constexpr (std::is_invocable_v<Exit&, const exit_context&>)
    exit(ctx);
  else
    exit();
}

HOLDFAST_NAMESPACE_END
