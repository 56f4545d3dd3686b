// holdfast/termination/polled.hpp — notices found by polling on a background thread:
// polled_notice<F> (any callable) and file_notice (a file appears).
//
// Guarantees:
//   - A polling notice runs one background thread; stop() wakes it through a condition variable
//     (and a callable taking `const std::atomic<bool>& stopping` sees it set), so it returns
//     within a few tens of milliseconds; no thread is left.
//   - Bad input never escapes a polling thread: an exception from a poll (a malformed or
//     truncated response, a slow or unreachable server, a failed stat) counts as "no notice" and
//     is logged once per run of failures through the notice's log hook (stderr by default).
//   - Once noticed, a polling notice stops polling and stays noticed; a poll_result's deadline
//     becomes deadline().
//   - Waking: with a waker attached (set_waker, before or after start()), the polling thread
//     notifies it right after recording the notice, so a watcher learns of it the moment the
//     poll that found it returns (not at its next look). set_waker(nullptr) and destruction
//     detach and wait for a notification in flight: after they return the waker may be
//     destroyed. Every notice built on polled_notice wakes (file_notice, the cloud notices).
//   - file_notice refuses, at construction, a path that could never appear: an empty one, or one
//     whose directory does not exist (the error names the path and that directory).
// Caveats:
//   - polled_notice<F>::stop() waits for a poll in progress; F should be short, or take a
//     `const std::atomic<bool>&` (true when stopping) and return early.
//   - Waking is as fast as the polling: a file that appears is seen (and wakes) at the next poll,
//     up to one interval later. An attached waker must outlive the attachment.
#pragma once

#include <sys/stat.h>  // stat, S_ISDIR: file_notice's poll and its directory check

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "../detail/path.hpp"   // parent_directory: file_notice checks its directory
#include "../detail/waker.hpp"  // waker_slot: what the polling thread notifies
#include "../error.hpp"
#include "../io.hpp"
#include "notice.hpp"  // log_fn, poll_result, notice_record

HOLDFAST_NAMESPACE_BEGIN

/// A notice found by calling `F` on a background thread every `interval` (1 s by default).
/// F returns bool or poll_result; it may take `const std::atomic<bool>& stopping`.
template <class F>
class polled_notice {
  static_assert(std::is_invocable_v<F&, const std::atomic<bool>&> || std::is_invocable_v<F&>,
                "holdfast: polled_notice<F> needs F() or F(const std::atomic<bool>& stopping)");

 public:
  /// Polls `poll` every `interval` (at least 1 ms) once started; failures go to `log`.
  explicit polled_notice(F poll, std::chrono::milliseconds interval = std::chrono::seconds(1),
                         log_fn log = log_to_stderr)
      : s_(std::make_unique<shared>(
            std::move(poll), std::max(interval, std::chrono::milliseconds(1)), std::move(log))) {}
  polled_notice(polled_notice&&) noexcept = default;
  polled_notice& operator=(polled_notice&& o) noexcept {
    if (this != &o) {
      stop();
      s_ = std::move(o.s_);
      thread_ = std::move(o.thread_);
    }
    return *this;
  }
  /// Stops the thread (promptly).
  ~polled_notice() { stop(); }

  /// Starts the polling thread (the first poll is immediate). No-op when running or noticed.
  void start() {
    if (thread_.joinable() || s_->rec.noticed.load()) return;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stop_requested = false;
    }
    s_->stopping.store(false);
    thread_ = std::thread([s = s_.get()] { run(*s); });
  }
  /// Wakes and joins the thread; cancels an HTTP request in flight. The outcome stays.
  void stop() noexcept {
    if (!s_ || !thread_.joinable()) return;
    s_->stopping.store(true);
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stop_requested = true;
    }
    s_->cv.notify_all();
    thread_.join();
  }
  /// True while the thread runs.
  bool running() const noexcept { return thread_.joinable(); }
  /// Notifies `w` from the polling thread when a poll finds the notice (nullptr detaches; on
  /// return the thread no longer writes to the previous waker). `w` must outlive the attachment.
  void set_waker(const detail::waker* w) noexcept {
    if (s_) s_->wake.attach(w);
  }

  /// True once a poll found a notice.
  bool noticed() const noexcept { return s_->rec.noticed.load(std::memory_order_acquire); }
  /// When the poll that found the notice returned (steady clock).
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    return s_->rec.noticed_at();
  }
  /// The deadline the source announced, if any.
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return s_->rec.deadline();
  }
  /// What fired, for the log: the poller's source() ("file '/run/preempt'", the metadata URL),
  /// or "a polled source" for a poller without one; "" before a notice.
  std::string source() const {
    if (!noticed()) return {};
    if constexpr (detail::detect<detail::notice_source_member, F>::value)
      return s_->fn.source();
    else
      return "a polled source";
  }
  /// Polls completed (with or without a notice), and polls that failed.
  std::uint64_t polls() const noexcept { return s_->polls.load(); }
  std::uint64_t failures() const noexcept { return s_->failures.load(); }
  /// Replaces the log hook; call before start().
  void set_log(log_fn log) { s_->log = std::move(log); }
  /// The interval between polls.
  std::chrono::milliseconds interval() const noexcept { return s_->interval; }
  /// The poller (e.g. to read its endpoint).
  const F& poller() const noexcept { return s_->fn; }

 private:
  struct shared {
    shared(F f, std::chrono::milliseconds i, log_fn l)
        : fn(std::move(f)), interval(i), log(std::move(l)) {}
    F fn;
    std::chrono::milliseconds interval;
    log_fn log;
    std::mutex mu;
    std::condition_variable cv;
    bool stop_requested = false;  // under mu
    std::atomic<bool> stopping{false};
    detail::notice_record rec;
    detail::waker_slot wake;  // notified once rec holds the notice
    std::atomic<std::uint64_t> polls{0}, failures{0};
    bool failing = false;  // polling thread only
  };

  static void fail(shared& s, const char* what) noexcept {
    s.failures.fetch_add(1);
    if (s.failing || s.stopping.load()) return;  // once per run of failures; quiet on shutdown
    s.failing = true;
    try {
      if (s.log)
        detail::log_line(s.log, std::string("notice poll failed (treated as no notice): ") + what);
    } catch (...) {
    }
  }

  static bool poll_once(shared& s) noexcept {
    try {
      poll_result r;
      if constexpr (std::is_invocable_v<F&, const std::atomic<bool>&>)
        r = s.fn(static_cast<const std::atomic<bool>&>(s.stopping));
      else
        r = s.fn();
      s.polls.fetch_add(1);
      s.failing = false;
      if (r.noticed) {
        s.rec.record(r.deadline);
        s.wake.notify();  // after recording: a woken watcher sees noticed()
      }
      return r.noticed;
    } catch (const std::exception& e) {
      fail(s, e.what());
    } catch (...) {
      fail(s, "unknown exception");
    }
    return false;
  }

  static void run(shared& s) noexcept {
    for (;;) {
      if (poll_once(s)) return;
      std::unique_lock<std::mutex> lock(s.mu);
      if (s.cv.wait_for(lock, s.interval, [&s] { return s.stop_requested; })) return;
    }
  }

  std::unique_ptr<shared> s_;
  std::thread thread_;
};

namespace detail {
/// file_notice's poll: does the path exist?
template <class Io>
struct file_exists {
  std::string path;
  std::string source() const { return "file '" + path + "'"; }
  bool operator()() const {
    struct stat st {};
    if (Io::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    throw error(errno, "stat", path);
  }
};
}  // namespace detail

/// A notice when a file appears (Kubernetes preStop hooks, batch schedulers, tests).
template <class Io = posix_io>
class basic_file_notice : public polled_notice<detail::file_exists<Io>> {
 public:
  /// Watches `path`, checking every `interval` (1 s by default) with stat. A path that could
  /// never appear is refused here (holdfast::error naming it): an empty one (EINVAL), one whose
  /// directory does not exist or is not a directory (that stat's errno, ENOTDIR).
  explicit basic_file_notice(std::string path,
                             std::chrono::milliseconds interval = std::chrono::seconds(1),
                             log_fn log = log_to_stderr)
      : polled_notice<detail::file_exists<Io>>(detail::file_exists<Io>{checked(std::move(path))},
                                               interval, std::move(log)) {}
  /// The watched path.
  const std::string& path() const noexcept { return this->poller().path; }

 private:
  static std::string checked(std::string path) {
    if (path.empty()) throw error(EINVAL, "file_notice", path, "an empty path never appears");
    const std::string dir = detail::parent_directory(path);
    struct stat st {};
    if (Io::stat(dir.c_str(), &st) != 0)
      throw error(errno, "file_notice", path, "its directory '" + dir + "' cannot be read");
    if (!S_ISDIR(st.st_mode))
      throw error(ENOTDIR, "file_notice", path, "'" + dir + "' is not a directory");
    return path;
  }
};
/// file_notice over the POSIX calls.
using file_notice = basic_file_notice<>;

HOLDFAST_NAMESPACE_END
