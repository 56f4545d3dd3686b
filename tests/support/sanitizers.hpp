// tests/support/sanitizers.hpp — whether this build runs under AddressSanitizer or
// ThreadSanitizer. Stress loops scale their counts down by it (sanitized code runs ~10x slower);
// every place that does says so next to its counts.
#pragma once

#include <thread>

namespace holdfast_test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif
#else
inline constexpr bool sanitized = false;
#endif

/// ThreadSanitizer alone: it defers asynchronous signals and runs the program's handler from its
/// own, with every signal blocked, so a handler does not see the mask the kernel would give it.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool thread_sanitized = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool thread_sanitized = true;
#else
inline constexpr bool thread_sanitized = false;
#endif
#else
inline constexpr bool thread_sanitized = false;
#endif

/// Spawns and joins one thread, once per process, so that runtime threads started lazily at the
/// first pthread_create (ThreadSanitizer's background thread) already exist when a test takes a
/// baseline of /proc/self/task; CTest runs every test case in a fresh process.
inline void start_runtime_threads() {
  static const bool started = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)started;
}

}  // namespace holdfast_test
