// holdfast/kv/url.hpp — one URL grammar for choosing a coordination store at run time.
//
//   file:///shared/dir                         filesystem_kv on a directory every worker mounts
//   etcd://host:port[,host:port...][/prefix]   etcd_kv on those members (port 2379 when left
//                                              out; IPv6 hosts in brackets; prefix default
//                                              "holdfast", one or more key segments)
//
//   holdfast::any_kv kv = holdfast::make_kv("etcd://10.0.0.5:2379,10.0.0.6:2379/jobs",
//                                           {"run-7", restart_count});
//
// Guarantees:
//   - parse_kv_url is the library's one parser of store URLs (the demo, the PyTorch extension and
//     the fuzz target use it). It never throws anything but holdfast::format_error, naming the
//     URL and the offset of what is wrong; it accepts nothing it does not understand (no query,
//     no fragment, no user info, no empty host or segment, no NUL, ports 1-65535).
//   - make_kv opens the store the URL names, in namespace `ns`, as an any_kv.
// Caveats:
//   - Schemes are matched without regard to case; hosts and paths are taken as written.
//   - A host application may give other names its own meaning before calling parse_kv_url (the
//     PyTorch extension's "torch": the job's own c10d store).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/http.hpp"  // http_endpoint, parse_http_url
#include "../kv.hpp"
#include "any.hpp"
#include "etcd.hpp"
#include "filesystem.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// A parsed store URL.
struct kv_url {
  /// Which store.
  enum class kind : unsigned char { file, etcd };
  kind scheme = kind::file;            ///< file:// or etcd://
  std::string directory;               ///< file: the absolute directory
  std::vector<std::string> endpoints;  ///< etcd: "http://host:port" per member, in order
  std::string prefix = "holdfast";     ///< etcd: the first key segment(s) in etcd
};

namespace detail {

inline bool kv_url_starts(std::string_view url, std::string_view scheme) {
  return url.size() >= scheme.size() && http_iequal(url.substr(0, scheme.size()), scheme);
}

// One "host[:port]" of an etcd URL, as an http:// endpoint URL (port 2379 when left out).
inline std::string kv_url_member(std::string_view member, const std::string& url,
                                 std::size_t offset) {
  auto bad = [&](const std::string& why) {
    throw format_error(url, "offset " + std::to_string(offset) + ": " + why);
  };
  if (member.empty()) bad("empty member (',' with nothing around it)");
  for (char c : member)
    if (c == '@' || c == '?' || c == '#' || c == '%' || c == '\0' ||
        static_cast<unsigned char>(c) <= ' ')
      bad(std::string("character '") + (c == '\0' ? std::string("\\0") : std::string(1, c)) +
          "' not allowed in a host");
  const std::size_t close = member.rfind(']');
  const std::size_t colon = member.rfind(':');
  const bool has_port =
      colon != std::string_view::npos &&
      (member.front() != '[' || (close != std::string_view::npos && colon > close));
  std::string endpoint = "http://" + std::string(member) + (has_port ? "" : ":2379");
  http_endpoint ep;
  try {
    ep = parse_http_url(endpoint);
  } catch (const format_error& e) {
    bad(std::string("bad member '") + std::string(member) + "': " + e.what());
  }
  if (ep.port == 0) bad("port 0");
  return endpoint;
}

}  // namespace detail

/// Parses a store URL (see the top of kv/url.hpp); throws holdfast::format_error naming the URL
/// and the offset of the problem.
inline kv_url parse_kv_url(std::string_view text) {
  const std::string url = detail::printable_key(text);  // a NUL shown as \0 in messages
  auto bad = [&](std::size_t offset, const std::string& why) {
    throw format_error(url, "offset " + std::to_string(offset) + ": " + why);
  };
  if (text.find('\0') != std::string_view::npos) bad(text.find('\0'), "NUL byte");
  kv_url out;
  if (detail::kv_url_starts(text, "file://")) {
    out.scheme = kv_url::kind::file;
    std::string_view path = text.substr(7);
    if (path.empty() || path.front() != '/') bad(7, "expected an absolute directory (file:///dir)");
    if (path.find_first_of("?#") != std::string_view::npos)
      bad(7 + path.find_first_of("?#"), "no query or fragment in a file URL");
    out.directory = std::string(path);
    while (out.directory.size() > 1 && out.directory.back() == '/') out.directory.pop_back();
    if (out.directory == "/") bad(7, "the root directory is not a store");
    return out;
  }
  if (!detail::kv_url_starts(text, "etcd://"))
    bad(0, "unknown scheme (expected file:// or etcd://)");
  out.scheme = kv_url::kind::etcd;
  std::string_view rest = text.substr(7);
  const std::size_t slash = rest.find('/');
  std::string_view members = rest.substr(0, slash);
  if (members.empty()) bad(7, "no etcd member");
  for (std::size_t at = 0;;) {
    const std::size_t comma = members.find(',', at);
    out.endpoints.push_back(detail::kv_url_member(members.substr(at, comma - at), url, 7 + at));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    const std::size_t offset = 7 + slash + 1;
    if (prefix.find_first_of("?#") != std::string_view::npos)
      bad(offset + prefix.find_first_of("?#"), "no query or fragment in an etcd URL");
    if (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    std::string why = detail::key_problem(prefix);
    if (!why.empty()) bad(offset, "bad prefix: " + why);
    out.prefix = std::string(prefix);
  }
  return out;
}

/// Opens the store `url` names, in namespace `ns`, as an any_kv. For etcd, `etcd` gives the
/// other options (timeouts, lease); the URL's members and prefix replace its endpoints and
/// prefix.
inline any_kv make_kv(std::string_view url, const kv_namespace& ns, etcd_options etcd = {}) {
  kv_url u = parse_kv_url(url);
  if (u.scheme == kv_url::kind::file) return any_kv(filesystem_kv(u.directory, ns));
  etcd.endpoints = std::move(u.endpoints);
  etcd.prefix = std::move(u.prefix);
  return any_kv(etcd_kv(std::move(etcd), ns));
}

HOLDFAST_NAMESPACE_END
