// holdfast/handler/checkpointer_calls.hpp — how preemption_handler (preemption_handler.hpp)
// calls its Checkpointer: the save (or the Config's save override instead), and each optional
// member the handler detects (traits.hpp): wait_until_finished, set_hang_bounds,
// restored_hang_bounds, newest_hang_bounds, set_durable_deadline, on_copy.
//
// Guarantees:
//   - An optional member a Checkpointer lacks is never called and costs nothing (if constexpr):
//     the call does nothing, or gives no bounds, or says the Checkpointer takes no deadline.
//   - checkpointer_save: the Config's save override when it has one (then the Checkpointer never
//     saves), else Checkpointer::save(step).
//   - checkpointer_record_bounds: a failure of set_hang_bounds is swallowed (a bound not recorded
//     costs the next start its warm-up, nothing more).
//   - Preemption save and a durable tier: a Checkpointer with set_durable_deadline()
//     (two_tier_checkpoints) is told, before the save, min(notice time + grace, the announced
//     deadline) - grace_margin for a worker with a notice of its own, so its
//     wait_until_finished() waits for the durable copy at most until then (its unfinished()
//     names what did not finish); the handler does not wait for it before that save.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

#include "../detail/detect.hpp"
#include "../version.hpp"
#include "hang.hpp"    // hang_bounds
#include "traits.hpp"  // the optional members, detected: ckpt_wait, ckpt_durable_deadline, ...

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// Saves `step`: the save override where the config has one, else the Checkpointer's save.
template <class Checkpointer, class Config>
void checkpointer_save(Checkpointer& c, Config& config, std::int64_t step) {
  if (config.has_save_override())
    config.save_override()(step);
  else
    c.save(step);
}

// Waits for the Checkpointer's background save, when it has one (wait_until_finished()).
template <class Checkpointer>
void checkpointer_finish(Checkpointer& c) {
  if constexpr (detect<ckpt_wait, Checkpointer>::value)
    c.wait_until_finished();
  else
    static_cast<void>(c);
}

// Hands `learner`'s bounds to a Checkpointer that records them in its saves (set_hang_bounds).
template <class Checkpointer, class Learner>
void checkpointer_record_bounds(Checkpointer& c, const Learner& learner) noexcept {
  if constexpr (detect<ckpt_hang_bounds_out, Checkpointer>::value) {
    try {
      c.set_hang_bounds(learner.bounds());
    } catch (...) {  // a bound not recorded costs the next start its warm-up, nothing more
    }
  } else {
    static_cast<void>(c);
    static_cast<void>(learner);
  }
}

// The bounds the checkpoint the Checkpointer restored records (restored_hang_bounds()).
template <class Checkpointer>
std::optional<hang_bounds> checkpointer_restored_hang_bounds(Checkpointer& c) {
  if constexpr (detect<ckpt_hang_bounds_in, Checkpointer>::value) {
    return c.restored_hang_bounds();
  } else {
    static_cast<void>(c);
    return std::nullopt;
  }
}

// The bounds the newest checkpoint records, read before the restore (newest_hang_bounds()).
template <class Checkpointer>
std::optional<hang_bounds> checkpointer_newest_hang_bounds(Checkpointer& c) {
  if constexpr (detect<ckpt_hang_bounds_newest, Checkpointer>::value) {
    return c.newest_hang_bounds();
  } else {
    static_cast<void>(c);
    return std::nullopt;
  }
}

// Hands `copied` (periodic_save_options::copied) to a Checkpointer that times its durable copies
// (on_copy()).
template <class Checkpointer, class Copied>
void checkpointer_on_copy(Checkpointer& c, const Copied& copied) {
  if constexpr (detect<ckpt_on_copy, Checkpointer>::value) {
    c.on_copy([copied](std::int64_t, std::chrono::duration<double> took) { copied(took); });
  } else {
    static_cast<void>(c);
    static_cast<void>(copied);
  }
}

// Tells a Checkpointer with set_durable_deadline() when this worker's grace period ends, less
// `margin` (what the exit needs): min(notice time + grace, the announced deadline), when this
// worker has a notice with either. Returns whether the Checkpointer takes a deadline.
template <class Checkpointer, class Config, class Margin>
bool checkpointer_tell_durable_deadline(Checkpointer& c, Config& config, Margin margin) {
  using steady = std::chrono::steady_clock;
  if constexpr (detect<ckpt_durable_deadline, Checkpointer>::value) {
    std::optional<steady::time_point> end;
    const auto grace = std::chrono::duration_cast<steady::duration>(config.grace_period());
    if (auto at = config.noticed_at(); at && grace.count() > 0) end = *at + grace;
    if (auto d = config.announced_deadline()) {
      const auto e = steady::now() + std::chrono::duration_cast<steady::duration>(
                                         *d - std::chrono::system_clock::now());
      end = end ? std::min(*end, e) : e;
    }
    if (end) c.set_durable_deadline(*end - margin);
    return true;
  } else {
    static_cast<void>(c);
    static_cast<void>(config);
    static_cast<void>(margin);
    return false;
  }
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
