// Fuzzes json_codec::decode (handoff.hpp): command.json and ready.json, the flat JSON objects jobs
// hand each other through a shared cache root.
// Properties: only holdfast::error escapes, from decoding or from the typed getters; every key
// decoded passes command::validate_key; json_codec::encode of a decoded command decodes to an
// equal command (strings, int64 integers, booleans and doubles keep their type and value).
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/handoff.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string source = "fuzz/command.json";
  holdfast::command c;
  try {
    c = holdfast::json_codec::decode(hf_fuzz::text(data, size), source);
  } catch (const holdfast::error&) {
    return 0;
  }
  for (const auto& e : c.entries()) {
    try {
      holdfast::command::validate_key(e.key);
    } catch (const holdfast::error& x) {
      hf_fuzz::fail("decode kept a key validate_key refuses: " + std::string(x.what()));
    }
    (void)c.get_string(e.key);
    try {
      (void)c.get_int(e.key);
    } catch (const holdfast::error&) {
    }
    try {
      (void)c.get_bool(e.key);
    } catch (const holdfast::error&) {
    }
    try {
      (void)c.get_double(e.key);
    } catch (const holdfast::error&) {
    }
  }
  std::string text;
  try {
    text = holdfast::json_codec::encode(c);
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("json_codec::encode refuses a decoded command: " + std::string(e.what()));
  }
  try {
    hf_fuzz::check(holdfast::json_codec::decode(text, source) == c,
                   "a re-encoded command.json decodes to another command");
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("json_codec rejects its own encoding: " + std::string(e.what()));
  }
  return 0;
}
