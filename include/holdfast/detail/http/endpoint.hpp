// holdfast/detail/http/endpoint.hpp — where the HTTP client connects: http_endpoint (host,
// port, TLS or not) and the parsing of `http://` and `https://` URLs into one.
//
// Guarantees:
//   - parse_url accepts `http://host[:port][/path]` (and with allow_https `https://...`), the
//     scheme ASCII case-insensitively, `[...]` around an IPv6 address, ports 0 to 65535; the
//     default port is 80 (443 for https).
//   - Anything else throws holdfast::format_error naming the URL and what is wrong with it
//     (the offset where the scheme or host was expected); nothing is half-parsed.
//   - http_endpoint::url() writes the endpoint back (brackets around IPv6), for messages.
//   - http_loopback_host is true only for an address in 127.0.0.0/8 (dotted quad), ::1 (any
//     spelling) and the name localhost (any case): hosts a request never leaves the machine for.
// Caveats:
//   - No user info, query or fragment handling: what follows the authority is the path, as is.
//   - The host is not resolved or checked here; connecting resolves it (transport.hpp).
#pragma once

#include <arpa/inet.h>   // inet_pton: loopback addresses
#include <netinet/in.h>  // in_addr, in6_addr

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "../../error.hpp"  // format_error
#include "message.hpp"      // http_iequal: the scheme

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Where to connect: a host name or address (IPv6 without brackets), a port, and whether the
/// connection speaks TLS (an https:// URL).
struct http_endpoint {
  std::string host;
  std::uint16_t port = 80;
  bool tls = false;
  /// "http://host:port" (or https://), with brackets around an IPv6 address; used in messages.
  std::string url() const {
    bool v6 = host.find(':') != std::string::npos;
    return (tls ? "https://" : "http://") + (v6 ? "[" + host + "]" : host) + ":" +
           std::to_string(port);
  }
  /// Same host, port and scheme.
  bool same(const http_endpoint& o) const noexcept {
    return port == o.port && tls == o.tls && host == o.host;
  }
};

/// True when `host` (as in http_endpoint: IPv6 without brackets) is a loopback address
/// (127.0.0.0/8, ::1) or the name localhost; false for any other name or address.
inline bool http_loopback_host(const std::string& host) {
  if (http_iequal(host, "localhost")) return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

/// Parses `http://host[:port][/path]`, and with `allow_https` also `https://...` (port 80 or
/// 443 by default; `[::1]` for IPv6). When `path` is given it receives the path ("" when
/// absent). Throws holdfast::format_error on anything else.
inline http_endpoint parse_url(std::string_view url, std::string* path, bool allow_https) {
  const std::string src(url);
  const bool tls = allow_https && url.size() >= 8 && http_iequal(url.substr(0, 8), "https://");
  const std::string_view scheme = tls ? "https://" : "http://";
  if (url.size() < scheme.size() || !http_iequal(url.substr(0, scheme.size()), scheme))
    throw format_error(
        src, allow_https ? "offset 0: expected http:// or https://" : "offset 0: expected http://");
  const std::string at = "offset " + std::to_string(scheme.size()) + ": ";
  std::string_view rest = url.substr(scheme.size());
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (path)
    *path = slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash));
  http_endpoint ep;
  ep.tls = tls;
  ep.port = tls ? 443 : 80;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) throw format_error(src, at + "unclosed '['");
    ep.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw format_error(src, "expected ':' after ']'");
      port = after.substr(1);
      if (port.empty()) throw format_error(src, "empty port");
    }
  } else {
    std::size_t colon = authority.find(':');
    ep.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) throw format_error(src, "empty port");
    }
  }
  if (ep.host.empty()) throw format_error(src, at + "empty host");
  if (!port.empty()) {
    unsigned long value = 0;
    for (char c : port) {
      if (c < '0' || c > '9') throw format_error(src, "port is not a number");
      value = value * 10 + static_cast<unsigned long>(c - '0');
      if (value > 65535) throw format_error(src, "port above 65535");
    }
    ep.port = static_cast<std::uint16_t>(value);
  }
  return ep;
}

/// Parses `http://host[:port][/path]` (port 80 by default; `[::1]` for IPv6); see parse_url.
inline http_endpoint parse_http_url(std::string_view url, std::string* path = nullptr) {
  return parse_url(url, path, false);
}

/// Parses `http://...` or `https://...` (a server a Transport may reach over TLS); see parse_url.
inline http_endpoint parse_endpoint_url(std::string_view url, std::string* path = nullptr) {
  return parse_url(url, path, true);
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
