// Fuzzes detail::base64_decode (etcd's keys and values arrive base64-encoded in its JSON).
// Properties: only holdfast::error escapes; the decoder accepts only canonical text, so encoding
// what it decoded gives back the input exactly; any bytes encode to text that decodes to them.
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/detail/base64.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);
  try {
    const std::string bytes = holdfast::detail::base64_decode(in, "fuzz");
    hf_fuzz::check_equal(holdfast::detail::base64_encode(bytes), std::string(in),
                         "base64_decode accepted non-canonical text");
  } catch (const holdfast::error&) {
  }
  const std::string encoded = holdfast::detail::base64_encode(in);
  std::string decoded;
  try {
    decoded = holdfast::detail::base64_decode(encoded, "fuzz (re-encoded)");
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("base64_decode rejects base64_encode's text: " + std::string(e.what()));
  }
  hf_fuzz::check(decoded == in, "base64 round trip changed the bytes");
  return 0;
}
