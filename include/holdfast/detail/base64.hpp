// holdfast/detail/base64.hpp — standard base64 (RFC 4648 §4, with padding), for etcd's JSON.
//
// Guarantees:
//   - base64_encode of any bytes (NUL and high bytes included) decodes back to the same bytes.
//   - base64_decode accepts exactly the canonical padded alphabet (A-Z a-z 0-9 + /, '=' only
//     as final padding, length a multiple of 4) and throws holdfast::format_error naming the
//     source and the offending offset otherwise; it never reads out of bounds.
// Caveats:
//   - No line breaks, no URL-safe alphabet, no whitespace skipping: etcd emits none of those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "../error.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Encodes `bytes` as padded standard base64.
inline std::string base64_encode(std::string_view bytes) {
  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte = [&](std::size_t k) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[k]));
  };
  for (; i + 3 <= bytes.size(); i += 3) {
    std::uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out += alphabet[v >> 18 & 63];
    out += alphabet[v >> 12 & 63];
    out += alphabet[v >> 6 & 63];
    out += alphabet[v & 63];
  }
  std::size_t rest = bytes.size() - i;
  if (rest == 1) {
    std::uint32_t v = byte(i) << 16;
    out += alphabet[v >> 18 & 63];
    out += alphabet[v >> 12 & 63];
    out += "==";
  } else if (rest == 2) {
    std::uint32_t v = byte(i) << 16 | byte(i + 1) << 8;
    out += alphabet[v >> 18 & 63];
    out += alphabet[v >> 12 & 63];
    out += alphabet[v >> 6 & 63];
    out += '=';
  }
  return out;
}

/// The value of one base64 digit, or -1.
constexpr int base64_digit(char c) noexcept {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/// Decodes padded standard base64; throws format_error(source, "offset N: why") when malformed.
inline std::string base64_decode(std::string_view text, const std::string& source) {
  if (text.size() % 4 != 0)
    throw format_error(
        source, "offset " + std::to_string(text.size()) + ": base64 length is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    if (last && text[i + 3] == '=') pad = text[i + 2] == '=' ? 2 : 1;
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      int d = k >= 4 - static_cast<std::size_t>(pad) ? 0 : base64_digit(text[i + k]);
      if (d < 0)
        throw format_error(
            source, "offset " + std::to_string(i + k) + ": invalid base64 " +
                        (text[i + k] == '=' ? std::string("padding") : std::string("character")));
      v = v << 6 | static_cast<std::uint32_t>(d);
    }
    if ((pad == 2 && (v & 0xffff) != 0) || (pad == 1 && (v & 0xff) != 0))
      throw format_error(source, "offset " + std::to_string(i + 3 - static_cast<std::size_t>(pad)) +
                                     ": non-zero padding bits in base64");
    out += static_cast<char>(v >> 16 & 0xff);
    if (pad < 2) out += static_cast<char>(v >> 8 & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
