// holdfast/error.hpp — the exception types every component throws.
//
// Guarantees:
//   - Every failure of an operating-system call surfaces as holdfast::error (a std::system_error
//     in the generic category) carrying the operation ("fsync"), the path or key it acted on, and
//     errno. what() reads "fsync '/ckpt/step-10': Input/output error".
//   - what() shows the path and the detail through detail::printable: a newline or ESC in a key,
//     a path or a peer's reply reaches a message as \x0a or \x1b, never raw. path() keeps the
//     bytes as given.
//   - Bad input (a malformed file, a corrupt cache or checkpoint, an invalid key) also derives from
//     holdfast::error, so one catch clause sees every holdfast failure.
//   - agreement_timeout and agreement_unreachable end their what() with what happened (the
//     missing tasks and the bound; the cause's own message), not an errno's text: a timeout
//     over a directory store never reads "Connection timed out", and an unreachable store's
//     code() is the cause's errno.
//   - Expected outcomes (a filled slot, an existing key, a timeout) are values, never exceptions.
//   - holdfast::step_abandoned is not a failure and not a holdfast::error: a step throws it for
//     the handler's run() to catch (a step's own catch of std::exception would swallow it).
// Caveats:
//   - errno values are Linux's; the category is std::generic_category().
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>  // std::exception: errnum_of
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "detail/ascii.hpp"  // printable: what() escapes control bytes
#include "version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// A failed operation: what was done, to which file or key, and the errno it failed with.
class error : public std::system_error {
 public:
  error(int errnum, std::string operation, std::string path)
      : error(errnum, std::move(operation), std::move(path), std::string()) {}

  /// As above, with extra detail appended to what() (a line number, a slot, a peer's message).
  error(int errnum, std::string operation, std::string path, const std::string& detail)
      : std::system_error(errnum, std::generic_category(), describe(operation, path, detail)),
        operation_(std::move(operation)),
        path_(std::move(path)) {}

  /// The operation that failed, e.g. "fsync", "rename", "parse".
  const std::string& operation() const noexcept { return operation_; }
  /// The file, directory or key the operation acted on (may be empty).
  const std::string& path() const noexcept { return path_; }
  /// The errno value (same as code().value()).
  int errnum() const noexcept { return code().value(); }
  /// "op 'path' (detail): <errno's text>", or without the errno's text where a subclass says
  /// it would mislead (a timeout of a directory store is no "Connection timed out").
  const char* what() const noexcept override {
    return own_what_.empty() ? std::system_error::what() : own_what_.c_str();
  }

 protected:
  /// As above, but what() ends with the detail: `errnum` is kept as code() only, its text not
  /// appended (the detail says what happened, or carries the cause's own text).
  struct no_errno_text {};
  error(int errnum, std::string operation, std::string path, const std::string& detail,
        no_errno_text)
      : error(errnum, std::move(operation), std::move(path), detail) {
    own_what_ = describe(operation_, path_, detail);
  }

 private:
  static std::string describe(const std::string& op, const std::string& path,
                              const std::string& detail) {
    std::string s = op;
    if (!path.empty()) s += " '" + detail::printable(path) + "'";
    if (!detail.empty()) s += " (" + detail::printable(detail) + ")";
    return s;
  }

  std::string operation_;
  std::string path_;
  std::string own_what_;  // what() when set (no_errno_text)
};

/// Malformed input file or message: names the file and the line or byte offset (errno EINVAL).
class format_error : public error {
 public:
  format_error(std::string path, const std::string& where_and_why)
      : error(EINVAL, "parse", std::move(path), where_and_why) {}
};

/// A cache file that cannot be trusted: names the file and the slot (errno EBADMSG).
class corrupt_cache : public error {
 public:
  corrupt_cache(std::string path, std::size_t slot, const std::string& why)
      : error(EBADMSG, "cache", std::move(path), "slot " + std::to_string(slot) + ": " + why),
        slot_(slot) {}
  /// The slot (index entry) found bad; for a bad header, 0.
  std::size_t slot() const noexcept { return slot_; }

 private:
  std::size_t slot_;
};

/// A checkpoint whose files do not match the sizes and CRC32Cs its metadata recorded, or whose
/// metadata is damaged: path() is the checkpoint, and it names the step and the first bad file
/// (errno EBADMSG).
class checkpoint_corrupt : public error {
 public:
  checkpoint_corrupt(std::string checkpoint_path, std::int64_t step, std::string file,
                     const std::string& why)
      : error(EBADMSG, "checkpoint verify", std::move(checkpoint_path),
              "step " + std::to_string(step) + ", file '" + file + "': " + why),
        step_(step),
        file_(std::move(file)) {}
  /// The checkpoint's step.
  std::int64_t step() const noexcept { return step_; }
  /// The first bad file, relative to the checkpoint (holdfast-metadata.json when it is damaged).
  const std::string& file() const noexcept { return file_; }

 private:
  std::int64_t step_;
  std::string file_;
};

/// Workers did not all answer within the agreement deadline (errno ETIMEDOUT). what() names
/// the outcome key and the missing tasks, and the bound where the raiser knows it: "agree
/// 'holdfast/r/restore/step' (no answer from tasks 1 within 600 s, handler_options::
/// restore_timeout)". It ends there: whatever the store, no "Connection timed out".
class agreement_timeout : public error {
 public:
  agreement_timeout(std::string key, std::vector<int> missing_tasks, const std::string& bound = {})
      : error(ETIMEDOUT, "agree", std::move(key),
              "no answer from tasks " + join(missing_tasks) + (bound.empty() ? "" : " " + bound),
              no_errno_text{}),
        missing_(std::move(missing_tasks)) {}
  /// The task ids that never answered.
  const std::vector<int>& missing_tasks() const noexcept { return missing_; }

 private:
  static std::string join(const std::vector<int>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i > 0) s += ',';
      s += std::to_string(v[i]);
    }
    return s;
  }
  std::vector<int> missing_;
};

/// This worker could not reach the coordination store to read or record the outcome of an
/// agreement before its deadline, or at the start (handler_options::start_timeout). It did not
/// save; its peers follow the outcome they recorded. The restore agreement keeps the restarted
/// job on one step. code() is the cause's errno (the last store error's: ECONNREFUSED,
/// ETIMEDOUT, ...; EHOSTUNREACH when the cause carried none), and what() ends with the cause's
/// own message, no errno text added.
class agreement_unreachable : public error {
 public:
  agreement_unreachable(std::string key, const std::string& why, int errnum = EHOSTUNREACH)
      : error(errnum > 0 ? errnum : EHOSTUNREACH, "agree", std::move(key), why, no_errno_text{}) {}
};

namespace detail {
/// The errno a store error carries (a std::system_error's code), else 0.
inline int errnum_of(const std::exception& e) noexcept {
  auto* s = dynamic_cast<const std::system_error*>(&e);
  return s ? s->code().value() : 0;
}
}  // namespace detail

/// Another worker's step failed; raised on every other worker (errno ECANCELED).
class peer_error : public error {
 public:
  peer_error(int origin_task, std::string type_name, std::string message)
      : error(ECANCELED, "peer step", "task " + std::to_string(origin_task),
              type_name + ": " + message),
        origin_(origin_task),
        type_(std::move(type_name)),
        message_(std::move(message)) {}
  /// The task id whose step raised.
  int origin_task() const noexcept { return origin_; }
  /// The type name of the original exception.
  const std::string& type_name() const noexcept { return type_; }
  /// The original exception's what().
  const std::string& message() const noexcept { return message_; }

 private:
  int origin_;
  std::string type_;
  std::string message_;
};

/// A hang verdict recorded for this job (handler/hang.hpp): a task stayed in a step, a save or
/// the restore past its bound, or stopped renewing its liveness lease (frozen). run() throws it
/// on every worker that learns the verdict (with the hang_report policy; hang_restart ends the
/// process instead). ETIMEDOUT.
class hang_detected : public error {
 public:
  hang_detected(int task, std::string phase, std::int64_t step, std::int64_t elapsed_ms,
                std::int64_t bound_ms, std::string description)
      : error(ETIMEDOUT, "hang", "task " + std::to_string(task), description),
        task_(task),
        phase_(std::move(phase)),
        step_(step),
        elapsed_ms_(elapsed_ms),
        bound_ms_(bound_ms) {}
  /// The task that hung.
  int hung_task() const noexcept { return task_; }
  /// Where: "step", "save", "restore", "frozen" or "start" (before the first step boundary).
  const std::string& phase() const noexcept { return phase_; }
  /// The step it was at; -1 unknown.
  std::int64_t step() const noexcept { return step_; }
  /// How long it had been in the phase, in milliseconds, when the verdict was recorded.
  std::int64_t elapsed_ms() const noexcept { return elapsed_ms_; }
  /// The bound it passed, in milliseconds.
  std::int64_t bound_ms() const noexcept { return bound_ms_; }

 private:
  int task_;
  std::string phase_;
  std::int64_t step_;
  std::int64_t elapsed_ms_;
  std::int64_t bound_ms_;
};

/// Not a failure: what a step throws to stop waiting for its peers once the handler says the
/// agreement failed (preemption_handler::agreement_failed()); run() catches it and raises that
/// failure (agreement_timeout, agreement_unreachable or peer_error) instead. Thrown while no
/// agreement failed, run() publishes it as this worker's error and throws std::logic_error.
class step_abandoned : public std::exception {
 public:
  const char* what() const noexcept override {
    return "holdfast::step_abandoned: the step stopped waiting for its peers";
  }
};

HOLDFAST_NAMESPACE_END
