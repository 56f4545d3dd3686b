// holdfast/detail/crc32c.hpp — CRC32C (Castagnoli), as used by iSCSI, ext4, LevelDB and gRPC.
//
// The cache's checked_format stores one CRC32C per item (and one over its header) so a torn or
// corrupted item is detected when it is read.
//
// Guarantees:
//   - crc32c("123456789") == 0xE3069283 (the standard check value): reflected polynomial
//     0x82F63B78, initial value and final xor 0xFFFFFFFF.
//   - crc32c_extend(crc32c(a), b) == crc32c(a + b), so a checksum can be built piecewise.
//   - The result does not depend on the machine: x86-64 with SSE4.2 uses the crc32 instruction
//     (chosen at run time; three interleaved streams for 3 KiB and more), every other machine
//     uses a table-driven slice-by-8 loop.
// Caveats:
//   - A CRC detects accidental corruption, not tampering.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../version.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HOLDFAST_CRC32C_X86 1
#include <nmmintrin.h>  // _mm_crc32_u64: the SSE4.2 instruction, enabled per function below
#endif

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The eight slice-by-8 tables for the reflected Castagnoli polynomial.
inline const std::array<std::array<std::uint32_t, 256>, 8>& crc32c_tables() noexcept {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (std::size_t i = 0; i < 256; ++i)
      for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    return t;
  }();
  return tables;
}

/// Software CRC32C on the raw (un-inverted) register value.
inline std::uint32_t crc32c_software(std::uint32_t crc, const unsigned char* p,
                                     std::size_t n) noexcept {
  const auto& t = crc32c_tables();
  while (n >= 8) {
    std::uint32_t lo = crc ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 |
                              std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24);
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
          t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

#ifdef HOLDFAST_CRC32C_X86
/// Bytes per stream in the three-way interleaved loop (the crc32 instruction has a latency of 3
/// and a throughput of 1, so three independent streams run about three times as fast).
inline constexpr std::size_t crc32c_block = 1024;

/// Tables that advance a raw CRC register over `zeros` zero bytes: shift(v) = T0[v & 0xFF] ^
/// T1[v >> 8 & 0xFF] ^ T2[v >> 16 & 0xFF] ^ T3[v >> 24] (the update is linear in the register).
struct crc32c_shift {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  std::uint32_t operator()(std::uint32_t v) const noexcept {
    return t[0][v & 0xFFu] ^ t[1][(v >> 8) & 0xFFu] ^ t[2][(v >> 16) & 0xFFu] ^ t[3][v >> 24];
  }
};

__attribute__((target("sse4.2"))) inline crc32c_shift crc32c_make_shift(std::size_t zeros) {
  crc32c_shift s;
  for (std::uint32_t k = 0; k < 4; ++k)
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint64_t c = std::uint64_t{b} << (8 * k);
      for (std::size_t i = 0; i < zeros / 8; ++i) c = _mm_crc32_u64(c, 0);
      s.t[k][b] = static_cast<std::uint32_t>(c);
    }
  return s;
}

/// Hardware CRC32C (SSE4.2) on the raw register value; only called when the CPU has it.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42(std::uint32_t crc,
                                                                    const unsigned char* p,
                                                                    std::size_t n) noexcept {
  std::uint64_t c = crc;
  if (n >= 3 * crc32c_block) {
    static const crc32c_shift by_one = crc32c_make_shift(crc32c_block);
    static const crc32c_shift by_two = crc32c_make_shift(2 * crc32c_block);
    while (n >= 3 * crc32c_block) {
      std::uint64_t c1 = 0, c2 = 0;
      for (std::size_t k = 0; k < crc32c_block; k += 8) {
        std::uint64_t w0, w1, w2;
        std::memcpy(&w0, p + k, 8);
        std::memcpy(&w1, p + crc32c_block + k, 8);
        std::memcpy(&w2, p + 2 * crc32c_block + k, 8);
        c = _mm_crc32_u64(c, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      c = by_two(static_cast<std::uint32_t>(c)) ^ by_one(static_cast<std::uint32_t>(c1)) ^
          static_cast<std::uint32_t>(c2);
      p += 3 * crc32c_block;
      n -= 3 * crc32c_block;
    }
  }
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

inline bool crc32c_has_sse42() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

/// Continues a CRC32C: `crc` is a previous result (0 to start), the result covers `data` too.
inline std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) noexcept {
  auto p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
#ifdef HOLDFAST_CRC32C_X86
  if (crc32c_has_sse42()) return ~crc32c_sse42(c, p, n);
#endif
  return ~crc32c_software(c, p, n);
}

/// The CRC32C of `n` bytes at `data`.
inline std::uint32_t crc32c(const void* data, std::size_t n) noexcept {
  return crc32c_extend(0, data, n);
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
