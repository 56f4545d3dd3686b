// benchmarks/bench.hpp — a small std-only benchmark harness.
//
// Each case is measured beside a baseline written with the same bare syscalls, and reported as
// median, minimum and p99 nanoseconds per operation and as the ratio median / baseline median.
// Case and baseline repetitions are interleaved (ABAB…) so drift on a noisy machine hits both.
//
//   static bench::registrar r{{"publish/4KiB/durable", bench::timed([](std::size_t n) {...}),
//                              "bare/4KiB/durable", bench::timed([](std::size_t n) {...})}};
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace bench {

/// Runs `n` operations and returns the nanoseconds they took (a body may exclude its setup).
using measure = std::function<double(std::size_t n)>;

/// Wraps a body that runs `n` operations: the harness times the whole call.
template <class F>
measure timed(F fn) {
  return [fn = std::move(fn)](std::size_t n) mutable {
    auto t0 = std::chrono::steady_clock::now();
    fn(n);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  };
}

/// How a case is run. iterations == 0 calibrates: n doubles until one repetition takes
/// `min_rep_ms`. Latency cases set iterations = 1 and many repetitions, so p99 is per operation.
struct config {
  std::size_t iterations = 0;
  int repetitions = 15;
  int warmup = 2;
  double min_rep_ms = 20;
};

/// One case and its baseline (baseline may be empty: then only the case is reported).
struct case_def {
  std::string name;
  measure fn;
  std::string baseline_name;
  measure baseline;
  config cfg{};
};

/// The cases of every linked *_bench.cpp, in registration order.
inline std::vector<case_def>& registry() {
  static std::vector<case_def> cases;
  return cases;
}

/// Registers a case at static-initialization time.
struct registrar {
  explicit registrar(case_def c) { registry().push_back(std::move(c)); }
};

/// Per-operation statistics of one side of a case.
struct stats {
  double median = 0, min = 0, p99 = 0;
};

inline stats summarize(std::vector<double> v) {
  stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  s.p99 = v[std::min(v.size() - 1, static_cast<std::size_t>(static_cast<double>(v.size()) * 0.99))];
  return s;
}

}  // namespace bench
