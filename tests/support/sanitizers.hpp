// tests/support/sanitizers.hpp — whether this build runs under AddressSanitizer or
// ThreadSanitizer. Stress loops scale their counts down by it (sanitized code runs ~10x slower);
// every place that does says so next to its counts.
#pragma once

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

}  // namespace holdfast_test
