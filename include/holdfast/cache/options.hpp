// holdfast/cache/options.hpp — the words a cache is opened and read with: the open tags
// (create_cache, attach_cache, preload_cache), cache_options, bad_slot_policy, and what reads
// return (cache_bytes, cache_entry).
//
// Guarantees:
//   - The tags are distinct types with explicit default constructors (as Boost.Interprocess's
//     create_only / open_only): `{}` never picks an open mode by accident.
//   - cache_bytes owns its bytes, is move-only and is never zero-filled first (the pread that
//     fills it writes every byte).
// Caveats:
//   - cache_options::reserve matters only with mmap_read; on_bad_slot only to preload.
#pragma once

#include <cstdint>
#include <memory>  // unique_ptr: cache_bytes
#include <string>
#include <string_view>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Tags: how a cache object gets its file.

/// Tag: create a new temp cache file in a directory (removed when the creating object dies, or
/// its process ends).
struct create_cache_t {
  explicit create_cache_t() = default;
};
/// Tag: open a live cache file created by another process, to put and get (exec'ed workers).
struct attach_cache_t {
  explicit attach_cache_t() = default;
};
/// Tag: open a preserved cache file read-only and frozen (read-only files and dirs work).
struct preload_cache_t {
  explicit preload_cache_t() = default;
};
/// Tag value for create_cache_t.
inline constexpr create_cache_t create_cache{};
/// Tag value for attach_cache_t.
inline constexpr attach_cache_t attach_cache{};
/// Tag value for preload_cache_t.
inline constexpr preload_cache_t preload_cache{};

// ---------------------------------------------------------------------------------------------
// Options, and what reads return.

/// What preload does with a slot whose entry or checksum is bad.
enum class bad_slot_policy {
  refuse,         ///< throw corrupt_cache naming the file and the first bad slot (the default)
  treat_as_empty  ///< read the slot as empty, count it in dropped_slots(); the file is unchanged
};

/// Options for creating, attaching to or preloading a cache.
struct cache_options {
  /// Directory for the temp file (create only); empty: $TMPDIR, else /tmp.
  std::string dir;
  /// Most bytes the file may hold, index included (0: no limit). A put past it freezes.
  std::uint64_t size_limit = 0;
  /// mmap_read: bytes of address space mapped at open, where this object's puts stop (0:
  /// size_limit, else 64 GiB). Items other processes put past it are mapped when first read.
  std::uint64_t reserve = 0;
  /// Preload only: what a bad entry or checksum does (attach always refuses).
  bad_slot_policy on_bad_slot = bad_slot_policy::refuse;
};

/// The owned bytes a pread_read get returns: allocated without zero-filling (the pread fills
/// them), move-only, viewable as std::string_view.
class cache_bytes {
 public:
  cache_bytes() noexcept = default;
  /// `n` uninitialized bytes.
  explicit cache_bytes(std::size_t n) : p_(n ? new char[n] : nullptr), n_(n) {}
  /// The bytes.
  char* data() noexcept { return p_.get(); }
  /// The bytes.
  const char* data() const noexcept { return p_.get(); }
  /// How many bytes.
  std::size_t size() const noexcept { return n_; }
  /// True for zero bytes.
  bool empty() const noexcept { return n_ == 0; }
  /// Iteration over the bytes.
  const char* begin() const noexcept { return p_.get(); }
  /// Iteration over the bytes.
  const char* end() const noexcept { return p_.get() + n_; }
  /// A view of the bytes.
  operator std::string_view() const noexcept { return {p_.get(), n_}; }
  /// A copy as std::string.
  std::string str() const { return std::string(p_.get(), n_); }
  /// Byte-wise equality with anything viewable as std::string_view.
  friend bool operator==(const cache_bytes& a, std::string_view b) noexcept {
    return std::string_view(a) == b;
  }
  friend bool operator==(std::string_view a, const cache_bytes& b) noexcept { return b == a; }
  friend bool operator!=(const cache_bytes& a, std::string_view b) noexcept { return !(a == b); }
  friend bool operator!=(std::string_view a, const cache_bytes& b) noexcept { return !(b == a); }

 private:
  std::unique_ptr<char[]> p_;
  std::size_t n_ = 0;
};

/// Where a filled slot's item lies in the file.
struct cache_entry {
  std::uint64_t offset;  ///< absolute file offset of the first byte
  std::uint64_t size;    ///< bytes
};

HOLDFAST_NAMESPACE_END
