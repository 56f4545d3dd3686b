// holdfast/store/url.hpp — store prefixes and the names under them: parse_store_url (file://,
// hdfs://, the DBFS spellings, plain paths), parse_hdfs_url, store_url, and the checks of run
// ids and dataset indexes.
//
// Guarantees:
//   - URLs parse as Horovod's: file://, hdfs://[host[:port]]/path (host `default`, port 0 when
//     absent), dbfs:/x, /dbfs/x and file:///dbfs/x all name /dbfs/x.
//   - An unknown scheme, a file:// URL with a remote host, an empty prefix, or NUL is a
//     holdfast::error (EINVAL) naming the URL (error::what() escapes it).
//   - A run id or dataset index that is empty, ".", or has '/', "..", or NUL is a
//     holdfast::error (EINVAL) naming it: no name can leave the store's prefix.
// Caveats:
//   - hdfs:// is reached through a FUSE or NFS gateway mount (store_options::hdfs_mount); there
//     is no HDFS client. S3, GCS and other schemes are rejected.
//   - /dbfs/ paths count as a DBFS mount whether or not the process runs on Databricks (Horovod
//     looks at DATABRICKS_RUNTIME_VERSION).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "../error.hpp"

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
  throw error(EINVAL, "store url", std::string(url), why);
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
/// spellings (normalized to /dbfs/...; file://localhost/dbfs/... too), file:// (absolute paths,
/// or file://localhost/...), or a plain path. Throws holdfast::error (EINVAL) naming the URL for an
/// unknown scheme, a file:// URL with a remote host, an empty prefix, or NUL.
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
    if (is_dbfs_path(rest)) return parse_store_url(rest);  // file://localhost/dbfs/x: DBFS
    store_url u;
    u.path = std::string(rest);
    u.url_prefix = "file://";
    return u;
  }
  if (!scheme.empty())
    detail::store_bad_url(url, "unknown URL scheme '" + std::string(scheme) +
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
  if (why) throw error(EINVAL, std::string(what), std::string(name), why);
}
}  // namespace detail

/// Checks a run id: non-empty, no '/', no "..", no NUL, not ".". Throws holdfast::error(EINVAL,
/// "run id", id) otherwise.
inline void validate_run_id(std::string_view run_id) { detail::store_check_name("run id", run_id); }

/// Checks a dataset index with the rules of validate_run_id.
inline void validate_dataset_index(std::string_view idx) {
  detail::store_check_name("dataset index", idx);
}

HOLDFAST_NAMESPACE_END
