// holdfast/store.hpp — a run's artifact layout on a local disk or a remote mount, and a mirrored
// sync of a local output directory to it (Horovod's Store, without its weaknesses). Include this
// header for all of it; each part lives in store/:
//
//   store/url.hpp            store_scheme, store_url, parse_store_url, parse_hdfs_url,
//                            is_dbfs_path, normalize_dbfs_path, validate_run_id,
//                            validate_dataset_index
//   store/fs_helpers.hpp     detail::store_*: the file operations, each through the Io policy
//   store/sync_manifest.hpp  sync_manifest_name, sync_lock_name, sync_origin_name,
//                            sync_manifest(_entry), format_sync_manifest, parse_sync_manifest
//   store/filesystem.hpp     directory_commit, basic_local_filesystem, basic_mounted_remote,
//                            basic_filesystem_by_url (+ aliases), is_filesystem_policy_v,
//                            filesystem_policy, check_filesystem_policy
//   store/options.hpp        store_options, dataset, sync_options, sync_result
//   store/output_dir.hpp     basic_output_dir
//   store/basic_store.hpp    basic_store, store
//
//   holdfast::store_options o;
//   o.hdfs_mount = "/mnt/hdfs";                   // where the HDFS gateway is mounted
//   auto s = holdfast::store::create("hdfs://nn:8020/user/me/exp", o);
//   auto out = s.local_output_dir("run-7");  // a new scratch dir per process on a mount
//   ... write logs into out.path() ...
//   holdfast::sync_options so;
//   so.propagate_deletions = true;
//   auto r = s.sync("run-7", out.path(), so);     // r.copied, r.deleted, r.unchanged
//
// A preempted job's next attempt runs the same lines in a new process with a new, empty scratch
// directory: its syncs keep every file the earlier attempt uploaded, because sync's state lives
// at the destination, not in the process.
//
// Guarantees and caveats: see each part; sync's own are in store/basic_store.hpp. In short: URLs
// parse as Horovod's and bad names are refused before any path is made of them; every copy is
// published atomically; sync's state (the manifest) lives at the destination and is parsed
// strictly; deletions remove only what the syncing origin uploaded, never leave the run
// directory and never follow a symlink.
#pragma once

#include "store/basic_store.hpp"
#include "store/filesystem.hpp"
#include "store/fs_helpers.hpp"
#include "store/options.hpp"
#include "store/output_dir.hpp"
#include "store/sync_manifest.hpp"
#include "store/url.hpp"
