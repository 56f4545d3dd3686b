// holdfast/checkpoint/names.hpp — what a checkpoint's directory is called: "<prefix><N>[.<G>]"
// (N the step, G a re-save of N), how a name is read back, and checkpoint_info.
//
// Guarantees:
//   - step_prefix and step_format_fixed_length (zero padding) shape new names; any width, padded
//     or not, of the configured prefix is read, so changing the width keeps a run readable.
//     Names written by holdfast 0.1.0 ("step-<N>", unpadded) are read unchanged.
//   - A prefix is checked once: not empty, no '/', space or control character, not starting
//     with '.' (holdfast's scratch names do); a bad one throws holdfast::error (EINVAL).
//   - Numbers are decimal with at most 18 significant digits: no overflow.
// Caveats:
//   - step_prefix must stay the same for a run: names of another prefix are not seen. Names
//     padded with zeros or written with a non-default prefix are not readable by holdfast 0.1.0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../error.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// One checkpoint: its step, its directory name and its full path.
struct checkpoint_info {
  std::int64_t step = -1;  ///< the training step it holds
  std::string name;        ///< "step-<N>" or "step-<N>.<G>" (with the configured prefix)
  std::string path;        ///< <checkpoint dir>/<name>
};

namespace detail {

// Checks a step prefix: not empty, no '/', no control character, not starting with '.'.
inline void checkpoint_check_prefix(std::string_view prefix) {
  const char* why = nullptr;
  if (prefix.empty())
    why = "is empty";
  else if (prefix[0] == '.')
    why = "starts with '.' (holdfast's scratch names do)";
  else
    for (char c : prefix)
      if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == ' ')
        why = "contains '/', a space or a control character";
  if (why) throw error(EINVAL, "step_prefix", std::string(prefix), why);
}

// Decimal digits, leading zeros allowed, at most 18 significant: the value.
inline std::optional<std::int64_t> checkpoint_number(std::string_view digits) {
  if (digits.empty()) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  std::size_t first = digits.find_first_not_of('0');
  if (first == std::string_view::npos) return 0;
  if (digits.size() - first > 18) return std::nullopt;
  std::int64_t v = 0;
  for (char c : digits.substr(first)) v = v * 10 + (c - '0');
  return v;
}

// {step, generation} of "<prefix><N>[.<G>]" (N and G decimal, any width), or nothing.
inline std::optional<std::pair<std::int64_t, std::int64_t>> checkpoint_parse_name(
    std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  auto dot = name.find('.');
  auto step = checkpoint_number(name.substr(0, dot));
  if (!step) return std::nullopt;
  if (dot == std::string_view::npos) return std::make_pair(*step, std::int64_t{0});
  auto gen = checkpoint_number(name.substr(dot + 1));
  if (!gen) return std::nullopt;
  return std::make_pair(*step, *gen);
}

// "<prefix><N>[.<G>]" -> N; any width of N, so runs written unpadded or padded stay readable.
inline std::optional<std::int64_t> checkpoint_step_of(std::string_view name,
                                                      std::string_view prefix) {
  auto p = checkpoint_parse_name(name, prefix);
  if (!p) return std::nullopt;
  return p->first;
}

// "step-<N>" or "step-<N>.<G>" -> N.
inline std::optional<std::int64_t> checkpoint_step_of(std::string_view name) {
  return checkpoint_step_of(name, "step-");
}

// The name of generation `gen` of `step`: prefix + step zero-padded to `width` [+ ".gen"].
inline std::string checkpoint_name(std::string_view prefix, std::size_t width, std::int64_t step,
                                   std::int64_t gen) {
  std::string digits = std::to_string(step);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  std::string n = std::string(prefix) + digits;
  if (gen > 0) n += "." + std::to_string(gen);
  return n;
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
