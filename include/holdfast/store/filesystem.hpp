// holdfast/store/filesystem.hpp — the store's Filesystem policies: how a prefix commits a
// directory and where a run's output is written (basic_local_filesystem, basic_mounted_remote,
// basic_filesystem_by_url and their aliases), is_filesystem_policy_v, the filesystem_policy
// concept (C++20) and check_filesystem_policy.
//
// Guarantees:
//   - local_filesystem: rename commits, output written in place, durable publishing.
//   - mounted_remote: commit markers written last (rename may be copy + delete on a mount),
//     output staged in a local scratch directory and mirrored by sync(); durability
//     durable_tolerate_einval, since many mounts answer EINVAL to a directory fsync.
//   - filesystem_by_url, the default of `store`: a local path or file:// as local_filesystem,
//     hdfs:// and DBFS as mounted_remote.
//   - check_filesystem_policy's static_asserts name the first member a policy lacks.
// Caveats:
//   - filesystem_by_url treats every /dbfs/ path as a mount; use basic_store<local_filesystem>
//     to treat one as a local path.
#pragma once

#include "../detail/detect.hpp"
#include "../io.hpp"       // posix_io: the default syscalls
#include "../publish.hpp"  // durable, durable_tolerate_einval
#include "url.hpp"         // store_scheme

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Filesystem policies
// ---------------------------------------------------------------------------------------------

/// How a store commits a directory (a checkpoint): by one atomic rename of a staging directory,
/// or, where rename is copy + delete, by writing in place and publishing a commit marker last.
enum class directory_commit { rename, marker };

/// A local (or POSIX-faithful network) filesystem: rename is atomic, directories are published
/// by rename. Io: the syscall policy; Durability: the publishing durability (publish.hpp).
template <class Io = posix_io, class Durability = durable>
struct basic_local_filesystem {
  using io_type = Io;                  ///< the syscall policy
  using durability_type = Durability;  ///< file and directory syncs on publish
  /// The commit mode for a prefix of `scheme`: always rename.
  static constexpr directory_commit commit_for(store_scheme) noexcept {
    return directory_commit::rename;
  }
  /// Whether local_output_dir() is the run directory itself (true) or a scratch copy.
  static constexpr bool writes_in_place(store_scheme) noexcept { return true; }
};

/// A network or FUSE mount (gcsfuse, DBFS, an HDFS gateway) where rename may be copy + delete:
/// directories are committed with a marker written last; output is staged in a local temp dir
/// and mirrored by sync().
template <class Io = posix_io, class Durability = durable_tolerate_einval>
struct basic_mounted_remote {
  using io_type = Io;                  ///< the syscall policy
  using durability_type = Durability;  ///< file and directory syncs on publish
  /// The commit mode for a prefix of `scheme`: always a commit marker.
  static constexpr directory_commit commit_for(store_scheme) noexcept {
    return directory_commit::marker;
  }
  /// Output is written to a local scratch directory and mirrored by sync().
  static constexpr bool writes_in_place(store_scheme) noexcept { return false; }
};

/// Chooses by URL: a local path or file:// behaves as basic_local_filesystem, hdfs:// and DBFS
/// (mounts) as basic_mounted_remote. The default policy of `store`.
template <class Io = posix_io, class Durability = durable_tolerate_einval>
struct basic_filesystem_by_url {
  using io_type = Io;                  ///< the syscall policy
  using durability_type = Durability;  ///< file and directory syncs on publish
  /// rename for local prefixes, marker for mounts.
  static constexpr directory_commit commit_for(store_scheme s) noexcept {
    return s == store_scheme::local ? directory_commit::rename : directory_commit::marker;
  }
  /// In place for local prefixes, a scratch directory for mounts.
  static constexpr bool writes_in_place(store_scheme s) noexcept {
    return s == store_scheme::local;
  }
};

using local_filesystem = basic_local_filesystem<>;    ///< local disk, default syscalls
using mounted_remote = basic_mounted_remote<>;        ///< a remote mount, default syscalls
using filesystem_by_url = basic_filesystem_by_url<>;  ///< chosen per URL, default syscalls

namespace detail {
template <class T>
using fs_io = typename T::io_type;
template <class T>
using fs_durability = typename T::durability_type;
template <class T>
using fs_commit = decltype(T::commit_for(store_scheme::local));
template <class T>
using fs_in_place = decltype(T::writes_in_place(store_scheme::local));
}  // namespace detail

/// True when F has the members of a Filesystem policy (see basic_local_filesystem).
template <class F>
inline constexpr bool is_filesystem_policy_v =
    detail::detect<detail::fs_io, F>::value&& detail::detect<detail::fs_durability, F>::value&&
        detail::detect<detail::fs_commit, F>::value&& detail::detect<detail::fs_in_place, F>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_filesystem_policy_v.
template <class F>
concept filesystem_policy = is_filesystem_policy_v<F>;
#endif

/// Checks a Filesystem policy at compile time, naming the first missing member.
template <class F>
constexpr bool check_filesystem_policy() {
  using namespace detail;
  static_assert(detect<fs_io, F>::value,
                "holdfast: the Filesystem policy needs `using io_type = <an Io policy>;`");
  static_assert(detect<fs_durability, F>::value,
                "holdfast: the Filesystem policy needs `using durability_type = <durable, "
                "data_only or no_sync>;`");
  static_assert(detect<fs_commit, F>::value,
                "holdfast: the Filesystem policy needs `static directory_commit "
                "commit_for(store_scheme)`");
  static_assert(
      detect<fs_in_place, F>::value,
      "holdfast: the Filesystem policy needs `static bool writes_in_place(store_scheme)`");
  return true;
}

HOLDFAST_NAMESPACE_END
