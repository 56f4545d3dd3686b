// holdfast/detail/ascii.hpp — ASCII helpers shared by the parsers (HTTP headers, flag files).
#pragma once

#include <cstddef>
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

}  // namespace detail
HOLDFAST_NAMESPACE_END
