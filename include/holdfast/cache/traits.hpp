// holdfast/cache/traits.hpp — what makes a type a cache Read, Lock, Sync or Format policy, and
// what a Format says it has: is_cache_*_policy_v (C++17), the cache_*_policy concepts (C++20),
// cache_format_records_data_end_v, cache_format_sealable_v, and check_cache_policies, whose
// static_asserts name the first member missing.
//
// Guarantees:
//   - A Format opts into the header features basic_file_cache offers by declaring them:
//       `static constexpr bool records_data_end = true` with `static constexpr std::size_t
//       end_offset`: the header keeps the end of data (a little-endian u64 at end_offset); puts
//       append there instead of asking the file's end (one lseek less each), and attach and
//       preload check it lies between the index and the end of the file;
//       `static constexpr bool sealable = true` with `static constexpr std::size_t state_offset`
//       and `static constexpr std::uint32_t sealed`: the header has a little-endian u32 state
//       word whose `sealed` bit preserve() sets, after which puts from every process return false.
//     A format that declares neither has neither (as before these traits existed).
//   - check_cache_policies refuses a format that declares a feature without its offset, or whose
//     word is misaligned or outside the header (the words are read and written atomically).
// Caveats:
//   - The traits check what a policy declares, not what it does: a format's header codec is
//     trusted to write the words it declares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>  // declval: the member probes

#include "../detail/detect.hpp"
#include "../io.hpp"  // basic_fd, posix_io: the Lock and Sync probes

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Policy checks.

namespace detail {
template <class T>
using cache_read_maps_data = decltype(bool{T::maps_data});
template <class T>
using cache_lock_interprocess = decltype(bool{T::interprocess});
template <class T>
using cache_lock_lock = decltype(std::declval<T&>().template lock<posix_io>(
    std::declval<basic_fd<posix_io>&>(), std::declval<const std::string&>()));
template <class T>
using cache_lock_unlock =
    decltype(std::declval<T&>().template unlock<posix_io>(std::declval<basic_fd<posix_io>&>()));
template <class T>
using cache_sync_data =
    decltype(T::template after_data<posix_io>(std::declval<const basic_fd<posix_io>&>()));
template <class T>
using cache_sync_entry =
    decltype(T::template after_entry<posix_io>(std::declval<const basic_fd<posix_io>&>()));
template <class T>
using cache_format_sizes = decltype(std::size_t{T::header_size} + std::size_t{T::entry_size});
template <class T>
using cache_format_flags = decltype(bool{T::stores_length} && bool{T::checksummed});
template <class T>
using cache_format_encode = decltype(std::string{T::encode_header(std::uint64_t{})});
template <class T>
using cache_format_decode = decltype(std::uint64_t{
    T::decode_header(nullptr, std::declval<const std::string&>())});
template <class T>
using cache_format_crc = decltype(std::uint32_t{T::item_crc(std::uint64_t{}, nullptr, 0)});
template <class T>
using cache_format_end_word = decltype(std::size_t{T::end_offset});
template <class T>
using cache_format_state_word = decltype(std::size_t{T::state_offset} + std::uint32_t{T::sealed});

/// T::records_data_end when T declares it, else false.
template <class T, class = void>
struct declared_records_data_end : std::false_type {};
template <class T>
struct declared_records_data_end<T, std::void_t<decltype(bool{T::records_data_end})>>
    : std::bool_constant<T::records_data_end> {};
/// T::sealable when T declares it, else false.
template <class T, class = void>
struct declared_sealable : std::false_type {};
template <class T>
struct declared_sealable<T, std::void_t<decltype(bool{T::sealable})>>
    : std::bool_constant<T::sealable> {};
}  // namespace detail

/// True when cache Format F declares `records_data_end = true`: its header keeps the end of data
/// at `end_offset` (see the top of this header).
template <class F>
inline constexpr bool cache_format_records_data_end_v = detail::declared_records_data_end<F>::value;
/// True when cache Format F declares `sealable = true`: its header's state word at
/// `state_offset` has a `sealed` bit that preserve() sets for every process.
template <class F>
inline constexpr bool cache_format_sealable_v = detail::declared_sealable<F>::value;

/// True when T is a cache Read policy (has `static constexpr bool maps_data`).
template <class T>
inline constexpr bool is_cache_read_policy_v =
    detail::detect<detail::cache_read_maps_data, T>::value;
/// True when T is a cache Lock policy (`interprocess`, `lock<Io>(fd, path)`, `unlock<Io>(fd)`).
template <class T>
inline constexpr bool is_cache_lock_policy_v =
    detail::detect<detail::cache_lock_interprocess, T>::value&& detail::detect<
        detail::cache_lock_lock, T>::value&& detail::detect<detail::cache_lock_unlock, T>::value;
/// True when T is a cache Sync policy (`after_data<Io>(fd)`, `after_entry<Io>(fd)`).
template <class T>
inline constexpr bool is_cache_sync_policy_v = detail::detect<detail::cache_sync_data, T>::value&&
    detail::detect<detail::cache_sync_entry, T>::value;
/// True when T is a cache Format policy (sizes, flags, header codec, item checksum, and the
/// header words of the features it declares).
template <class T>
inline constexpr bool is_cache_format_policy_v =
    detail::detect<detail::cache_format_sizes, T>::value&&
        detail::detect<detail::cache_format_flags, T>::value&&
            detail::detect<detail::cache_format_encode, T>::value&&
                detail::detect<detail::cache_format_decode, T>::value&&
                    detail::detect<detail::cache_format_crc, T>::value &&
    (!cache_format_records_data_end_v<T> ||
     detail::detect<detail::cache_format_end_word, T>::value) &&
    (!cache_format_sealable_v<T> || detail::detect<detail::cache_format_state_word, T>::value);

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_cache_read_policy_v.
template <class T>
concept cache_read_policy = is_cache_read_policy_v<T>;
/// C++20 spelling of is_cache_lock_policy_v.
template <class T>
concept cache_lock_policy = is_cache_lock_policy_v<T>;
/// C++20 spelling of is_cache_sync_policy_v.
template <class T>
concept cache_sync_policy = is_cache_sync_policy_v<T>;
/// C++20 spelling of is_cache_format_policy_v.
template <class T>
concept cache_format_policy = is_cache_format_policy_v<T>;
#endif

/// Checks the cache policies at compile time, naming the first missing member.
template <class Read, class Lock, class Sync, class Format>
constexpr bool check_cache_policies() {
  using namespace detail;
  static_assert(detect<cache_read_maps_data, Read>::value,
                "holdfast: the cache Read policy needs static constexpr bool maps_data "
                "(use mmap_read or pread_read)");
  static_assert(detect<cache_lock_interprocess, Lock>::value,
                "holdfast: the cache Lock policy needs static constexpr bool interprocess");
  static_assert(detect<cache_lock_lock, Lock>::value,
                "holdfast: the cache Lock policy needs template <class Io> void lock(basic_fd<Io>& "
                "lock_fd, const std::string& path)");
  static_assert(
      detect<cache_lock_unlock, Lock>::value,
      "holdfast: the cache Lock policy needs template <class Io> void unlock(basic_fd<Io>& "
      "lock_fd) noexcept");
  static_assert(detect<cache_sync_data, Sync>::value,
                "holdfast: the cache Sync policy needs template <class Io> static void "
                "after_data(const basic_fd<Io>&)");
  static_assert(detect<cache_sync_entry, Sync>::value,
                "holdfast: the cache Sync policy needs template <class Io> static void "
                "after_entry(const basic_fd<Io>&)");
  static_assert(detect<cache_format_sizes, Format>::value,
                "holdfast: the cache Format policy needs static constexpr std::size_t "
                "header_size and entry_size");
  static_assert(detect<cache_format_flags, Format>::value,
                "holdfast: the cache Format policy needs static constexpr bool stores_length and "
                "checksummed");
  static_assert(detect<cache_format_encode, Format>::value,
                "holdfast: the cache Format policy needs static std::string "
                "encode_header(uint64_t length)");
  static_assert(detect<cache_format_decode, Format>::value,
                "holdfast: the cache Format policy needs static uint64_t decode_header(const "
                "char*, const std::string& path)");
  static_assert(detect<cache_format_crc, Format>::value,
                "holdfast: the cache Format policy needs static uint32_t item_crc(uint64_t slot, "
                "const void*, size_t)");
  static_assert(
      !cache_format_records_data_end_v<Format> || detect<cache_format_end_word, Format>::value,
      "holdfast: a cache Format with records_data_end = true needs static constexpr "
      "std::size_t end_offset (where its header keeps the end of data)");
  static_assert(!cache_format_sealable_v<Format> || detect<cache_format_state_word, Format>::value,
                "holdfast: a cache Format with sealable = true needs static constexpr std::size_t "
                "state_offset and static constexpr std::uint32_t sealed (its header's state word "
                "and seal bit)");
  if constexpr (cache_format_records_data_end_v<Format> &&
                detect<cache_format_end_word, Format>::value) {
    static_assert(Format::end_offset % 8 == 0 && Format::end_offset + 8 <= Format::header_size,
                  "holdfast: a cache Format's end_offset must name an 8-byte aligned word inside "
                  "its header");
  }
  if constexpr (cache_format_sealable_v<Format> && detect<cache_format_state_word, Format>::value) {
    static_assert(Format::state_offset % 4 == 0 && Format::state_offset + 4 <= Format::header_size,
                  "holdfast: a cache Format's state_offset must name a 4-byte aligned word inside "
                  "its header");
    static_assert(Format::sealed != 0, "holdfast: a cache Format's sealed bit must not be 0");
  }
  return true;
}

HOLDFAST_NAMESPACE_END
