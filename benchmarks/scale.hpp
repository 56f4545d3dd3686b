// benchmarks/scale.hpp — what every scale case (scale_*_bench.cpp) shares: the clocks a row is
// measured with, and a figure line printed once per name.
//
// Guarantees:
//   - cpu_ns() is this process's CPU time (all threads), now_ns() the steady clock, both in ns.
//   - first_time(name) is true once per name and binary: repetitions of a case compute the same
//     figures again, and its "# ..." line is printed only the first time.
// Caveats:
//   - first_time is not thread-safe: call it from the harness's thread, as the cases do.
#pragma once

#include <time.h>  // clock_gettime(CLOCK_PROCESS_CPUTIME_ID)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "stamps.hpp"  // now_ns

namespace bench::scale {

using clk = std::chrono::steady_clock;

/// This process's CPU time, ns.
inline std::int64_t cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

using bench::now_ns;  // the steady clock, ns since its epoch

/// True the first time it is asked about `name` (a figure line is printed once per name).
inline bool first_time(const std::string& name) {
  static std::vector<std::string> printed;
  if (std::find(printed.begin(), printed.end(), name) != printed.end()) return false;
  printed.push_back(name);
  return true;
}

}  // namespace bench::scale
