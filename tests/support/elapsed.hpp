// tests/support/elapsed.hpp — the milliseconds since a moment, as the timing checks of the kv
// tests compare them with their bounds.
//
// Guarantees:
//   - ms_since(t0) is whole milliseconds on the steady clock, rounded down: a check
//     `ms_since(t0) < bound` never passes on a fraction over the bound.
// Caveats:
//   - A bound is only as tight as a loaded 2-core machine allows: see DESIGN.md, "Tests".
#pragma once

#include <chrono>

namespace holdfast_test {

/// Whole milliseconds (steady clock) since `t0`.
inline long long ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

}  // namespace holdfast_test
