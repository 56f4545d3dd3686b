// holdfast/store/options.hpp — what a store is created and synced with, and what a sync
// reports: store_options, sync_options, sync_result, and the dataset names.
//
// Guarantees:
//   - The defaults are the safe ones: sync_options deletes nothing (propagate_deletions false),
//     leaves the run's checkpoint directory to checkpoint_manager (exclude {"checkpoint"}), and
//     fails where the run directory cannot be locked (tolerate_no_lock false).
// Caveats:
//   - store_options::hdfs_mount is required for hdfs:// prefixes: there is no HDFS client.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Options and results
// ---------------------------------------------------------------------------------------------

/// Options of store::create.
struct store_options {
  /// Where hdfs:// paths are mounted locally (a FUSE or NFS gateway mount): hdfs://nn/user/x is
  /// read and written at <hdfs_mount>/user/x. Required for hdfs:// prefixes.
  std::string hdfs_mount;
  /// Where local_output_dir() makes scratch directories for remote stores; empty: $TMPDIR or
  /// /tmp.
  std::string local_temp_dir;
};

/// The three intermediate datasets.
enum class dataset { train, val, test };

/// Options of sync().
struct sync_options {
  /// Remove the remote files this local directory (its origin) uploaded and has since deleted,
  /// and the remote directories that leaves empty; never another origin's files.
  bool propagate_deletions = false;
  /// Top-level names under the run directory that sync neither writes nor deletes.
  std::vector<std::string> exclude{"checkpoint"};
  /// With propagate_deletions: publish temps at least this old are swept from the remote.
  std::chrono::seconds sweep_temps_older_than{600};
  /// Where the run directory's filesystem cannot lock (flock answers ENOLCK, EOPNOTSUPP or
  /// ENOSYS): false fails the sync with that error; true syncs without the lock, and concurrent
  /// syncs of the run may then lose each other's manifest entries (a file whose entry is lost is
  /// kept remotely: copied again, never deleted).
  bool tolerate_no_lock = false;
};

/// What a sync() did, as paths relative to the run directory, in walk order (depth first, names
/// sorted within each directory); `deleted` sorted.
struct sync_result {
  std::vector<std::string> copied;  ///< new or changed files published remotely
  /// remote files this origin had uploaded, and the directories that left empty, removed
  std::vector<std::string> deleted;
  /// files this origin copied before, unchanged since (size, mtime, inode, mode)
  std::vector<std::string> unchanged;
  std::vector<std::string> skipped;  ///< local entries that are not files or directories
};

HOLDFAST_NAMESPACE_END
