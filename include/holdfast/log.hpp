// holdfast/log.hpp — the library's one logging hook: a sink that receives one line per event a
// component reports without throwing (a background notice that failed, a checkpoint pointer
// found garbled and recovered from), and its default, stderr.
//
//   holdfast::checkpoint_options o;
//   o.log = [](std::string_view line) { my_logger.warn("{}", line); };
//
// Guarantees:
//   - log_fn is the one sink type every component takes (an option or a set_log()); an empty
//     log_fn means the default, log_to_stderr.
//   - detail::log_line hands a sink the line through detail::printable: a key, a path or a
//     peer's text with a newline or ESC in it cannot forge a second line or drive a terminal.
//   - log_to_stderr writes "holdfast: <line>\n" with one fprintf (one write for short lines), so
//     lines of concurrent threads do not interleave mid-line; it never throws.
// Caveats:
//   - A sink may be called from a component's background thread (a notice watcher, an async
//     checkpoint save): it must be thread-safe and should not block for long.
#pragma once

#include <cstdio>       // fprintf: the default sink
#include <functional>   // std::function: the sink type
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "detail/ascii.hpp"  // printable: one line per report
#include "version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Receives one line per problem a component reports without throwing.
using log_fn = std::function<void(std::string_view)>;

/// The default log hook: "holdfast: <line>" on stderr.
inline void log_to_stderr(std::string_view line) noexcept {
  std::fprintf(stderr, "holdfast: %.*s\n", static_cast<int>(line.size()), line.data());
}

namespace detail {
/// Sends `line` to `log`, or to log_to_stderr when `log` is empty; never throws.
inline void log_line(const log_fn& log, std::string_view line) noexcept {
  try {
    const std::string shown = printable(line);
    if (log)
      log(shown);
    else
      log_to_stderr(shown);
  } catch (...) {  // a throwing sink (or no memory) must not turn a report into a failure
  }
}
}  // namespace detail
HOLDFAST_NAMESPACE_END
