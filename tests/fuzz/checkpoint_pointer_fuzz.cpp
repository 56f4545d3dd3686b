// Fuzzes detail::parse_checkpoint_pointer, the reader of <run>/checkpoint/latest (a file on a
// shared or remote mount that anything may have garbled).
// Read with the default name prefix "step-" and with an empty one (names that are just numbers).
// Properties: only holdfast::error escapes; an accepted pointer is in the canonical form, so
// format_checkpoint_pointer gives back the input byte for byte, and every name it holds is a
// checkpoint name with that prefix (checkpoint_step_of accepts it).
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/checkpoint.hpp>

#include "fuzz_support.hpp"

namespace {

void parse(std::string_view in, std::string_view prefix) {
  namespace d = holdfast::detail;
  d::checkpoint_pointer p;
  try {
    p = d::parse_checkpoint_pointer(in, "fuzz/checkpoint/latest", prefix);
  } catch (const holdfast::error&) {
    return;
  }
  hf_fuzz::check(d::checkpoint_step_of(p.latest, prefix).has_value(),
                 "'latest' is not a checkpoint name");
  for (const auto& k : p.keep)
    hf_fuzz::check(d::checkpoint_step_of(k, prefix).has_value(),
                   "a 'keep' is not a checkpoint name");
  for (const auto& r : p.remove)
    hf_fuzz::check(d::checkpoint_step_of(r, prefix).has_value(),
                   "a 'delete' is not a checkpoint name");
  hf_fuzz::check_equal(d::format_checkpoint_pointer(p), std::string(in),
                       "an accepted pointer does not format back to its text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);
  parse(in, "step-");
  parse(in, "");
  return 0;
}
