// holdfast/publish/durability.hpp — the Durability policies: what a publisher (and every
// component that publishes through it) syncs, and how a directory fsync's EINVAL is taken.
//
// Guarantees:
//   - `durable` (fsync file + fsync directory; a directory fsync answering EINVAL is an
//     error), `durable_tolerate_einval` (the same, but EINVAL from the directory fsync — some
//     NFS and FUSE filesystems — is accepted: the rename is then as durable as that filesystem
//     makes it), `data_only` (fdatasync of the file only: survives a crash of the process, and
//     a power loss once the directory entry reaches disk), `no_sync` (atomic for concurrent
//     readers only).
//   - A custom policy states all three members (`file`, `sync_parent`, `on_directory_einval`);
//     is_durability_policy_v (and, in C++20, the durability_policy concept) checks them, and
//     check_durability_policy's static_assert names the one missing.
//   - detail::sync_per and detail::sync_dir_fd are the only places a policy is applied to a
//     descriptor; EINTR is retried.
#pragma once

#include <cerrno>

#include "../detail/detect.hpp"  // detect: the policy's members
#include "../error.hpp"
#include "../io.hpp"  // basic_fd: the descriptors synced

HOLDFAST_NAMESPACE_BEGIN

/// How a publisher syncs the temp file before renaming it.
enum class file_sync {
  none,  ///< no sync of the file
  data,  ///< fdatasync: the data and the metadata needed to read it (size)
  full   ///< fsync: data and all metadata
};

/// What a Durability policy does when the directory fsync answers EINVAL.
enum class directory_einval {
  fail,   ///< an error: the publish is rolled back and holdfast::error(EINVAL, "fsync") thrown
  accept  ///< counts as done: the filesystem gives no stronger guarantee for the rename
};

/// Default Durability: fsync the file, fsync the parent directory; EINVAL from it is an error.
struct durable {
  static constexpr file_sync file = file_sync::full;  ///< fsync the temp before the rename
  static constexpr bool sync_parent = true;           ///< fsync the directory after the rename
  /// EINVAL from the directory fsync is an error.
  static constexpr directory_einval on_directory_einval = directory_einval::fail;
};

/// As durable, but a directory fsync answering EINVAL (some NFS/FUSE mounts) counts as done.
struct durable_tolerate_einval {
  static constexpr file_sync file = file_sync::full;  ///< fsync the temp before the rename
  static constexpr bool sync_parent = true;           ///< fsync the directory after the rename
  /// EINVAL from the directory fsync counts as done (the documented NFS/FUSE choice).
  static constexpr directory_einval on_directory_einval = directory_einval::accept;
};

/// fdatasync of the file only; the rename itself is not synced.
struct data_only {
  static constexpr file_sync file = file_sync::data;  ///< fdatasync the temp
  static constexpr bool sync_parent = false;          ///< the rename is not synced
  /// Unused (no directory sync); stated because every policy must state it.
  static constexpr directory_einval on_directory_einval = directory_einval::fail;
};

/// No sync at all: atomic for concurrent readers, not for power loss.
struct no_sync {
  static constexpr file_sync file = file_sync::none;  ///< no file sync
  static constexpr bool sync_parent = false;          ///< no directory sync
  /// Unused (no directory sync); stated because every policy must state it.
  static constexpr directory_einval on_directory_einval = directory_einval::fail;
};

namespace detail {

template <class T>
using dur_file = decltype(T::file);
template <class T>
using dur_parent = decltype(T::sync_parent);
template <class T>
using dur_einval = decltype(T::on_directory_einval);

/// Checks a Durability policy, naming the missing member.
template <class D>
constexpr bool check_durability_policy() {
  static_assert(detect<dur_file, D>::value,
                "holdfast: a Durability policy needs static constexpr file_sync file");
  static_assert(detect<dur_parent, D>::value,
                "holdfast: a Durability policy needs static constexpr bool sync_parent");
  static_assert(detect<dur_einval, D>::value,
                "holdfast: a Durability policy needs static constexpr directory_einval "
                "on_directory_einval (what an EINVAL directory fsync means must be a choice)");
  return true;
}

/// True when D states file, sync_parent and on_directory_einval.
template <class D>
inline constexpr bool is_durability_policy_v =
    detect<dur_file, D>::value&& detect<dur_parent, D>::value&& detect<dur_einval, D>::value;

/// Syncs an open file per the Durability policy.
template <class D, class Io>
void sync_per(const basic_fd<Io>& fd) {
  if constexpr (D::file == file_sync::full) {
    sync_file(fd);
  } else if constexpr (D::file == file_sync::data) {
    datasync_file(fd);
  } else {
    (void)fd;
  }
}

/// fsync of an open directory per the policy's EINVAL choice.
template <class D, class Io>
void sync_dir_fd(const basic_fd<Io>& dir) {
  while (Io::fsync(dir.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL && D::on_directory_einval == directory_einval::accept) return;
    throw error(errno, "fsync", dir.path(), "directory sync");
  }
}

}  // namespace detail

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of the Durability policy check.
template <class D>
concept durability_policy = detail::is_durability_policy_v<D>;
#endif

HOLDFAST_NAMESPACE_END
