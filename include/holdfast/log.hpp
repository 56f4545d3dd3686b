// holdfast/log.hpp — the library's one logging hook: a sink that receives one line per event a
// component reports without throwing, with its level (info: a notice came, a step was agreed,
// saved or restored; warning: a timeout, a fallback to an older checkpoint, a background
// failure), and its default, stderr for warnings only.
//
//   holdfast::handler_options o;
//   o.log = [](holdfast::log_level level, std::string_view line) {   // every event
//     my_logger.log(level == holdfast::log_level::info ? INFO : WARN, "{}", line);
//   };
//   o.log = [](std::string_view line) { my_logger.warn("{}", line); };  // warnings only
//   o.log = holdfast::log_to_stderr_from(holdfast::log_level::info);   // stderr, info too
//
// Guarantees:
//   - log_fn is the one sink type every component takes (an option or a set_log()); an empty
//     log_fn means the default, log_to_stderr.
//   - A sink of one argument (std::string_view), what this hook took before levels, gets the
//     warnings only, as before: no info line reaches a hook written for problems. A sink of two
//     (log_level, std::string_view) gets every event. The default prints no info line.
//   - detail::log_line hands a sink the line through detail::printable: a key, a path or a
//     peer's text with a newline or ESC in it cannot forge a second line or drive a terminal.
//   - log_to_stderr writes "holdfast: <line>\n" with one fprintf (one write for short lines), so
//     lines of concurrent threads do not interleave mid-line; it never throws.
// Caveats:
//   - A sink may be called from a component's background thread (a notice watcher, an async
//     checkpoint save): it must be thread-safe and should not block for long.
#pragma once

#include <chrono>       // seconds_text
#include <cstddef>      // nullptr_t
#include <cstdio>       // fprintf: the default sink
#include <functional>   // std::function: the sink
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <type_traits>  // is_invocable_v
#include <utility>      // move

#include "detail/ascii.hpp"  // printable: one line per report
#include "version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// How much an event matters. info: what the job did (a notice and its source, the agreed step,
/// a save started and committed, the restored step); warning: something went wrong or was
/// worked around (a timeout, a fallback to an older checkpoint, a hang verdict, a background
/// failure).
enum class log_level : int { info = 20, warning = 30 };

/// "info" or "warning".
constexpr const char* log_level_name(log_level level) noexcept {
  return level == log_level::info ? "info" : "warning";
}

/// Receives one line per event a component reports without throwing. Built from a callable
/// taking (log_level, std::string_view), which gets every event, or one taking
/// (std::string_view), which gets the warnings only. Empty: the default (log_to_stderr).
class log_fn {
 public:
  log_fn() noexcept = default;
  log_fn(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): as std::function
  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, log_fn> &&
                                     (std::is_invocable_v<D&, log_level, std::string_view> ||
                                      std::is_invocable_v<D&, std::string_view>)>>
  log_fn(F&& f) {  // NOLINT(google-explicit-constructor): a lambda converts, as to std::function
    if constexpr (std::is_pointer_v<D> || is_function_object<D>::value) {
      if (is_empty<D>(f)) return;  // a null pointer or an empty std::function: the default
    }
    if constexpr (std::is_invocable_v<D&, log_level, std::string_view>) {
      sink_ = std::forward<F>(f);
    } else {  // a mutable lambda too, as std::function<void(std::string_view)> took
      sink_ = [g = D(std::forward<F>(f))](log_level level, std::string_view line) mutable {
        if (level >= log_level::warning) g(line);
      };
    }
  }

  /// True when a sink is set.
  explicit operator bool() const noexcept { return static_cast<bool>(sink_); }
  /// Hands the sink one event (a sink of one argument gets it only at warning).
  void operator()(log_level level, std::string_view line) const { sink_(level, line); }
  /// One warning (what a call of the hook meant before levels).
  void operator()(std::string_view line) const { sink_(log_level::warning, line); }

 private:
  template <class T>
  struct is_function_object : std::false_type {};
  template <class R, class... A>
  struct is_function_object<std::function<R(A...)>> : std::true_type {};
  template <class T>
  static bool is_empty(const T& f) noexcept {
    return !f;
  }

  std::function<void(log_level, std::string_view)> sink_;
};

/// The default log hook: "holdfast: <line>" on stderr.
inline void log_to_stderr(std::string_view line) noexcept {
  std::fprintf(stderr, "holdfast: %.*s\n", static_cast<int>(line.size()), line.data());
}

/// A hook printing events at `least` and above on stderr, as log_to_stderr:
/// log_to_stderr_from(log_level::info) shows what the job did as well as its problems.
inline log_fn log_to_stderr_from(log_level least) {
  return [least](log_level level, std::string_view line) noexcept {
    if (level >= least) log_to_stderr(line);
  };
}

namespace detail {
/// Sends `line` at `level` to `log`, or to log_to_stderr when `log` is empty (warnings only);
/// never throws.
inline void log_line(const log_fn& log, std::string_view line,
                     log_level level = log_level::warning) noexcept {
  try {
    if (!log && level < log_level::warning) return;
    const std::string shown = printable(line);
    if (log)
      log(level, shown);
    else
      log_to_stderr(shown);
  } catch (...) {  // a throwing sink (or no memory) must not turn a report into a failure
  }
}
/// "1.25 s": a duration as a log line shows it.
template <class Rep, class Period>
std::string seconds_text(std::chrono::duration<Rep, Period> d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f s", std::chrono::duration<double>(d).count());
  return b;
}
/// An info line (what the job did): see log_line.
inline void log_info(const log_fn& log, std::string_view line) noexcept {
  log_line(log, line, log_level::info);
}
}  // namespace detail
HOLDFAST_NAMESPACE_END
