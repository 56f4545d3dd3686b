// tests/support/fault_sweep.hpp — failing every system call of an operation in turn (through
// holdfast::testing::fault_io), as the etcd client tests do over plain TCP and over TLS.
//
// Guarantees:
//   - fail_each_call first runs the operation once with a fault that only counts (it must answer
//     right), then runs it once per call k = 1 .. calls + extra with call k failing with EIO:
//     each run either answers right or throws a holdfast::error (handed to `on_error` for the
//     caller's checks), and each takes less than bound_ms.
//   - A run that did not throw may have lost only what cannot change its answer: a close, or
//     with a pool of idle connections the check of one (its poll, or the read after it), which
//     drops that connection and connects anew. Anything else failing must throw.
//   - The plan is disarmed after each run; disarm_on_exit disarms it when a scope ends, so a
//     failed REQUIRE never leaves a fault armed for the next case.
// Caveats:
//   - `extra` covers calls that exist only in a failed run (a reconnect after a dropped
//     connection); a watch makes a varying number of poll/recv calls, so call k may not happen
//     at all in a given run.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <holdfast/error.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <string>

#include "elapsed.hpp"

namespace holdfast_test {

/// Disarms fault_plan when the scope ends.
struct disarm_on_exit {
  disarm_on_exit() = default;
  disarm_on_exit(const disarm_on_exit&) = delete;
  disarm_on_exit& operator=(const disarm_on_exit&) = delete;
  ~disarm_on_exit() { holdfast::testing::fault_plan::disarm(); }
};

/// How fail_each_call sweeps an operation.
struct call_sweep {
  std::uint64_t min_calls = 1;  ///< a clean run makes at least this many calls
  std::uint64_t extra = 0;      ///< k goes this far past a clean run's calls
  bool pooled = false;          ///< idle connections are kept: their checks may fail unnoticed
  long long bound_ms = 0;       ///< each run's time limit
};

/// Runs `run` (true when its answer is right) with each of its calls failed in turn, as `sweep`
/// says; `on_error(e)` checks each holdfast::error thrown.
template <class Run, class OnError>
void fail_each_call(const call_sweep& sweep, Run run, OnError on_error) {
  using holdfast::testing::fault;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  fault_plan::arm(fault{io_op::any, std::uint64_t(1) << 62, EIO});  // counts, never fires
  CHECK(run());
  const auto calls = fault_plan::calls(io_op::any);
  REQUIRE(calls >= sweep.min_calls);
  for (std::uint64_t k = 1; k <= calls + sweep.extra; ++k) {
    CAPTURE(k);
    fault_plan::arm(fault{io_op::any, k, EIO});
    const auto t0 = std::chrono::steady_clock::now();
    bool threw = false;
    try {
      const bool right = run();
      CHECK(right);
    } catch (const holdfast::error& e) {
      threw = true;
      INFO(std::string(e.what()));
      on_error(e);
    }
    fault_plan::disarm();
    CHECK(ms_since(t0) < sweep.bound_ms);
    if (!threw) {
      const auto last = fault_plan::last_failed();
      CHECK((fault_plan::failures() == 0 || last == io_op::close ||
             (sweep.pooled && (last == io_op::poll || last == io_op::recv))));
    }
  }
}

}  // namespace holdfast_test
