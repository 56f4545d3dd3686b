// Fuzzes detail::parse_json (RFC 8259, strict): command files, ready markers, etcd replies.
// Properties: only holdfast::error escapes; a parsed value written compactly and indented parses
// back to an equal value, and writing is idempotent (the text of the re-parsed value is the
// same); every number's accessors either answer or throw holdfast::error.
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/detail/json.hpp>

#include "fuzz_support.hpp"

namespace {

using holdfast::detail::json_value;

void touch_numbers(const json_value& v, int depth) {
  if (depth > 600) return;
  switch (v.type()) {
    case json_value::kind::number:
      try {
        (void)v.as_double();
      } catch (const holdfast::error&) {
      }
      if (v.is_integer()) {
        try {
          (void)v.as_int64();
        } catch (const holdfast::error&) {
        }
        try {
          (void)v.as_uint64();
        } catch (const holdfast::error&) {
        }
      }
      break;
    case json_value::kind::array:
      for (const auto& e : v.as_array()) touch_numbers(e, depth + 1);
      break;
    case json_value::kind::object:
      for (const auto& m : v.as_object()) {
        hf_fuzz::check(v.find(m.first) != nullptr, "find() misses a member the parser stored");
        touch_numbers(m.second, depth + 1);
      }
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string source = "fuzz.json";
  json_value v;
  try {
    v = holdfast::detail::parse_json(hf_fuzz::text(data, size), source);
  } catch (const holdfast::error&) {
    return 0;
  }
  touch_numbers(v, 0);
  const std::string compact = holdfast::detail::to_json(v);
  const std::string pretty = holdfast::detail::to_json(v, 2);
  json_value again, again_pretty;
  try {
    again = holdfast::detail::parse_json(compact, source);
    again_pretty = holdfast::detail::parse_json(pretty, source);
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("to_json wrote text that parse_json rejects: " + std::string(e.what()));
  }
  hf_fuzz::check(again == v, "compact JSON does not parse back to an equal value");
  hf_fuzz::check(again_pretty == v, "indented JSON does not parse back to an equal value");
  hf_fuzz::check_equal(holdfast::detail::to_json(again), compact, "to_json is not idempotent");
  return 0;
}
