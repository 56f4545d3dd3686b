// tests/support/expect_error.hpp — what the tests of failure paths share: catch the
// holdfast::error an operation must throw, and look for a part of its message.
//
// Guarantees:
//   - error_from(op) returns the holdfast::error `op` threw; when it threw none, the test case
//     fails (doctest FAIL) instead of going on with a made-up error.
//   - error_from(op, seen) hands the error to `seen` first (a test that records every message,
//     or checks each for a secret, does it there).
//   - error_text<E>(op) returns the what() of the `E` that `op` threw (E is holdfast::error
//     unless named: a test of a derived error names it); when it threw none, the test case fails.
// Caveats:
//   - Only holdfast::error (and what derives from it), or error_text's `E`, is caught: another
//     exception escapes, and doctest reports it as the failure it is.
#pragma once

#include <doctest/doctest.h>

#include <holdfast/error.hpp>
#include <string>

namespace holdfast_test {

/// Runs `op`; returns the holdfast::error it threw, after calling `seen(error)` (fails the test
/// case when none was thrown).
template <class Op, class Seen>
holdfast::error error_from(Op op, Seen seen) {
  try {
    op();
  } catch (const holdfast::error& e) {
    seen(e);
    return e;
  }
  FAIL("no holdfast::error was thrown");
  return holdfast::error(0, "", "");
}

/// Runs `op`; returns the holdfast::error it threw (fails the test case when none was thrown).
template <class Op>
holdfast::error error_from(Op op) {
  return error_from(op, [](const holdfast::error&) {});
}

/// Runs `op`; returns the what() of the `E` it threw (fails the test case when none was thrown).
template <class E = holdfast::error, class Op>
std::string error_text(Op op) {
  try {
    op();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no exception of the expected type was thrown");
  return {};
}

/// Whether `part` occurs in `s` (a message check that reads as one).
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace holdfast_test
