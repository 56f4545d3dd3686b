// holdfast/detail/ascii.hpp — ASCII helpers shared by the parsers and the messages: case-blind
// comparison, the one hex-digit decoder, the one escaper for text shown in messages.
//
// Guarantees:
//   - hex_digit is the only place a hex digit is decoded; each format states the cases it
//     accepts (the filesystem store's names accept upper case only, so a key has one file name).
//   - printable is the only escaper for text that reaches a message or a log line: every control
//     byte (below 0x20, and 0x7f) becomes \xNN, so a newline or ESC from a key, a path or a URL
//     can neither forge a log line nor drive a terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// ASCII case-insensitive equality (header names, absl booleans); other bytes compare exactly.
constexpr bool ascii_iequal(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

/// Which letter cases hex_digit accepts for the digits a-f.
enum class hex_case : unsigned char { either, lower, upper };

/// The value of one hex digit (0..15), or -1 when `c` is not a hex digit in the accepted case.
constexpr int hex_digit(char c, hex_case accept = hex_case::either) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (accept != hex_case::upper && c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (accept != hex_case::lower && c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Text as shown in a message: every control byte (NUL, newline, ESC, DEL...) becomes \xNN.
inline std::string printable(std::string_view s) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += digits[u >> 4];
      out += digits[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
