// benchmarks/stamps.hpp — what cases that time parts of a run themselves share: the steady clock
// in nanoseconds (when a save or a wake-up happened) and ids for fresh keys and namespaces.
//
// Guarantees:
//   - now_ns() is the steady clock in ns since its epoch: stamps taken by any thread or any
//     process of the machine (forked children included) compare with each other.
//   - next_id() never returns the same id twice in one binary (one counter for every case), so a
//     key or namespace built from it is fresh.
// Caveats:
//   - next_id is not thread-safe: call it from the harness's thread, as the cases do.
#pragma once

#include <chrono>
#include <cstdint>

namespace bench {

/// The steady clock, ns since its epoch.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// An id not handed out before in this binary (1, 2, ...).
inline std::uint64_t next_id() {
  static std::uint64_t id = 0;
  return ++id;
}

}  // namespace bench
