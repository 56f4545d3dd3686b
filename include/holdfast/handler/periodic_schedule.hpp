// holdfast/handler/periodic_schedule.hpp — the training side of periodic saves
// (handler_options::periodic_saves) beside the save itself: task 0's schedule (when to ask the
// policy, the step it asks its watcher to publish, the cost it records) and the report every
// task writes after each periodic save. preemption_handler.hpp saves at the decided steps, the
// watcher (watcher.hpp) publishes and learns them, handler/periodic.hpp binds a
// save_interval_policy to the options.
//
// Guarantees:
//   - Only task 0 decides, and only with the policy's next_due and saved set. due() is its
//     check at each boundary: one clock read compared with the policy's next due time, no store
//     traffic (its only steady-state cost); on every other task it reads no clock.
//   - When due, decide() asks next_due again (the interval may have grown), and when a save is
//     due asks for S = the run counter + a lead of max(min_lead_steps, lead_time / mean step
//     time) steps (rounded up; lead_time at least the floor the driver gives: two watch
//     intervals over a store without a watch); no decision before a step is timed. It then asks
//     nothing more until it acted on the last step it asked for: saved it (the next due time is
//     next_due of the save's end), skipped it (due at once), or its publication failed (due a
//     lead_time later).
//   - After each periodic save task 0 records in the policy (saved) the longest cost the tasks
//     reported: its own, or the largest report of the others (saved/<task>).
//   - put_periodic_report puts "saved <step> <cost>" ("-": skipped) under saved/<task>, over the
//     previous report, and never throws: a report not written keeps the decisions' keys a save
//     longer, nothing more.
// Caveats:
//   - A schedule refers to the options it was made from: they must outlive it (the handler's).
//   - Training thread only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "../agreement/keys.hpp"   // periodic_report_key_name: saved/<task>
#include "../agreement/value.hpp"  // agreement_value: "saved <step> <cost>"
#include "../version.hpp"
#include "options.hpp"  // periodic_save_options

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// Task 0's schedule of periodic decisions; every other task holds one that never decides.
class periodic_schedule {
 public:
  using steady = std::chrono::steady_clock;

  periodic_schedule(const periodic_save_options& o, int task)
      : o_(o), decider_(o.enabled && task == 0 && o.next_due && o.saved) {}
  periodic_schedule(const periodic_schedule&) = delete;
  periodic_schedule& operator=(const periodic_schedule&) = delete;

  // Whether this task decides.
  bool decides() const noexcept { return decider_; }

  // At the handler's start: the first due time.
  void start() {
    if (decider_) due_ = o_.next_due(steady::now());
  }

  // At a boundary: whether to decide().
  bool due() const noexcept { return decider_ && steady::now() >= due_; }

  // Asks next_due again; when a save is due, hands ask(S) the step to publish, S = `counter` +
  // max(min_lead_steps, lead / `mean`) steps, lead = max(lead_time, `min_lead_time`); then asks
  // nothing more until it has acted on S. Nothing while no step is timed (`mean` zero).
  template <class Ask>
  void decide(std::chrono::nanoseconds mean, std::chrono::milliseconds min_lead_time,
              std::int64_t counter, Ask&& ask) {
    const auto now = steady::now();
    const auto due = o_.next_due(now);
    if (due > now) {
      due_ = due;
      return;
    }
    if (mean.count() <= 0) return;  // no step timed yet: the lead in steps is unknown
    const auto lead_time = std::max(o_.lead_time, min_lead_time);
    const auto lead_ns = std::chrono::nanoseconds(lead_time).count();
    const std::int64_t lead =
        std::max<std::int64_t>(o_.min_lead_steps, (lead_ns + mean.count() - 1) / mean.count());
    requested_ = counter + lead;
    std::forward<Ask>(ask)(requested_);
    due_ = steady::time_point::max();
  }

  // The publication failed: ask again after a lead time.
  void retry() { due_ = steady::now() + o_.lead_time; }

  // A decided step `s` was skipped (learned past it): when it is the last asked for, ask again.
  void skipped(std::int64_t s) {
    if (decider_ && s >= requested_) due_ = steady::now();
  }

  // Task 0 saved `step` by `end`, costing `cost_us`, the others' longest report `others_us`:
  // recorded in the policy; when it is the last step asked for, the next due time follows.
  void saved(std::int64_t step, std::int64_t cost_us, std::int64_t others_us,
             steady::time_point end) {
    o_.saved(std::chrono::duration<double>(std::chrono::microseconds(std::max(cost_us, others_us))),
             end);
    if (step >= requested_) due_ = o_.next_due(end);
  }

 private:
  const periodic_save_options& o_;
  const bool decider_;
  steady::time_point due_ = steady::time_point::max();  // when to ask next_due
  std::int64_t requested_ = -1;                         // the step it asked to publish last
};

// Puts "saved <step> <cost_us>" ("-" for a negative cost: skipped) under saved/<task>, written by
// `task`/`nonce`, over the previous report. Best effort: it never throws.
template <class Kv>
void put_periodic_report(Kv& kv, const std::string& scope, int task, const std::string& nonce,
                         std::int64_t step, std::int64_t cost_us) noexcept {
  try {
    agreement_value v;
    v.what = agreement_value::kind::saved;
    v.step = step;
    v.cost_us = cost_us;
    v.writer = task;
    v.nonce = nonce;
    kv.put(periodic_report_key_name(scope, task), format_agreement_value(v));
  } catch (...) {
  }
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
