// holdfast/store.hpp — a run's artifact layout on a local disk or a remote mount, and a mirrored
// sync of a local output directory to it (Horovod's Store, without its weaknesses).
//
//   holdfast::store_options o;
//   o.hdfs_mount = "/mnt/hdfs";                   // where the HDFS gateway is mounted
//   auto s = holdfast::store::create("hdfs://nn:8020/user/me/exp", o);
//   auto out = s.local_output_dir("run-7");  // a scratch dir on a remote store, the run dir
//   locally
//   ... write logs into out.path() ...
//   holdfast::sync_options so;
//   so.propagate_deletions = true;
//   auto r = s.sync("run-7", out.path(), so);     // r.copied, r.deleted, r.unchanged
//
// Layout under the prefix:  runs/<run_id>/checkpoint/   (owned by checkpoint_manager)
//                           runs/<run_id>/logs/
//                           intermediate_{train,val,test}_data[.<idx>]
//
// Guarantees:
//   - URLs parse as Horovod's: file://, hdfs://[host[:port]]/path (host `default`, port 0 when
//     absent), dbfs:/x, /dbfs/x and file:///dbfs/x all name /dbfs/x. An unknown scheme, a run id
//     or dataset index with '/', "..", or NUL is a holdfast::error (EINVAL) naming it.
//   - sync() copies each changed file through atomic publishing (temp in the target directory,
//     then rename): a remote reader, or a copier killed at any point, never leaves a partial file
//     under a final name. Changes are detected by size, nanosecond mtime, inode and mode against
//     what this store object last copied, so two writes within one second are both mirrored. A
//     file modified within 20 ms of a sync's scan (two ticks of the coarse clock file times come
//     from) is copied again at the next sync, so a same-size rewrite in the same tick is not
//     missed either (git's "racily clean" rule).
//   - With propagate_deletions, files and directories gone locally are removed remotely (and
//     stale publish temps swept), so the remote matches the local tree exactly.
//   - The `checkpoint` directory of a run is left to checkpoint_manager: sync neither copies into
//     it nor deletes from it (sync_options::exclude).
//   - Intermediate data is removed only by reclaim_intermediate_data(); each dataset is first
//     renamed aside, so no reader sees a half-deleted dataset under its name.
//   - Filesystem policies: local_filesystem (rename commits, output written in place),
//     mounted_remote (commit markers, output staged locally and synced; durability
//     durable_tolerate_einval, since many mounts answer EINVAL to a directory fsync), and
//     filesystem_by_url, the default of `store`, which picks one of the two per URL.
// Caveats:
//   - The sync memory lives in the store object (copies of a store share it): the first sync of
//     a process copies every file.
//   - Symbolic links, FIFOs and sockets in the local tree are not copied (reported as skipped).
//   - hdfs:// is reached through a FUSE or NFS gateway mount (store_options::hdfs_mount); there
//     is no HDFS client. S3, GCS and other schemes are rejected.
//   - One process syncs a given run at a time.
//   - /dbfs/ paths count as a DBFS mount whether or not the process runs on Databricks (Horovod
//     looks at DATABRICKS_RUNTIME_VERSION); use basic_store<local_filesystem> to treat one as a
//     local path.
#pragma once

#include <dirent.h>    // DIR: directory scans through the Io policy
#include <fcntl.h>     // O_RDONLY: reading the local files
#include <sys/stat.h>  // struct stat: nanosecond mtimes

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv: TMPDIR for local output dirs
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "error.hpp"
#include "io.hpp"
#include "publish.hpp"

HOLDFAST_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// URLs
// ---------------------------------------------------------------------------------------------

/// The kind of location a store prefix names.
enum class store_scheme { local, hdfs, dbfs };

/// A parsed store prefix: where it lives and how to write its paths back as URLs.
struct store_url {
  store_scheme scheme = store_scheme::local;  ///< what the URL names
  std::string path;                           ///< the path on that filesystem ("/user/x")
  std::string url_prefix;  ///< prepended by full_path: "file://", "hdfs://nn:8020", "hdfs://"
  std::string host;        ///< HDFS name node; "default" when the URL names none
  std::uint16_t port = 0;  ///< HDFS port; 0 when the URL names none

  /// `p` (a path on this filesystem) as a URL: url_prefix + p (Horovod's get_full_path).
  std::string full_path(std::string_view p) const { return url_prefix + std::string(p); }
  /// `url` without this store's url_prefix (Horovod's get_localized_path).
  std::string localized_path(std::string_view url) const {
    if (!url_prefix.empty() && url.substr(0, url_prefix.size()) == url_prefix)
      url.remove_prefix(url_prefix.size());
    return std::string(url);
  }
};

namespace detail {
// Shows an id or URL in a message: NUL and control bytes become \xNN.
inline std::string store_printable(std::string_view s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] inline void store_bad_url(std::string_view url, const std::string& why) {
  throw error(EINVAL, "store url", store_printable(url), why);
}

inline bool store_starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// The scheme of "<scheme>://...", or empty when `url` does not start with one.
inline std::string_view store_url_scheme(std::string_view url) {
  auto colon = url.find("://");
  if (colon == std::string_view::npos || colon == 0) return {};
  auto is_alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (!is_alpha(url[0])) return {};
  for (std::size_t i = 1; i < colon; ++i) {
    char c = url[i];
    if (!is_alpha(c) && !(c >= '0' && c <= '9') && c != '+' && c != '-' && c != '.') return {};
  }
  return url.substr(0, colon);
}
}  // namespace detail

/// True for the DBFS spellings Horovod recognizes: "dbfs:/x" (not "dbfs://"), "/dbfs/x",
/// "file:///dbfs/x".
inline bool is_dbfs_path(std::string_view p) noexcept {
  using detail::store_starts_with;
  return (store_starts_with(p, "dbfs:/") && !store_starts_with(p, "dbfs://")) ||
         store_starts_with(p, "/dbfs/") || store_starts_with(p, "file:///dbfs/");
}

/// The FUSE path of a DBFS location: "dbfs:/x" and "file:///dbfs/x" become "/dbfs/x"; any other
/// string is returned unchanged.
inline std::string normalize_dbfs_path(std::string_view p) {
  using detail::store_starts_with;
  if (store_starts_with(p, "dbfs:/") && !store_starts_with(p, "dbfs://"))
    return "/dbfs" + std::string(p.substr(5));
  if (store_starts_with(p, "file:///dbfs/")) return std::string(p.substr(7));
  return std::string(p);
}

/// Parses an HDFS location as Horovod's HDFSStore does: "hdfs://host:port/path",
/// "hdfs:///path", "host:port/path" or "/path". Host defaults to "default", port to 0.
/// Throws holdfast::error (EINVAL) for another scheme, a bad port, or no path.
inline store_url parse_hdfs_url(std::string_view url) {
  if (url.find('\0') != std::string_view::npos) detail::store_bad_url(url, "contains NUL");
  store_url u;
  u.scheme = store_scheme::hdfs;
  std::string_view rest = url;
  auto scheme = detail::store_url_scheme(url);
  bool has_scheme = !scheme.empty();
  if (has_scheme) {
    if (scheme != "hdfs")
      detail::store_bad_url(url, "mismatched HDFS namespace: found '" + std::string(scheme) +
                                     "://', expected 'hdfs://'");
    rest.remove_prefix(scheme.size() + 3);
  }
  // [host][:port] up to the first '/'.
  auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  auto colon = authority.find(':');
  std::string_view host = authority.substr(0, colon);
  if (colon != std::string_view::npos) {
    std::string_view port = authority.substr(colon + 1);
    unsigned long value = 0;
    if (port.empty() || port.size() > 5) detail::store_bad_url(url, "bad port");
    for (char c : port) {
      if (c < '0' || c > '9') detail::store_bad_url(url, "bad port");
      value = value * 10 + static_cast<unsigned long>(c - '0');
    }
    if (value > 65535) detail::store_bad_url(url, "port out of range");
    u.port = static_cast<std::uint16_t>(value);
  }
  if (path.empty()) detail::store_bad_url(url, "failed to parse a path from the URL");
  u.host = host.empty() ? std::string("default") : std::string(host);
  u.path = std::string(path);
  // Horovod keeps the URL text before the path as the prefix when the URL had a scheme.
  u.url_prefix = has_scheme ? std::string(url.substr(0, url.size() - path.size())) : "hdfs://";
  return u;
}

/// Parses any store prefix and says what it names: hdfs:// (see parse_hdfs_url), the DBFS
/// spellings (normalized to /dbfs/...), file:// (absolute paths, or file://localhost/...), or a
/// plain path. Throws holdfast::error (EINVAL) naming the URL for an unknown scheme, a file://
/// URL with a remote host, an empty prefix, or NUL.
inline store_url parse_store_url(std::string_view url) {
  if (url.empty()) detail::store_bad_url(url, "empty store prefix");
  if (url.find('\0') != std::string_view::npos) detail::store_bad_url(url, "contains NUL");
  if (is_dbfs_path(url)) {
    store_url u;
    u.scheme = store_scheme::dbfs;
    u.path = normalize_dbfs_path(url);
    return u;
  }
  auto scheme = detail::store_url_scheme(url);
  if (scheme == "hdfs") return parse_hdfs_url(url);
  if (scheme == "file") {
    std::string_view rest = url.substr(7);
    if (detail::store_starts_with(rest, "localhost/")) rest.remove_prefix(9);
    if (rest.empty() || rest[0] != '/')
      detail::store_bad_url(url, "a file:// URL must name an absolute local path");
    store_url u;
    u.path = std::string(rest);
    u.url_prefix = "file://";
    return u;
  }
  if (!scheme.empty())
    detail::store_bad_url(url, "unknown URL scheme '" + detail::store_printable(scheme) +
                                   "://' (supported: file://, hdfs://, dbfs:/, /dbfs/, a path)");
  store_url u;
  u.path = std::string(url);
  return u;
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

namespace detail {
inline void store_check_name(std::string_view what, std::string_view name) {
  const char* why = nullptr;
  if (name.empty())
    why = "is empty";
  else if (name.find('\0') != std::string_view::npos)
    why = "contains NUL";
  else if (name.find('/') != std::string_view::npos)
    why = "contains the path separator '/'";
  else if (name.find("..") != std::string_view::npos)
    why = "contains '..'";
  else if (name == ".")
    why = "is '.'";
  if (why) throw error(EINVAL, std::string(what), store_printable(name), why);
}
}  // namespace detail

/// Checks a run id: non-empty, no '/', no "..", no NUL, not ".". Throws holdfast::error(EINVAL,
/// "run id", id) otherwise.
inline void validate_run_id(std::string_view run_id) { detail::store_check_name("run id", run_id); }

/// Checks a dataset index with the rules of validate_run_id.
inline void validate_dataset_index(std::string_view idx) {
  detail::store_check_name("dataset index", idx);
}

// ---------------------------------------------------------------------------------------------
// Filesystem helpers (every call through the Io policy)
// ---------------------------------------------------------------------------------------------

namespace detail {
inline std::string store_join(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

inline std::string store_parent(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// lstat: false when the path does not exist; throws on any other failure.
template <class Io>
bool store_lstat(const std::string& path, struct stat& st) {
  if (Io::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw error(errno, "lstat", path);
}

// The names in `dir` (without "." and ".."), sorted. A missing directory lists as empty.
template <class Io>
std::vector<std::string> store_list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = Io::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return names;
    throw error(errno, "opendir", dir);
  }
  for (;;) {
    errno = 0;
    struct dirent* e = Io::readdir(d);
    if (!e) {
      int err = errno;
      Io::closedir(d);
      if (err != 0) throw error(err, "readdir", dir);
      break;
    }
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// mkdir -p; returns the directories it created, outermost first.
template <class Io>
std::vector<std::string> store_make_dirs(const std::string& path, mode_t mode = 0755) {
  std::vector<std::string> created;
  if (path.empty()) return created;
  struct stat st {};
  if (Io::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return created;
    throw error(ENOTDIR, "mkdir", path);
  }
  if (errno != ENOENT) throw error(errno, "stat", path);
  std::string parent = store_parent(path);
  if (parent != path && parent != "." && parent != "/") created = store_make_dirs<Io>(parent, mode);
  if (Io::mkdir(path.c_str(), mode) != 0) {
    if (errno != EEXIST) throw error(errno, "mkdir", path);
  } else {
    created.push_back(path);
  }
  return created;
}

// rm -r: unlinks files, removes directories depth first. A missing path is not an error.
template <class Io>
void store_remove_tree(const std::string& path) {
  struct stat st {};
  if (!store_lstat<Io>(path, st)) return;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : store_list_dir<Io>(path)) store_remove_tree<Io>(store_join(path, name));
    if (Io::rmdir(path.c_str()) != 0 && errno != ENOENT) throw error(errno, "rmdir", path);
  } else if (Io::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw error(errno, "unlink", path);
  }
}

// A process-wide counter for unique scratch names (with the pid).
inline std::uint64_t store_next_serial() noexcept {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}

// Makes a directory's entries durable, as the Durability policy syncs a publish's parent.
template <class Durability, class Io>
void store_sync_dir(const std::string& dir) {
  if constexpr (Durability::sync_parent) {
    auto fd = open_file<Io>(dir, O_RDONLY | O_DIRECTORY);
    sync_dir_fd<Durability>(fd);
    fd.close();
  } else {
    (void)dir;
  }
}

inline std::int64_t store_mtime_ns(const struct stat& st) noexcept {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 +
         static_cast<std::int64_t>(st.st_mtim.tv_nsec);
}
}  // namespace detail

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

// ---------------------------------------------------------------------------------------------
// The store
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
  /// Remove remote files and directories that no longer exist locally.
  bool propagate_deletions = false;
  /// Top-level names under the run directory that sync neither writes nor deletes.
  std::vector<std::string> exclude{"checkpoint"};
  /// With propagate_deletions: publish temps at least this old are swept from the remote.
  std::chrono::seconds sweep_temps_older_than{600};
};

/// What a sync() did, as paths relative to the run directory, in walk order (depth first, names
/// sorted within each directory); `deleted` sorted.
struct sync_result {
  std::vector<std::string> copied;     ///< new or changed files published remotely
  std::vector<std::string> deleted;    ///< remote files and directories removed
  std::vector<std::string> unchanged;  ///< files whose size, mtime and inode had not changed
  std::vector<std::string> skipped;    ///< local entries that are not files or directories
};

/// A local output directory for a run; a scratch one is removed with everything in it when this
/// object is destroyed.
template <class Io = posix_io>
class basic_output_dir {
 public:
  basic_output_dir() = default;
  basic_output_dir(std::string path, bool scratch) : path_(std::move(path)), scratch_(scratch) {}
  basic_output_dir(basic_output_dir&& o) noexcept
      : path_(std::move(o.path_)), scratch_(std::exchange(o.scratch_, false)) {}
  basic_output_dir& operator=(basic_output_dir&& o) noexcept {
    if (this != &o) {
      cleanup();
      path_ = std::move(o.path_);
      scratch_ = std::exchange(o.scratch_, false);
    }
    return *this;
  }
  basic_output_dir(const basic_output_dir&) = delete;
  basic_output_dir& operator=(const basic_output_dir&) = delete;
  ~basic_output_dir() { cleanup(); }

  /// The directory to write into.
  const std::string& path() const noexcept { return path_; }
  /// True when it is a scratch directory (removed on destruction) rather than the run directory.
  bool is_scratch() const noexcept { return scratch_; }

 private:
  void cleanup() noexcept {
    if (!scratch_) return;
    scratch_ = false;
    try {
      detail::store_remove_tree<Io>(path_);
    } catch (...) {  // best effort: a destructor must not throw
    }
  }
  std::string path_;
  bool scratch_ = false;
};

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
        throw error(EINVAL, "store url", detail::store_printable(prefix),
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
  /// filesystem writes in place (it is created), else a fresh scratch directory removed when the
  /// returned object is destroyed (mirror it with sync()).
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
      if (io_type::mkdir(dir.c_str(), 0700) == 0) return output_dir(dir, true);
      if (errno != EEXIST) throw error(errno, "mkdir", dir);
    }
  }

  /// Mirrors `local_dir` into the run directory: new and changed files (size, nanosecond mtime,
  /// inode) are published atomically, others left alone; with options.propagate_deletions,
  /// remote entries missing locally are removed. Syncing the run directory onto itself copies
  /// nothing. Throws holdfast::error on failure; files published before it stay published.
  sync_result sync(std::string_view run_id, const std::string& local_dir,
                   const sync_options& options = {}) {
    std::string remote = run_path(run_id);
    sync_result result;
    make_dirs(remote);
    struct stat lst {};
    struct stat rst {};
    if (io_type::stat(local_dir.c_str(), &lst) != 0) throw error(errno, "stat", local_dir);
    if (!S_ISDIR(lst.st_mode)) throw error(ENOTDIR, "sync", local_dir);
    if (io_type::stat(remote.c_str(), &rst) != 0) throw error(errno, "stat", remote);

    // Racy-git's rule: a file whose mtime is within a clock tick of the scan may be written
    // again with the same mtime, so it is copied again at the next sync.
    const std::int64_t scan_start = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count();
    local_tree tree;
    {
      std::string path = local_dir, rel;
      scan_local(path, rel, options, tree, result);
    }
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto& memory = state_->synced[std::string(run_id) + '\0' + local_dir];
    if (lst.st_dev == rst.st_dev && lst.st_ino == rst.st_ino) {  // the run directory itself
      for (auto& f : tree.files) result.unchanged.push_back(std::move(f.first));
      return result;
    }
    if (options.propagate_deletions) {
      std::unordered_set<std::string_view> files, dirs;
      for (const auto& f : tree.files) files.insert(f.first);
      for (const auto& d : tree.dirs) dirs.insert(d);
      delete_extraneous(remote, std::string(), options, files, dirs, result);
      std::sort(result.deleted.begin(), result.deleted.end());
    }

    std::unordered_set<std::string> made;  // remote directories known to exist in this pass
    std::unique_ptr<char[]> buffer;
    std::size_t remembered = 0;  // memory entries of files present now
    std::string target, from;
    for (auto& [rel, sig] : tree.files) {
      auto known = memory.find(rel);
      if (known != memory.end()) {
        ++remembered;
        if (known->second == sig && !known->second.racy) {
          result.unchanged.push_back(std::move(rel));
          continue;
        }
      }
      target = detail::store_join(remote, rel);
      std::string parent = detail::store_parent(target);
      if (!made.count(parent)) {
        make_dirs(parent);
        made.insert(parent);
      }
      if (!buffer) buffer.reset(new char[copy_buffer_size]);
      from = detail::store_join(local_dir, rel);
      if (!copy_file(from, target, buffer.get())) {  // vanished locally since the scan
        if (known != memory.end()) {
          memory.erase(known);
          --remembered;
        }
        continue;
      }
      sig.racy = sig.mtime_ns + racy_window_ns > scan_start;
      if (known != memory.end()) {
        known->second = sig;
      } else {
        memory.emplace(rel, sig);
        ++remembered;
      }
      result.copied.push_back(std::move(rel));
    }
    if (remembered != memory.size()) {  // forget files gone locally: a re-created one is copied
      std::unordered_set<std::string_view> present(result.unchanged.begin(),
                                                   result.unchanged.end());
      present.insert(result.copied.begin(), result.copied.end());
      for (auto it = memory.begin(); it != memory.end();)
        it = present.count(it->first) ? std::next(it) : memory.erase(it);
    }
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

  // What identifies a version of a local file.
  struct signature {
    std::int64_t size;
    std::int64_t mtime_ns;
    std::uint64_t ino;
    mode_t mode;
    // Modified so close to the scan that a later write could share its mtime (file times come
    // from the kernel's coarse clock, one tick of 1-10 ms): never trusted as unchanged.
    bool racy = false;
    bool operator==(const signature& o) const noexcept {
      return size == o.size && mtime_ns == o.mtime_ns && ino == o.ino && mode == o.mode;
    }
  };
  struct local_tree {
    std::vector<std::pair<std::string, signature>> files;  // relative path, in walk order
    std::vector<std::string> dirs;                         // relative paths
  };
  struct shared_state {
    std::mutex mutex;
    // run id + NUL + local dir -> relative path -> what was copied
    std::map<std::string, std::unordered_map<std::string, signature>> synced;
  };

  basic_store(store_url url, std::string root, store_options options)
      : url_(std::move(url)),
        root_(std::move(root)),
        options_(std::move(options)),
        state_(std::make_shared<shared_state>()) {}

  void make_dirs(const std::string& path) const {
    auto created = detail::store_make_dirs<io_type>(path);
    if (!created.empty())
      detail::store_sync_dir<durability_type, io_type>(detail::store_parent(created[0]));
    for (const auto& dir : created)
      if (dir != created.back()) detail::store_sync_dir<durability_type, io_type>(dir);
  }

  static bool excluded(const std::string& rel, const sync_options& options) {
    return std::find(options.exclude.begin(), options.exclude.end(), rel) != options.exclude.end();
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
      if (rel_len == 0 && excluded(rel, options)) continue;
      path.resize(path_len);
      if (path_len && path.back() != '/') path += '/';
      path += name;
      struct stat st {};
      if (!detail::store_lstat<io_type>(path, st)) continue;  // removed since the listing
      if (S_ISDIR(st.st_mode)) {
        tree.dirs.push_back(rel);
        scan_local(path, rel, options, tree, result);
      } else if (S_ISREG(st.st_mode)) {
        tree.files.emplace_back(
            rel, signature{static_cast<std::int64_t>(st.st_size), detail::store_mtime_ns(st),
                           static_cast<std::uint64_t>(st.st_ino), st.st_mode});
      } else {
        result.skipped.push_back(rel);
      }
    }
    path.resize(path_len);
    rel.resize(rel_len);
  }

  // Removes remote entries under `rel_dir` that the local tree does not have.
  void delete_extraneous(const std::string& remote, const std::string& rel_dir,
                         const sync_options& options,
                         const std::unordered_set<std::string_view>& files,
                         const std::unordered_set<std::string_view>& dirs,
                         sync_result& result) const {
    std::string dir = rel_dir.empty() ? remote : detail::store_join(remote, rel_dir);
    sweep_stale_temps<io_type>(dir, options.sweep_temps_older_than);
    bool removed_any = false;
    for (const auto& name : detail::store_list_dir<io_type>(dir)) {
      std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
      if (rel_dir.empty() && excluded(rel, options)) continue;
      if (is_temp_name(name)) continue;  // a copier's temp, fresher than the sweep age
      std::string path = detail::store_join(remote, rel);
      struct stat st {};
      if (!detail::store_lstat<io_type>(path, st)) continue;
      if (S_ISDIR(st.st_mode) && dirs.count(rel)) {
        delete_extraneous(remote, rel, options, files, dirs, result);
        continue;
      }
      if (!S_ISDIR(st.st_mode) && files.count(rel)) continue;
      detail::store_remove_tree<io_type>(path);
      result.deleted.push_back(rel);
      removed_any = true;
    }
    if (removed_any) detail::store_sync_dir<durability_type, io_type>(dir);
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
  std::shared_ptr<shared_state> state_;  // shared by copies of this store
};

/// The default store: the filesystem chosen by the URL, POSIX syscalls, durable publishing.
using store = basic_store<>;

HOLDFAST_NAMESPACE_END
