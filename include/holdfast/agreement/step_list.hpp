// holdfast/agreement/step_list.hpp — the restore agreement's step lists: the text form of the
// checkpoint steps a worker holds, and the newest step every worker holds.
//
// Guarantees:
//   - parse_step_list accepts exactly what format_step_list writes: strictly ascending
//     non-negative decimals joined by ',' ("" for none), no trailing ','.
//   - newest_common_step answers from ascending lists without copying them.
// Caveats:
//   - format_step_list writes at most the newest `max_steps` (1000 by default): older steps are
//     not proposed for a restore.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../version.hpp"
#include "value.hpp"  // detail::parse_agreement_int: the grammar's one integer reader

HOLDFAST_NAMESPACE_BEGIN

/// The text of a restore agreement's step list: the steps a worker holds, ascending, joined by
/// ',' ("" for none). At most the newest `max_steps` are written.
inline std::string format_step_list(const std::vector<std::int64_t>& steps,
                                    std::size_t max_steps = 1000) {
  std::string s;
  const std::size_t from = steps.size() > max_steps ? steps.size() - max_steps : 0;
  for (std::size_t i = from; i < steps.size(); ++i)
    s += (i > from ? "," : "") + std::to_string(steps[i]);
  return s;
}

/// Parses format_step_list's text (strictly ascending non-negative steps); std::nullopt when it
/// does not follow that form.
inline std::optional<std::vector<std::int64_t>> parse_step_list(std::string_view text) {
  std::vector<std::int64_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    auto s = detail::parse_agreement_int(text.substr(0, comma), INT64_MAX);
    if (!s || (!out.empty() && *s <= out.back())) return std::nullopt;
    out.push_back(*s);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // a trailing ','
  }
  return out;
}

/// The newest step present in every list (each ascending), or std::nullopt when they share none.
inline std::optional<std::int64_t> newest_common_step(
    const std::vector<std::vector<std::int64_t>>& lists) {
  if (lists.empty()) return std::nullopt;
  const auto& first = lists.front();
  for (auto it = first.rbegin(); it != first.rend(); ++it) {
    bool everywhere = std::all_of(lists.begin() + 1, lists.end(), [&](const auto& l) {
      return std::binary_search(l.begin(), l.end(), *it);
    });
    if (everywhere) return *it;
  }
  return std::nullopt;
}

HOLDFAST_NAMESPACE_END
