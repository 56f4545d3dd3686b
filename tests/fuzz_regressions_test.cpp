// Inputs the libFuzzer targets (tests/fuzz) crashed on, kept as ordinary tests: each calls the
// parser its fuzz target calls, with the bytes of the crash file, and asserts the outcome a fixed
// parser gives (a holdfast error or the right value). Names say which target found it.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <holdfast/termination.hpp>
#include <string>

namespace {

std::int64_t unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t.time_since_epoch()).count();
}

}  // namespace

TEST_CASE("fuzz iso8601: a time the clock cannot hold is a format_error, not an overflow") {
  using holdfast::detail::parse_iso8601;
  // iso8601_fuzz, crash-9c3cff66503450edcf85d34f4f65af318d30fe35, and notice_bodies_fuzz (the
  // same time inside AWS's instance-action), crash-c5a99e30bbcc2db07f3e690d82fa88295cb84eed:
  // the seconds were multiplied into system_clock's nanoseconds (int64: 1677-09-21 to
  // 2262-04-11) without a range check, a signed overflow (UBSan) that gives a wrong deadline.
  const char* const outside[] = {
      "1008-09-18T08:22:00.123456789Z",  // iso8601_fuzz
      "5227-02-29T12:00:00.5+05:30",     // notice_bodies_fuzz, the AWS `time`
      "9999-12-31T23:59:59Z",            // the last time four year digits spell
      "0000-01-01T00:00:00Z",            // the first
      "2262-04-12T00:00:00Z",            // the day after the last one system_clock holds
      "1677-09-20T23:59:59Z",            // the day before the first one
  };
  for (const std::string t : outside) {
    CAPTURE(t);
    CHECK_THROWS_AS(parse_iso8601(t, "fuzz"), holdfast::format_error);
  }
  // Far but representable times still parse, to the right second.
  CHECK(unix_seconds(parse_iso8601("2200-01-01T00:00:00Z", "fuzz")) == 7258118400);
  CHECK(unix_seconds(parse_iso8601("1700-01-01T00:00:00Z", "fuzz")) == -8520336000);
}
