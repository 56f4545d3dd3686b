// Fuzzes parse_agreement_value and parse_step_list (agreement.hpp): the values every worker reads
// from the shared coordination store (etcd, a shared directory), written by other processes.
// Properties: parse_agreement_value never throws (noexcept: a throw would terminate); a parsed
// value formats back (format_agreement_value) to exactly the input and parses to the same value;
// an accepted step list is strictly ascending, non-negative, and formats back to the input.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <holdfast/agreement.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);

  if (auto v = holdfast::parse_agreement_value(in)) {
    std::string text;
    try {
      text = holdfast::format_agreement_value(*v);
    } catch (const std::invalid_argument& e) {
      hf_fuzz::fail("format_agreement_value refuses a parsed value: " + std::string(e.what()));
    }
    hf_fuzz::check_equal(text, std::string(in), "a parsed agreement value formats differently");
    auto again = holdfast::parse_agreement_value(text);
    hf_fuzz::check(again && *again == *v, "a formatted agreement value parses differently");
  }

  std::optional<std::vector<std::int64_t>> steps;
  try {
    steps = holdfast::parse_step_list(in);
  } catch (const holdfast::error&) {
    return 0;
  }
  if (steps) {
    for (std::size_t i = 0; i < steps->size(); ++i) {
      hf_fuzz::check((*steps)[i] >= 0, "a negative step in a step list");
      hf_fuzz::check(i == 0 || (*steps)[i] > (*steps)[i - 1], "a step list not ascending");
    }
    // format_step_list writes the newest max_steps only: ask for all of them.
    hf_fuzz::check_equal(holdfast::format_step_list(*steps, steps->size()), std::string(in),
                         "a parsed step list formats differently");
  }
  return 0;
}
