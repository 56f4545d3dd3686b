// holdfast/kv/url.hpp — one URL grammar for choosing a coordination store at run time.
//
//   file:///shared/dir                         filesystem_kv on a directory every worker mounts
//   /shared/dir                                the same: an absolute path is its directory, as
//                                              for store::create (a relative one is refused)
//   etcd://host:port[,host:port...][/prefix][?lease]  etcd_kv on those members (port 2379
//                                              when left out; IPv6 hosts in brackets; prefix
//                                              default "holdfast", one or more key segments)
//   etcds://host:port[,...][/prefix][?query]   the same over TLS (https://), with a query of
//       ca=FILE             CA certificates (PEM) to verify the members; default: the system's
//       cert=FILE&key=FILE  a client certificate and its key (PEM), both or neither
//       server_name=NAME    the name the members' certificates must carry (default: the host)
//       user=NAME           authenticate as NAME, with exactly one of
//       password_file=FILE  a file holding the password (one line), or
//       password_env=VAR    an environment variable holding it
//   and, in both etcd schemes, the lease for liveness keys (handler/liveness.hpp), both or neither:
//       lease_ttl=SECONDS   etcd_options::lease_ttl (1-3600)
//       leased_prefix=KEYS  etcd_options::leased_prefix (keys below it carry the lease), such as
//                           holdfast/<run id>/live for the liveness monitor's keys
//     (values may be %XX-escaped; each key at most once)
//
//   holdfast::any_kv kv = holdfast::make_kv("etcd://10.0.0.5:2379,10.0.0.6:2379/jobs",
//                                           {"run-7", restart_count});
//   holdfast::any_kv secure = holdfast::make_kv<holdfast_tls::openssl_transport<>>(
//       "etcds://10.0.0.5:2379,10.0.0.6:2379/jobs?ca=/etc/etcd/ca.pem"
//       "&user=trainer&password_file=/run/secrets/etcd", {"run-7", restart_count});
//
// Guarantees:
//   - parse_kv_url is the library's one parser of store URLs (the demo, the PyTorch extension and
//     the fuzz target use it). It never throws anything but holdfast::format_error, naming the
//     URL and the offset of what is wrong; it accepts nothing it does not understand (no query
//     but etcd:// and etcds://'s, no fragment, no user info, no empty host or segment, no NUL,
//     ports 1-65535, no unknown or repeated query key).
//   - A password never sits in a URL: `password=`, `user:password@` and `token@` are refused, and
//     the URL an error names has such a password, all of user info without ':' (a token: a user
//     name shows only when a password follows it), and the value of any unknown query key
//     replaced by "***".
//   - make_kv opens the store the URL names, in namespace `ns`, as an any_kv; etcds:// needs a
//     TLS transport: make_kv<Transport>(...) (see examples/tls/openssl_transport.hpp).
// Caveats:
//   - Schemes are matched without regard to case; hosts and paths are taken as written.
//   - A host application may give other names its own meaning before calling parse_kv_url (the
//     PyTorch extension's "torch": the job's own c10d store).
//   - The files a query names are read when the store is opened (the password file by the
//     library, the CA, certificate and key by the TLS transport), not when the URL is parsed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/ascii.hpp"  // hex_digit, printable: %XX and redacted URLs
#include "../detail/http.hpp"   // http_endpoint, parse_endpoint_url, tls_options
#include "../kv.hpp"
#include "any.hpp"
#include "etcd.hpp"
#include "filesystem.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// A parsed store URL.
struct kv_url {
  /// Which store.
  enum class kind : unsigned char { file, etcd };
  kind scheme = kind::file;            ///< file://, or etcd:// and etcds://
  std::string directory;               ///< file: the absolute directory
  std::vector<std::string> endpoints;  ///< etcd: "http://host:port" (etcds: https://) per member
  std::string prefix = "holdfast";     ///< etcd: the first key segment(s) in etcd
  bool secure = false;                 ///< etcds://: TLS
  tls_options tls;                     ///< etcds: ca, cert, key, server_name
  std::string user;                    ///< etcds: user=
  std::string password_file;           ///< etcds: password_file=
  std::string password_env;            ///< etcds: password_env=
  std::chrono::seconds lease_ttl{0};   ///< etcd, etcds: lease_ttl= (0: none)
  std::string leased_prefix;           ///< etcd, etcds: leased_prefix= (empty: none)
};

namespace detail {

inline bool kv_url_starts(std::string_view url, std::string_view scheme) {
  return url.size() >= scheme.size() && http_iequal(url.substr(0, scheme.size()), scheme);
}

// The query keys whose values may show in an error (a password never is one of them).
inline bool kv_url_safe_key(std::string_view key) {
  for (std::string_view k : {"ca", "cert", "key", "server_name", "user", "password_file",
                             "password_env", "lease_ttl", "leased_prefix"})
    if (key == k) return true;
  return false;
}

// True for a query key that may name a secret in any scheme's URL.
inline bool kv_url_secret_key(std::string_view key) {
  for (std::string_view word : {"pass", "secret", "token", "pwd"})
    if (key.find(word) != std::string_view::npos) return true;
  return false;
}

// `url` as errors show it: a password in user info (all of user info without ':') replaced by
// "***", and in the query every
// value but those of the known harmless keys replaced by "***" (in etcds:// the whole item, key
// included); a NUL shown as \0.
inline std::string kv_url_redacted(std::string_view url) {
  std::string out;
  const bool secure = kv_url_starts(url, "etcds://");
  const std::size_t scheme_end = url.find("://");
  const std::size_t auth = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  const std::size_t auth_end = std::min(url.find_first_of("/?#", auth), url.size());
  const std::size_t at = url.substr(0, auth_end).rfind('@');
  std::size_t from = 0;
  if (at != std::string_view::npos && at > auth) {
    // "user:password@": the password; "token@" (no ':'): all of it, a token being a secret.
    const std::size_t colon = url.substr(0, at).find(':', auth);
    out += url.substr(0, colon == std::string_view::npos ? auth : colon + 1);
    out += "***";
    from = at;
  }
  const std::size_t q = url.find('?', auth_end);
  if (q == std::string_view::npos) return printable(out + std::string(url.substr(from)));
  out += url.substr(from, q + 1 - from);
  std::string_view query = url.substr(q + 1);
  while (true) {
    const std::size_t amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    const std::string_view key = item.substr(0, item.find('='));
    if (key.size() < item.size() && kv_url_safe_key(key))
      out += item;
    else if (!secure || kv_url_secret_key(key))  // the name, never the value
      out += std::string(key) + (key.size() < item.size() ? "=***" : "");
    else if (!item.empty())  // etcds://: not even the name (a secret may be typed there)
      out += "***";
    if (amp == std::string_view::npos) break;
    out += '&';
    query.remove_prefix(amp + 1);
  }
  return printable(out);
}

// One "host[:port]" of an etcd URL, as an http:// (or https://) endpoint URL (port 2379 when
// left out).
inline std::string kv_url_member(std::string_view member, const std::string& url,
                                 std::size_t offset, bool secure = false) {
  auto bad = [&](const std::string& why) {
    throw format_error(url, "offset " + std::to_string(offset) + ": " + why);
  };
  if (member.empty()) bad("empty member (',' with nothing around it)");
  if (member.find('@') != std::string_view::npos)
    bad("character '@' not allowed in a host: no user info in a store URL (authenticate with "
        "user= and password_file= or password_env= in an etcds:// URL)");
  for (char c : member)
    if (c == '?' || c == '#' || c == '%' || c == '\0' || static_cast<unsigned char>(c) <= ' ' ||
        c == '\x7f')
      bad(std::string("character '") + (c == '\0' ? std::string("\\0") : std::string(1, c)) +
          "' not allowed in a host");
  const std::size_t close = member.rfind(']');
  const std::size_t colon = member.rfind(':');
  const bool has_port =
      colon != std::string_view::npos &&
      (member.front() != '[' || (close != std::string_view::npos && colon > close));
  std::string endpoint =
      (secure ? "https://" : "http://") + std::string(member) + (has_port ? "" : ":2379");
  http_endpoint ep;
  try {
    ep = parse_endpoint_url(endpoint);
  } catch (const format_error& e) {
    bad(std::string("bad member '") + std::string(member) + "': " + e.what());
  }
  if (ep.port == 0) bad("port 0");
  return endpoint;
}

// %XX-decodes a query value; false on a malformed escape or a NUL.
inline bool kv_url_decode(std::string_view in, std::string& out) {
  auto hex = [](char c) { return hex_digit(c); };
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

// The value of lease_ttl=: whole seconds, 1 to 3600; -1 when it is not one.
inline long long kv_url_seconds(const std::string& value) {
  if (value.empty() || value.size() > 4) return -1;
  long long n = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n >= 1 && n <= 3600 ? n : -1;
}

// The query of an etcd:// or etcds:// URL (etcd:// takes the lease keys only), from `offset` in
// `url` (shown as `shown` in errors).
inline void kv_url_query(std::string_view query, std::size_t offset, const std::string& shown,
                         kv_url& out) {
  auto bad = [&](std::size_t at, const std::string& why) {
    throw format_error(shown, "offset " + std::to_string(at) + ": " + why);
  };
  std::vector<std::string> seen;
  for (std::size_t at = 0;;) {
    const std::size_t amp = query.find('&', at);
    const std::string_view item = query.substr(at, amp - at);
    const std::size_t item_offset = offset + at;
    const std::size_t eq = item.find('=');
    if (item.empty()) bad(item_offset, "empty query parameter");
    if (eq == std::string_view::npos) bad(item_offset, "query parameter without '='");
    const std::string key(item.substr(0, eq));
    if (key == "password")
      bad(item_offset, "a password does not belong in a URL: use password_file= or password_env=");
    if (!kv_url_safe_key(key))  // its name is not shown: it might be a secret typed there
      bad(item_offset,
          "unknown query parameter (known: ca, cert, key, server_name, user, password_file, "
          "password_env, lease_ttl, leased_prefix)");
    if (!out.secure && key != "lease_ttl" && key != "leased_prefix")
      bad(item_offset,
          "etcd:// takes only lease_ttl= and leased_prefix= (TLS and "
          "authentication need etcds://)");
    for (const auto& k : seen)
      if (k == key) bad(item_offset, "query parameter '" + key + "' given twice");
    seen.push_back(key);
    std::string value;
    if (!kv_url_decode(item.substr(eq + 1), value))
      bad(item_offset + eq + 1, "bad %-escape (or %00) in the value of '" + key + "'");
    if (value.empty()) bad(item_offset + eq + 1, "empty value for '" + key + "'");
    if (key == "ca") out.tls.ca_file = value;
    if (key == "cert") out.tls.cert_file = value;
    if (key == "key") out.tls.key_file = value;
    if (key == "server_name") out.tls.server_name = value;
    if (key == "user") out.user = value;
    if (key == "password_file") out.password_file = value;
    if (key == "password_env") out.password_env = value;
    if (key == "lease_ttl") {
      const long long n = kv_url_seconds(value);
      if (n < 0) bad(item_offset + eq + 1, "lease_ttl= takes whole seconds, 1 to 3600");
      out.lease_ttl = std::chrono::seconds(n);
    }
    if (key == "leased_prefix") {
      std::string_view p = value;
      if (p.back() == '/') p.remove_suffix(1);
      const std::string why = key_problem(p);
      if (!why.empty()) bad(item_offset + eq + 1, "bad leased_prefix: " + why);
      out.leased_prefix = std::string(p);
    }
    if (amp == std::string_view::npos) break;
    at = amp + 1;
  }
  if (out.tls.cert_file.empty() != out.tls.key_file.empty())
    bad(offset, "cert= and key= go together");
  if (!out.password_file.empty() && !out.password_env.empty())
    bad(offset, "password_file= and password_env= exclude each other");
  if (out.user.empty() && !(out.password_file.empty() && out.password_env.empty()))
    bad(offset, "a password source without user=");
  if (!out.user.empty() && out.password_file.empty() && out.password_env.empty())
    bad(offset, "user= needs password_file= or password_env=");
  if ((out.lease_ttl.count() > 0) != !out.leased_prefix.empty())
    bad(offset, "lease_ttl= and leased_prefix= go together");
}

}  // namespace detail

/// Parses a store URL (see the top of kv/url.hpp); throws holdfast::format_error naming the URL
/// (any password in it shown as ***) and the offset of the problem.
inline kv_url parse_kv_url(std::string_view text) {
  const std::string url = detail::kv_url_redacted(text);
  auto bad = [&](std::size_t offset, const std::string& why) {
    throw format_error(url, "offset " + std::to_string(offset) + ": " + why);
  };
  if (text.find('\0') != std::string_view::npos) bad(text.find('\0'), "NUL byte");
  kv_url out;
  const bool plain = !text.empty() && text.front() == '/';  // a path, as store::create takes
  if (plain || detail::kv_url_starts(text, "file://")) {
    out.scheme = kv_url::kind::file;
    const std::size_t from = plain ? 0 : 7;
    std::string_view path = text.substr(from);
    if (path.empty() || path.front() != '/') bad(7, "expected an absolute directory (file:///dir)");
    if (path.find_first_of("?#") != std::string_view::npos)
      bad(from + path.find_first_of("?#"), "no query or fragment in a directory store's URL");
    out.directory = std::string(path);
    while (out.directory.size() > 1 && out.directory.back() == '/') out.directory.pop_back();
    if (out.directory == "/") bad(from, "the root directory is not a store");
    return out;
  }
  out.secure = detail::kv_url_starts(text, "etcds://");
  if (!out.secure && !detail::kv_url_starts(text, "etcd://"))
    bad(0,
        "unknown scheme (expected file://, etcd://, etcds:// or an absolute directory; a "
        "relative path would name another directory in each worker's working directory)");
  out.scheme = kv_url::kind::etcd;
  const std::size_t start = out.secure ? 8 : 7;
  std::string_view rest = text.substr(start);
  std::string_view query;
  std::size_t query_offset = 0;
  if (const std::size_t hash = rest.find('#'); hash != std::string_view::npos)
    bad(start + hash, "no fragment in an etcd URL");
  if (const std::size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    query_offset = start + q + 1;
    rest = rest.substr(0, q);
    if (query.empty()) bad(query_offset, "empty query");
  }
  const std::size_t slash = rest.find('/');
  std::string_view members = rest.substr(0, slash);
  if (members.empty()) bad(start, "no etcd member");
  for (std::size_t at = 0;;) {
    const std::size_t comma = members.find(',', at);
    out.endpoints.push_back(
        detail::kv_url_member(members.substr(at, comma - at), url, start + at, out.secure));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    const std::size_t offset = start + slash + 1;
    if (prefix.find_first_of("?#") != std::string_view::npos)
      bad(offset + prefix.find_first_of("?#"), "no query or fragment in an etcd URL");
    if (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    std::string why = detail::key_problem(prefix);
    if (!why.empty()) bad(offset, "bad prefix: " + why);
    out.prefix = std::string(prefix);
  }
  if (!query.empty()) detail::kv_url_query(query, query_offset, url, out);
  return out;
}

/// Opens the store `url` names, in namespace `ns`, as an any_kv. For etcd, `etcd` gives the
/// other options (timeouts, lease, pool); the URL's members and prefix replace its endpoints and
/// prefix, its lease_ttl= and leased_prefix= replace the lease, and an etcds:// URL's TLS and
/// authentication settings replace those it names.
/// `Transport` makes etcd's connections: etcds:// needs a TLS one (such as
/// holdfast_tls::openssl_transport<> from examples/tls), else holdfast::error(EPROTONOSUPPORT).
template <class Transport = plain_transport<posix_io>>
any_kv make_kv(std::string_view url, const kv_namespace& ns, etcd_options etcd = {}) {
  kv_url u = parse_kv_url(url);
  if (u.scheme == kv_url::kind::file) return any_kv(filesystem_kv(u.directory, ns));
  if (u.secure && !transport_speaks_tls_v<Transport>)
    throw error(EPROTONOSUPPORT, "make_kv", detail::kv_url_redacted(url),
                "etcds:// needs a TLS transport: make_kv<Transport>(...) with one such as "
                "holdfast_tls::openssl_transport<> (examples/tls/openssl_transport.hpp)");
  etcd.endpoints = std::move(u.endpoints);
  etcd.prefix = std::move(u.prefix);
  if (!u.tls.ca_file.empty()) etcd.tls.ca_file = u.tls.ca_file;
  if (!u.tls.cert_file.empty()) {
    etcd.tls.cert_file = u.tls.cert_file;
    etcd.tls.key_file = u.tls.key_file;
  }
  if (!u.tls.server_name.empty()) etcd.tls.server_name = u.tls.server_name;
  if (!u.user.empty()) {
    etcd.user = u.user;
    etcd.password_file = u.password_file;
    etcd.password_env = u.password_env;
  }
  if (u.lease_ttl.count() > 0) {
    etcd.lease_ttl = u.lease_ttl;
    etcd.leased_prefix = u.leased_prefix;
  }
  return any_kv(basic_etcd_kv<posix_io, Transport>(std::move(etcd), ns));
}

HOLDFAST_NAMESPACE_END
