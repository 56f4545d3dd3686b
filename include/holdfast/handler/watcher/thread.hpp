// holdfast/handler/watcher/thread.hpp — the watcher thread: starting it, stopping it, and its
// loop, whose every turn looks for a hang (hang_watch.hpp), forwards this worker's notice to the
// machine, does the periodic saves' work (periodic_saves.hpp), performs the machine's next store
// operation (protocol.hpp) and, when there is none, waits for a trigger (triggers.hpp).
//
// Guarantees:
//   - Stopping (request_watcher_stop, stop_watcher) wakes the watcher wherever it sleeps;
//     stop_watcher joins it, and the destructor does too, before the parts below are destroyed.
//   - A notice is fed to the machine once per notice time (noticed_at), with the deadline the
//     source announced, if any.
//   - An exception that is no store error (the protocol step feeds those to the machine) fails
//     the machine (on_store_failure); a wait for a trigger that failed (the store unreachable for
//     now) is tried again after a pause of one watch_interval, which a stop cuts short.
#pragma once

#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "../../error.hpp"  // errnum_of: a store failure's errno for the machine
#include "../../version.hpp"
#include "../traits.hpp"  // to_clock: a notice's times on the handler's Clock
#include "triggers.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's thread and its loop, on every other part.
template <class Config, class Kv, class Clock, class Hang>
class watcher_thread : public watcher_triggers<Config, Kv, Clock, Hang> {
  using below = watcher_triggers<Config, Kv, Clock, Hang>;

 protected:
  using below::below;

  /// Stops and joins the watcher (the handler has done so already).
  ~watcher_thread() { stop_watcher(); }

  // What this part uses of the parts below.
  using below::config_;
  using below::detects_hangs;
  using below::learn_hang;
  using below::log_event;
  using below::look_for_hang_when_due;
  using below::machine_;
  using below::mutex_;
  using below::options_;
  using below::periodic_work;
  using below::protocol_step;
  using below::raise_attention_locked;
  using below::stop_;
  using below::train_cv_;
  using below::wait_for_trigger;
  using below::wake_watcher;
  using below::watch_cv_;
  using typename below::time_point;

  // ---- starting and stopping ------------------------------------------------------------------

  void start_watcher() {
    stop_.store(false);
    watcher_ = std::thread([this] { watch(); });
  }

  void request_watcher_stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true);
    }
    wake_watcher();
  }

  void stop_watcher() noexcept {
    request_watcher_stop();
    if (watcher_.joinable()) watcher_.join();
  }

  // ---- the watcher thread ----------------------------------------------------------------------

  void watch() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_.load()) {
      lock.unlock();
      if constexpr (detects_hangs) {
        learn_hang();
        look_for_hang_when_due();
      }
      forward_notice();
      periodic_work();
      lock.lock();
      bool worked = false;
      try {
        worked = protocol_step(lock);
      } catch (const std::exception& e) {  // not a store error (those are fed to the machine)
        if (!lock.owns_lock()) lock.lock();
        machine_.on_store_failure(e.what(), detail::errnum_of(e));
        worked = true;
      }
      if (worked) {
        raise_attention_locked();
        train_cv_.notify_all();
        continue;
      }
      try {
        wait_for_trigger(lock);
      } catch (...) {
        // Watching failed (the store is unreachable for now): try again after a pause.
        if (!lock.owns_lock()) lock.lock();
        watch_cv_.wait_for(lock, options_.watch_interval, [&] { return stop_.load(); });
      }
    }
  }

  // Feeds a new notice to the machine.
  void forward_notice() {
    if (!config_.noticed()) return;
    auto at = config_.noticed_at();
    if (!at || (last_notice_ && *last_notice_ == *at)) return;
    last_notice_ = *at;
    std::optional<time_point> deadline;
    const auto announced = config_.announced_deadline();
    if (announced) deadline = to_clock<Clock>(*announced);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      machine_.on_notice(to_clock<Clock>(*at), deadline);
      raise_attention_locked();
    }
    log_notice(announced);
  }

  // "preemption notice from signal SIGTERM, deadline in 28.50 s" (info). On the watcher thread,
  // which must not throw: a source() that throws, or no memory for the line, logs nothing.
  void log_notice(
      const std::optional<std::chrono::system_clock::time_point>& announced) const noexcept {
    if (!options_.log) return;  // the default sink prints no info
    try {
      std::string line = "preemption notice";
      const std::string from = detail::notice_source_of(config_);
      if (!from.empty()) line += " from " + from;
      if (announced)
        line +=
            ", deadline in " + detail::seconds_text(*announced - std::chrono::system_clock::now());
      log_event(line);
    } catch (...) {
    }
  }

  std::optional<std::chrono::steady_clock::time_point> last_notice_;  // watcher thread only
  std::thread watcher_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
