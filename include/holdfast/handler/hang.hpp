// holdfast/handler/hang.hpp — what the handler's hang detector is made of: the phases a worker
// can hang in (hang_phase), the bounds it learns from the job (hang_bounds, hang_learner), its
// options (hang_options), the verdict it records (hang_verdict, spelt in the agreement's value
// grammar) and the policies that act on one (hang_none, hang_report, hang_restart).
//
// A phase is hung when it runs past max(multiplier x learned bound, floor): the learned bound of
// a step is the longest step time over the last one to two windows of steps (a windowed max, two
// buckets), of a save the longest of the last 16 to 32 saves (the same windowed max over saves;
// a save's length varies more than a step's, and saves are rare), of a restore the last one. Until
// warmup_steps steps are timed, a step's bound is warmup_floor. The bounds persist in the
// checkpoint metadata (checkpoint_manager: "hang_bounds"), so a restarted job starts with its
// predecessor's.
//
// Guarantees:
//   - hang_learner::add_step costs a compare, an increment and a compare per step; it
//     recomputes and publishes a bound (one relaxed atomic store) only when the window's maximum
//     grows, a window ends or the warm-up does.
//   - A save's bound covers the longest of at least the last 16 saves (at most 32): a job whose
//     saves vary 30x (1 to 30 step times) gets no verdict from a long save after short ones
//     (tests/hang_learner_test.cpp simulates 100,000 steps and 500 saves: 0 false verdicts; a
//     memory of the last two saves gave 28 to 30, of 8 to 16 saves one in some runs).
//   - A verdict's value text is the agreement grammar's "hang" body (agreement/value.hpp), so a
//     verdict recorded into a round's outcome key is read by every worker's agreement machine.
//   - hang_none compiles detection out: no atomic store per step, no watcher wake-up.
// Caveats:
//   - The bounds are the job's own: a job whose steps grow slowly (a curriculum) raises its
//     bound with them, but a job whose step time jumps by more than `multiplier` at once (an
//     evaluation inside a step) needs a floor above that step, or it is taken for a hang.
#pragma once

#include <unistd.h>  // _exit: the restart policy

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>  // snprintf: a verdict's seconds
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "../agreement/value.hpp"
#include "../detail/hang_bounds.hpp"  // hang_bounds: shared with the checkpoint metadata
#include "../detail/temp_files.hpp"   // remove_temp_files: before the restart policy's _exit
#include "../log.hpp"                 // log_fn: where a verdict's line goes
#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Where a worker hung: in a step (between two run() boundaries), in a save, in the restore at
/// construction, as a whole process (frozen: its liveness key expired; see handler/liveness),
/// or in its start: from the handler's construction to its first step boundary (the set-up a
/// start or relaunch does there: model build, compile, the loader, the first collectives).
enum class hang_phase : unsigned char { none, step, save, restore, frozen, start };

/// "step", "save", "restore", "frozen", "start" ("none" for none).
inline const char* hang_phase_name(hang_phase p) noexcept {
  switch (p) {
    case hang_phase::step:
      return "step";
    case hang_phase::save:
      return "save";
    case hang_phase::restore:
      return "restore";
    case hang_phase::frozen:
      return "frozen";
    case hang_phase::start:
      return "start";
    case hang_phase::none:
      break;
  }
  return "none";
}

/// The phase named `s` (hang_phase_name's), or none.
inline hang_phase parse_hang_phase(std::string_view s) noexcept {
  for (hang_phase p : {hang_phase::step, hang_phase::save, hang_phase::restore, hang_phase::frozen,
                       hang_phase::start})
    if (s == hang_phase_name(p)) return p;
  return hang_phase::none;
}

/// A recorded hang: which task, in which phase, at which step, for how long, past which bound,
/// and who recorded it.
struct hang_verdict {
  int task = -1;                         ///< the task that hung
  hang_phase phase = hang_phase::none;   ///< where
  std::int64_t step = -1;                ///< the step counter it was at; -1: unknown (frozen)
  std::chrono::milliseconds elapsed{0};  ///< how long it had been in the phase when recorded
  std::chrono::milliseconds bound{0};    ///< the bound it passed
  int recorder = -1;                     ///< the task whose watcher recorded it
  std::string nonce;                     ///< the recording handler instance

  /// One line for a log: "task 2 hung in step 57 for 12.0 s (bound 10.0 s; recorded by task 0)".
  std::string describe() const {
    auto secs = [](std::chrono::milliseconds d) {
      char b[32];
      std::snprintf(b, sizeof b, "%.1f s", static_cast<double>(d.count()) / 1000.0);
      return std::string(b);
    };
    std::string s = "task " + std::to_string(task) + " hung";
    if (phase == hang_phase::frozen)
      s += " (frozen: its liveness lease expired)";
    else if (phase == hang_phase::start)
      s += " in its start (set-up before its first step ended)";
    else
      s += std::string(" in ") + hang_phase_name(phase) +
           (step >= 0 ? " at step " + std::to_string(step) : std::string());
    return s + " for " + secs(elapsed) + " (bound " + secs(bound) + "; recorded by task " +
           std::to_string(recorder) + ")";
  }
};

/// The verdict as an agreement value (the "hang" body).
inline agreement_value hang_verdict_value(const hang_verdict& v) {
  agreement_value a;
  a.what = agreement_value::kind::hang;
  a.tasks = {v.task};
  a.phase = hang_phase_name(v.phase);
  a.step = v.step < 0 ? -1 : v.step;
  a.elapsed_ms = v.elapsed.count();
  a.bound_ms = v.bound.count();
  a.writer = v.recorder;
  a.nonce = v.nonce;
  return a;
}

/// The verdict an agreement value holds, when it is a "hang" one.
inline std::optional<hang_verdict> hang_verdict_of(const agreement_value& a) {
  if (a.what != agreement_value::kind::hang || a.tasks.size() != 1) return std::nullopt;
  hang_verdict v;
  v.task = a.tasks[0];
  v.phase = parse_hang_phase(a.phase);
  v.step = a.step;
  v.elapsed = std::chrono::milliseconds(a.elapsed_ms);
  v.bound = std::chrono::milliseconds(a.bound_ms);
  v.recorder = a.writer;
  v.nonce = a.nonce;
  return v;
}

/// The detector's tuning (handler_options::hang). Defaults: the bound is 5 x the longest step
/// of the recent window (nvidia-resiliency-ext's rule), never under 60 s for a step (10 min
/// until 100 steps are timed: a window of 10 steps misses the 1 % of steps ten times the median
/// about 3 times in 4, and the first one after would pass 5 x their longest), 5 min for a save
/// and 10 min for a restore: a hang is found in about a minute, or 5 x the longest step where
/// steps are long, against NCCL's 10 minutes. A restarted job starts from the bounds its
/// checkpoint recorded, warm-up included; its start (construction to the first step boundary:
/// set-up, compile, the first collectives) is held to the warm-up floor (or the step bound,
/// when that is longer) and its restore to the restore bound its newest checkpoint recorded.
struct hang_options {
  double multiplier = 5.0;  ///< k: a phase is hung past max(k x learned bound, floor)
  std::chrono::milliseconds step_floor{std::chrono::seconds(60)};     ///< after the warm-up
  std::chrono::milliseconds warmup_floor{std::chrono::minutes(10)};   ///< a step's, in warm-up
  std::chrono::milliseconds save_floor{std::chrono::minutes(5)};      ///< a save's
  std::chrono::milliseconds restore_floor{std::chrono::minutes(10)};  ///< the restore's
  std::uint32_t warmup_steps = 100;   ///< steps timed before the learned step bound applies
  std::uint32_t window_steps = 1000;  ///< steps per window of the windowed max
  /// The longest the watcher sleeps without looking at the training thread's phase (it also
  /// wakes exactly when the current phase's bound runs out, so this matters only while a bound
  /// changes under it). Detection is within the bound plus this period.
  std::chrono::milliseconds period{std::chrono::seconds(1)};
  /// What the restart policy exits with: EX_TEMPFAIL, a failure the launcher restarts
  /// (torchrun restarts the group on any nonzero exit while it has restarts left).
  int exit_code = 75;
  /// Called once per verdict on the worker's watcher thread (both policies), after the log
  /// line and, for hang_restart, before the exit. Must not call back into the handler.
  std::function<void(const hang_verdict&)> on_hang;
  /// Where the verdict's line goes, at warning ("hang detected: task 2 hung in step 57 ...");
  /// empty: the handler's handler_options::log (whose default is stderr).
  log_fn log;
};

namespace detail {

// max(k x learned, floor) in nanoseconds.
inline std::int64_t hang_bound_ns(double k, std::chrono::nanoseconds learned,
                                  std::chrono::milliseconds floor) {
  const double b = k * static_cast<double>(learned.count());
  const double f = static_cast<double>(std::chrono::nanoseconds(floor).count());
  const double m = std::max(b, f);
  return m >= 9.0e18 ? INT64_MAX : static_cast<std::int64_t>(m);
}

}  // namespace detail

/// The training thread's learner of step and save times, and the bounds it publishes to the
/// watcher (relaxed atomics the watcher reads). Training thread: add_step, add_save,
/// add_restore, seed; watcher: step_bound, save_bound, restore_bound.
class hang_learner {
 public:
  explicit hang_learner(const hang_options& o = {})
      : k_(o.multiplier),
        step_floor_(o.step_floor),
        warmup_floor_(o.warmup_floor),
        save_floor_(o.save_floor),
        restore_floor_(o.restore_floor),
        warmup_(o.warmup_steps),
        window_(std::max<std::uint32_t>(o.window_steps, 1)) {
    publish_all();
  }

  /// Starts from bounds a checkpoint recorded (a restarted job): the warm-up is over when they
  /// counted it over.
  void seed(const hang_bounds& b) {
    prev_ = b.step;
    steps_ = b.steps;
    save_prev_ = save_max_ = b.save;
    save_cur_ = std::chrono::nanoseconds::zero();
    saves_in_window_ = 0;
    restore_max_ = b.restore;
    publish_all();
  }

  /// One step time (the hot path: see the header). True when the bound changed (rarely: the
  /// window's maximum grew, a window or the warm-up ended).
  bool add_step(std::chrono::nanoseconds dt) noexcept {
    bool changed = false;
    if (dt > cur_) {
      cur_ = dt;
      changed = cur_ > prev_;
    }
    if (++in_window_ == window_) {  // the window ends: the older bucket goes
      prev_ = cur_;
      cur_ = std::chrono::nanoseconds::zero();
      in_window_ = 0;
      changed = true;
    }
    if (++steps_ == warmup_) changed = true;
    if (changed) publish_step();
    return changed;
  }

  /// Saves per window of the saves' windowed max (a slow save ages out after 16 to 32 saves).
  static constexpr std::uint32_t save_window = 16;

  /// One save's duration (its durable end included).
  void add_save(std::chrono::nanoseconds d) noexcept {
    save_cur_ = std::max(save_cur_, d);
    if (++saves_in_window_ == save_window) {  // the window ends: the older bucket goes
      save_prev_ = save_cur_;
      save_cur_ = std::chrono::nanoseconds::zero();
      saves_in_window_ = 0;
    }
    save_max_ = std::max(save_prev_, save_cur_);
    save_bound_.store(detail::hang_bound_ns(k_, save_max_, save_floor_), std::memory_order_relaxed);
  }

  /// The restore's duration.
  void add_restore(std::chrono::nanoseconds d) noexcept {
    restore_max_ = d;
    restore_bound_.store(detail::hang_bound_ns(k_, restore_max_, restore_floor_),
                         std::memory_order_relaxed);
  }

  /// The restore's bound is at least `d` from now on (a restore agreement that bounds its own
  /// wait for the other tasks: that wait is theirs, not this task's hang).
  void hold_restore_floor(std::chrono::milliseconds d) noexcept {
    restore_floor_ = std::max(restore_floor_, d);
    restore_bound_.store(detail::hang_bound_ns(k_, restore_max_, restore_floor_),
                         std::memory_order_relaxed);
  }

  /// What was learned (for the checkpoint metadata).
  hang_bounds bounds() const noexcept {
    return {std::max(prev_, cur_), save_max_, restore_max_, steps_};
  }

  /// The bound of a step now, of a save, of the restore (watcher side).
  std::chrono::nanoseconds step_bound() const noexcept {
    return std::chrono::nanoseconds(step_bound_.load(std::memory_order_relaxed));
  }
  std::chrono::nanoseconds save_bound() const noexcept {
    return std::chrono::nanoseconds(save_bound_.load(std::memory_order_relaxed));
  }
  std::chrono::nanoseconds restore_bound() const noexcept {
    return std::chrono::nanoseconds(restore_bound_.load(std::memory_order_relaxed));
  }
  /// The bound of the start: max(warmup_floor, the step bound), however the bounds were seeded.
  std::chrono::nanoseconds start_bound() const noexcept {
    return std::max(step_bound(), std::chrono::nanoseconds(warmup_floor_));
  }
  /// The bound of `p` (none and frozen: none, the largest value).
  std::chrono::nanoseconds bound(hang_phase p) const noexcept {
    switch (p) {
      case hang_phase::step:
        return step_bound();
      case hang_phase::start:
        return start_bound();
      case hang_phase::save:
        return save_bound();
      case hang_phase::restore:
        return restore_bound();
      case hang_phase::none:
      case hang_phase::frozen:
        break;
    }
    return std::chrono::nanoseconds::max();
  }

 private:
  void publish_step() noexcept {
    const std::int64_t b = steps_ < warmup_
                               ? detail::hang_bound_ns(1.0, {}, warmup_floor_)
                               : detail::hang_bound_ns(k_, std::max(prev_, cur_), step_floor_);
    step_bound_.store(b, std::memory_order_relaxed);
  }
  void publish_all() noexcept {
    publish_step();
    save_bound_.store(detail::hang_bound_ns(k_, save_max_, save_floor_), std::memory_order_relaxed);
    restore_bound_.store(detail::hang_bound_ns(k_, restore_max_, restore_floor_),
                         std::memory_order_relaxed);
  }

  double k_;
  std::chrono::milliseconds step_floor_, warmup_floor_, save_floor_, restore_floor_;
  std::uint64_t warmup_;
  std::uint32_t window_;
  // training thread only
  std::chrono::nanoseconds prev_{0}, cur_{0};  // the windowed max's two buckets
  std::uint32_t in_window_ = 0;
  std::uint64_t steps_ = 0;
  std::chrono::nanoseconds save_prev_{0}, save_cur_{0}, save_max_{0}, restore_max_{0};
  std::uint32_t saves_in_window_ = 0;
  // read by the watcher
  std::atomic<std::int64_t> step_bound_{0}, save_bound_{0}, restore_bound_{0};
};

// A hang policy is a type with `static constexpr bool detects` (false: no detection compiled
// in), `static constexpr bool ends_job` (true: the verdict goes where every worker waits, the
// current round's claim or outcome key, and fails the job's agreement; false: outside a round
// it goes to ctl/hang and fails nothing) and `static void act(const hang_verdict&, const
// hang_options&)`, called once per handler on the watcher thread when the verdict is known.

/// Hang policy: no detection at all (compiled out).
struct hang_none {
  static constexpr bool detects = false;
  static constexpr bool ends_job = false;
  static void act(const hang_verdict&, const hang_options&) noexcept {}
};

/// Hang policy: report a verdict (a warning line to hang_options::log, then on_hang) on every
/// worker that learns it; the job goes on. A verdict found while an agreement round is under way is
/// that round's outcome, and fails it: run() throws hang_detected on every worker.
struct hang_report {
  static constexpr bool detects = true;
  static constexpr bool ends_job = false;
  static void act(const hang_verdict& v, const hang_options& o) noexcept {
    try {
      detail::log_line(o.log, "hang detected: " + v.describe());
    } catch (...) {  // no memory for the line
    }
    try {
      if (o.on_hang) o.on_hang(v);
    } catch (...) {
    }
  }
};

/// Hang policy: report, then end the process with hang_options::exit_code (_exit: no destructor
/// runs, no buffer is flushed, nothing half-written is published); every worker does the same
/// when it learns the verdict, so the launcher restarts the group and the next start resumes
/// from the newest checkpoint every task holds.
struct hang_restart {
  static constexpr bool detects = true;
  static constexpr bool ends_job = true;
  [[noreturn]] static void act(const hang_verdict& v, const hang_options& o) noexcept {
    hang_report::act(v, o);
    remove_temp_files();  // the cache files of create_cache go with the process
    ::_exit(o.exit_code);
  }
};

HOLDFAST_NAMESPACE_END
