// holdfast/store/basic_store.hpp — basic_store (and `store`), a run's artifact layout under a
// prefix on a local disk or a remote mount, and a mirrored sync of a local output directory to
// it (Horovod's Store, without its weaknesses).
//
// Layout under the prefix:  runs/<run_id>/checkpoint/   (owned by checkpoint_manager)
//                           runs/<run_id>/logs/
//                           runs/<run_id>/.holdfast-sync-manifest[.lock]   (sync's state)
//                           intermediate_{train,val,test}_data[.<idx>]
//
// Guarantees:
//   - Run ids and dataset indexes are checked (store/url.hpp) before any path is made of them.
//   - sync() copies each changed file through atomic publishing (temp in the target directory,
//     then rename): a remote reader, or a copier killed at any point, never leaves a partial file
//     under a final name.
//   - Sync's state is kept at the destination, in the run directory's manifest
//     `.holdfast-sync-manifest` (a versioned line-based text format, see sync_manifest; published
//     atomically at the end of each sync that changed it). Per file it records the origin that
//     uploaded it — the id of a local directory, 32 random hex digits in
//     `<local dir>/.holdfast-origin`, made once with the directory (origin_of) and never copied —
//     and that file's size, nanosecond mtime, inode and mode. So the memory survives restarts:
//     a file is copied when it is new or changed since its origin last copied it (two writes
//     within one second are both mirrored), and a new process syncing the same local directory
//     copies nothing unchanged. A file modified within 20 ms of a sync's scan (two ticks of the
//     coarse clock file times come from) is copied again at the next sync, so a same-size
//     rewrite in the same tick is not missed either (git's "racily clean" rule).
//   - With propagate_deletions, a sync removes exactly the files its own origin uploaded and has
//     since deleted locally, then the remote directories above them left empty that do not exist
//     locally, and sweeps stale publish temps. Files uploaded by other origins (an earlier
//     attempt's directory, another worker's) and files no manifest lists are never deleted: a
//     new attempt's empty directory deletes nothing. Deletions never leave the run directory:
//     every name is resolved relative to an open directory without following a symlink.
//   - A remote without a manifest (written by holdfast 0.1, which kept none, or by hand) is
//     adopted: the first sync deletes nothing there and records only what it copies.
//   - A malformed manifest or origin file is a holdfast::format_error naming the file and line,
//     thrown before anything is copied or deleted; removing the manifest recovers (adoption).
//   - Syncs of one run are serialized by an flock on `<run>/.holdfast-sync-manifest.lock`, held
//     from reading the manifest to publishing it: concurrent syncs of several origins (threads,
//     processes, hosts on a filesystem whose flock reaches the server, as NFS) lose no entries.
//   - A local directory inside the run directory, or one containing it, is refused
//     (holdfast::error EINVAL naming both): a sync would delete its own source, or copy the
//     mirror into itself. Syncing the run directory onto itself copies nothing.
//   - The `checkpoint` directory of a run is left to checkpoint_manager: sync neither copies into
//     it nor deletes from it (sync_options::exclude).
//   - Intermediate data is removed only by reclaim_intermediate_data(); each dataset is first
//     renamed aside, so no reader sees a half-deleted dataset under its name. Tree removal never
//     follows a symlink, even one swapped in mid-removal (publish.hpp's remove_tree).
// Caveats:
//   - The remote is not an exact mirror of one local directory (as 0.1 promised): it holds the
//     union of what every origin uploaded and has not deleted, plus files no manifest lists.
//     Remove a file another origin uploaded by syncing from that origin's directory, or by hand.
//   - The origin file identifies a directory: a copy of a local directory made with its
//     `.holdfast-origin` is the same origin, and deletions from either propagate. Remove the file
//     from a copy that should be a new origin. The first sync of a directory writes that file
//     into it (the directory must be writable).
//   - The lock is held for the whole sync, copies included: a second sync of the same run waits.
//   - Where the run directory's filesystem cannot flock (ENOLCK, EOPNOTSUPP, ENOSYS) sync fails
//     unless sync_options::tolerate_no_lock; concurrent syncs may then lose each other's
//     entries, which only costs copies (a file whose entry is lost is kept, never deleted).
//     FUSE mounts without lock support lock within one host only.
//   - Each sync reads and (when something changed) rewrites the whole manifest: one line per
//     file.
//   - Symbolic links, FIFOs and sockets in the local tree are not copied (reported as skipped).
#pragma once

#include <fcntl.h>     // O_RDONLY: reading the local files
#include <sys/stat.h>  // struct stat: nanosecond mtimes

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv: TMPDIR for local output dirs
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../io.hpp"
#include "../publish.hpp"     // basic_publisher: every copy is published atomically
#include "filesystem.hpp"     // the Filesystem policies
#include "fs_helpers.hpp"     // detail::store_*: the file operations
#include "options.hpp"        // store_options, sync_options, sync_result, dataset
#include "output_dir.hpp"     // basic_output_dir: what local_output_dir() returns
#include "sync_manifest.hpp"  // the mirror's state
#include "url.hpp"            // parse_store_url, validate_run_id

HOLDFAST_NAMESPACE_BEGIN

/// A run layout under a prefix, on the filesystem chosen by the Filesystem policy.
template <class Filesystem = filesystem_by_url>
class basic_store {
  static_assert(check_filesystem_policy<Filesystem>());

 public:
  using filesystem_type = Filesystem;                                ///< the policy
  using io_type = typename Filesystem::io_type;                      ///< its syscall policy
  using durability_type = typename Filesystem::durability_type;      ///< its publishing durability
  using publisher_type = basic_publisher<durability_type, io_type>;  ///< how files are published
  using output_dir = basic_output_dir<io_type>;  ///< what local_output_dir() returns

  /// Parses `prefix` (see parse_store_url) and lays the store out under it. Nothing is created
  /// until a run directory is used.
  static basic_store create(std::string_view prefix, store_options options = {}) {
    store_url url = parse_store_url(prefix);
    std::string root = url.path;
    if (url.scheme == store_scheme::hdfs) {
      if (options.hdfs_mount.empty())
        throw error(EINVAL, "store url", std::string(prefix),
                    "hdfs:// needs store_options::hdfs_mount, the local mount point of the HDFS "
                    "FUSE or NFS gateway");
      root = options.hdfs_mount;
      while (root.size() > 1 && root.back() == '/') root.pop_back();
      root += url.path;
    }
    return basic_store(std::move(url), std::move(root), std::move(options));
  }

  /// The parsed prefix.
  const store_url& url() const noexcept { return url_; }
  /// The prefix as a local path (for hdfs://, under the mount).
  const std::string& prefix_path() const noexcept { return root_; }
  /// How this store commits checkpoint directories.
  directory_commit commit_mode() const noexcept { return Filesystem::commit_for(url_.scheme); }

  /// <prefix>/runs
  std::string runs_path() const { return detail::store_join(root_, "runs"); }
  /// <prefix>/runs/<run_id>; throws for an invalid run id.
  std::string run_path(std::string_view run_id) const {
    validate_run_id(run_id);
    return detail::store_join(runs_path(), run_id);
  }
  /// <prefix>/runs/<run_id>/checkpoint (a directory of checkpoints; see checkpoint.hpp)
  std::string checkpoint_path(std::string_view run_id) const {
    return detail::store_join(run_path(run_id), checkpoint_dirname());
  }
  /// <prefix>/runs/<run_id>/logs
  std::string logs_path(std::string_view run_id) const {
    return detail::store_join(run_path(run_id), logs_dirname());
  }
  /// "checkpoint"
  static constexpr std::string_view checkpoint_dirname() noexcept { return "checkpoint"; }
  /// "logs"
  static constexpr std::string_view logs_dirname() noexcept { return "logs"; }

  /// <prefix>/intermediate_<kind>_data
  std::string data_path(dataset kind) const {
    return detail::store_join(root_, dataset_basename(kind));
  }
  /// <prefix>/intermediate_<kind>_data.<idx>; throws for an invalid index.
  std::string data_path(dataset kind, std::string_view idx) const {
    validate_dataset_index(idx);
    return data_path(kind) + "." + std::string(idx);
  }
  /// <prefix>/intermediate_train_data
  std::string train_data_path() const { return data_path(dataset::train); }
  /// <prefix>/intermediate_train_data.<idx>
  std::string train_data_path(std::string_view idx) const { return data_path(dataset::train, idx); }
  /// <prefix>/intermediate_train_data.<idx> for an integral index
  template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
  std::string train_data_path(Int idx) const {
    return train_data_path(std::string_view(std::to_string(idx)));
  }
  /// <prefix>/intermediate_val_data
  std::string val_data_path() const { return data_path(dataset::val); }
  /// <prefix>/intermediate_val_data.<idx>
  std::string val_data_path(std::string_view idx) const { return data_path(dataset::val, idx); }
  /// <prefix>/intermediate_val_data.<idx> for an integral index
  template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
  std::string val_data_path(Int idx) const {
    return val_data_path(std::string_view(std::to_string(idx)));
  }
  /// <prefix>/intermediate_test_data
  std::string test_data_path() const { return data_path(dataset::test); }
  /// <prefix>/intermediate_test_data.<idx>
  std::string test_data_path(std::string_view idx) const { return data_path(dataset::test, idx); }
  /// <prefix>/intermediate_test_data.<idx> for an integral index
  template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
  std::string test_data_path(Int idx) const {
    return test_data_path(std::string_view(std::to_string(idx)));
  }

  /// "intermediate_train_data", "intermediate_val_data" or "intermediate_test_data".
  static std::string dataset_basename(dataset kind) {
    switch (kind) {
      case dataset::train:
        return "intermediate_train_data";
      case dataset::val:
        return "intermediate_val_data";
      case dataset::test:
        return "intermediate_test_data";
    }
    return "intermediate_unknown_data";
  }

  /// A local directory to write the run's output into: the run directory itself when the
  /// filesystem writes in place (it is created), else a fresh scratch directory, made with its
  /// origin id (origin_of), removed when the returned object is destroyed (mirror it with
  /// sync()).
  output_dir local_output_dir(std::string_view run_id) const {
    std::string run = run_path(run_id);
    if (Filesystem::writes_in_place(url_.scheme)) {
      make_dirs(run);
      return output_dir(run, false);
    }
    std::string base = options_.local_temp_dir;
    if (base.empty()) {
      const char* env = std::getenv("TMPDIR");
      base = env && *env ? env : "/tmp";
    }
    for (;;) {
      std::string dir = detail::store_join(base, "holdfast-run-" + std::string(run_id) + "-" +
                                                     std::to_string(io_type::getpid()) + "-" +
                                                     std::to_string(detail::store_next_serial()));
      if (io_type::mkdir(dir.c_str(), 0700) == 0) {
        output_dir out(dir, true);  // removed again if the origin cannot be made
        origin_of(dir);
        return out;
      }
      if (errno != EEXIST) throw error(errno, "mkdir", dir);
    }
  }

  /// The origin id of `local_dir` (32 lowercase hex digits, random): read from
  /// `<local_dir>/.holdfast-origin`, which is made once (publish_once, so concurrent callers
  /// agree) when absent. sync() records it for every file it uploads from that directory.
  /// Throws holdfast::format_error naming the file and line for a malformed origin file.
  std::string origin_of(const std::string& local_dir) const {
    std::string path = detail::store_join(local_dir, sync_origin_name);
    if (auto id = read_origin(path)) return *id;
    std::string id = detail::new_origin_id(static_cast<std::uint64_t>(io_type::getpid()));
    if (publisher_type().publish_once(path, std::string(origin_magic) + id + "\n", 0644)) return id;
    if (auto winner = read_origin(path)) return *winner;  // another process made it first
    throw error(ENOENT, "open", path, "the origin file vanished after it was made");
  }

  /// Mirrors `local_dir` into the run directory, keeping the mirror's state in the run's
  /// manifest (see the header): new and changed files are published atomically, files this
  /// origin copied before and has not changed are left alone; with options.propagate_deletions,
  /// files this origin uploaded and has since deleted locally are removed remotely, and nothing
  /// else is. Syncing the run directory onto itself copies nothing. Throws holdfast::error on
  /// failure (EINVAL for a local directory nested in the run directory or around it, or a path
  /// with NUL; format_error for a malformed manifest or origin file, before anything changed);
  /// files published before a failure stay published and are recorded.
  sync_result sync(std::string_view run_id, const std::string& local_dir,
                   const sync_options& options = {}) {
    if (local_dir.find('\0') != std::string::npos)
      throw error(EINVAL, "sync", local_dir, "the local directory's path contains NUL");
    // Racy-git's rule: a file whose mtime is within a clock tick of the scan may be written
    // again with the same mtime, so it is copied again at the next sync. Taken before anything
    // that may take time (making the origin file syncs it), so an early reading only errs
    // towards copying again.
    const std::int64_t scan_start = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count();
    std::string remote = run_path(run_id);
    sync_result result;
    struct stat lst {};
    if (io_type::stat(local_dir.c_str(), &lst) != 0) throw error(errno, "stat", local_dir);
    if (!S_ISDIR(lst.st_mode)) throw error(ENOTDIR, "sync", local_dir);
    const bool itself = refuse_nested(local_dir, lst, remote);
    make_dirs(remote);
    const std::string origin = itself ? std::string() : origin_of(local_dir);

    local_tree tree;
    {
      std::string path = local_dir, rel;
      scan_local(path, rel, options, tree, result);
    }
    if (itself) {  // the run directory itself (a local store's output dir)
      for (auto& f : tree.files) result.unchanged.push_back(std::move(f.first));
      return result;
    }

    auto lock = lock_run(remote, options);
    const std::string manifest_path = detail::store_join(remote, sync_manifest_name);
    sync_manifest manifest = read_manifest(manifest_path);
    bool dirty = false;  // the manifest changed and must be published
    try {
      if (options.propagate_deletions) {
        delete_owned(remote, origin, tree, options, manifest, result, dirty);
        sweep_remote(remote, std::string(), options);
      }
      copy_changed(remote, local_dir, origin, scan_start, tree, manifest, result, dirty);
    } catch (...) {
      // Record what was done before the failure (best effort: the first error is the one
      // reported); an unrecorded copy is only copied again.
      if (dirty) {
        try {
          publish_manifest(manifest_path, manifest);
        } catch (...) {
        }
      }
      throw;
    }
    if (dirty) publish_manifest(manifest_path, manifest);
    return result;
  }

  /// Removes intermediate datasets (all three, or one kind) with every indexed variant, and
  /// returns the paths removed. Never called implicitly. Each is renamed aside first, so readers
  /// see a dataset whole or not at all.
  std::vector<std::string> reclaim_intermediate_data(std::optional<dataset> kind = std::nullopt) {
    std::vector<std::string> removed;
    for (const auto& name : detail::store_list_dir<io_type>(root_)) {
      for (dataset k : {dataset::train, dataset::val, dataset::test}) {
        if (kind && *kind != k) continue;
        std::string base = dataset_basename(k);
        if (name != base &&
            !(detail::store_starts_with(name, base + ".") && name.size() > base.size() + 1))
          continue;
        std::string path = detail::store_join(root_, name);
        std::string aside = detail::store_join(
            root_, ".holdfast-reclaim-" + name + "-" + std::to_string(io_type::getpid()) + "-" +
                       std::to_string(detail::store_next_serial()));
        if (io_type::rename(path.c_str(), aside.c_str()) != 0) {
          if (errno == ENOENT) continue;
          throw error(errno, "rename", path);
        }
        detail::store_remove_tree<io_type>(aside);
        removed.push_back(path);
      }
    }
    return removed;
  }

 private:
  static constexpr std::size_t copy_buffer_size = std::size_t{1} << 20;
  // Two ticks of the slowest kernel clock (HZ=100) for file times.
  static constexpr std::int64_t racy_window_ns = 20'000'000;
  // The first line of an origin file.
  static constexpr std::string_view origin_magic = "holdfast-origin 1\n";

  struct local_tree {
    // relative path -> the local version (origin empty), in walk order
    std::vector<std::pair<std::string, sync_manifest_entry>> files;
    std::vector<std::string> dirs;  // relative paths
  };

  basic_store(store_url url, std::string root, store_options options)
      : url_(std::move(url)), root_(std::move(root)), options_(std::move(options)) {}

  void make_dirs(const std::string& path) const {
    auto created = detail::store_make_dirs<io_type>(path);
    if (!created.empty())
      detail::store_sync_dir<durability_type, io_type>(detail::parent_directory(created[0]));
    for (const auto& dir : created)
      if (dir != created.back()) detail::store_sync_dir<durability_type, io_type>(dir);
  }

  static bool excluded(const std::string& rel, const sync_options& options) {
    return std::find(options.exclude.begin(), options.exclude.end(), rel) != options.exclude.end();
  }
  static bool reserved(std::string_view top) {
    return top == sync_manifest_name || top == sync_lock_name || top == sync_origin_name;
  }
  static std::string_view top_name(std::string_view rel) { return rel.substr(0, rel.find('/')); }

  // "holdfast-origin 1\n<32 hex>\n", or nullopt when the file does not exist.
  static std::optional<std::string> read_origin(const std::string& path) {
    auto fd = open_file_if_exists<io_type>(path, O_RDONLY | O_NOFOLLOW);
    if (!fd) return std::nullopt;
    std::string text = read_all(fd);
    fd.close();
    if (!detail::store_starts_with(text, origin_magic))
      throw format_error(path, "line 1: expected 'holdfast-origin 1'");
    std::string_view id = std::string_view(text).substr(origin_magic.size());
    if (id.size() != detail::origin_id_length + 1 || id.back() != '\n' ||
        !detail::is_origin_id(id.substr(0, detail::origin_id_length)))
      throw format_error(path, "line 2: expected an origin id (32 lowercase hex digits)");
    return std::string(id.substr(0, detail::origin_id_length));
  }

  // Refuses a local directory inside the run directory (a deletion there would remove the
  // source) and a run directory inside the local one, or to be made inside it (each sync would
  // copy the mirror into itself); true when the local directory is the run directory itself.
  static bool refuse_nested(const std::string& local, const struct stat& lst,
                            const std::string& remote) {
    std::string existing = remote;  // the run directory, or its nearest existing ancestor
    struct stat est {};
    while (io_type::stat(existing.c_str(), &est) != 0) {
      if (errno != ENOENT) throw error(errno, "stat", existing);
      std::string up = detail::parent_directory(existing);
      if (up == existing) return false;
      existing = std::move(up);
    }
    if (existing == remote) {
      if (est.st_dev == lst.st_dev && est.st_ino == lst.st_ino) return true;
      if (is_within(local, lst, est))
        throw error(EINVAL, "sync", local,
                    "the local directory lies inside the run directory '" + remote + "'");
    }
    if (is_within(existing, est, lst))
      throw error(EINVAL, "sync", local,
                  "the run directory '" + remote + "' lies inside the local directory");
    return false;
  }

  // True when `path` (whose stat is `st`) is the directory `outer` or lies below it: compares
  // device and inode while walking ".." up to the root.
  static bool is_within(const std::string& path, struct stat st, const struct stat& outer) {
    std::string p = path;
    for (int depth = 0; depth < 1024; ++depth) {
      if (st.st_dev == outer.st_dev && st.st_ino == outer.st_ino) return true;
      p += "/..";
      struct stat up {};
      if (io_type::stat(p.c_str(), &up) != 0) throw error(errno, "stat", p);
      if (up.st_dev == st.st_dev && up.st_ino == st.st_ino) return false;  // the root
      st = up;
    }
    return false;
  }

  // Takes the run's sync lock (flock on <run>/.holdfast-sync-manifest.lock), held until the
  // returned descriptor is closed.
  static basic_fd<io_type> lock_run(const std::string& remote, const sync_options& options) {
    std::string path = detail::store_join(remote, sync_lock_name);
    auto fd = open_file<io_type>(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644);
    while (io_type::flock(fd.get(), LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      if (options.tolerate_no_lock && (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS))
        break;
      throw error(errno, "flock", path, "the run's sync lock");
    }
    return fd;
  }

  static sync_manifest read_manifest(const std::string& path) {
    auto fd = open_file_if_exists<io_type>(path, O_RDONLY | O_NOFOLLOW);
    if (!fd) return {};  // no manifest yet: a new run, or one written by an older holdfast
    std::string text = read_all(fd);
    fd.close();
    return parse_sync_manifest(text, path);
  }

  void publish_manifest(const std::string& path, const sync_manifest& m) const {
    publisher_type().publish(path, format_sync_manifest(m), 0644);
  }

  // Walks `path` (a buffer holding the directory; restored on return) depth first, names sorted
  // within each directory; `rel` holds the path relative to the local root.
  void scan_local(std::string& path, std::string& rel, const sync_options& options,
                  local_tree& tree, sync_result& result) const {
    const std::size_t path_len = path.size(), rel_len = rel.size();
    for (const auto& name : detail::store_list_dir<io_type>(path)) {
      rel.resize(rel_len);
      if (rel_len) rel += '/';
      rel += name;
      if (rel_len == 0 && (excluded(rel, options) || reserved(rel))) continue;
      path.resize(path_len);
      if (path_len && path.back() != '/') path += '/';
      path += name;
      struct stat st {};
      if (!detail::store_lstat<io_type>(path, st)) continue;  // removed since the listing
      if (S_ISDIR(st.st_mode)) {
        tree.dirs.push_back(rel);
        scan_local(path, rel, options, tree, result);
      } else if (S_ISREG(st.st_mode)) {
        sync_manifest_entry e;
        e.size = static_cast<std::int64_t>(st.st_size);
        e.mtime_ns = detail::store_mtime_ns(st);
        e.ino = static_cast<std::uint64_t>(st.st_ino);
        e.mode = static_cast<std::uint32_t>(st.st_mode);
        tree.files.emplace_back(rel, std::move(e));
      } else {
        result.skipped.push_back(rel);
      }
    }
    path.resize(path_len);
    rel.resize(rel_len);
  }

  // The directory `rel_dir` under the run directory, opened without following a symlink at any
  // component (openat O_NOFOLLOW|O_DIRECTORY from the run directory); empty when a component is
  // missing, not a directory, or a symlink.
  static basic_fd<io_type> open_under(const std::string& remote, const std::string& rel_dir) {
    auto fd = open_file<io_type>(remote, O_RDONLY | O_DIRECTORY);
    std::size_t start = 0;
    while (start < rel_dir.size()) {
      std::size_t slash = std::min(rel_dir.find('/', start), rel_dir.size());
      std::string part = rel_dir.substr(start, slash - start);
      std::string shown = detail::store_join(remote, rel_dir.substr(0, slash));
      int sub = io_type::openat(fd.get(), part.c_str(),
                                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
      if (sub < 0) {
        if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return {};
        throw error(errno, "openat", shown);
      }
      basic_fd<io_type> next(sub, shown);
      fd.close();
      fd = std::move(next);
      start = slash + 1;
    }
    return fd;
  }

  // Unlinks `name` in the open directory `dir` (never a directory, never through a symlink);
  // false when there was nothing to unlink.
  static bool unlink_in(const basic_fd<io_type>& dir, const std::string& name, int flags,
                        const std::string& shown) {
    if (io_type::unlinkat(dir.get(), name.c_str(), flags) == 0) return true;
    int e = errno;
    // gone; a directory where the file was (not what this origin uploaded); not empty
    if (e == ENOENT || e == ENOTDIR || e == EISDIR || e == ENOTEMPTY || e == EEXIST) return false;
    throw error(e, "unlinkat", shown);
  }

  // With propagate_deletions: removes the files this origin uploaded that are gone locally
  // (only those: the files of other origins and files no manifest lists are kept), then the
  // directories above them that are empty and do not exist locally. Their entries leave the
  // manifest only once all of that is done, so a failed sync's retry finishes it.
  void delete_owned(const std::string& remote, const std::string& origin, const local_tree& tree,
                    const sync_options& options, sync_manifest& manifest, sync_result& result,
                    bool& dirty) const {
    std::unordered_set<std::string_view> present, local_dirs(tree.dirs.begin(), tree.dirs.end());
    for (const auto& f : tree.files) present.insert(f.first);
    std::map<std::string, std::vector<std::string>> by_dir;  // parent -> files to delete
    std::set<std::string> above;                             // their ancestor directories
    for (const auto& [rel, e] : manifest.files) {
      if (e.origin != origin || present.count(rel)) continue;
      if (excluded(std::string(top_name(rel)), options)) continue;
      auto slash = rel.rfind('/');
      std::string dir = slash == std::string::npos ? std::string() : rel.substr(0, slash);
      by_dir[dir].push_back(rel);
      for (std::string d = dir; !d.empty();) {
        above.insert(d);
        auto up = d.rfind('/');
        d = up == std::string::npos ? std::string() : d.substr(0, up);
      }
    }
    if (by_dir.empty()) return;
    for (const auto& [dir, rels] : by_dir) {
      auto fd = open_under(remote, dir);
      if (!fd) continue;  // gone, or a symlink now: nothing of this origin's to remove there
      bool removed = false;
      for (const auto& rel : rels) {
        std::string leaf = rel.substr(dir.empty() ? 0 : dir.size() + 1);
        if (unlink_in(fd, leaf, 0, detail::store_join(remote, rel))) {
          result.deleted.push_back(rel);
          removed = true;
        }
      }
      if constexpr (durability_type::sync_parent) {
        if (removed) detail::sync_dir_fd<durability_type>(fd);
      }
      fd.close();
    }
    // Deepest first, so a parent is tried after its children.
    std::vector<std::string> dirs(above.begin(), above.end());
    std::stable_sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) {
      return std::count(a.begin(), a.end(), '/') > std::count(b.begin(), b.end(), '/');
    });
    for (const auto& d : dirs) {
      if (local_dirs.count(d)) continue;
      auto slash = d.rfind('/');
      auto fd = open_under(remote, slash == std::string::npos ? std::string() : d.substr(0, slash));
      if (!fd) continue;
      std::string leaf = slash == std::string::npos ? d : d.substr(slash + 1);
      if (unlink_in(fd, leaf, AT_REMOVEDIR, detail::store_join(remote, d))) {
        result.deleted.push_back(d);
        if constexpr (durability_type::sync_parent) detail::sync_dir_fd<durability_type>(fd);
      }
      fd.close();
    }
    for (const auto& [dir, rels] : by_dir)
      for (const auto& rel : rels) manifest.files.erase(rel);
    dirty = true;
    std::sort(result.deleted.begin(), result.deleted.end());
  }

  // With propagate_deletions: sweeps stale publish temps (a killed copier's) from the run's
  // directories, except excluded ones; symlinks are not entered.
  void sweep_remote(const std::string& dir, const std::string& rel_dir,
                    const sync_options& options) const {
    sweep_stale_temps<io_type>(dir, options.sweep_temps_older_than);
    for (const auto& name : detail::store_list_dir<io_type>(dir)) {
      if (rel_dir.empty() && (excluded(name, options) || reserved(name))) continue;
      if (is_temp_name(name)) continue;
      std::string path = detail::store_join(dir, name);
      struct stat st {};
      if (detail::store_lstat<io_type>(path, st) && S_ISDIR(st.st_mode))
        sweep_remote(path, rel_dir.empty() ? name : rel_dir + "/" + name, options);
    }
  }

  // Publishes the files that are new or changed since this origin last copied them (or that
  // another origin, or no manifest, recorded), recording each in the manifest.
  void copy_changed(const std::string& remote, const std::string& local_dir,
                    const std::string& origin, std::int64_t scan_start, local_tree& tree,
                    sync_manifest& manifest, sync_result& result, bool& dirty) const {
    std::unordered_set<std::string> made;  // remote directories known to exist in this pass
    std::unique_ptr<char[]> buffer;
    std::string target, from;
    for (auto& [rel, local] : tree.files) {
      auto known = manifest.files.find(rel);
      if (known != manifest.files.end() && known->second.origin == origin &&
          same_version(known->second, local) && !known->second.racy) {
        result.unchanged.push_back(std::move(rel));
        continue;
      }
      target = detail::store_join(remote, rel);
      std::string parent = detail::parent_directory(target);
      if (!made.count(parent)) {
        make_dirs(parent);
        made.insert(parent);
      }
      if (!buffer) buffer.reset(new char[copy_buffer_size]);
      from = detail::store_join(local_dir, rel);
      if (!copy_file(from, target, buffer.get())) continue;  // vanished locally since the scan
      local.origin = origin;
      local.racy = local.mtime_ns + racy_window_ns > scan_start;
      manifest.files[rel] = local;
      dirty = true;
      result.copied.push_back(std::move(rel));
    }
  }

  static bool same_version(const sync_manifest_entry& a, const sync_manifest_entry& b) noexcept {
    return a.size == b.size && a.mtime_ns == b.mtime_ns && a.ino == b.ino && a.mode == b.mode;
  }

  // Publishes a copy of `from` at `to`; false when `from` no longer exists.
  bool copy_file(const std::string& from, const std::string& to, char* buffer) const {
    auto in = open_file_if_exists<io_type>(from, O_RDONLY);
    if (!in) return false;
    struct stat st = stat_fd(in);
    publisher_type().publish_with(
        to,
        [&](const basic_fd<io_type>& out) {
          for (;;) {
            std::size_t got = read_full(in, buffer, copy_buffer_size);
            if (got > 0) write_all(out, buffer, got);
            if (got < copy_buffer_size) break;
          }
        },
        st.st_mode & 07777);
    return true;
  }

  store_url url_;
  std::string root_;
  store_options options_;
};

/// The default store: the filesystem chosen by the URL, POSIX syscalls, durable publishing.
using store = basic_store<>;

HOLDFAST_NAMESPACE_END
