// holdfast/cache/format.hpp — the cache file formats: pfio_format (pfio's file, byte for byte)
// and checked_format (a header and a CRC32C per item), with the little-endian codec both use.
//
// A Format declares its layout (header_size, entry_size), what the file has (stores_length,
// checksummed, and optionally records_data_end, sealable: see cache/traits.hpp), its header
// codec (encode_header, decode_header) and its item checksum (item_crc). basic_file_cache reads
// only those declarations, so a user-written format gets the same treatment as these two.
//
// Guarantees:
//   - pfio_format files are byte-for-byte pfio's: no header, little-endian `Qq` entries
//     (offset, length), (0, -1) an empty slot, data from 16 * length on.
//   - checked_format's header carries a magic, a version and a CRC32C over its fixed part;
//     decode_header refuses anything else with corrupt_cache naming the file. Its item checksum
//     is salted with the slot number, so an entry pointing at another slot's item fails it.
//   - Every integer in either file is little-endian, whatever the host's byte order.
// Caveats:
//   - pfio_format stores no length: the reader must be told it (as with pfio).
//   - checked_format's state word and end of data change under the put lock and are not covered
//     by the header CRC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>  // memcpy, memcmp: the header codec
#include <string>

#include "../detail/crc32c.hpp"
#include "../error.hpp"  // corrupt_cache

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Formats.

namespace detail {

inline constexpr bool host_is_little_endian() noexcept {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return false;
#else
  return true;
#endif
}

/// Converts between host order and little-endian (the same function both ways).
inline std::uint64_t le64(std::uint64_t v) noexcept {
  return host_is_little_endian() ? v : __builtin_bswap64(v);
}
inline std::uint32_t le32(std::uint32_t v) noexcept {
  return host_is_little_endian() ? v : __builtin_bswap32(v);
}

/// Stores / loads a little-endian integer at an unaligned byte address.
inline void put_le64(char* p, std::uint64_t v) noexcept {
  v = le64(v);
  std::memcpy(p, &v, 8);
}
inline void put_le32(char* p, std::uint32_t v) noexcept {
  v = le32(v);
  std::memcpy(p, &v, 4);
}
inline std::uint64_t get_le64(const char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return le64(v);
}
inline std::uint32_t get_le32(const char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return le32(v);
}

}  // namespace detail

/// pfio's file, byte for byte: no header; entry i at 16 * i is (uint64 offset, int64 length),
/// little-endian; (0, -1) is an empty slot; data from 16 * length on.
struct pfio_format {
  /// The format's name (for tools and messages).
  static constexpr const char* name = "pfio";
  /// Bytes before the index.
  static constexpr std::size_t header_size = 0;
  /// Bytes per index entry.
  static constexpr std::size_t entry_size = 16;
  /// Whether the file records its own length.
  static constexpr bool stores_length = false;
  /// Whether items carry a checksum.
  static constexpr bool checksummed = false;
  /// Whether the header records the end of data (no: a put finds the end of the file).
  static constexpr bool records_data_end = false;
  /// Whether the header has a seal bit (no: preserve() freezes one object only).
  static constexpr bool sealable = false;
  /// The header bytes for a new file (none).
  static std::string encode_header(std::uint64_t) { return {}; }
  /// The length a header declares (pfio stores none: 0).
  static std::uint64_t decode_header(const char*, const std::string&) { return 0; }
  /// The checksum of an item (pfio has none: 0).
  static std::uint32_t item_crc(std::uint64_t, const void*, std::size_t) noexcept { return 0; }
};

/// holdfast's checked file: a 48-byte header, 24-byte entries (offset, length, CRC32C, 0), data.
///   header: "HFCACHE\n", u32 version (1), u32 flags (0), u64 length, u32 CRC32C of bytes 0-23,
///           u32 state (bit 0: sealed by preserve), u64 end of data, u64 zero. State and end of
///           data change under the put lock and are not covered by the CRC; the end of data
///           saves writers an lseek per put.
///   entry:  u64 offset, i64 length (-1 = empty), u32 CRC32C(le64(slot) + data), u32 zero.
struct checked_format {
  /// The format's name (for tools and messages).
  static constexpr const char* name = "checked";
  /// Bytes before the index.
  static constexpr std::size_t header_size = 48;
  /// Bytes per index entry.
  static constexpr std::size_t entry_size = 24;
  /// Whether the file records its own length.
  static constexpr bool stores_length = true;
  /// Whether items carry a checksum.
  static constexpr bool checksummed = true;
  /// Whether the header records the end of data (at end_offset).
  static constexpr bool records_data_end = true;
  /// Whether the header has a seal bit (`sealed` in the state word at state_offset).
  static constexpr bool sealable = true;
  /// The first 8 bytes of every checked file.
  static constexpr char magic[8] = {'H', 'F', 'C', 'A', 'C', 'H', 'E', '\n'};
  /// The format version this header writes and reads.
  static constexpr std::uint32_t version = 1;
  /// Offset of the state word (bit 0: sealed) inside the header.
  static constexpr std::size_t state_offset = 28;
  /// The state bit preserve() sets: puts from every process return false.
  static constexpr std::uint32_t sealed = 1;
  /// Offset of the end-of-data word inside the header.
  static constexpr std::size_t end_offset = 32;

  /// The header bytes for a new file of `length` slots (no data yet).
  static std::string encode_header(std::uint64_t length) {
    std::string h(header_size, '\0');
    std::memcpy(&h[0], magic, 8);
    detail::put_le32(&h[8], version);
    detail::put_le32(&h[12], 0);
    detail::put_le64(&h[16], length);
    detail::put_le32(&h[24], detail::crc32c(h.data(), 24));
    detail::put_le64(&h[end_offset], header_size + length * entry_size);
    return h;
  }
  /// Checks the header at `p` (header_size bytes) and returns its length; throws corrupt_cache.
  static std::uint64_t decode_header(const char* p, const std::string& path) {
    if (std::memcmp(p, magic, 8) != 0) throw corrupt_cache(path, 0, "bad magic: not a cache file");
    if (detail::get_le32(p + 24) != detail::crc32c(p, 24))
      throw corrupt_cache(path, 0, "header checksum mismatch");
    auto v = detail::get_le32(p + 8);
    if (v != version) throw corrupt_cache(path, 0, "unsupported version " + std::to_string(v));
    if (detail::get_le32(p + 12) != 0) throw corrupt_cache(path, 0, "unknown header flags");
    return detail::get_le64(p + 16);
  }
  /// CRC32C of the slot number (8 bytes, little-endian) followed by the item's bytes, so an
  /// entry pointing at another slot's item is caught too.
  static std::uint32_t item_crc(std::uint64_t slot, const void* data, std::size_t n) noexcept {
    char s[8];
    detail::put_le64(s, slot);
    return detail::crc32c_extend(detail::crc32c(s, 8), data, n);
  }
};

HOLDFAST_NAMESPACE_END
