// holdfast/detail/hang_bounds.hpp — hang_bounds, the hang detector's learned bounds as plain
// values: what the handler's learner measured (handler/hang.hpp) and what a checkpoint's
// metadata records for the next start (checkpoint/metadata.hpp). Here, below both, so that the
// checkpoint layer names it without including the handler's.
//
// Guarantees:
//   - A plain aggregate: no I/O, no allocation; == compares every field.
#pragma once

#include <chrono>
#include <cstdint>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The learned bounds (before the multiplier): what the job measured, and what a checkpoint
/// records for the next start.
struct hang_bounds {
  std::chrono::nanoseconds step{0};     ///< the longest step over the recent window(s)
  std::chrono::nanoseconds save{0};     ///< the longest of the recent saves
  std::chrono::nanoseconds restore{0};  ///< the longest restore seen
  std::uint64_t steps = 0;              ///< steps timed (the warm-up counts them)
  /// Same values.
  friend bool operator==(const hang_bounds& a, const hang_bounds& b) {
    return a.step == b.step && a.save == b.save && a.restore == b.restore && a.steps == b.steps;
  }
};

HOLDFAST_NAMESPACE_END
