// Fuzzes detail::parse_iso8601 (termination.hpp): the `time` of AWS's spot instance-action, the
// moment a preemption notice says the machine goes away.
// Properties: only holdfast::error escapes (a signed overflow is a UBSan report); an accepted
// time in the range the clock can hold agrees with timegm(3) on the same fields, to the second.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

#include <holdfast/termination.hpp>

#include "fuzz_support.hpp"

namespace {

// The fields of a time the parser accepted (it checked the shape), read again independently.
int field(std::string_view s, std::size_t at, std::size_t n) {
  int v = 0;
  for (std::size_t i = at; i < at + n; ++i) v = v * 10 + (s[i] - '0');
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);
  std::chrono::system_clock::time_point t;
  try {
    t = holdfast::detail::parse_iso8601(in, "fuzz");
  } catch (const holdfast::error&) {
    return 0;
  }
  // YYYY-MM-DDTHH:MM:SS[.f+](Z|±HH:MM)
  std::tm tm{};
  tm.tm_year = field(in, 0, 4) - 1900;
  tm.tm_mon = field(in, 5, 2) - 1;
  tm.tm_mday = field(in, 8, 2);
  tm.tm_hour = field(in, 11, 2);
  tm.tm_min = field(in, 14, 2);
  tm.tm_sec = field(in, 17, 2);
  std::int64_t expect = static_cast<std::int64_t>(timegm(&tm));
  const char zone = in.back() == 'Z' || in.back() == 'z' ? 'Z' : in[in.size() - 6];
  if (zone != 'Z') {
    const int off = field(in, in.size() - 5, 2) * 3600 + field(in, in.size() - 2, 2) * 60;
    expect += zone == '-' ? off : -off;
  }
  // floor, not truncation: a time before 1970 with a fraction is still in its second
  const auto got = std::chrono::floor<std::chrono::seconds>(t.time_since_epoch()).count();
  if (got != expect)
    hf_fuzz::fail("parse_iso8601('" + std::string(in) + "') = " + std::to_string(got) +
                  " s, timegm says " + std::to_string(expect));
  return 0;
}
