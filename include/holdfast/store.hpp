// holdfast/store.hpp — a run's artifact layout on a local disk or a remote mount, and a mirrored
// sync of a local output directory to it (Horovod's Store, without its weaknesses).
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
// Layout under the prefix:  runs/<run_id>/checkpoint/   (owned by checkpoint_manager)
//                           runs/<run_id>/logs/
//                           runs/<run_id>/.holdfast-sync-manifest[.lock]   (sync's state)
//                           intermediate_{train,val,test}_data[.<idx>]
//
// Guarantees:
//   - URLs parse as Horovod's: file://, hdfs://[host[:port]]/path (host `default`, port 0 when
//     absent), dbfs:/x, /dbfs/x and file:///dbfs/x all name /dbfs/x. An unknown scheme, a run id
//     or dataset index with '/', "..", or NUL is a holdfast::error (EINVAL) naming it.
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
//   - Filesystem policies: local_filesystem (rename commits, output written in place),
//     mounted_remote (commit markers, output staged locally and synced; durability
//     durable_tolerate_einval, since many mounts answer EINVAL to a directory fsync), and
//     filesystem_by_url, the default of `store`, which picks one of the two per URL.
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
//   - hdfs:// is reached through a FUSE or NFS gateway mount (store_options::hdfs_mount); there
//     is no HDFS client. S3, GCS and other schemes are rejected.
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
#include <charconv>  // to_chars: the manifest's numbers
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv: TMPDIR for local output dirs
#include <map>
#include <memory>
#include <optional>
#include <random>  // random_device: origin ids
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "detail/ascii.hpp"  // printable, hex_digit: the manifest's escapes
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
[[noreturn]] inline void store_bad_url(std::string_view url, const std::string& why) {
  throw error(EINVAL, "store url", printable(url), why);
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
    detail::store_bad_url(url, "unknown URL scheme '" + detail::printable(scheme) +
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
  if (why) throw error(EINVAL, std::string(what), printable(name), why);
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

// rm -r without following any symlink (publish.hpp's remove_tree: every name below `path` is
// resolved relative to an open directory). A missing path is not an error.
template <class Io>
void store_remove_tree(const std::string& path) {
  remove_tree<Io>(path);
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
// The sync manifest: the mirror's state, kept at the destination
// ---------------------------------------------------------------------------------------------

/// The manifest of a run's mirror, in the run directory (format below; see sync()).
inline constexpr std::string_view sync_manifest_name = ".holdfast-sync-manifest";
/// The lock file syncs of one run take (flock) from reading the manifest to publishing it.
inline constexpr std::string_view sync_lock_name = ".holdfast-sync-manifest.lock";
/// The file in a local directory that holds its origin id (made once, never copied).
inline constexpr std::string_view sync_origin_name = ".holdfast-origin";

/// One file of a sync manifest: the origin that uploaded it and the local version it copied.
struct sync_manifest_entry {
  std::string origin;         ///< origin id of the local directory (32 lowercase hex digits)
  std::int64_t size = 0;      ///< local size when copied
  std::int64_t mtime_ns = 0;  ///< local mtime when copied, nanoseconds since the epoch
  std::uint64_t ino = 0;      ///< local inode when copied
  std::uint32_t mode = 0;     ///< local st_mode when copied (type and permission bits)
  bool racy = false;          ///< modified within 20 ms of that sync's scan: copied again next
  bool operator==(const sync_manifest_entry& o) const noexcept {
    return origin == o.origin && size == o.size && mtime_ns == o.mtime_ns && ino == o.ino &&
           mode == o.mode && racy == o.racy;
  }
  bool operator!=(const sync_manifest_entry& o) const noexcept { return !(*this == o); }
};

/// A run's sync manifest: relative path -> entry. Format version 1, line-based text:
///
///     holdfast-sync-manifest 1
///     file <origin> <size> <mtime_ns> <ino> <mode, octal> <flags: - or r> <path>
///     ...
///     end <number of file lines>
///
/// Every line ends with a newline; fields are separated by one space; the path (relative to the
/// run directory, '/'-separated, no empty, "." or ".." component, not one of sync's own names)
/// is the rest of the line, with a backslash written as two backslashes, a newline as backslash
/// n, and other control bytes as backslash x and two lowercase hex digits. Files are written in
/// path order (read in any order, each once); the end line makes truncation detectable. Origin
/// ids are 32 lowercase hex digits; size, mtime (may be negative), inode are decimal.
struct sync_manifest {
  std::map<std::string, sync_manifest_entry> files;  ///< relative path -> entry
};

namespace detail {
inline constexpr std::string_view manifest_magic = "holdfast-sync-manifest";
inline constexpr unsigned manifest_version = 1;
inline constexpr std::size_t origin_id_length = 32;

inline bool is_origin_id(std::string_view s) noexcept {
  if (s.size() != origin_id_length) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A fresh origin id: 128 random bits as 32 lowercase hex digits (mixed with the clock and the
// pid, in case random_device is weak or fails).
inline std::string new_origin_id(std::uint64_t pid) {
  auto mix = [](std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  };
  auto t = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  auto s = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::uint64_t parts[2] = {mix(t ^ (pid << 40)), mix(s + store_next_serial())};
  try {
    std::random_device rd;
    for (auto& p : parts) p ^= (std::uint64_t{rd()} << 32) ^ std::uint64_t{rd()};
  } catch (const std::exception&) {  // no entropy source: the clock, pid and counter remain
  }
  static const char hex[] = "0123456789abcdef";
  std::string id(origin_id_length, '0');
  for (std::size_t i = 0; i < origin_id_length; ++i)
    id[i] = hex[(parts[i / 16] >> (60 - 4 * (i % 16))) & 15];
  return id;
}

inline std::string manifest_escape(std::string_view path) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

// Why `rel` cannot name a file under a run directory, or nullptr when it can.
inline const char* manifest_path_problem(std::string_view rel) noexcept {
  if (rel.empty()) return "empty path";
  if (rel.find('\0') != std::string_view::npos) return "NUL in the path";
  if (rel.front() == '/') return "absolute path";
  std::size_t start = 0;
  for (;;) {
    std::size_t slash = rel.find('/', start);
    std::string_view part = rel.substr(start, slash - start);
    if (part.empty()) return "empty path component";
    if (part == "." || part == "..") return "'.' or '..' path component";
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  std::string_view top = rel.substr(0, rel.find('/'));
  if (top == sync_manifest_name || top == sync_lock_name || top == sync_origin_name)
    return "a name sync reserves";
  return nullptr;
}

// Parses the manifest's unsigned decimal (or octal) field; false on anything else.
inline bool manifest_number(std::string_view s, unsigned base, std::uint64_t& out) noexcept {
  if (s.empty() || s.size() > 20) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c >= static_cast<char>('0' + base)) return false;
    auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (~std::uint64_t{0} - d) / base) return false;
    v = v * base + d;
  }
  out = v;
  return true;
}

[[noreturn]] inline void manifest_fail(const std::string& path, std::size_t line,
                                       const std::string& why) {
  throw format_error(path, "line " + std::to_string(line) + ": " + why);
}

inline bool manifest_signed(std::string_view s, std::int64_t& out) noexcept {
  bool neg = !s.empty() && s.front() == '-';
  if (neg) s.remove_prefix(1);
  std::uint64_t v = 0;
  if (!manifest_number(s, 10, v)) return false;
  if (v > static_cast<std::uint64_t>(INT64_MAX) + (neg ? 1 : 0)) return false;
  out = neg ? static_cast<std::int64_t>(0 - v) : static_cast<std::int64_t>(v);
  return true;
}
}  // namespace detail

/// The text of `m` in format version 1.
inline std::string format_sync_manifest(const sync_manifest& m) {
  std::string out;
  out.reserve(40 + m.files.size() * 112);
  out += detail::manifest_magic;
  out += ' ';
  out += std::to_string(detail::manifest_version);
  out += '\n';
  char num[24];
  auto append = [&](auto value, int base) {
    auto r = std::to_chars(num, num + sizeof num, value, base);
    out.append(num, r.ptr);
  };
  for (const auto& [path, e] : m.files) {
    out += "file ";
    out += e.origin;
    out += ' ';
    append(e.size, 10);
    out += ' ';
    append(e.mtime_ns, 10);
    out += ' ';
    append(e.ino, 10);
    out += ' ';
    append(e.mode, 8);
    out += e.racy ? " r " : " - ";
    out += detail::manifest_escape(path);
    out += '\n';
  }
  out += "end ";
  append(m.files.size(), 10);
  out += '\n';
  return out;
}

/// Parses manifest text strictly. Throws holdfast::format_error naming `path` (the file, for
/// the message) and the line: a wrong first line, a newer version, a malformed or duplicate
/// entry, a path that could leave the run directory, or a missing end line (truncation).
inline sync_manifest parse_sync_manifest(std::string_view text, const std::string& path) {
  sync_manifest m;
  std::size_t line_no = 0, pos = 0, count = 0;
  bool ended = false;
  auto fail = [&](const std::string& why) { detail::manifest_fail(path, line_no, why); };
  while (pos < text.size()) {
    ++line_no;
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos)
      detail::manifest_fail(path, line_no, "truncated: the last line has no newline");
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (ended) fail("text after the end line");
    if (line_no == 1) {
      std::string_view magic = line.substr(0, line.find(' '));
      if (magic != detail::manifest_magic)
        fail("not a holdfast sync manifest (expected '" + std::string(detail::manifest_magic) +
             " 1')");
      std::uint64_t format_version = 0;
      if (line.size() <= magic.size() + 1 ||
          !detail::manifest_number(line.substr(magic.size() + 1), 10, format_version))
        fail("bad format version");
      if (format_version != detail::manifest_version)
        fail("format version " + std::to_string(format_version) + " (this holdfast reads version " +
             std::to_string(detail::manifest_version) + ")");
      continue;
    }
    if (detail::store_starts_with(line, "end ")) {
      std::uint64_t n = 0;
      if (!detail::manifest_number(line.substr(4), 10, n)) fail("bad end line");
      if (n != count)
        fail("the end line counts " + std::to_string(n) + " files, the manifest lists " +
             std::to_string(count));
      ended = true;
      continue;
    }
    if (!detail::store_starts_with(line, "file ")) fail("expected 'file' or 'end'");
    // file <origin> <size> <mtime_ns> <ino> <mode> <flags> <path>
    std::string_view f[6];
    std::string_view rest = line.substr(5);
    for (auto& field : f) {
      std::size_t sp = rest.find(' ');
      if (sp == std::string_view::npos) fail("too few fields in a file line");
      field = rest.substr(0, sp);
      rest.remove_prefix(sp + 1);
    }
    sync_manifest_entry e;
    std::uint64_t size = 0, ino = 0, mode = 0;
    if (!detail::is_origin_id(f[0])) fail("bad origin id");
    e.origin = std::string(f[0]);
    if (!detail::manifest_number(f[1], 10, size) || size > static_cast<std::uint64_t>(INT64_MAX))
      fail("bad size");
    e.size = static_cast<std::int64_t>(size);
    if (!detail::manifest_signed(f[2], e.mtime_ns)) fail("bad mtime");
    if (!detail::manifest_number(f[3], 10, ino)) fail("bad inode");
    e.ino = ino;
    if (!detail::manifest_number(f[4], 8, mode) || mode > 0177777) fail("bad mode");
    e.mode = static_cast<std::uint32_t>(mode);
    if (f[5] != "-" && f[5] != "r") fail("bad flags (expected '-' or 'r')");
    e.racy = f[5] == "r";
    std::string rel;
    const bool escaped = rest.find('\\') != std::string_view::npos;
    if (!escaped) rel.assign(rest.data(), rest.size());
    for (std::size_t i = 0; escaped && i < rest.size(); ++i) {
      if (rest[i] != '\\') {
        rel += rest[i];
        continue;
      }
      if (i + 1 < rest.size() && (rest[i + 1] == '\\' || rest[i + 1] == 'n')) {
        rel += rest[i + 1] == 'n' ? '\n' : '\\';
        ++i;
        continue;
      }
      auto hexval = [](char c) { return detail::hex_digit(c, detail::hex_case::lower); };
      if (i + 3 >= rest.size() || rest[i + 1] != 'x' || hexval(rest[i + 2]) < 0 ||
          hexval(rest[i + 3]) < 0)
        fail("bad escape in the path");
      rel += static_cast<char>(hexval(rest[i + 2]) * 16 + hexval(rest[i + 3]));
      i += 3;
    }
    if (const char* why = detail::manifest_path_problem(rel))
      fail(std::string(why) + " '" + detail::printable(rel) + "'");
    if (m.files.empty() || std::prev(m.files.end())->first < rel)  // in order, as written
      m.files.emplace_hint(m.files.end(), std::move(rel), std::move(e));
    else if (!m.files.try_emplace(rel, std::move(e)).second)
      fail("duplicate path '" + detail::printable(rel) + "'");
    ++count;
  }
  if (line_no == 0) throw format_error(path, "line 1: empty file (truncated)");
  if (!ended) detail::manifest_fail(path, line_no, "truncated: no end line");
  return m;
}

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
        throw error(EINVAL, "store url", detail::printable(prefix),
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
      throw error(EINVAL, "sync", detail::printable(local_dir),
                  "the local directory's path contains NUL");
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
      detail::store_sync_dir<durability_type, io_type>(detail::store_parent(created[0]));
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
      std::string up = detail::store_parent(existing);
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
      std::string parent = detail::store_parent(target);
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
